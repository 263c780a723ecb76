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
        ("train.xla=sometimes", r"train\.xla"),
        ("model.num_heads=3", r"model\.d_model: 256 is not divisible by model\.num_heads=3"),
        ("data.max_length=0", r"data\.max_length: must be positive"),
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
