"""What a training start imports before its first batch (issue 18: time from train.py start to the first batch).

In a fresh process, train.py's path to the first batch (its modules, the run's tokenizer, a prepared folder corpus,
`make_train_dataset`, one batch) must not import TensorFlow Text (0.3-1 s; the tokenizer builds its in-graph
ops on first use), sacreBLEU, CTranslate2 or TFDS (a folder corpus has no TFDS builder). Checked in `sys.modules`,
not with a clock. Then the tokenizer's first use imports TF Text and tokenizes like the `sentencepiece` package,
also when that first use is inside a tf.function trace or a SavedModel save.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.data.conftest import sentences

REPO = Path(__file__).resolve().parents[2]
NOT_BEFORE_FIRST_BATCH = ("tensorflow_text", "sacrebleu", "ctranslate2", "tensorflow_datasets")

CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path

    import train  # noqa: F401  (the entry point's own imports)
    from nmt.trainer import Trainer  # noqa: F401  (what train.py imports before Trainer.setup)
    from data.config import DataConfig
    from data.pipeline import make_train_dataset
    from data.prepare import prepare, run_tokenizer
    from transformer.model import build_model  # noqa: F401

    work = Path(sys.argv[1])
    cfg = DataConfig(dataset="folder", source="en", target="fr", folder=str(work / "corpus"),
                     cache_dir=str(work / "cache"), vocab_size=96, max_length=24, batch_tokens=256,
                     eval_batch_tokens=256, validation_split="dev")
    tokenizer = run_tokenizer(cfg, work / "run" / "tokenizer")
    prepare(cfg, tokenizer=tokenizer, progress=False)
    batch = next(iter(make_train_dataset(cfg, tokenizer, seed=1)))
    loaded = lambda: sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[2].split(",")))
    before = loaded()
    texts = [line for line in sys.argv[3].split("\\n") if line]
    ids = tokenizer.tokenize_source(texts).to_list()
    import tensorflow as tf
    back = [text.decode("utf-8") for text in tokenizer.detokenize_source(tf.ragged.constant(ids)).numpy()]
    print(json.dumps({"before": before, "after": loaded(), "ids": ids, "back": back,
                      "batch_rows": int(batch["source"].shape[0]), "source_model": tokenizer.models[0].hex()}))
    """
)


def test_first_batch_imports_no_tf_text_sacrebleu_ctranslate2_or_tfds(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for lang in ("en", "fr"):
        (corpus / f"{lang}.train.txt").write_text("\n".join(sentences(lang, 60, 0)) + "\n", encoding="utf-8")
        (corpus / f"{lang}.dev.txt").write_text("\n".join(sentences(lang, 12, 1)) + "\n", encoding="utf-8")
    texts = sentences("en", 5, 7)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path), ",".join(NOT_BEFORE_FIRST_BATCH), "\n".join(texts)],
        cwd=REPO, capture_output=True, text=True, timeout=600,  # against a hang only
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["batch_rows"] > 0
    assert report["before"] == [], f"imported before the first batch: {report['before']}"
    # the check above can fail: the tokenizer's first use does import TF Text
    assert report["after"] == ["tensorflow_text"]
    import sentencepiece as spm  # the reference: the sentencepiece package on the same model

    reference = spm.SentencePieceProcessor(model_proto=bytes.fromhex(report["source_model"]))
    assert report["ids"] == reference.encode(texts)
    assert report["back"] == texts


def _fresh_tokenizer(tmp_path: Path):
    import sentencepiece as spm

    from common.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
    from data.tokenizer import Tokenizer

    (tmp_path / "spm").mkdir(parents=True)
    spm.SentencePieceTrainer.Train(
        sentence_iterator=iter(sentences("en", 60, 0)), model_prefix=str(tmp_path / "spm" / "spm"),
        vocab_size=64, character_coverage=1.0, normalization_rule_name="identity", remove_extra_whitespaces=False,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, minloglevel=2,
    )  # fmt: skip
    return Tokenizer.load(tmp_path / "spm")


def test_tokenizer_first_used_while_tracing_or_saving(tmp_path):
    """The in-graph ops are built on first use: inside a tf.function trace, or by a SavedModel save."""
    import tensorflow as tf

    texts = sentences("en", 4, 3)
    traced = _fresh_tokenizer(tmp_path / "a")
    round_trip = tf.function(lambda s: traced.detokenize_source(traced.tokenize_source(s)))
    assert [t.decode() for t in round_trip(tf.constant(texts)).numpy()] == texts  # first use: while tracing
    assert [t.decode() for t in traced.detokenize_source(traced.tokenize_source(texts)).numpy()] == texts

    saved = _fresh_tokenizer(tmp_path / "b")  # never used before the save
    module = tf.Module()
    module.tokenizer = saved
    module.round_trip = tf.function(
        lambda s: saved.detokenize_source(saved.tokenize_source(s)),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path / "export"))
    restored = tf.saved_model.load(str(tmp_path / "export"))
    assert [t.decode() for t in restored.round_trip(tf.constant(texts)).numpy()] == texts
