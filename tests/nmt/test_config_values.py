"""The config loader's checks of values: ranges (`_range` metadata next to each field), NaN, non-string keys,
YAML 1.1 floats. Each error names the dotted path."""

import dataclasses
import re
import typing

import pytest
import yaml

from nmt.config import Config, ConfigError, load_config, new_run_problem
from tests.nmt.test_config import write


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.max_steps=-1", r"train\.max_steps: must be in \[0, 4611686018427387904\], got -1"),
        ("train.max_minutes=-1", r"train\.max_minutes: must be >= 0, got -1\.0"),
        ("train.max_minutes=.inf", r"train\.max_minutes: must be >= 0 and finite, got inf"),
        ("train.learning_rate=0", r"train\.learning_rate: must be > 0, got 0\.0"),
        ("train.learning_rate=-1", r"train\.learning_rate: must be > 0, got -1\.0"),
        ("train.learning_rate=.inf", r"train\.learning_rate: must be > 0 and finite, got inf"),
        ("train.label_smoothing=1", r"train\.label_smoothing: must be in \[0, 1\), got 1\.0"),
        ("train.label_smoothing=-0.1", r"train\.label_smoothing: must be in \[0, 1\), got -0\.1"),
        ("train.clipnorm=-1", r"train\.clipnorm: must be >= 0, got -1\.0"),
        ("train.average_last=-2", r"train\.average_last: must be in \[0, 2147483647\], got -2"),
        ("train.bleu_max_sentences=-3", r"train\.bleu_max_sentences: must be in \[0, 2147483647\], got -3"),
        ("train.log_every=0", r"train\.log_every: must be in \[1, 4611686018427387904\], got 0"),
        (
            "train.checkpoint_every=0",
            r"train\.checkpoint_every: must be in \[1, 4611686018427387904\], got 0",
        ),
        ("train.keep_checkpoints=0", r"train\.keep_checkpoints: must be in \[1, 2147483647\], got 0"),
        ("train.eval_every=-1", r"train\.eval_every: must be in \[0, 4611686018427387904\], got -1"),
        ("train.bleu_every=-1", r"train\.bleu_every: must be in \[0, 4611686018427387904\], got -1"),
        ("train.early_stopping=-1", r"train\.early_stopping: must be in \[0, 2147483647\], got -1"),
        ("train.max_bad_steps=-1", r"train\.max_bad_steps: must be in \[0, 4611686018427387904\], got -1"),
        ("train.ema_decay=1", r"train\.ema_decay: must be in \[0, 1\), got 1\.0"),
        ("train.ema_decay=2", r"train\.ema_decay: must be in \[0, 1\), got 2\.0"),
        ("train.ema_decay=-0.5", r"train\.ema_decay: must be in \[0, 1\), got -0\.5"),
        ("train.warmup_steps=-1", r"train\.warmup_steps: must be in \[0, 4611686018427387904\], got -1"),
        ("train.accumulate_steps=0", r"train\.accumulate_steps: must be in \[1, 65536\], got 0"),
        (
            "train.budget_probe_skip=-1",
            r"train\.budget_probe_skip: must be in \[0, 4611686018427387904\], got -1",
        ),
        ("train.budget_replan_at=1", r"train\.budget_replan_at: must be in \[0, 1\), got 1\.0"),
        ("train.beta_1=1", r"train\.beta_1: must be in \[0, 1\), got 1\.0"),
        ("train.beta_2=-0.1", r"train\.beta_2: must be in \[0, 1\), got -0\.1"),
        ("train.epsilon=0", r"train\.epsilon: must be > 0, got 0\.0"),
        ("eval.max_length_a=-5", r"eval\.max_length_a: must be >= 0, got -5\.0"),
        ("eval.max_length_b=-5", r"eval\.max_length_b: must be in \[0, 2147483647\], got -5"),
        ("eval.beam_size=-1", r"eval\.beam_size: must be in \[1, 1024\], got -1"),
        ("eval.alpha=-0.1", r"eval\.alpha: must be in \[0, 5\], got -0\.1"),
        ("eval.batch_size=0", r"eval\.batch_size: must be in \[1, 2147483647\], got 0"),
        ("model.attention_dropout=1", r"model\.attention_dropout: must be in \[0, 1\), got 1\.0"),
        ("model.dropout=-0.1", r"model\.dropout: must be in \[0, 1\), got -0\.1"),
        # before d_model % num_heads
        ("model.num_heads=0", r"model\.num_heads: must be in \[1, 2147483647\], got 0"),
        ("model.num_layers=0", r"model\.num_layers: must be in \[1, 2147483647\], got 0"),
        ("model.d_ff=-1", r"model\.d_ff: must be in \[1, 2147483647\], got -1"),
        ("model.chunk_size=0", r"model\.chunk_size: must be in \[1, 2147483647\], got 0"),
        ("model.window=-1", r"model\.window: must be in \[0, 2147483647\], got -1"),
        ("model.scale=0", r"model\.scale: must be > 0, got 0\.0"),
        ("model.max_length=0", r"model\.max_length: must be in \[1, 2147483647\], got 0"),
        # the rest: tests/data/test_config.py
        ("data.vocab_size=3", r"data\.vocab_size: must be in \[6, 2147483647\], got 3"),
        (
            "data.bucket_boundaries=[30, 10, 0]",
            r"data\.bucket_boundaries\[2\]: must be in \[1, 2147483647\], got 0",
        ),
        ("train.seed=-1", r"train\.seed: must be in \[0, 4294967295\], got -1"),
        ("train.seed=4294967296", r"train\.seed: must be in \[0, 4294967295\], got 4294967296"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_a_saved_run_config_with_settings_refused_since_loads(tmp_path):
    """A run trained before 2026-12-07d with data.batch_tokens below data.max_length (or a chunk/band past every
    position): its config.yaml still loads (translate, evaluate, resume); only a new run is refused."""
    saved = load_config(None, ["data.batch_tokens=16", "model.attention=local", "model.window=600"])
    path = write(tmp_path / "config.yaml", saved.to_yaml())
    assert load_config(path) == saved
    assert new_run_problem(saved).startswith("model.window: 600 reaches past model.max_length=512")
    assert new_run_problem(load_config(path, ["model.window=16"])).startswith(
        "data.batch_tokens: 16 is less than data.max_length=128"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["model.attention=chunked", "model.chunk_size=513"],
            r"model\.chunk_size: 513 exceeds model\.max_length=512",
        ),
        (
            ["model.attention=local", "model.window=512"],
            r"model\.window: 512 reaches past model\.max_length=512",
        ),
    ],
)
def test_chunks_and_bands_past_every_position_are_refused_for_a_new_run(overrides, message):
    """Before 2026-12-07d accepted: a chunk or band of 2^31 positions padded every batch to it, out of memory. A
    saved run's config with one still loads (translated, evaluated, resumed as it was)."""
    assert re.match(message, new_run_problem(load_config(None, overrides)))
    # the largest that still cut, and the same sizes for the other kinds of attention (unused there)
    for ok in (
        ["model.attention=chunked", "model.chunk_size=512"],
        ["model.attention=local", "model.window=511"],
        ["model.attention=full", "model.window=2147483647", "model.chunk_size=2147483647"],
    ):
        assert new_run_problem(load_config(None, ok)) == ""


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.max_steps=0", "train.max_minutes=0"],  # 0 = no limit
        ["train.learning_rate=1e-12", "train.label_smoothing=0", "train.clipnorm=0", "train.warmup_steps=0"],
        ["train.label_smoothing=0.999", "train.ema_decay=0.999", "train.beta_1=0", "train.beta_2=0.999"],
        ["train.average_last=0", "train.bleu_max_sentences=0", "train.eval_every=0", "train.bleu_every=0"],
        ["train.log_every=1", "train.checkpoint_every=1", "train.keep_checkpoints=1", "train.ema_decay=0"],
        [
            "train.early_stopping=0",
            "train.max_bad_steps=0",
            "train.budget_replan_at=0",
            "train.budget_probe_skip=0",
        ],
        ["train.average_fraction=1", "train.min_learning_rate_fraction=0", "train.accumulate_steps=1"],
        ["eval.max_length_a=0", "eval.max_length_b=0", "eval.beam_size=1", "eval.alpha=0", "eval.streams=0"],
        ["eval.alpha=5", "eval.batch_size=1", "train.seed=0"],
        ["train.seed=4294967295"],
        ["model.dropout=0", "model.attention_dropout=0.999", "model.ffn_dropout=0", "model.window=0"],
        ["model.ffn_dropout=null", "model.scale=1e-3", "model.chunk_size=1", "model.num_heads=1"],
        ["data.vocab_size=6", "data.max_length=2", "data.bucket_boundaries=[1, 2, 100]"],
        [f"train.max_steps={2**62}", f"train.warmup_steps={2**62}", f"train.log_every={2**62}"],
        [f"eval.max_length_b={2**31 - 1}", f"eval.batch_size={2**31 - 1}", f"model.max_length={2**31 - 1}"],
        ["train.accumulate_steps=65536", f"train.keep_checkpoints={2**31 - 1}"],
    ],
)
def test_range_boundaries_are_accepted(overrides):
    load_config(None, overrides)  # together
    for text in overrides:  # and each alone, with the value given
        dotted, raw = text.split("=", 1)
        section, key = dotted.split(".")
        got = getattr(getattr(load_config(None, [text]), section), key)
        expected = yaml.safe_load(raw)
        assert got == (float(expected) if isinstance(got, float) else expected), text


def _numeric_fields(cls=Config, path=""):
    """(dotted key, field, annotation) of every int or float field (also optional and in lists), recursively."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            yield from _numeric_fields(annotation, f"{path}{f.name}.")
        elif {int, float} & _leaf_types(annotation):
            yield f"{path}{f.name}", f, annotation


def _leaf_types(annotation):
    args = typing.get_args(annotation)
    return set().union(*map(_leaf_types, args)) if args else {annotation}


def test_every_numeric_field_declares_a_range_but_a_few():
    """A new numeric field gets its `_range` next to it, or is listed here with the reason."""
    unbounded = {
        "model.mask_fill",  # a score fill, negative on purpose (-1e9); NaN is still refused
    }
    unbounded |= {"train.dropout_by_plan", "train.ffn_dropout_by_plan"}  # [steps, rate] pairs: checked apart
    assert {name for name, f, _ in _numeric_fields() if "range" not in f.metadata} == unbounded


INT_KEYS = [name for name, _, annotation in _numeric_fields() if int in _leaf_types(annotation)]
DATA_INTS_UNBOUNDED_ABOVE: set[str] = set()  # none left (data.* bounded since 2026-12-07d)


def test_every_int_field_has_an_upper_bound_but_a_few():
    """A new int field gets an upper bound (a number TensorFlow holds), or is listed above."""
    fields = {name: f for name, f, _ in _numeric_fields()}
    assert {key for key in INT_KEYS if fields[key].metadata["range"].max is None} == DATA_INTS_UNBOUNDED_ABOVE


@pytest.mark.parametrize("key", sorted(set(INT_KEYS) - DATA_INTS_UNBOUNDED_ABOVE))
@pytest.mark.parametrize("huge", [2**63, 99999999999999999999])
def test_ints_too_large_for_tensorflow_are_refused(key, huge):
    """An int64 holds less than 2**63: train.max_steps=99999999999999999999 was accepted, then a traceback at the
    step plan's variable (train.warmup_steps: at the first step's learning rate); now exit 2 at config time."""
    assert {"train.max_steps", "train.warmup_steps", "model.d_model", "eval.max_length_b"} <= set(INT_KEYS)
    # a list of ints: each is checked, named by its index
    value = f"[{huge}]" if key == "data.bucket_boundaries" else str(huge)
    suffix = "[0]" if key == "data.bucket_boundaries" else ""
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(key + suffix)}: must be in \[\d+, \d+\], got {huge}"
    ):
        load_config(None, [f"{key}={value}"])


def test_the_largest_accepted_steps_work_where_they_end():
    """The bounds are numbers TensorFlow holds: the step plan's int64 variables and the warmup's float32."""
    import tensorflow as tf

    from nmt.budget import TrainingPlan
    from nmt.schedule import make_schedule

    train = load_config(None, [f"train.max_steps={2**62}", f"train.warmup_steps={2**62}"]).train
    plan = TrainingPlan(train, 1, 512)
    plan.start(0, 0.0)
    assert plan.total_steps == 2**62
    for kind in ("inverse_sqrt", "cosine"):
        schedule = make_schedule(kind, 1.0, train.warmup_steps, floor=0.1, total_steps=plan.state.total_steps)
        rate = float(schedule(tf.constant(0, tf.int64)))
        assert rate == pytest.approx(2.0**-62, rel=1e-6)  # the first warmup step: peak x 1 / warmup_steps


FLOAT_KEYS = [
    name
    for name, _, annotation in _numeric_fields()
    if annotation is float or float in typing.get_args(annotation)
]


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_nan_is_refused_in_every_float_field(key):
    assert {"train.learning_rate", "model.ffn_dropout", "model.mask_fill", "eval.alpha"} <= set(FLOAT_KEYS)
    for nan in (".nan", "nan", "NaN"):  # the YAML float, and strings float() reads as NaN
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}: expected a number, got NaN"):
            load_config(None, [f"{key}={nan}"])


@pytest.mark.parametrize("key", ["train.dropout_by_plan", "train.ffn_dropout_by_plan"])
def test_nan_is_refused_inside_float_lists(key):
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}\[0\]\[1\]: expected a number, got NaN"):
        load_config(None, ["train.max_steps=100", f"{key}=[[50, .nan]]"])
    with pytest.raises(ConfigError, match=rf"{re.escape(key)}\[1\]\[0\]: expected a number, got NaN"):
        load_config(None, ["train.max_steps=100", f"{key}=[[50, 0.1], [nan, 0.2]]"])


@pytest.mark.parametrize(
    "text, where",
    [
        ("base: tiny.yaml\n1: 2\nfoo: 3\n", r"the top level has the key 1 \(int\)"),
        ("train:\n  null: 3\n  seed: 1\n", r"train has the key None \(NoneType\)"),
        ("null:\nmodel:\n  d_model: 64\n", r"the top level has the key None"),
        ("model:\n  d_model: 64\n  yes: 1\n", r"model has the key True \(bool\)"),  # YAML 1.1: yes is true
        ("data:\n  1.5: x\n", r"data has the key 1\.5 \(float\)"),
    ],
)
def test_non_string_keys_are_a_config_error(tmp_path, text, where):
    path = write(tmp_path / "keys.yaml", text)
    with pytest.raises(ConfigError, match=rf"config keys must be strings: {where}"):
        load_config(path)


def test_yaml_1_1_exponent_floats_are_accepted(tmp_path):
    """YAML 1.1 reads `1e-9` (no dot) as a string; a float field takes any string float() parses, a file or --set."""
    path = write(
        tmp_path / "exp.yaml",
        "train:\n  epsilon: 1e-9\n  learning_rate: 1e-3\n  clipnorm: '2'\nmodel:\n  mask_fill: -1e9\n",
    )
    config = load_config(path, ["eval.max_length_a=15e-1", "model.ffn_dropout=1e-1"])
    assert (config.train.epsilon, config.train.learning_rate, config.train.clipnorm) == (1e-9, 1e-3, 2.0)
    assert config.model.mask_fill == -1e9 and isinstance(config.model.mask_fill, float)
    assert (config.eval.max_length_a, config.model.ffn_dropout) == (1.5, 0.1)
    assert load_config(None, ["train.learning_rate=1e-3"]).train.learning_rate == 1e-3
    plan = load_config(
        None, ["train.max_steps=9", "train.dropout_by_plan=[[5e3, 1e-1]]"]
    ).train.dropout_by_plan
    assert plan == [[5000.0, 0.1]]
    assert load_config(write(tmp_path / "again.yaml", config.to_yaml())) == config  # saved as 1.0e-09
    assert load_config(None, ["model.mask_fill=auto"]).model.mask_fill == "auto"  # not a number: a string
    with pytest.raises(ConfigError, match=r"train\.learning_rate: expected float, got str 'fast'"):
        load_config(None, ["train.learning_rate=fast"])
    with pytest.raises(ConfigError, match=r"train\.max_steps: expected int, got str '1e3'"):
        load_config(None, ["train.max_steps=1e3"])  # int fields take no strings
    with pytest.raises(ConfigError, match=r"train\.learning_rate: must be > 0, got -0\.001"):
        load_config(None, ["train.learning_rate=-1e-3"])  # and the parsed float still meets the range


def test_settings_that_do_nothing_in_a_config_are_named():
    """Accepted (boundaries, an experiment half switched off) but without effect: train.py warns with these."""
    from nmt.config import ignored_settings

    def notes(*overrides):
        return ignored_settings(load_config(None, list(overrides)).train)

    assert (
        notes() == []
        and notes("train.average_last=4", "train.average_fraction=0.2", "train.max_steps=100") == []
    )
    assert notes("train.average_last=1") == [
        "train.average_last 1 averages one checkpoint: nothing (0 is off; 2 or more average)"
    ]
    (fraction,) = notes("train.average_fraction=0.2", "train.max_steps=100")
    assert (
        fraction
        == "train.average_fraction 0.2 spreads train.average_last snapshots, and average_last is 0: no effect"
    )
    (unplanned,) = notes("train.average_fraction=0.2", "train.average_last=3")
    assert "there is no step plan" in unplanned
