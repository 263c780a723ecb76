"""The Trainer's claims, read back from one tiny in-process run: EMA, early stopping, best/, TensorBoard.

The validation BLEU is scripted (the Trainer's `scorer` hook): the real trainer translates the validation
sentences, and the scorer returns the next score of SCRIPTED_BLEU instead of what a tiny model happens to reach,
so when the run stops and which step best/ holds do not depend on the CPU's floating-point behaviour.
Every weight after every step is in a checkpoint (`checkpoint_every: 1`): the EMA is recomputed from those.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from nmt.config import config_from_dict
from nmt.run_dir import RunDir, write_atomic
from nmt.trainer import Trainer
from tests.run_fixture import tiny_config_tree, write_corpus

EVAL_EVERY = 2
PATIENCE = 2  # train.early_stopping
# Validation BLEU at steps 2, 4, 6, 8, 10: best at step 6; step 4 does not improve, step 6 resets the count, the
# tie at step 8 is no improvement, step 10 is the 2nd evaluation in a row without one: the run stops at step 10.
SCRIPTED_BLEU = [10.0, 5.0, 30.0, 30.0, 25.0]
BEST_STEP, STOP_STEP = 6, 10
FINAL_BLEU = 1.0  # the evaluation of the final weights (never a candidate for best/)
EMA_DECAY = 0.8
WARMUP, PEAK = 4, 0.01
CLIPNORM = 0.05  # below every gradient norm of this run: clipping is active at each step
NUM_HEADS = 2
LAYERS = ("source_embedding", "encoder_layer_0", "decoder_layer_0")  # grad_norm/<layer>
TRAIN_SCALARS = {"loss", "nll", "learning_rate", "grad_norm", "loss_scale", "tokens_per_sec", "skipped_steps",
                 "peak_memory_mb"} | {f"grad_norm/{layer}" for layer in LAYERS}  # fmt: skip
VALIDATION_SCALARS = {"loss", "perplexity", "bleu"}
IMAGE = "cross_attention_last_layer"


class ScriptedScorer:
    """Returns the scripted BLEU scores in order (0 once they run out), recording what it was asked to score."""

    def __init__(self, scores):
        self.scores, self.calls = list(scores), []

    def __call__(self, hypotheses, references):
        self.calls.append((list(hypotheses), list(references)))
        bleu = self.scores[len(self.calls) - 1] if len(self.calls) <= len(self.scores) else 0.0
        return {"bleu": bleu, "chrf": 0.0, "signature": "scripted"}


@dataclasses.dataclass
class Run:
    path: Path
    result: object
    scorer: ScriptedScorer
    records: list[dict]
    model: object  # the trained model object; the tests restore checkpoints into it to read them


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    """(corpus, prepared-data cache) of the module: the tokenizer and the prepared data are made once."""
    tmp = tmp_path_factory.mktemp("trainer_corpus")
    return write_corpus(tmp / "corpus"), tmp / "data_cache"


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus) -> Run:
    tmp = tmp_path_factory.mktemp("trainer")
    tree = tiny_config_tree(corpus[0])
    tree["data"].update(bucket_boundaries=[32], batch_tokens=256)  # one bucket: one compiled batch shape
    tree["model"].update(d_model=16, d_ff=32, num_heads=NUM_HEADS)
    tree["train"] = {
        "max_steps": 30,  # never reached: early stopping ends the run at STOP_STEP
        "precision": "float32",
        "xla": False,
        "learning_rate": PEAK,
        "warmup_steps": WARMUP,
        "clipnorm": CLIPNORM,
        "checkpoint_every": 1,
        "keep_checkpoints": 50,
        "log_every": 1,
        "eval_every": EVAL_EVERY,
        "bleu_every": EVAL_EVERY,
        "bleu_max_sentences": 3,
        "early_stopping": PATIENCE,
        "ema_decay": EMA_DECAY,
    }
    config = config_from_dict(tree)
    run_dir = RunDir(tmp / "run")
    run_dir.path.mkdir()
    write_atomic(run_dir.config_path, config.to_yaml())
    scorer = ScriptedScorer([*SCRIPTED_BLEU, FINAL_BLEU])
    trainer = Trainer(config, run_dir, scorer=scorer)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("NMT_DATA_CACHE", str(corpus[1]))  # prepared data: not in the user's ~/.cache
        trainer.setup()
        result = trainer.train()
    records = [json.loads(line) for line in run_dir.metrics_path.read_text(encoding="utf-8").splitlines()]
    return Run(run_dir.path, result, scorer, records, trainer.model)


def model_weights(run: Run, prefix: str) -> dict[str, np.ndarray]:
    """{variable path: value} of the model weights in a checkpoint (training or weights-only), by object graph.

    (A training checkpoint stores the weights under optimizer/_trainable_variables/..., not model/...: they are
    restored into the run's model rather than looked up by key.)
    """
    status = tf.train.Checkpoint(model=run.model).restore(prefix)
    status.expect_partial().assert_existing_objects_matched()
    return {w.path: w.numpy().copy() for w in run.model.weights}


def weights_at(run: Run, step: int) -> dict[str, np.ndarray]:
    return model_weights(run, str(run.path / "checkpoints" / f"ckpt-{step}"))


def saved_weights(run: Run, name: str) -> tuple[str, dict[str, np.ndarray]]:
    prefix = tf.train.latest_checkpoint(str(run.path / name))
    assert prefix, f"no weights in {name}/"
    return Path(prefix).name, model_weights(run, prefix)


def small_trainer(corpus, tmp_path, monkeypatch, train: dict, scores, boundaries=(32,)):
    """(Trainer set up, RunDir) of a float32 run of the module's corpus in tmp_path/run, with `train` over the
    defaults here and BLEU scripted as `scores`; one bucket unless `boundaries` says otherwise."""
    tree = tiny_config_tree(corpus[0])
    tree["data"].update(bucket_boundaries=list(boundaries), batch_tokens=256)
    tree["model"].update(d_model=16, d_ff=32, num_heads=NUM_HEADS)
    tree["train"] = {
        "precision": "float32",
        "xla": False,
        "bleu_max_sentences": 3,
        "average_last": 0,
        **train,
    }
    config = config_from_dict(tree)
    run_dir = RunDir(tmp_path / "run")
    run_dir.path.mkdir()
    write_atomic(run_dir.config_path, config.to_yaml())
    monkeypatch.setenv("NMT_DATA_CACHE", str(corpus[1]))
    trainer = Trainer(config, run_dir, scorer=ScriptedScorer(scores))
    trainer.setup()
    return trainer, run_dir


def test_early_stopping_after_patience_evaluations_without_improvement(run, corpus):
    assert run.result.status == "early_stopped" and run.result.step == STOP_STEP, run.result
    # the best validation BLEU and the final weights' scores, each named (before 2026-12-07c: "validation BLEU
    # stopped improving, BLEU 1.00", the final weights' BLEU read as the validation's; found by a review)
    assert run.result.message.startswith(
        f"validation BLEU stopped improving (best {max(SCRIPTED_BLEU):.2f}, then {PATIENCE} evaluations without a "
        f"better one): stopped at step {STOP_STEP}; final weights: validation loss "
    ), run.result.message
    # of the 3 validation sentences train.bleu_max_sentences keeps, as the step line says (before: not said)
    lines = len((corpus[0] / "en.validation.txt").read_text(encoding="utf-8").splitlines())
    assert run.result.message.endswith(f", BLEU {FINAL_BLEU:.2f} (first 3 of {lines} sentences)"), (
        run.result.message
    )
    validation = [r for r in run.records if r["tag"] == "validation"]
    assert [r["step"] for r in validation] == list(range(EVAL_EVERY, STOP_STEP + 1, EVAL_EVERY))
    assert [r["bleu"] for r in validation] == SCRIPTED_BLEU
    final = run.records[-1]
    assert final["tag"] == "final" and final["step"] == STOP_STEP and final["bleu"] == FINAL_BLEU
    assert len(run.records) == len(SCRIPTED_BLEU) + 1
    # The trainer translated the validation sentences each time (bleu_max_sentences of them) and passed them on.
    assert len(run.scorer.calls) == len(SCRIPTED_BLEU) + 1
    assert all(len(h) == len(r) == 3 and all(isinstance(s, str) for s in h) for h, r in run.scorer.calls)
    # ...and every BLEU record says it is of those 3 of the split's lines (before 2026-12-07d nothing said so)
    assert lines > 3
    assert all((r["bleu_sentences"], r["validation_sentences"]) == (3, lines) for r in run.records), (
        run.records
    )
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(run.path / "checkpoints")))
    assert float(reader.get_tensor("best_bleu/.ATTRIBUTES/VARIABLE_VALUE")) == max(SCRIPTED_BLEU)
    assert int(reader.get_tensor("evals_since_best/.ATTRIBUTES/VARIABLE_VALUE")) == PATIENCE


def test_best_holds_the_weights_of_the_best_validation_score(run):
    name, best = saved_weights(run, "best")
    assert name == f"ckpt-{BEST_STEP}"  # the first of the tied scores; one set of weights kept
    at_best = weights_at(run, BEST_STEP)
    assert best.keys() == at_best.keys() and len(best) > 10
    for key in best:
        np.testing.assert_array_equal(best[key], at_best[key], err_msg=key)
    for step in (
        BEST_STEP - EVAL_EVERY,
        BEST_STEP + EVAL_EVERY,
        STOP_STEP,
    ):  # the weights do tell steps apart
        other = weights_at(run, step)
        assert any(not np.array_equal(best[k], other[k]) for k in best), step


def test_final_weights_are_the_ema_of_the_weights_after_each_step(run):
    _, final = saved_weights(run, "final")
    ema = None
    for step in range(1, STOP_STEP + 1):
        weights = {k: v.astype(np.float64) for k, v in weights_at(run, step).items()}
        ema = weights if ema is None else {k: EMA_DECAY * ema[k] + (1 - EMA_DECAY) * weights[k] for k in ema}
    assert final.keys() == ema.keys()
    last = weights_at(run, STOP_STEP)
    for key in final:
        np.testing.assert_allclose(final[key], ema[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert any(np.max(np.abs(final[k] - last[k])) > 1e-4 for k in final)  # not merely the last weights


def read_events(directory: Path) -> dict[str, list[tuple[int, np.ndarray]]]:
    """{tag: [(step, value), ...]} of every TF2 summary in the event files under `directory`, with its plugin."""
    files = sorted(directory.glob("events.out.tfevents.*"))
    assert files, f"no event files in {directory}"
    events, plugins = {}, {}
    for path in files:
        for record in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                events.setdefault(value.tag, []).append((event.step, tf.make_ndarray(value.tensor)))
                if value.metadata.plugin_data.plugin_name:
                    plugins[value.tag] = value.metadata.plugin_data.plugin_name
    return events, plugins


def test_tensorboard_train_scalars_read_back(run):
    events, plugins = read_events(run.path / "tensorboard" / "train")
    assert set(events) == TRAIN_SCALARS
    assert all(plugins[tag] == "scalars" for tag in TRAIN_SCALARS)
    series = {tag: dict((step, float(value)) for step, value in values) for tag, values in events.items()}
    steps = np.arange(1, STOP_STEP + 1)
    # log_every: 1; the rate of the process's first step (its trace) is left out
    assert all(sorted(values) == list(steps) for tag, values in series.items() if tag != "tokens_per_sec")
    assert sorted(series["tokens_per_sec"]) == list(steps[1:])
    want_lr = PEAK * np.minimum(steps / WARMUP, np.sqrt(WARMUP / steps))
    np.testing.assert_allclose([series["learning_rate"][s] for s in steps], want_lr, rtol=1e-6)
    for step in steps:
        layers = [series[f"grad_norm/{layer}"][step] for layer in LAYERS]
        norm = series["grad_norm"][step]
        assert norm > CLIPNORM  # the update was clipped, the logged norms are both of the unclipped gradient:
        assert np.sqrt(np.sum(np.square(layers))) == pytest.approx(norm, rel=1e-4)
        assert series["loss_scale"][step] == 1.0 and series["skipped_steps"][step] == 0
        assert series["tokens_per_sec"].get(step, 1.0) > 0 and series["peak_memory_mb"][step] > 0
        assert 0 < series["loss"][step] < 10 and 0 < series["nll"][step] < 10  # ln(64) = 4.2 at the start


def test_the_logged_train_loss_is_the_token_weighted_mean_of_the_steps_since_the_last_log(
    tmp_path, monkeypatch, corpus
):
    """train/loss and train/nll at a logged step: the steps since the last logged one, each weighted by its target
    tokens (before 2026-12-08 the logged step's batch alone), against the step metrics recorded around the trainer's
    own step function."""
    train = {"max_steps": 7, "log_every": 3, "eval_every": 100, "bleu_every": 100}
    # several buckets: batches of differing token counts
    trainer, run_dir = small_trainer(
        corpus, tmp_path, monkeypatch, train, [FINAL_BLEU], boundaries=[8, 16, 32]
    )
    steps, step = [], trainer.step_fn.step

    def recorded(batches):
        metrics = step(batches)
        steps.append({key: float(metrics[key].numpy()) for key in ("loss", "nll", "tokens")})
        return metrics

    monkeypatch.setattr(trainer.step_fn, "step", recorded)
    assert trainer.train().status == "done" and len(steps) == 7
    events, _ = read_events(run_dir.path / "tensorboard" / "train")
    windows = {1: [1], 3: [2, 3], 6: [4, 5, 6]}  # step 7 is logged by no window's end
    for tag in ("loss", "nll"):
        logged = {step: float(value) for step, value in events[tag]}
        assert sorted(logged) == sorted(windows)
        for end, window in windows.items():
            tokens = np.array([steps[s - 1]["tokens"] for s in window])
            values = np.array([steps[s - 1][tag] for s in window])
            assert logged[end] == pytest.approx(np.sum(values * tokens) / np.sum(tokens), rel=1e-6), (
                tag,
                end,
            )
    assert len({steps[s - 1]["tokens"] for s in range(1, 7)}) > 1  # the weights matter: token counts differ
    assert logged[6] != pytest.approx(steps[5]["nll"], rel=1e-6)  # not the last step's alone


@pytest.mark.parametrize("tag", ["validation", "final"])
def test_tensorboard_validation_scalars_and_attention_images_read_back(run, tag):
    """The scheduled evaluations in tensorboard/validation, the final weights' in tensorboard/final (a run of its
    own: the final weights are an average or the EMA, not a point of the training's curve)."""
    events, plugins = read_events(run.path / "tensorboard" / tag)
    assert set(events) == VALIDATION_SCALARS | {IMAGE}
    assert plugins[IMAGE] == "images" and all(plugins[name] == "scalars" for name in VALIDATION_SCALARS)
    evaluated = [(r["step"], r) for r in run.records if r["tag"] == tag]  # in order
    assert evaluated
    for name, key in (("loss", "loss"), ("perplexity", "perplexity"), ("bleu", "bleu")):
        got = [(step, float(value)) for step, value in events[name]]
        assert [s for s, _ in got] == [s for s, _ in evaluated], name
        np.testing.assert_allclose(
            [v for _, v in got], [r[key] for _, r in evaluated], rtol=1e-6, err_msg=name
        )
    assert [s for s, _ in events[IMAGE]] == [s for s, _ in evaluated]
    for _, image in events[IMAGE]:
        width, height, *pngs = image  # TF2 image summaries: width, height, then one PNG per image
        assert len(pngs) == NUM_HEADS  # one heat map per head of the last decoder layer
        for png in pngs:
            pixels = tf.io.decode_png(png).numpy()
            assert pixels.shape == (int(height), int(width), 1)
            assert pixels.max() == 255  # normalised per head: the largest weight is white


def test_the_bleu_recorded_in_training_translates_like_evaluate(run, monkeypatch):
    """The in-training greedy BLEU pass against `Translator.from_run_dir` (what evaluate.py uses) on the same
    weights: a source longer than data.max_length (the training filter) is cut where evaluate cuts it, at the
    model's position table, so the recorded BLEU is the one evaluate.py reports."""
    from nmt.translator import Translator

    reference = Translator.from_run_dir(run.path, weights="final")
    config = reference.config
    sources = [" ".join(["the cat sees a red ball and a dog runs ."] * 4), "a dog ."]
    pieces = len(reference.tokenizer.tokenize_source([sources[0]])[0])
    assert config.data.max_length < pieces, pieces  # cut differently by the two limits
    monkeypatch.setattr(
        "data.corpus.load_text_pairs", lambda cfg, split, every_line=False: (sources, ["x", "y"])
    )
    probe = object.__new__(Trainer)  # the trainer's evaluation methods on the final weights
    probe.config, probe.model, probe.tokenizer = config, reference.model, reference.tokenizer
    probe.scorer = ScriptedScorer([0.0])
    probe._validation_bleu()
    assert probe.scorer.calls[0][0] == reference.translate(sources, beam_size=1)


@pytest.mark.parametrize("steps", [2 * EVAL_EVERY, 2 * EVAL_EVERY + 1], ids=["multiple", "off-schedule"])
def test_the_evaluation_due_at_the_last_step_runs_and_its_weights_can_be_best(
    tmp_path, monkeypatch, corpus, steps
):
    """The last step is evaluated, then the final evaluation: with max_steps a multiple of bleu_every (before
    2026-12-06 the final evaluation replaced it, so the last weights never competed for best/) and off the schedule
    (before, the curve ended at the last multiple and those weights never competed either)."""
    train = {
        "max_steps": steps, "learning_rate": PEAK, "warmup_steps": WARMUP, "eval_every": EVAL_EVERY,
        "bleu_every": EVAL_EVERY,
    }  # fmt: skip
    scores = [10.0, 20.0, *([30.0] if steps % EVAL_EVERY else []), FINAL_BLEU]
    trainer, run_dir = small_trainer(corpus, tmp_path, monkeypatch, train, scores)
    result = trainer.train()
    assert result.status == "done"
    # the closing line's BLEU is of bleu_max_sentences of the validation sentences, and says so (before: not said)
    lines = len((corpus[0] / "en.validation.txt").read_text(encoding="utf-8").splitlines())
    assert result.message.startswith(f"finished at step {steps}: validation loss "), result.message
    assert result.message.endswith(f", BLEU {FINAL_BLEU:.2f} (first 3 of {lines} sentences)"), result.message
    records = [json.loads(line) for line in run_dir.metrics_path.read_text(encoding="utf-8").splitlines()]
    evaluations = [(r["tag"], r["step"], r.get("bleu")) for r in records if "bleu" in r]
    expected = [("validation", 2, 10.0), ("validation", 4, 20.0)] + (
        [("validation", 5, 30.0)] if steps == 5 else []
    )
    assert evaluations == [*expected, ("final", steps, FINAL_BLEU)]
    assert Path(tf.train.latest_checkpoint(str(run_dir.best_dir))).name == f"ckpt-{steps}"


def test_a_failed_first_checkpoint_says_there_is_none_to_resume(tmp_path):
    """The very first checkpoint cannot be written (here: checkpoints/ is under a file): TrainingError says so, with
    the OS error, instead of pointing at a previous checkpoint (the disk-full fault test covers a later one)."""
    import keras

    from nmt.checkpoints import TrainingCheckpoints
    from nmt.trainer import Trainer, TrainingError

    (tmp_path / "file").write_text("not a directory")
    trainer = Trainer.__new__(Trainer)
    trainer.watch_config, trainer.resumed_from = False, None
    trainer.optimizer = keras.optimizers.Adam()
    trainer.optimizer.iterations.assign(4)
    trainer.manager = TrainingCheckpoints(
        tf.train.Checkpoint(step=tf.Variable(4)), tmp_path / "file" / "checkpoints", keep=2, every=2
    )
    with pytest.raises(TrainingError) as raised:
        trainer.save_checkpoint()
    assert str(raised.value).startswith("could not write a checkpoint at step 4 (")
    assert str(raised.value).endswith("); no earlier checkpoint to resume")
