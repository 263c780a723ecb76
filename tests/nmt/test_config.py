"""The config loader: inheritance, overrides, and errors that name the dotted path."""

import math
import re
import subprocess
import sys

import pytest

from nmt.config import CONFIG_DIR, Config, ConfigError, load_config, load_tree


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


def test_an_empty_section_keeps_its_defaults_and_a_section_replaced_by_a_value_names_the_file(tmp_path):
    """`train:` with its keys commented out keeps the base's (or the defaults); `train: 5` under a base that has
    the section names the file that wrote it (before 2026-12-08 neither: "train: expected a mapping, got
    NoneType")."""
    write(tmp_path / "parent.yaml", "train:\n  seed: 7\n  warmup_steps: 10\n")
    empty = write(tmp_path / "empty.yaml", "base: parent.yaml\ntrain:\n  # seed: 8\nmodel:\n")
    config = load_config(empty)
    assert (config.train.seed, config.train.warmup_steps) == (7, 10)
    assert config.model == Config().model
    assert load_config(write(tmp_path / "plain.yaml", "train:\n")).train == Config().train
    write(tmp_path / "middle.yaml", "base: parent.yaml\ntrain: 5\n")
    child = write(tmp_path / "child.yaml", "base: middle.yaml\n")
    with pytest.raises(
        ConfigError, match=re.escape(f"{tmp_path / 'middle.yaml'}: train: expected a mapping")
    ):
        load_config(child)


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


@pytest.mark.parametrize(
    "text, line, where, reading",
    [
        ("base: base.yaml\ntrain:\n  max_minutes: 1:30:00\n  warmup_steps: 0400\n", 3, "train.max_minutes: 1:30:00",
         r"5400 \(base 60\)"),
        ("train:\n  warmup_steps: 0400\n", 2, "train.warmup_steps: 0400", r"256 \(octal\)"),
        ("train: {max_steps: 10, seed: 0123}\n", 1, "train.seed: 0123", r"83 \(octal\)"),
        ("train:\n  max_steps: -1:00\n", 2, "train.max_steps: -1:00", r"-60 \(base 60\)"),
        ("train:\n  max_minutes: 1:30.5\n", 2, "train.max_minutes: 1:30.5", r"90\.5 \(base 60\)"),
        ("data:\n  bucket_boundaries: [8,\n    010]\n", 3, "data.bucket_boundaries[1]: 010", r"8 \(octal\)"),
        ("data:\n  folder: 1:30\n", 2, "data.folder: 1:30", r"90 \(base 60\)"),
    ],
)  # fmt: skip
def test_a_file_refuses_numbers_yaml_11_reads_otherwise(tmp_path, text, line, where, reading):
    """As --set does: `max_minutes: 1:30:00` in a file was 5400 minutes, `warmup_steps: 0400` 256 steps."""
    path = write(tmp_path / "child.yaml", text)
    advice = r"write the number without leading zeros or colons \(or quote it for a text value\)"
    with pytest.raises(ConfigError, match=rf"^{re.escape(f'{path}, line {line}: {where}')}: YAML reads this as "
                       rf"{reading}: {advice}$"):  # fmt: skip
        load_config(path)
    # in an inherited file too, named
    child = write(tmp_path / "grandchild.yaml", "base: child.yaml\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(f'{path}, line {line}: {where}')}: YAML reads"):
        load_config(child)


def test_a_file_keeps_numbers_and_texts_that_only_look_alike(tmp_path):
    # 07 and 00 are octal to YAML 1.1, but the numbers they look like: kept (before 2026-12-07d refused as if not)
    plain = (
        "values: [0, 0.5, 1e-3, 10, -1, 4096, 1_000, 0x1F, 1.5, '0400', \"1:30\", 08, 0:30, a:1, 07, 00]\n"
        "nan: .nan\n"
    )
    tree = load_tree(write(tmp_path / "plain.yaml", plain))
    expected = [0, 0.5, "1e-3", 10, -1, 4096, 1000, 31, 1.5, "0400", "1:30", "08", "0:30", "a:1", 7, 0]
    # 1e-3 (no dot) a string, as YAML 1.1 reads it: float fields take it
    assert tree["values"] == expected
    assert math.isnan(tree["nan"])
    text = "base: base.yaml\ntrain:\n  max_steps: 0\n  warmup_steps: 4096\n  learning_rate: 1e-3\n"
    text += "  label_smoothing: 0.5\n  max_minutes: 10\ndata:\n  dataset: folder\n  folder: '0400'\n"
    config = load_config(write(tmp_path / "ordinary.yaml", text))
    assert (config.train.max_steps, config.train.warmup_steps, config.train.learning_rate) == (0, 4096, 1e-3)
    assert (config.train.label_smoothing, config.train.max_minutes, config.data.folder) == (0.5, 10.0, "0400")


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
        ("data.max_length=0", r"data\.max_length: must be in \[2, 65535\], got 0"),
        ("eval.streams=-1", r"eval\.streams: must be in \[0, 2147483647\], got -1 \(0 = auto\)"),
        ("model.dropout=1.0", r"model\.dropout: must be in \[0, 1\), got 1\.0"),
        ("model.ffn_dropout=-0.1", r"model\.ffn_dropout: must be in \[0, 1\), got -0\.1"),
        ("train", r"--set expects section\.key=value"),
        (
            "data.target=no",
            r"data\.target: expected str, got bool False \(YAML reads no, yes, on and off as ",
        ),
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
    # a missing base names the file whose base: it is (in a chain, not the first file)
    write(tmp_path / "top.yaml", "base: middle.yaml\n")
    middle = write(tmp_path / "middle.yaml", "base: gone.yaml\n")
    with pytest.raises(
        ConfigError, match=rf"^{re.escape(f'{middle}: base: config file not found: gone.yaml')}"
    ):
        load_config(tmp_path / "top.yaml")
    # an empty base (before 2026-12-07e: taken for none, the run trained on the defaults with no budget)
    for text, got in (("base:\n", "None (NoneType)"), ("base: ''\n", "'' (str)"), ("base: 3\n", "3 (int)")):
        empty = write(tmp_path / "empty.yaml", text + "train:\n  seed: 3\n")
        with pytest.raises(
            ConfigError, match=rf"^{re.escape(f'{empty}: base: expected a file name, got {got}')}$"
        ):
            load_config(empty)


def test_python_object_tags_are_refused(tmp_path):
    evil = write(tmp_path / "evil.yaml", "train: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(evil)


def test_a_repeated_key_is_refused_not_the_last_one_kept(tmp_path):
    """yaml.safe_load keeps the last of a repeated key: a `train:` section appended at the end replaced the first
    whole (its max_steps gone: a run without end). Merge keys (`<<: *anchor`) still override."""
    repeated = write(
        tmp_path / "repeated.yaml", "base: tiny.yaml\ntrain:\n  max_steps: 5\ntrain:\n  seed: 7\n"
    )
    with pytest.raises(ConfigError, match=r"found the key 'train' twice \(first on line 2\)[\s\S]*line 4"):
        load_config(repeated)
    inner = write(tmp_path / "inner.yaml", "base: tiny.yaml\ntrain:\n  seed: 5\n  max_steps: 3\n  seed: 7\n")
    with pytest.raises(ConfigError, match="found the key 'seed' twice"):
        load_config(inner)
    merged = "base: tiny.yaml\nx-defaults: &d {seed: 1, max_steps: 3}\ntrain:\n  <<: *d\n  seed: 2\n"
    with pytest.raises(ConfigError, match="x-defaults"):  # an unknown section, not a repeated key
        load_config(write(tmp_path / "merged.yaml", merged))


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
        (
            ["train.budget_probe_steps=0"],
            r"train\.budget_probe_steps: must be in \[1, 4611686018427387904\], got 0",
        ),
        (["eval.beam_size=0"], r"eval\.beam_size: must be in \[1, 1024\], got 0"),
        (["eval.beam_size=1000000"], r"eval\.beam_size: must be in \[1, 1024\], got 1000000"),
        (["eval.alpha=6"], r"eval\.alpha: must be in \[0, 5\], got 6\.0"),
        (
            ["train.reference_batch_tokens=-1"],
            r"train\.reference_batch_tokens: must be in \[0, 4611686018427387904\], got -1",
        ),
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
    # nor its length penalty, chosen on Multi30k's validation (a review of 2026-12-07e found 1.4 inherited)
    assert load_config(CONFIG_DIR / name).eval.alpha == 0.6


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "train.max_steps=-5"], "train.max_steps: must be in [0, 4611686018427387904], got -5"),
        (["--set", "eval.max_length_a=-5"], "eval.max_length_a: must be >= 0, got -5.0"),
        (["--config", "{mixkeys}"], "config keys must be strings: the top level has the key 1 (int)"),
        (
            ["--config", "{octal}"],
            "{octal}, line 3: train.warmup_steps: 0400: YAML reads this as 256 (octal)",
        ),
        # a new run only (a saved run's config.yaml with it still loads: test_config_values)
        (["--set", "data.batch_tokens=16"], "data.batch_tokens: 16 is less than data.max_length=40"),
        (
            ["--set", "train.max_steps=99999999999999999999"],
            "train.max_steps: must be in [0, 4611686018427387904], got 99999999999999999999",
        ),
    ],
)
def test_train_py_exits_2_and_writes_nothing(tmp_path, extra, message):
    files = {
        "mixkeys": write(tmp_path / "mixkeys.yaml", "base: tiny.yaml\n1: 2\nfoo: 3\n"),
        "octal": write(tmp_path / "octal.yaml", "base: tiny.yaml\ntrain:\n  warmup_steps: 0400\n"),
    }
    model_dir = tmp_path / "run"
    command = [sys.executable, "train.py", "--config", "tiny.yaml", "--model-dir", str(model_dir)]
    command += [arg.format(**files) for arg in extra]
    done = subprocess.run(command, cwd=CONFIG_DIR.parent, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith(f"train.py: config error: {message.format(**files)}"), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not model_dir.exists()
