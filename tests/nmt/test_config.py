"""The config loader: inheritance, overrides, and errors that name the dotted path."""

import dataclasses
import re
import subprocess
import sys
import typing

import pytest
import yaml

from nmt.config import CONFIG_DIR, Config, ConfigError, load_config


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_defaults_and_bare_name_lookup():
    config = load_config("base")
    assert config.data.dataset == "multi30k"
    assert (config.data.source, config.data.target) == ("en", "de")
    assert config.model.norm == "post"
    assert config.train.clipnorm == 1.0
    assert load_config("base.yaml") == config


def test_inheritance_and_override_order(tmp_path):
    write(tmp_path / "parent.yaml", "model:\n  d_model: 64\n  num_heads: 4\ntrain:\n  seed: 7\n")
    child = write(tmp_path / "child.yaml", "base: parent.yaml\nmodel:\n  num_heads: 2\n")
    config = load_config(child, ["train.seed=9", "data.bucket_boundaries=[8, 16]"])
    assert config.model.d_model == 64  # inherited
    assert config.model.num_heads == 2  # child wins over parent
    assert config.train.seed == 9  # --set wins over files
    assert config.data.bucket_boundaries == [8, 16]
    assert config.model.d_ff == Config().model.d_ff  # untouched default


def test_base_is_found_next_to_the_file_then_in_configs_never_in_the_current_directory(tmp_path, monkeypatch):
    """A `base.yaml` in the current directory must not replace the one next to the config (or configs/base.yaml
    for a shipped config): every shipped config says `base: base.yaml`."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    write(cwd / "base.yaml", "train:\n  seed: 111\n")
    (tmp_path / "cfgs").mkdir()
    write(tmp_path / "cfgs" / "base.yaml", "train:\n  seed: 222\n")
    child = write(tmp_path / "cfgs" / "child.yaml", "base: base.yaml\n")
    monkeypatch.chdir(cwd)
    assert load_config(child).train.seed == 222
    assert load_config("tiny") == load_config(CONFIG_DIR / "tiny.yaml")  # configs/base.yaml under it
    assert load_config("tiny").train.seed != 111
    assert (
        load_config("base.yaml").train.seed == 111
    )  # a --config name itself is looked up from the cwd first


@pytest.mark.parametrize(
    "override, reading",
    [
        ("train.max_minutes=1:30", r"90 \(base 60\)"),
        ("train.max_steps=010", r"8 \(octal\)"),
        ("train.seed=0123", r"83 \(octal\)"),
        ("train.max_steps=-1:00", r"-60 \(base 60\)"),
    ],
)
def test_set_refuses_numbers_yaml_11_reads_otherwise(override, reading):
    with pytest.raises(ConfigError, match=rf"--set {re.escape(override)}: YAML reads this as {reading}"):
        load_config(None, [override])


def test_set_keeps_numbers_and_texts_that_only_look_alike(tmp_path):
    config = load_config(None, ["train.seed=0", "train.max_steps=1_000", "train.learning_rate=0.5"])
    assert (config.train.seed, config.train.max_steps, config.train.learning_rate) == (0, 1000, 0.5)
    folder = load_config(None, ["data.dataset=folder", "data.folder=/corpora/a:1"]).data.folder
    assert folder == "/corpora/a:1"  # a text: kept as given


def test_int_is_accepted_for_float_but_not_the_reverse():
    assert load_config(None, ["train.clipnorm=2"]).train.clipnorm == 2.0
    with pytest.raises(ConfigError, match=r"train\.warmup_steps: expected int, got float"):
        load_config(None, ["train.warmup_steps=1.5"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.learning_rat=0.1", r"unknown config key train\.learning_rat"),
        ("modle.d_model=8", r"unknown config key modle"),
        ("train.max_steps=ten", r"train\.max_steps: expected int, got str"),
        ("model.share_embeddings=1", r"model\.share_embeddings: expected bool, got int"),
        ("model.norm=middle", r"model\.norm: 'middle' is not one of post, pre"),
        ("train.precision=fp8", r"train\.precision: 'fp8' is not one of"),
        ("train.xla=sometimes", r"train\.xla: expected true, false, fusible or auto, got 'sometimes'"),
        ("model.num_heads=3", r"model\.d_model: 256 is not divisible by model\.num_heads=3"),
        ("data.max_length=0", r"data\.max_length: must be >= 2, got 0"),
        ("eval.streams=-1", r"eval\.streams: must be >= 0, got -1 \(0 = auto\)"),
        ("model.dropout=1.0", r"model\.dropout: must be in \[0, 1\), got 1\.0"),
        ("model.ffn_dropout=-0.1", r"model\.ffn_dropout: must be in \[0, 1\), got -0\.1"),
        ("train", r"--set expects section\.key=value"),
    ],
)
def test_errors_name_the_dotted_path(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("base", [override])


def test_missing_file_and_loop(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: nope.yaml") as raised:
        load_config("nope.yaml")
    assert "did you mean" not in str(raised.value)
    with pytest.raises(
        ConfigError, match=r"config file not found: tyny\.yaml .*did you mean .*configs/tiny\.yaml\?"
    ):
        load_config("tyny.yaml")
    with pytest.raises(ConfigError, match=f"config file {tmp_path} is a directory: give a YAML file"):
        load_config(tmp_path)
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="inheritance loop"):
        load_config(tmp_path / "a.yaml")


def test_python_object_tags_are_refused(tmp_path):
    evil = write(tmp_path / "evil.yaml", "train: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(evil)


def test_round_trip_through_yaml(tmp_path):
    config = load_config("tiny")
    saved = write(tmp_path / "resolved.yaml", config.to_yaml())
    assert load_config(saved) == config


def test_schedule_and_batch_defaults_keep_older_configs_unchanged(tmp_path):
    """A config written before the schedule/batch keys (e.g. an old run directory's) loads with the old behaviour:
    inverse square root, checkpoint averaging of the last K training checkpoints, and, on one replica, the
    learning rate as given (the reference batch defaults to one replica's)."""
    old = write(
        tmp_path / "old.yaml", "train:\n  learning_rate: 0.002\n  warmup_steps: 400\n  average_last: 4\n"
    )
    train = load_config(old).train
    assert (train.schedule, train.average_fraction, train.reference_batch_tokens) == ("inverse_sqrt", 0.0, 0)
    assert (train.learning_rate_scaling, train.allow_batch_change) == ("sqrt", False)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["train.schedule=linear", "train.max_steps=0", "train.max_minutes=0"],
            r"train\.schedule: linear .*needs",
        ),
        (["train.schedule=step"], r"train\.schedule: 'step' is not one of inverse_sqrt, linear, cosine"),
        (["train.average_fraction=1.5"], r"train\.average_fraction: must be in \[0, 1\], got 1\.5"),
        (
            ["train.min_learning_rate_fraction=-0.1"],
            r"train\.min_learning_rate_fraction: must be in \[0, 1\]",
        ),
        (["train.learning_rate_scaling=cube"], r"train\.learning_rate_scaling: 'cube' is not one of"),
        (["train.budget_probe_steps=0"], r"train\.budget_probe_steps: must be >= 1, got 0"),
        (["eval.beam_size=0"], r"eval\.beam_size: must be >= 1, got 0"),
        (["eval.alpha=6"], r"eval\.alpha: must be in \[0, 5\], got 6\.0"),
        (["train.reference_batch_tokens=-1"], r"train\.reference_batch_tokens: must be >= 0, got -1"),
        (
            ["train.dropout_by_plan=[[3000, 0.1, 2]]"],
            r"train\.dropout_by_plan: expected \[planned steps, dropout\]",
        ),
        (
            ["train.dropout_by_plan=[[3000, 0.1], [3000, 0.2]]"],
            r"must be positive and increasing, got 3000 after",
        ),
        (["train.dropout_by_plan=[[0, 0.1]]"], r"train\.dropout_by_plan: planned steps must be positive"),
        (["train.dropout_by_plan=[[3000, 1.0]]"], r"a dropout must be in \[0, 1\), got 1 at 3000 steps"),
        (
            ["train.dropout_by_plan=[[3000, 0.1]]", "train.max_minutes=0", "train.schedule=inverse_sqrt"],
            r"dropout_by_plan: needs a step plan",
        ),
        (["train.dropout_by_plan=[3000, 0.1]"], r"train\.dropout_by_plan"),
        (["train.ffn_dropout_by_plan=[[3000, 1.0]]"], r"train\.ffn_dropout_by_plan: a dropout must be in"),
        (
            [
                "train.ffn_dropout_by_plan=[[3000, 0.1]]",
                "train.dropout_by_plan=[]",
                "train.max_minutes=0",
                "train.schedule=inverse_sqrt",
            ],
            r"train\.ffn_dropout_by_plan: needs a step plan",
        ),
        (
            ["model.ffn_dropout=0", "train.ffn_dropout_by_plan=[[3000, 0.1]]"],
            r"model\.ffn_dropout: .*add train\.ffn_dropout_by_plan=\[\] to train it without dropout",
        ),
        (
            ["model.dropout=0"],
            r"model\.dropout: 0 .* add train\.dropout_by_plan=\[\] train\.ffn_dropout_by_plan=\[\] to train without",
        ),
        (
            ["train.early_stopping=3", "train.bleu_every=0"],
            r"train\.early_stopping counts greedy validation BLEU evaluations, and train\.bleu_every is 0",
        ),
    ],
)
def test_schedule_and_budget_errors_name_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config("base", overrides)


def test_no_dropout_with_the_plan_emptied():
    config = load_config(
        "base", ["model.dropout=0", "train.dropout_by_plan=[]", "train.ffn_dropout_by_plan=[]"]
    )
    assert config.model.dropout == 0 and config.train.dropout_by_plan == []
    fixed = load_config("base", ["model.dropout=0", "model.ffn_dropout=0.1", "train.dropout_by_plan=[]"])
    assert fixed.model.ffn_dropout == 0.1  # a feed-forward block built with dropout can follow the plan


def test_a_decay_needs_a_planned_end():
    assert (
        load_config("base", ["train.schedule=cosine"]).train.max_minutes == 60
    )  # planned from the time budget
    assert load_config(None, ["train.schedule=linear", "train.max_steps=100"]).train.schedule == "linear"


@pytest.mark.parametrize(("value", "expected"), [("fusible", "fusible"), ("auto", "auto"), ("true", True)])
def test_train_xla_accepts_fusible_auto_and_booleans(value, expected):
    assert load_config("base", [f"train.xla={value}"]).train.xla == expected


# ----------------------------------------------------------------------------------------------------------------
# Ranges (`_range` metadata next to each field), NaN, non-string keys, YAML 1.1 floats


@pytest.mark.parametrize(
    "override, message",
    [
        ("train.max_steps=-1", r"train\.max_steps: must be >= 0, got -1"),
        ("train.max_minutes=-1", r"train\.max_minutes: must be >= 0, got -1\.0"),
        ("train.max_minutes=.inf", r"train\.max_minutes: must be >= 0 and finite, got inf"),
        ("train.learning_rate=0", r"train\.learning_rate: must be > 0, got 0\.0"),
        ("train.learning_rate=-1", r"train\.learning_rate: must be > 0, got -1\.0"),
        ("train.learning_rate=.inf", r"train\.learning_rate: must be > 0 and finite, got inf"),
        ("train.label_smoothing=1", r"train\.label_smoothing: must be in \[0, 1\), got 1\.0"),
        ("train.label_smoothing=-0.1", r"train\.label_smoothing: must be in \[0, 1\), got -0\.1"),
        ("train.clipnorm=-1", r"train\.clipnorm: must be >= 0, got -1\.0"),
        ("train.average_last=-2", r"train\.average_last: must be >= 0, got -2"),
        ("train.bleu_max_sentences=-3", r"train\.bleu_max_sentences: must be >= 0, got -3"),
        ("train.log_every=0", r"train\.log_every: must be >= 1, got 0"),
        ("train.checkpoint_every=0", r"train\.checkpoint_every: must be >= 1, got 0"),
        ("train.keep_checkpoints=0", r"train\.keep_checkpoints: must be >= 1, got 0"),
        ("train.eval_every=-1", r"train\.eval_every: must be >= 0, got -1"),
        ("train.bleu_every=-1", r"train\.bleu_every: must be >= 0, got -1"),
        ("train.early_stopping=-1", r"train\.early_stopping: must be >= 0, got -1"),
        ("train.max_bad_steps=-1", r"train\.max_bad_steps: must be >= 0, got -1"),
        ("train.ema_decay=1", r"train\.ema_decay: must be in \[0, 1\), got 1\.0"),
        ("train.ema_decay=2", r"train\.ema_decay: must be in \[0, 1\), got 2\.0"),
        ("train.ema_decay=-0.5", r"train\.ema_decay: must be in \[0, 1\), got -0\.5"),
        ("train.warmup_steps=-1", r"train\.warmup_steps: must be >= 0, got -1"),
        ("train.accumulate_steps=0", r"train\.accumulate_steps: must be >= 1, got 0"),
        ("train.budget_probe_skip=-1", r"train\.budget_probe_skip: must be >= 0, got -1"),
        ("train.budget_replan_at=1", r"train\.budget_replan_at: must be in \[0, 1\), got 1\.0"),
        ("train.beta_1=1", r"train\.beta_1: must be in \[0, 1\), got 1\.0"),
        ("train.beta_2=-0.1", r"train\.beta_2: must be in \[0, 1\), got -0\.1"),
        ("train.epsilon=0", r"train\.epsilon: must be > 0, got 0\.0"),
        ("eval.max_length_a=-5", r"eval\.max_length_a: must be >= 0, got -5\.0"),
        ("eval.max_length_b=-5", r"eval\.max_length_b: must be >= 0, got -5"),
        ("eval.beam_size=-1", r"eval\.beam_size: must be >= 1, got -1"),
        ("eval.alpha=-0.1", r"eval\.alpha: must be in \[0, 5\], got -0\.1"),
        ("eval.batch_size=0", r"eval\.batch_size: must be >= 1, got 0"),
        ("model.attention_dropout=1", r"model\.attention_dropout: must be in \[0, 1\), got 1\.0"),
        ("model.dropout=-0.1", r"model\.dropout: must be in \[0, 1\), got -0\.1"),
        ("model.num_heads=0", r"model\.num_heads: must be >= 1, got 0"),  # before d_model % num_heads
        ("model.num_layers=0", r"model\.num_layers: must be >= 1, got 0"),
        ("model.d_ff=-1", r"model\.d_ff: must be >= 1, got -1"),
        ("model.chunk_size=0", r"model\.chunk_size: must be >= 1, got 0"),
        ("model.window=-1", r"model\.window: must be >= 0, got -1"),
        ("model.scale=0", r"model\.scale: must be > 0, got 0\.0"),
        ("model.max_length=0", r"model\.max_length: must be >= 1, got 0"),
        (
            "data.vocab_size=3",
            r"data\.vocab_size: must be >= 6, got 3",
        ),  # the rest: tests/data/test_config.py
        ("data.bucket_boundaries=[30, 10, 0]", r"data\.bucket_boundaries\[2\]: must be >= 1, got 0"),
        ("train.seed=-1", r"train\.seed: must be in \[0, 4294967295\], got -1"),
        ("train.seed=4294967296", r"train\.seed: must be in \[0, 4294967295\], got 4294967296"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


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


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_round_trips(tmp_path, path):
    config = load_config(path)
    assert load_config(write(tmp_path / "resolved.yaml", config.to_yaml())) == config


@pytest.mark.parametrize("name", ["ted_pt_en.yaml", "wmt14_en_de_base.yaml"])
def test_the_published_recipes_train_at_their_own_dropout(name):
    """The tutorial's and the paper's configs say dropout 0.1: base.yaml's rules for Multi30k (a plan of 40,000 or
    100,000 steps would get 0.25) must not reach them."""
    from nmt.budget import planned_dropout

    train = load_config(CONFIG_DIR / name).train
    for points in (train.dropout_by_plan, train.ffn_dropout_by_plan):
        assert planned_dropout(points, train.max_steps) is None


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "train.max_steps=-5"], "train.max_steps: must be >= 0, got -5"),
        (["--set", "eval.max_length_a=-5"], "eval.max_length_a: must be >= 0, got -5.0"),
        (["--config", "{mixkeys}"], "config keys must be strings: the top level has the key 1 (int)"),
    ],
)
def test_train_py_exits_2_and_writes_nothing(tmp_path, extra, message):
    mixkeys = write(tmp_path / "mixkeys.yaml", "base: tiny.yaml\n1: 2\nfoo: 3\n")
    model_dir = tmp_path / "run"
    command = [sys.executable, "train.py", "--config", "tiny.yaml", "--model-dir", str(model_dir)]
    command += [arg.format(mixkeys=mixkeys) for arg in extra]
    done = subprocess.run(command, cwd=CONFIG_DIR.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"train.py: config error: {message}"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not model_dir.exists()
