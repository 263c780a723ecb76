"""CTranslate2 export against our TensorFlow model: its log-probabilities, int8, its files, and the errors of
exporting and loading.

References: our model's teacher-forced log-softmax (with PAD and BOS forbidden, as our decoder does) for the
numbers, on the tiny trained fixture (tests/run_fixture.py: it memorised its corpus, so its sentences end with EOS)
and on inputs it never saw (word salads), plus randomly initialised models of other shapes: Pre-LN, untied output,
shared Q/K, 2 layers. The engine's searches against ours: test_ctranslate2_engine.py.
"""

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from common.cpu import int8_saturates
from common.special_ids import BOS_ID, EOS_ID, PAD_ID
from data.tokenizer import Tokenizer
from nmt.ctranslate2_engine import CTranslate2Translator
from nmt.ctranslate2_export import ExportError, export_ctranslate2, read_export_metadata
from tests.nmt.ctranslate2_helpers import engine
from tests.run_fixture import assert_int8_translations, salads, tiny_corpus
from transformer.model import build_model

ctranslate2 = pytest.importorskip("ctranslate2")


def random_model(ours, **overrides):
    config = dataclasses.replace(ours.config.model, **overrides)
    return build_model(config, ours.tokenizer.source_vocab_size, ours.tokenizer.target_vocab_size)


def forbidden_log_softmax(logits):
    logits = np.array(logits, np.float64)
    logits[..., [PAD_ID, BOS_ID]] = -1e9
    return (
        logits
        - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )


@pytest.mark.parametrize(
    "shape",
    [{}, {"norm": "pre", "num_layers": 2, "tie_output": False, "share_qkv": "qk", "scale": 0.3}],
    ids=["fixture", "pre_ln_untied_2_layers"],
)
def test_token_log_probs_match_our_model(shape, ours, tokenizer, tmp_path):
    """score_batch (the export's teacher-forced log-probabilities) == our model's, random targets of many lengths."""
    model = ours.model if not shape else random_model(ours, **shape)
    export = export_ctranslate2(model, tokenizer, tmp_path / "export")
    translator = ctranslate2.Translator(str(export), compute_type="float32", intra_threads=1)
    vocab = json.loads((export / "shared_vocabulary.json").read_text(encoding="utf-8"))
    rng = np.random.default_rng(0)
    sources = ours.encode([s for s, _ in tiny_corpus()["test"][:16]])
    allowed = [i for i in range(len(vocab)) if i not in (PAD_ID, BOS_ID, EOS_ID)]
    targets = [list(rng.choice(allowed, size=rng.integers(1, 40))) for _ in sources]
    results = translator.score_batch(
        [[vocab[i] for i in s] for s in sources], [[vocab[i] for i in t] for t in targets]
    )
    source = np.full((len(sources), max(map(len, sources)) + 1), PAD_ID, np.int32)  # one padded batch
    target_in = np.full((len(targets), max(map(len, targets)) + 1), PAD_ID, np.int32)
    for row, (ids, target) in enumerate(zip(sources, targets)):
        source[row, : len(ids) + 1] = [*ids, EOS_ID]
        target_in[row, : len(target) + 1] = [BOS_ID, *target]
    log_probs = forbidden_log_softmax(model({"source": source, "target_in": target_in}).numpy())
    for row, (target, result) in enumerate(zip(targets, results)):
        expected = log_probs[row, np.arange(len(target) + 1), [*target, EOS_ID]]
        assert result.tokens == [vocab[i] for i in target] + ["</s>"]
        np.testing.assert_allclose(result.log_probs, expected, rtol=1e-4, atol=1e-4)
    # PAD and BOS cannot be generated: their log-probability is -1e9 (exactly 0 probability), as in our decoder.
    forbidden = translator.score_batch([[vocab[i] for i in sources[0]]] * 2, [["<s>"], ["<pad>"]])
    assert [r.log_probs[0] < -1e8 for r in forbidden] == [True, True]


def test_int8_export_translates_like_float32(ours, exports, tokenizer):
    metadata = read_export_metadata(exports["int8"])
    assert metadata["quantization"] == "int8" and metadata["compute_type"] == "int8_float32"
    int8 = engine(exports["int8"], tokenizer, dataclasses.replace(ours.config.eval, alpha=0.0))
    assert int8.compute_type == "int8_float32" and int8.int8_saturates == int8_saturates()
    pairs = tiny_corpus()["test"]
    lines, references = [s for s, _ in pairs], [t for _, t in pairs]
    # Memorised with a margin (tests/run_fixture.py) far above int8 rounding where the CPU has VNNI: greedy and
    # beam give the references (beam with alpha 0, where CTranslate2 stops at the best hypothesis: see
    # test_ctranslate2_engine.py, test_beam_alpha_0...); most of them without VNNI.
    assert_int8_translations(int8.translate(lines, beam_size=1), references)
    assert_int8_translations(int8.translate(lines, beam_size=2), references)
    # The weights are really int8 (about 4x smaller) and the log-probabilities stay close to float32's: with VNNI
    # those of the references (near 0) within 0.05, those of unseen word salads (down to -15) within 0.25 on
    # average; looser bounds without it.
    assert (exports["int8"] / "model.bin").stat().st_size < 0.5 * (
        exports["float32"] / "model.bin"
    ).stat().st_size
    vocab = json.loads((exports["int8"] / "shared_vocabulary.json").read_text(encoding="utf-8"))
    sources = [[vocab[i] for i in ids] for ids in ours.encode(lines)]
    references = [
        [vocab[i] for i in ids] for ids in tokenizer.tokenize_target(tf.constant(references)).to_list()
    ]
    unseen = [[vocab[i] for i in ids] for ids in ours.encode(salads(len(lines), seed=2))]
    scores = {}
    for name, compute_type in (("float32", "float32"), ("int8", "int8_float32")):
        translator = ctranslate2.Translator(str(exports[name]), compute_type=compute_type, intra_threads=1)
        scores[name] = [
            np.concatenate([r.log_probs for r in translator.score_batch(sources, targets)])
            for targets in (references, unseen)
        ]
    differences = [np.abs(scores["int8"][i] - scores["float32"][i]) for i in (0, 1)]
    if not int8_saturates():
        assert np.max(differences[0]) < 0.05 and np.mean(differences[1]) < 0.25
    else:  # pairs of products saturate in 16 bits: larger differences (AVX2 EPYC: means 0.03 and 0.86, the
        # largest 2.1 and 7.0), still a model that scores like float32 on average
        assert np.mean(differences[0]) < 0.25 and np.mean(differences[1]) < 2.0, [
            (np.mean(d), np.max(d)) for d in differences
        ]
    assert not np.array_equal(scores["int8"][1], scores["float32"][1])


def test_export_is_self_contained(exports, ours):
    """Plain ctranslate2 + sentencepiece + the export's nmt_export.json (no project code) reproduce the engine."""
    import math

    import sentencepiece

    export = exports["float32"]
    processor = sentencepiece.SentencePieceProcessor(model_file=str(export / "spm.model"))
    metadata = json.loads((export / "nmt_export.json").read_text(encoding="utf-8"))
    a, b = metadata["eval"]["max_length_a"], metadata["eval"]["max_length_b"]
    translator = ctranslate2.Translator(str(export), compute_type="float32", intra_threads=1)
    lines, plain = salads(20, seed=3), []
    for line in lines:
        pieces = processor.encode(line, out_type=str)[: metadata["max_source_length"] - 1]
        limit = min(math.floor(a * len(pieces) + b), metadata["position_table"] - 1)
        result = translator.translate_batch(
            [pieces], beam_size=1, max_decoding_length=limit, min_decoding_length=0
        )
        plain.append(processor.decode(result[0].hypotheses[0]))
    standalone = CTranslate2Translator.from_export_dir(export, intra_threads=1)
    assert standalone.eval_config == ours.config.eval
    assert standalone.translate(lines, beam_size=1) == plain


def test_export_refuses_to_overwrite_something_else(ours, tokenizer, exports, tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not a CTranslate2 export"):
        export_ctranslate2(ours.model, tokenizer, taken)
    assert [p.name for p in taken.iterdir()] == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"
    assert [p.name for p in tmp_path.iterdir()] == ["taken"]  # no leftover staging directory
    with pytest.raises(ExportError, match="not a CTranslate2 export"):
        CTranslate2Translator(taken, tokenizer, ours.config.eval)
    # An existing export is replaced (here: float32 by int8).
    again = export_ctranslate2(ours.model, tokenizer, tmp_path / "again")
    export_ctranslate2(ours.model, tokenizer, again, quantization="int8")
    assert read_export_metadata(again)["quantization"] == "int8"
    # So is one of ours that the engines refuse as damaged or older ("make it again with export.py").
    metadata = json.loads((again / "nmt_export.json").read_text(encoding="utf-8"))
    (again / "nmt_export.json").write_text(json.dumps({**metadata, "compute_type": None, "version": 0}))
    export_ctranslate2(ours.model, tokenizer, again)
    assert read_export_metadata(again)["quantization"] == "float32"


def test_a_full_disk_names_the_export_and_leaves_nothing(ours, tokenizer, exports, tmp_path, monkeypatch):
    """The converter's write fails with ENOSPC and no file name (as it did on a 300 KB tmpfs: a bare "[Errno 28] No
    space left on device"): the error names the export, and neither it nor its staging directory is left."""
    import errno

    def full(self, output_dir):
        (Path(output_dir) / "model.bin").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ctranslate2.specs.ModelSpec, "save", full)
    target = tmp_path / "export"
    with pytest.raises(OSError, match=re.escape(f"No space left on device: '{target}'")) as caught:
        export_ctranslate2(ours.model, tokenizer, target)
    assert caught.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_what_ctranslate2_cannot_run(ours, tokenizer, tmp_path):
    model = random_model(ours, attention="local", window=2)
    with pytest.raises(ExportError, match="attention='local'"):
        export_ctranslate2(model, tokenizer, tmp_path / "local")
    assert not (tmp_path / "local").exists()


def test_missing_ctranslate2_says_what_to_install(ours, exports, tokenizer, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"pip install ctranslate2==4\.8\.5"):
        export_ctranslate2(ours.model, tokenizer, tmp_path / "export")
    with pytest.raises(ImportError, match=r"pip install ctranslate2==4\.8\.5"):
        engine(exports["float32"], tokenizer, ours.config.eval)
    assert list(tmp_path.iterdir()) == []


def test_engine_refuses_a_corrupt_export_or_another_tokenizer(ours, exports, tokenizer, tmp_path):
    import shutil

    from nmt.ctranslate2_engine import EngineError

    other = Tokenizer(
        tokenizer.models[0], tokenizer.models[0]
    )  # same pieces, but not the tokenizer of the export
    with pytest.raises(ExportError, match="another tokenizer"):
        engine(exports["float32"], other, ours.config.eval)
    corrupt = shutil.copytree(exports["float32"], tmp_path / "corrupt")
    (corrupt / "model.bin").write_bytes((exports["float32"] / "model.bin").read_bytes()[:1000])
    with pytest.raises(EngineError, match="cannot load the CTranslate2 model"):
        engine(corrupt, tokenizer, ours.config.eval)


@pytest.mark.parametrize("key", ["tokenizer", "position_table", "tokenizer.fingerprint"])
def test_metadata_without_a_key_is_one_clear_error(exports, tmp_path, key):
    import shutil

    damaged = shutil.copytree(exports["float32"], tmp_path / "damaged")
    metadata = json.loads((damaged / "nmt_export.json").read_text(encoding="utf-8"))
    if key == "tokenizer.fingerprint":
        del metadata["tokenizer"]["fingerprint"]
    else:
        del metadata[key]
    (damaged / "nmt_export.json").write_text(json.dumps(metadata), encoding="utf-8")
    with pytest.raises(ExportError, match=f"nmt_export.json has no key '{key}'"):
        read_export_metadata(damaged)


def test_export_to_the_current_directory(ours, tokenizer, tmp_path, monkeypatch):
    (target := tmp_path / "here").mkdir()  # --output . (empty): no ValueError about an empty name
    inode = target.stat().st_ino
    monkeypatch.chdir(target)
    output = export_ctranslate2(ours.model, tokenizer, ".")
    assert output == target and read_export_metadata(target)["quantization"] == "float32"
    # replaced in place: a shell standing in the directory keeps a live one
    export_ctranslate2(ours.model, tokenizer, ".", quantization="int8")
    assert target.stat().st_ino == inode and read_export_metadata(target)["quantization"] == "int8"
    assert [p.name for p in tmp_path.iterdir()] == ["here"]  # no leftover staging directory
