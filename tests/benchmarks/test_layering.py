"""Package layering, read from the source with `ast` (nothing is imported, so it takes milliseconds).

The rules (README, Layout):
- the product (common/, transformer/, data/, nmt/ and the train/evaluate/translate/export entry points) never
  imports `benchmarks` nor the `bench.py` / `ablate.py` faces: the benchmarks measure the product from outside;
- `common/` imports nothing of ours but itself;
- `transformer/` knows no files or configs: of ours it imports only itself, `common.special_ids` and
  `common.sampling` (not nmt/, data/, nor the config tree), and no file or config library (yaml, json, pathlib,
  ...) nor the `open` builtin;
- `data/` imports nothing from nmt/ or transformer/ (it may use `common`).
Imports inside functions, under `TYPE_CHECKING`, relative imports and `importlib.import_module("...")` /
`__import__("...")` with a literal name all count.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = ("train.py", "evaluate.py", "translate.py", "distill.py", "export.py")
PACKAGES = ("common", "transformer", "data", "nmt")
# What each part of the product may import of ours (dotted-name prefixes); anything else of ours is a violation.
ALLOWED = {
    "common": ("common",),
    "transformer": ("transformer", "common.special_ids", "common.sampling"),
    "data": ("data", "common"),
    "nmt": ("nmt", "data", "transformer", "common"),
    "entry point": ("nmt", "data", "transformer", "common"),
}
FILE_LIBRARIES = ("yaml", "json", "pathlib", "shutil", "tempfile", "glob", "csv", "pickle")


def _ours(root: Path) -> set[str]:
    """Top-level names of our packages and modules under `root`."""
    return {p.parent.name for p in root.glob("*/__init__.py")} | {p.stem for p in root.glob("*.py")}


def _product_files(root: Path) -> list[tuple[str, Path]]:
    files = [("entry point", root / name) for name in ENTRY_POINTS if (root / name).is_file()]
    for package in PACKAGES:
        files += [(package, path) for path in sorted((root / package).rglob("*.py"))]
    return files


def _imported_names(path: Path, root: Path):
    """(line, dotted module name) of every import in the file, relative ones resolved."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    package = parts[:-1]  # the package a relative import starts from (also right for __init__.py)
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            if not node.module:  # `from . import x`: x is a module of that package
                for alias in node.names:
                    yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                yield node.lineno, node.args[0].value


def _opens_files(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
            yield node.lineno


def violations(root: Path) -> list[str]:
    """Every broken layering rule in the product under `root`, as "path:line: what"."""
    ours, found = _ours(root), []
    for part, path in _product_files(root):
        where, in_file = path.relative_to(root).as_posix(), []
        for line, module in _imported_names(path, root):
            top = module.split(".")[0]
            allowed = ALLOWED[part]
            if top in ours and not any(module == a or module.startswith(a + ".") for a in allowed):
                in_file.append((line, f"{part} imports {module}"))
            elif part == "transformer" and top in FILE_LIBRARIES:
                in_file.append((line, f"transformer imports {module}"))
        if part == "transformer":
            in_file += [(line, "transformer calls open()") for line in _opens_files(path)]
        found += [f"{where}:{line}: {what}" for line, what in sorted(in_file)]
    return found


def test_the_product_respects_the_layering():
    scanned = {path.relative_to(REPO).as_posix() for _, path in _product_files(REPO)}
    # The scan reads the real tree (not an empty one): these files exist and hold imports of ours.
    assert {"train.py", "transformer/vocab.py", "data/pipeline.py", "nmt/trainer.py"} <= scanned
    vocab = dict(_imported_names(REPO / "transformer" / "vocab.py", REPO))
    assert "common.special_ids" in vocab.values()
    assert violations(REPO) == []


def test_the_check_reports_each_kind_of_violation(tmp_path):
    """A miniature tree with one violation of each rule next to allowed imports: exactly the violations found."""
    sources = {
        "benchmarks/__init__.py": "",
        "benchmarks/runner.py": "import nmt.trainer\n",  # benchmarks may import the product
        "bench.py": "",
        "common/__init__.py": "",
        "common/special_ids.py": "PAD_ID = 0\n",
        "common/config_tree.py": "import yaml\nfrom data import config\n",
        "transformer/__init__.py": "",
        "transformer/vocab.py": "from common.special_ids import PAD_ID\nimport tensorflow as tf\n",
        "transformer/model.py": """
            from transformer.vocab import PAD_ID
            from common.config_tree import load
            from pathlib import Path
            def build(config):
                with open(config) as handle:
                    return handle
        """,
        "data/__init__.py": "",
        "data/sub/__init__.py": "",
        "data/sub/pipeline.py": """
            from common.config_tree import load
            from .. import store
            from ...nmt import config
            def make():
                import transformer.model
                return transformer.model
        """,
        "nmt/__init__.py": "",
        "nmt/trainer.py": """
            import importlib
            from typing import TYPE_CHECKING
            from data.sub import pipeline
            if TYPE_CHECKING:
                from benchmarks.runner import BenchOptions
            runner = importlib.import_module("benchmarks.runner")
        """,
        "train.py": "from nmt import trainer\nimport bench\n",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")

    assert violations(tmp_path) == [
        "train.py:2: entry point imports bench",
        "common/config_tree.py:2: common imports data",
        "transformer/model.py:2: transformer imports common.config_tree",
        "transformer/model.py:3: transformer imports pathlib",
        "transformer/model.py:5: transformer calls open()",
        "data/sub/pipeline.py:3: data imports nmt",
        "data/sub/pipeline.py:5: data imports transformer.model",
        "nmt/trainer.py:5: nmt imports benchmarks.runner",
        "nmt/trainer.py:6: nmt imports benchmarks.runner",
    ]
