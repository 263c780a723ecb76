"""A tiny, trained run directory for the tests of evaluate/translate/export (a few seconds on a CPU).

    run_dir = make_tiny_run_dir(tmp_path)        # DIR/config.yaml, DIR/tokenizer/, DIR/final/

The corpus is templated sentences over a ~40-word vocabulary ("the red cat sees a dog" -> "die rote katze sieht
einen hund"), written as a `dataset: folder` corpus; the model (d_model 32, one layer) is trained by a plain Adam
loop of a few hundred steps, enough to overfit into non-trivial translations. The real trainer is not used, so
these tests do not depend on it.
"""

from __future__ import annotations

import hashlib
import itertools
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


def tiny_corpus(seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """{"train": 200 pairs, "validation": 40, "test": 40}, deterministic; capitalised, with punctuation."""
    pairs = []
    for (s_en, s_de), (v_en, v_de), (o_en, o_de), (e_en, e_de) in itertools.product(
        SUBJECTS, VERBS, OBJECTS, ENDINGS
    ):
        pairs.append((f"{s_en} {v_en} {o_en}{e_en}".capitalize(), f"{s_de} {v_de} {o_de}{e_de}".capitalize()))
    random.Random(seed).shuffle(pairs)
    return {"train": pairs[:200], "validation": pairs[200:240], "test": pairs[240:280]}


def write_corpus(folder: Path, source: str = "en", target: str = "de") -> Path:
    """Writes the tiny corpus as a TranslateFolder directory (`<lang>.<split>.txt`)."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, pairs in tiny_corpus().items():
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


def make_tiny_run_dir(tmp_path: Path, *, steps: int = 200) -> Path:
    """Writes corpus, config, tokenizer and trained weights; returns the run directory (tmp_path / "run")."""
    import keras
    import tensorflow as tf

    from data.pipeline import make_train_dataset
    from data.tokenizer import Tokenizer, train_tokenizer
    from nmt.config import config_from_dict
    from nmt.losses import smoothed_cross_entropy
    from nmt.run_dir import RunDir, save_model_weights, write_atomic
    from transformer.model import build_model

    tmp_path = Path(tmp_path)
    corpus = write_corpus(tmp_path / "corpus")
    config = config_from_dict(tiny_config_tree(corpus))
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir(parents=True, exist_ok=True)
    write_atomic(run_dir.config_path, config.to_yaml())
    # Seed first: tf.random.set_seed clears TensorFlow's eager kernel cache, which destroys the SentencePiece
    # resources of tokenizers created before it (tensorflow_text's kernel-owned resource).
    keras.utils.set_random_seed(config.train.seed)
    train_tokenizer(config.data, run_dir.tokenizer_dir)
    tokenizer = Tokenizer.load(run_dir.tokenizer_dir)
    model = build_model(config.model, tokenizer.source_vocab_size, tokenizer.target_vocab_size)
    dataset = make_train_dataset(config.data, tokenizer, seed=config.train.seed, repeat=True)

    # A hand-written Adam: tracing Keras' optimizer costs several seconds, this costs well under one.
    variables = model.trainable_variables
    moments = [(tf.Variable(tf.zeros_like(v)), tf.Variable(tf.zeros_like(v))) for v in variables]
    step = tf.Variable(0.0)
    spec = {key: tf.TensorSpec([None, None], tf.int32) for key in ("source", "target_in", "target_out")}

    @tf.function(input_signature=[spec], autograph=False)
    def train_step(batch, lr=config.train.learning_rate, beta_1=0.9, beta_2=0.98, epsilon=1e-9):
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

    for batch in dataset.take(steps):
        train_step(batch)
    save_model_weights(model, run_dir.final_dir, steps)
    return run_dir.path


_CACHE: dict[str, Path] = {}
_SOURCES = ("tests/run_fixture.py", "transformer", "data", "nmt/config.py", "nmt/run_dir.py", "nmt/losses.py")


def _sources_hash() -> str:
    """A hash of every file that can change what make_tiny_run_dir produces."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in _SOURCES:
        path = root / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            digest.update(file.relative_to(root).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def shared_tiny_run_dir(tmp_path_factory, cache=None) -> Path:
    """One tiny run directory per pytest session, shared by every test module that asks for it.

    Test modules wrap this in their own session-scoped fixture (tests/conftest.py is not ours to edit); the
    module-level cache makes those fixtures share a single trained model. With `cache` (pytest's
    `request.config.cache`), the trained directory is also kept in .pytest_cache, keyed by a hash of the code that
    makes it, and reused by later sessions; each session works on its own copy.
    """
    if "run" in _CACHE:
        return _CACHE["run"]
    copy = tmp_path_factory.mktemp("tiny_run") / "run"
    if cache is None:
        _CACHE["run"] = make_tiny_run_dir(copy.parent)
        return _CACHE["run"]
    stored = Path(cache.mkdir(f"tiny_run_{_sources_hash()}"))
    if not (stored / "run" / "final").is_dir():
        staging = Path(tempfile.mkdtemp(prefix="staging-", dir=stored))
        make_tiny_run_dir(staging)
        for name in ("corpus", "run"):
            shutil.rmtree(stored / name, ignore_errors=True)
            (staging / name).rename(stored / name)
        shutil.rmtree(staging, ignore_errors=True)
        for stale in stored.parent.glob("tiny_run_*"):  # made by older code
            if stale != stored:
                shutil.rmtree(stale, ignore_errors=True)
    shutil.copytree(stored / "corpus", copy.parent / "corpus")
    shutil.copytree(stored / "run", copy)
    tree = yaml.safe_load((copy / "config.yaml").read_text(encoding="utf-8"))
    tree["data"]["folder"] = str(copy.parent / "corpus")
    (copy / "config.yaml").write_text(yaml.safe_dump(tree, sort_keys=False), encoding="utf-8")
    _CACHE["run"] = copy
    return copy
