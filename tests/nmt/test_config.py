"""The config loader: inheritance, overrides, and errors that name the dotted path."""

import pytest

from nmt.config import Config, ConfigError, load_config


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
        ("data.max_length=0", r"data\.max_length: must be positive"),
        ("eval.streams=-1", r"eval\.streams: must be >= 0 \(0 = auto\), got -1"),
        ("model.dropout=1.0", r"model\.dropout: a dropout must be in \[0, 1\), got 1"),
        ("model.ffn_dropout=-0.1", r"model\.ffn_dropout: a dropout must be in \[0, 1\), got -0.1"),
        ("train", r"--set expects section\.key=value"),
    ],
)
def test_errors_name_the_dotted_path(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config("base", [override])


def test_missing_file_and_loop(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: nope.yaml"):
        load_config("nope.yaml")
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
        (["train.average_fraction=1.5"], r"train\.average_fraction: must be between 0 and 1"),
        (["train.min_learning_rate_fraction=-0.1"], r"train\.min_learning_rate_fraction: must be between"),
        (["train.learning_rate_scaling=cube"], r"train\.learning_rate_scaling: 'cube' is not one of"),
        (["train.budget_probe_steps=0"], r"train\.budget_probe_steps: must be at least 1"),
        (["eval.beam_size=0"], r"eval\.beam_size must be at least 1, got 0"),
        (["eval.alpha=6"], r"eval\.alpha must be between 0 and 5, got 6"),
        (["train.reference_batch_tokens=-1"], r"train\.reference_batch_tokens: must not be negative"),
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
