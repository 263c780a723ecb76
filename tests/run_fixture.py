"""A tiny, trained run directory for the tests of evaluate/translate/export (a few seconds on a CPU).

    run_dir = make_tiny_run_dir(tmp_path)        # DIR/config.yaml, DIR/tokenizer/, DIR/final/

The corpus is templated sentences over a ~40-word vocabulary ("the red cat sees a dog" -> "die rote katze sieht
einen hund"), written as a `dataset: folder` corpus; the model (d_model 32, one layer) is trained by a plain
full-batch Adam loop (all 280 pairs in every step). The real trainer is not used, so these tests do not depend on it.

What the fixture guarantees, on any CPU. Training does not run a fixed number of steps (their float trajectory
depends on the CPU's summation order: AVX2 or AVX-512 kernels, oneDNN on or off, the thread count). It runs until
every pair of the fixture's corpus has a teacher-forced negative log-likelihood of its whole reference (pieces and
EOS) below MAX_SENTENCE_NLL, checked every CHECK_EVERY steps, and raises FixtureNotTrained at MAX_STEPS: a bad model
is never handed to the tests. The fixture's train split holds all 280 pairs (its validation and test splits are
subsets of it), so the model memorises every sentence the tests use. From the threshold (s = MAX_SENTENCE_NLL):

- Greedy search reproduces every reference exactly: each reference piece has probability > exp(-s) > 1/2.
- Beam search of any width with alpha in [0, 0.6] and an output buffer of at most 64 does too: the reference has
  log-probability > -s and a length penalty >= 1, so its score is > -s; any other hypothesis leaves the reference
  at a piece of probability < 1 - exp(-s), so its score is < log(1 - exp(-s)) / lp(64) (lp(64) = 4.33), which is
  below -s for s <= 0.25. The reference's prefix stays the best alive hypothesis, so it is never pruned.
- The validation/test loss (mean NLL per token) is below s.
(Decoding with the key/value cache differs from the full forward pass by float rounding, far inside the margins.
So does CTranslate2's int8 on a CPU with VNNI; without VNNI its products saturate and some references change:
`assert_int8_translations`.)
The fixture checks its preconditions too: the tokenizer round-trips every reference and every reference fits in
the output length limit of its source.

The seed (of the initial weights) comes from the environment variable NMT_FIXTURE_SEED (default 1234), so that
`python -m tests.robustness` can retrain the fixture under other seeds; it is part of the cache key.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import random
import shutil
import tempfile
from pathlib import Path

import yaml

SUBJECTS = [("the cat", "die katze"), ("a dog", "ein hund"), ("the man", "der mann"), ("a woman", "eine frau"),
            ("the child", "das kind"), ("my friend", "mein freund")]  # fmt: skip
VERBS = [("sees", "sieht"), ("likes", "mag"), ("finds", "findet"), ("has", "hat")]
OBJECTS = [("the ball", "den ball"), ("an apple", "einen apfel"), ("the house", "das haus"),
           ("a book", "ein buch"), ("the car", "das auto"), ("a hat", "einen hut")]  # fmt: skip
ENDINGS = [(".", "."), (" today.", " heute."), (" again.", " wieder.")]

SEED_VARIABLE = "NMT_FIXTURE_SEED"
DEFAULT_SEED = 1234
MAX_SENTENCE_NLL = 0.2  # nats, per reference sentence (EOS included); see the module docstring
CHECK_EVERY = 10  # steps between two checks of the threshold
MAX_STEPS = 1000  # ~8x what any seed needed (tests/robustness.py records the steps)
LEARNING_RATE = 0.005  # full-batch Adam: 110-130 steps for every seed tried


INT8_MIN_SAME = 0.75  # share of the memorised references an int8 engine still gives on a CPU without VNNI


def assert_int8_translations(hypotheses: list[str], references: list[str]) -> None:
    """CTranslate2 int8 (`int8_float32`) translations of memorised sentences (greedy, or beam with alpha 0).

    With VNNI (`common.cpu.int8_saturates` false) the int8 products accumulate in 32 bits and their rounding stays
    far inside the margin of the module docstring: every reference. Without it they are summed in pairs in
    saturating 16-bit lanes, which no margin bounds (3 of the 40 test sentences changed on an AVX2 EPYC, e.g. "freund" -> "freu"):
    most must still be exact, which a broken export (wrong scales or vocabulary) would not give.
    """
    from common.cpu import int8_saturates

    assert len(hypotheses) == len(references)
    if not int8_saturates():
        assert hypotheses == references
        return
    same = sum(h == r for h, r in zip(hypotheses, references))
    assert same >= INT8_MIN_SAME * len(references), f"{same} of {len(references)} int8 translations are exact"


class FixtureNotTrained(RuntimeError):
    """The tiny model did not reach MAX_SENTENCE_NLL within MAX_STEPS (or a precondition of the guarantee failed)."""


def fixture_seed() -> int:
    """The fixture's seed: $NMT_FIXTURE_SEED, default DEFAULT_SEED."""
    value = os.environ.get(SEED_VARIABLE, "").strip()
    try:
        return int(value) if value else DEFAULT_SEED
    except ValueError:
        raise ValueError(f"{SEED_VARIABLE} must be an integer, got {value!r}") from None


def tiny_corpus(seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """{"train": 200 pairs, "validation": 40, "test": 40}, deterministic; capitalised, with punctuation."""
    pairs = []
    for (s_en, s_de), (v_en, v_de), (o_en, o_de), (e_en, e_de) in itertools.product(
        SUBJECTS, VERBS, OBJECTS, ENDINGS
    ):
        pairs.append((f"{s_en} {v_en} {o_en}{e_en}".capitalize(), f"{s_de} {v_de} {o_de}{e_de}".capitalize()))
    random.Random(seed).shuffle(pairs)
    return {"train": pairs[:200], "validation": pairs[200:240], "test": pairs[240:280]}


def fixture_corpus() -> dict[str, list[tuple[str, str]]]:
    """The trained fixture's corpus: tiny_corpus(), with every pair (validation and test too) in the train split."""
    corpus = tiny_corpus()
    return {**corpus, "train": corpus["train"] + corpus["validation"] + corpus["test"]}


def salads(n, seed=0):
    """Sentences of the fixture's words in random order: the model never saw them."""
    rng = random.Random(seed)
    words = [w for group in (SUBJECTS, VERBS, OBJECTS) for en, _ in group for w in en.split()]
    return [
        " ".join(rng.choice(words) for _ in range(rng.randint(1, 12))).capitalize()
        + rng.choice([".", "", "!"])
        for _ in range(n)
    ]


def write_corpus(folder: Path, source: str = "en", target: str = "de", corpus: dict | None = None) -> Path:
    """Writes the tiny corpus (or `corpus`) as a TranslateFolder directory (`<lang>.<split>.txt`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in (corpus or tiny_corpus()).items():
        (folder / f"{source}.{split}.txt").write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
        (folder / f"{target}.{split}.txt").write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return folder


def tiny_config_tree(corpus: Path) -> dict:
    return {
        "data": {
            "dataset": "folder",
            "folder": str(corpus),
            "source": "en",
            "target": "de",
            "vocab_size": 64,
            "max_length": 32,
            "batch_tokens": 512,
            "eval_batch_tokens": 1024,
            "tokenizer_max_sentences": 1000,
        },
        "model": {
            "d_model": 32,
            "num_heads": 2,
            "d_ff": 64,
            "num_layers": 1,
            "dropout": 0.0,
            "max_length": 64,
        },
        "train": {"max_steps": 200, "precision": "float32", "xla": False, "learning_rate": 0.01},
        "eval": {"beam_size": 2, "batch_size": 16, "alpha": 0.6},
    }


def _padded(rows: list[list[int]]):
    import numpy as np

    out = np.zeros((len(rows), max(map(len, rows))), np.int32)  # PAD_ID is 0
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def _check_preconditions(tokenizer, config, pairs) -> dict:
    """Raises FixtureNotTrained unless references round-trip and fit their limits; returns the teacher-forced batch."""
    import tensorflow as tf

    from transformer.vocab import BOS_ID, EOS_ID

    sources = tokenizer.tokenize_source(tf.constant([s for s, _ in pairs])).to_list()
    targets = tokenizer.tokenize_target(tf.constant([t for _, t in pairs])).to_list()
    texts = [t.decode("utf-8") for t in tokenizer.detokenize_target(tf.ragged.constant(targets)).numpy()]
    for (_, reference), text, src, tgt in zip(pairs, texts, sources, targets):
        limit = math.floor(config.eval.max_length_a * len(src) + config.eval.max_length_b)
        if text != reference or len(tgt) > min(limit, config.model.max_length - 1):
            raise FixtureNotTrained(
                f"precondition: {reference!r} round-trips to {text!r}, {len(tgt)} > {limit}?"
            )
    return {
        "source": tf.constant(_padded([[*s, EOS_ID] for s in sources])),
        "target_in": tf.constant(_padded([[BOS_ID, *t] for t in targets])),
        "target_out": tf.constant(_padded([[*t, EOS_ID] for t in targets])),
    }


def make_tiny_run_dir(tmp_path: Path, *, seed: int | None = None, max_steps: int = MAX_STEPS) -> Path:
    """Writes corpus, config, tokenizer and trained weights; returns the run directory (tmp_path / "run").

    Also writes tmp_path / "training.json" (seed, steps, worst sentence NLL, a hash of the weights). Raises
    FixtureNotTrained if the threshold is not reached within `max_steps`.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    from data.tokenizer import Tokenizer
    from data.tokenizer_training import train_tokenizer
    from nmt.checkpoints import save_model_weights
    from nmt.config import config_from_dict
    from nmt.losses import smoothed_cross_entropy
    from nmt.run_dir import RunDir, write_atomic
    from transformer.model import build_model

    seed = fixture_seed() if seed is None else seed
    tmp_path = Path(tmp_path)
    pairs = fixture_corpus()
    corpus = write_corpus(tmp_path / "corpus", corpus=pairs)
    tree = tiny_config_tree(corpus)
    tree["train"].update(seed=seed, max_steps=max_steps, learning_rate=LEARNING_RATE)
    config = config_from_dict(tree)
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir.config_path, config.to_yaml())
    # Seed first: tf.random.set_seed clears TensorFlow's eager kernel cache, which destroys the SentencePiece
    # resources of tokenizers created before it (tensorflow_text's kernel-owned resource).
    keras.utils.set_random_seed(seed)
    train_tokenizer(config.data, run_dir.tokenizer_dir)
    tokenizer = Tokenizer.load(run_dir.tokenizer_dir)
    everything = _check_preconditions(tokenizer, config, pairs["train"])
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)

    # A hand-written Adam: tracing Keras' optimizer costs several seconds, this costs well under one.
    variables = model.trainable_variables
    moments = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v))) for v in variables]
    step = tf.Variable(0.0)
    spec = {key: tf.TensorSpec([None, None], tf.int32) for key in ("source", "target_in", "target_out")}

    @tf.function(input_signature=[spec], autograph=False)
    def train_step(batch, lr=LEARNING_RATE, beta_1=0.9, beta_2=0.98, epsilon=1e-9):
        with tf.GradientTape() as tape:
            logits = model({"source": batch["source"], "target_in": batch["target_in"]}, training=True)
            loss, _, tokens = smoothed_cross_entropy(logits, batch["target_out"], label_smoothing=0.0)
            loss = loss / tokens
        grads, _ = tf.clip_by_global_norm(tape.gradient(loss, variables), 1.0)
        step.assign_add(1.0)
        scale = lr * tf.sqrt(1.0 - beta_2**step) / (1.0 - beta_1**step)
        for variable, grad, (m, v) in zip(variables, grads, moments):
            grad = tf.convert_to_tensor(grad)  # embedding gradients come as IndexedSlices
            m.assign(beta_1 * m + (1.0 - beta_1) * grad)
            v.assign(beta_2 * v + (1.0 - beta_2) * tf.square(grad))
            variable.assign_sub(scale * m / (tf.sqrt(v) + epsilon))
        return loss

    @tf.function(autograph=False)
    def sentence_nll():  # (pairs,) teacher-forced NLL of each whole reference, EOS included
        logits = model({"source": everything["source"], "target_in": everything["target_in"]}, training=False)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        nll = -tf.gather(log_probs, everything["target_out"], axis=-1, batch_dims=2)
        return tf.reduce_sum(tf.where(everything["target_out"] != 0, nll, 0.0), axis=-1)

    steps, worst = 0, float("inf")
    for steps in range(1, max_steps + 1):
        train_step(everything)
        if steps % CHECK_EVERY == 0 or steps == max_steps:
            nll = sentence_nll().numpy()
            worst = float(np.max(nll))  # NaN if training diverged
            if worst < MAX_SENTENCE_NLL:
                break
    if not worst < MAX_SENTENCE_NLL:
        worst_pair = pairs["train"][int(np.nanargmax(nll))] if np.isfinite(nll).any() else None
        raise FixtureNotTrained(
            f"the tiny fixture model (seed {seed}) did not memorise its corpus in {steps} steps: worst sentence "
            f"NLL {worst:.3f} (pair {worst_pair}), needed < {MAX_SENTENCE_NLL}; the tests that use it would "
            "assert on a model without the quality they rely on"
        )
    save_model_weights(model, run_dir.final_dir, steps)
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()[:16]
    record = {"seed": seed, "steps": steps, "worst_sentence_nll": worst, "max_sentence_nll": MAX_SENTENCE_NLL}
    record["weights_sha256"] = digest
    (tmp_path / "training.json").write_text(json.dumps(record) + "\n", encoding="utf-8")
    return run_dir.path


_CACHE: dict[str, Path] = {}
_SOURCES = (
    "tests/run_fixture.py",
    "transformer",
    "data",
    "common",  # special ids, the config machinery: both shape the fixture
    "nmt/config.py",
    "nmt/config_checks.py",
    "nmt/run_dir.py",
    "nmt/checkpoint_state.py",
    "nmt/checkpoints.py",
    "nmt/losses.py",
)


def _sources_hash() -> str:
    """A hash of every file that can change what make_tiny_run_dir produces."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in _SOURCES:
        path = root / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _store_tiny_run_dir(stored: Path) -> None:
    """Trains the fixture into the pytest cache entry `stored` unless it is there (the caller holds the lock)."""
    if (stored / "run" / "final").is_dir():
        return
    staging = Path(tempfile.mkdtemp(prefix="staging-", dir=stored))
    make_tiny_run_dir(staging)
    for name in ("corpus", "run", "training.json"):
        target = stored / name
        shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
        (staging / name).rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    for stale in stored.parent.glob("tiny_run_*"):  # made by older code or for another seed (and their locks)
        if stale.is_dir() and stale != stored:
            shutil.rmtree(stale, ignore_errors=True)
        elif stale.suffix == ".lock" and stale.stem != stored.name:
            stale.unlink(missing_ok=True)


def shared_tiny_run_dir(tmp_path_factory, cache=None) -> Path:
    """One tiny run directory per pytest session, shared by every test module that asks for it.

    Test modules wrap this in their own session-scoped fixture (tests/conftest.py is not ours to edit); the
    module-level cache makes those fixtures share a single trained model. With `cache` (pytest's
    `request.config.cache`), the trained directory is also kept in .pytest_cache, keyed by a hash of the code that
    makes it and by the seed, and reused by later sessions; each session works on its own copy.
    """
    if "run" in _CACHE:
        return _CACHE["run"]
    copy = tmp_path_factory.mktemp("tiny_run") / "run"
    if cache is None:
        _CACHE["run"] = make_tiny_run_dir(copy.parent)
        return _CACHE["run"]
    from data.cache import exclusive

    stored = Path(cache.mkdir(f"tiny_run_{_sources_hash()}_seed{fixture_seed()}"))
    # `make test`'s workers: one trains the fixture, the other waits for it (data.cache's lock file)
    with exclusive(stored):
        _store_tiny_run_dir(stored)
        shutil.copytree(stored / "corpus", copy.parent / "corpus")
        shutil.copytree(stored / "run", copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text(encoding="utf-8"))
    tree["data"]["folder"] = str(copy.parent / "corpus")
    (copy / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    _CACHE["run"] = copy
    return copy


def shared_ct2_export(run_dir: Path, tmp_path_factory) -> Path:
    """One CTranslate2 export of `run_dir` (the shared tiny run) per pytest session, for the modules that use one."""
    key = f"ct2:{run_dir}"
    if key not in _CACHE:
        from nmt.ctranslate2_export import export_run_dir_ctranslate2

        _CACHE[key] = export_run_dir_ctranslate2(run_dir, tmp_path_factory.mktemp("ct2") / "export")
    return _CACHE[key]
