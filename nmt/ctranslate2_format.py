"""What a CTranslate2 export directory of this project is, read and checked without writing one.

`nmt.ctranslate2_export` writes exports, `nmt.ctranslate2_engine` translates with them; both take from here the
format's names (`METADATA`, `COMPUTE_TYPES`, ...), `ExportError`, `import_ctranslate2` and `read_export_metadata`
(which checks a directory is an undamaged export, without ctranslate2). Here too: an export's vocabulary files
(`export_vocabulary`), the checkpoints a run directory holds by digest (`stored_checkpoints`), and whether an
export was made from one of them (`check_export_weights`). The names are re-exported by `nmt.ctranslate2_export`.
"""

from __future__ import annotations

import json
from pathlib import Path

from nmt.checkpoints import checkpoint_digest

__all__ = [
    "COMPUTE_TYPES",
    "CTRANSLATE2_PIN",
    "METADATA",
    "ExportError",
    "check_export_weights",
    "export_vocabulary",
    "import_ctranslate2",
    "read_export_metadata",
    "stored_checkpoints",
]

CTRANSLATE2_PIN = "ctranslate2==4.8.5"
METADATA = "nmt_export.json"
FORMAT = "nmt-ctranslate2"
FORMAT_VERSION = 1
# int8 weights with float32 activations between the int8 matrix products ("int8" alone may pick int8_float16 on GPUs)
COMPUTE_TYPES = {"float32": "float32", "int8": "int8_float32"}
# the METADATA keys the engine reads (`nmt.ctranslate2_engine`); "tokenizer" holds a "fingerprint"
REQUIRED_METADATA = ("tokenizer", "position_table", "max_source_length", "compute_type")


class ExportError(ValueError):
    """A path is not (or cannot become) an export, or the model cannot be expressed in CTranslate2."""


def import_ctranslate2():
    """``import ctranslate2``, or an ImportError saying how to install it."""
    try:
        import ctranslate2
    except ImportError as err:
        message = "CTranslate2 export and engine need the ctranslate2 package, which is not installed"
        raise ImportError(f"{message}: pip install {CTRANSLATE2_PIN}") from err
    return ctranslate2


def read_export_metadata(path: str | Path) -> dict:
    """The `METADATA` of an export directory; ExportError if `path` is not one (checked without ctranslate2)."""
    path = Path(path)
    if not path.is_dir():
        raise ExportError(f"not a CTranslate2 export (no such directory): {path}")
    missing = [name for name in ("model.bin", "config.json", METADATA) if not (path / name).is_file()]
    if missing:
        raise ExportError(
            f"not a CTranslate2 export of this project: {path} has no {', '.join(missing)} "
            "(make one with export.py --format ctranslate2)"
        )
    try:
        metadata = json.loads((path / METADATA).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ExportError(
            f"not a CTranslate2 export of this project: {path / METADATA} is unreadable ({err})"
        ) from err
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise ExportError(
            f"not a CTranslate2 export of this project: {path / METADATA} has no format {FORMAT!r}"
        )
    if metadata.get("version") != FORMAT_VERSION:
        raise ExportError(
            f"{path}: export format version {metadata.get('version')}, this code reads {FORMAT_VERSION}"
        )
    missing = [key for key in REQUIRED_METADATA if key not in metadata]
    if not missing and not (
        isinstance(metadata["tokenizer"], dict) and "fingerprint" in metadata["tokenizer"]
    ):
        missing = ["tokenizer.fingerprint"]
    if missing:
        raise ExportError(
            f"a damaged CTranslate2 export: {path / METADATA} has no key {missing[0]!r} "
            "(make it again with export.py --format ctranslate2)"
        )
    if not isinstance(metadata.get("vocab", {}), dict):
        raise ExportError(
            f"a damaged CTranslate2 export: {path / METADATA} has vocab {metadata['vocab']!r}, not a mapping "
            "(make it again with export.py --format ctranslate2)"
        )
    counts = [
        ("position_table", metadata["position_table"]),
        ("max_source_length", metadata["max_source_length"]),
    ]
    counts += [(f"vocab.{side}", n) for side, n in (metadata.get("vocab") or {}).items()]
    for key, value in counts:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ExportError(
                f"a damaged CTranslate2 export: {path / METADATA} has {key} {value!r}, not a positive integer "
                "(make it again with export.py --format ctranslate2)"
            )
    return metadata


def export_vocabulary(engine_dir: Path, side: str) -> list[str]:
    """The pieces of an export's `side` ("source" or "target") vocabulary, in id order (a shared one if it has it)."""
    shared = engine_dir / "shared_vocabulary.json"
    path = shared if shared.is_file() else engine_dir / f"{side}_vocabulary.json"
    return json.loads(path.read_text(encoding="utf-8"))


def stored_checkpoints(run_path: str | Path) -> dict[str, Path]:
    """The checkpoints under `run_path` (final, best, the training ones, the averaging snapshots) by their
    `checkpoint_digest` (an unreadable index has none): where a run holds the weights an export records."""
    prefixes = [index.with_suffix("") for index in sorted(Path(run_path).rglob("ckpt-*.index"))]
    return {digest: prefix for prefix in prefixes if (digest := checkpoint_digest(prefix))}


def check_export_weights(run_dir, engine_dir) -> None:
    """ExportError unless the export at `engine_dir` was made from weights stored in `run_dir` (any checkpoint it
    holds: final, best, the training checkpoints, the averaging snapshots; by `weights_digest`, so a moved or copied
    run still matches). The tokenizer check alone lets another run with the same tokenizer (a fine-tuned child,
    another seed) pass. Exports without a digest (made before it was recorded, or from weights computed at export:
    an average, the EMA), and run directories without weights (config and tokenizer kept to serve an export), are
    not checked."""
    metadata = read_export_metadata(Path(engine_dir))
    digest, weights = metadata.get("weights_digest"), Path(str(metadata.get("weights")))
    stored = stored_checkpoints(run_dir.path) if digest else {}
    if not stored or digest in stored:  # no weights at all: a run directory kept for its config and tokenizer
        return
    # this run's, trained on since: recorded inside it and no longer there (a relative path, older exports: from the
    # current directory, or named after this run's folder)
    owner = weights.parent.parent
    inside = owner.resolve() == run_dir.path.resolve() or (
        not weights.is_absolute() and owner.name == run_dir.path.name
    )
    if inside and checkpoint_digest(str(weights)) != digest:
        raise ExportError(
            f"the CTranslate2 export {engine_dir} was made from {weights}, which {run_dir.path} no longer holds "
            "(trained on since, or the checkpoint rotated away): export it again"
        )
    raise ExportError(
        f"the CTranslate2 export {engine_dir} was made from other weights ({weights}) than any stored in "
        f"{run_dir.path}: export the run directory you translate with"
    )
