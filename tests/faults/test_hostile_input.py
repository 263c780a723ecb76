"""Hostile input for translate.py and hostile config files for train.py / translate.py / evaluate.py.

translate.py, on a tiny trained run directory (tests/run_fixture): each input case must give exit 0, exactly one
output line per input line (counted like `wc -l`, plus an unterminated last line), and a warning naming the line
where something was repaired. The single-file cases run `translate.main` in this process through `nmt.cli.run`
(the CLI's own error handling; a new process per case would cost ~10 s of imports each), sharing one loaded
Translator. The 100,000-line case runs the real process on a pipe and checks that it *streams*: its first output
lines must arrive while the test still holds the second half of the input back (so memory is bounded by the
chunk, not by the input). Its lines are mostly empty, with one real sentence in every 2,000, so it checks streaming
and line accounting in seconds rather than decoding 100,000 sentences. No duration is asserted: its waits have
generous deadlines (HANG_SECONDS) only so that a hang fails instead of blocking the suite.

Config files: unknown keys, wrong types and YAML tags that would run code are refused with exit 2 and a message
naming the dotted path, before anything is written: no run directory is created, and in an existing one no file is
added or changed (size, mtime and hash compared).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading

import pytest
import yaml

import translate
from tests.faults.helpers import (
    ROOT,
    cli_env,
    command,
    fault_tree,
    run_cli,
    run_main,
    snapshot,
    train,
    write_config,
)

SENTENCE = b"The cat sees a ball."
HANG_SECONDS = 600  # translate.py idle: ~15 s for the 100,000 lines; past this it is hung, not slow


def count_lines(data: bytes) -> int:
    """Lines as translate.py promises to see them: newline-terminated ones, plus an unterminated last one."""
    return data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))


CASES = {
    "empty_file": (b"", []),
    "only_empty_lines": (b"\n" * 40 + b"   \n\t\n", []),
    "invalid_utf8": (SENTENCE + b"\nThe \xff\xfe cat \xc3\x28 sees a dog.\n" + SENTENCE + b"\n", ["line 2: invalid UTF-8"]),
    "nul_bytes": (b"The cat\x00 sees\x00 a ball.\n\x00\x00\x00\n" + SENTENCE, ["line 1: removed 2 NUL", "line 2: removed 3 NUL"]),
    "one_megabyte_line": (b"the cat sees a ball " * 52_429 + b"\n" + SENTENCE + b"\n", ["line 1: ", "translated only the first"]),
}  # fmt: skip


_TRANSLATORS: dict = {}


@pytest.fixture
def shared_translator(monkeypatch):
    """`Translator.from_run_dir` loads each run directory once for all the cases (its decoder traces are reused)."""
    from nmt.translator import Translator

    load = Translator.from_run_dir.__func__

    def from_run_dir(cls, path, weights="auto", **kwargs):
        key = (str(path), weights, tuple(sorted(kwargs.items())))
        if key not in _TRANSLATORS:
            _TRANSLATORS[key] = load(cls, path, weights=weights, **kwargs)
        return _TRANSLATORS[key]

    monkeypatch.setattr(Translator, "from_run_dir", classmethod(from_run_dir))


@pytest.mark.parametrize("case", sorted(CASES))
def test_translate_hostile_file(case, tiny_run_dir, tmp_path, capsys, restore_logging, shared_translator):
    data, warnings = CASES[case]
    source, output = tmp_path / "input.txt", tmp_path / "output.txt"
    source.write_bytes(data)
    before = snapshot(tiny_run_dir)
    argv = ["--model-dir", str(tiny_run_dir), "--input", str(source), "--output", str(output), "--beam", "1"]
    code = run_main(
        translate, argv
    )  # greedy: a beam-search graph costs more to trace and proves nothing more here
    stderr = capsys.readouterr().err
    assert code == 0, stderr[-3000:]
    out = output.read_bytes()
    assert count_lines(out) == count_lines(data) and (not out or out.endswith(b"\n"))
    inputs, outputs = data.split(b"\n"), out.decode("utf-8").split("\n")
    for line_in, line_out in zip(inputs, outputs):  # blank in <=> blank out (a NUL-only line is blank too)
        assert bool(line_in.replace(b"\x00", b"").strip()) == bool(line_out), (line_in[:40], line_out)
    assert max(map(len, outputs)) < 1000  # the 1 MB line was truncated, not echoed or decoded in full
    for warning in warnings:
        assert warning in stderr
    if not warnings:
        assert "WARNING" not in stderr
    assert snapshot(tiny_run_dir) == before


@pytest.mark.slow  # ~20 s; the other hostile-input tests stay in make test
def test_translate_streams_100k_lines(tiny_run_dir, tmp_path):
    lines = [SENTENCE if i % 2000 == 0 else b"" for i in range(100_000)]
    head, tail = b"".join(x + b"\n" for x in lines[:50_000]), b"".join(x + b"\n" for x in lines[50_000:])
    with open(tmp_path / "stderr.log", "wb") as stderr_log:
        proc = subprocess.Popen(
            command("translate.py", "--model-dir", tiny_run_dir, "--beam", "1"),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr_log,
            cwd=ROOT,
            env=cli_env(),
        )
    first_output, state = threading.Event(), {"tail_sent": False, "hung": False}

    def feed():
        proc.stdin.write(head)
        proc.stdin.flush()
        # Hold the second half back until output shows up. A translate.py that does not stream never writes
        # before its input ends: after HANG_SECONDS the tail is sent anyway and `streamed` stays False.
        first_output.wait(timeout=HANG_SECONDS)
        state["tail_sent"] = True
        proc.stdin.write(tail)
        proc.stdin.close()

    def watchdog():  # a hung process would block os.read below forever
        state["hung"] = True
        proc.kill()

    feeder = threading.Thread(target=feed, daemon=True)
    timer = threading.Timer(3 * HANG_SECONDS, watchdog)
    feeder.start()
    timer.start()
    out, streamed = bytearray(), False
    try:
        while chunk := os.read(proc.stdout.fileno(), 1 << 16):
            out += chunk
            if not first_output.is_set() and b"\n" in out:
                streamed = not state["tail_sent"]  # a whole output line while the input is still open
                first_output.set()
        code = proc.wait()
    finally:
        timer.cancel()
        first_output.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    feeder.join(timeout=HANG_SECONDS)
    stderr = (tmp_path / "stderr.log").read_text(errors="replace")
    assert not state["hung"], f"hang: translate.py killed after {3 * HANG_SECONDS} s:\n{stderr[-3000:]}"
    assert code == 0, stderr[-3000:]
    assert streamed, (
        f"no output line within {HANG_SECONDS} s while the input was held open: translate.py does not stream "
        "(it waits for the end of its input) or hangs"
    )
    assert count_lines(bytes(out)) == 100_000
    outputs = bytes(out).split(b"\n")[:-1]
    assert [bool(x) for x in outputs] == [bool(x) for x in lines]


# --------------------------------------------------------------------------------------------------------------
# Hostile config files


@pytest.fixture
def existing_run(tiny_run_dir, tmp_path):
    target = tmp_path / "existing"
    shutil.copytree(tiny_run_dir, target)
    return target


def bad_configs(corpus, tmp_path):
    """name -> (config file, --set overrides, expected message); the files derive from the valid tiny config."""
    marker = tmp_path / "code-was-run"

    def variant(name, edit):
        tree = fault_tree(corpus)
        edit(tree)
        return write_config(tmp_path / f"{name}.yaml", tree)

    good = write_config(tmp_path / "good.yaml", fault_tree(corpus))
    tagged = tmp_path / "tagged.yaml"
    text = yaml.safe_dump(fault_tree(corpus), sort_keys=False)
    tagged.write_text(
        text.replace("max_steps: 60", f'max_steps: !!python/object/apply:os.system ["touch {marker}"]'),
        encoding="utf-8",
    )
    assert "!!python" in tagged.read_text()
    return marker, {
        "unknown_key": (
            variant("unknown", lambda t: t["train"].update(max_stepz=5)),
            [],
            "unknown config key train.max_stepz",
        ),
        "wrong_type": (
            variant("wrong_type", lambda t: t["model"].update(d_model="sixteen")),
            [],
            "model.d_model: expected int, got str 'sixteen'",
        ),
        "section_not_mapping": (
            variant("flat", lambda t: t.update(model=16)),
            [],
            "model: expected a mapping, got int",
        ),
        "python_tag": (tagged, [], "could not determine a constructor for the tag"),
        "override_wrong_type": (
            good,
            ["train.max_steps=many"],
            "train.max_steps: expected int, got str 'many'",
        ),
        "override_unknown_key": (good, ["model.depth=3"], "unknown config key model.depth"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown_key",
        "wrong_type",
        "section_not_mapping",
        "python_tag",
        "override_wrong_type",
        "override_unknown_key",
    ],
)
def test_bad_config_exits_2_and_writes_nothing(case, corpus, existing_run, tmp_path):
    marker, cases = bad_configs(corpus, tmp_path / "configs")
    config, overrides, message = cases[case]
    new_dir = tmp_path / "new_run"
    before = snapshot(existing_run)
    for run_dir in (new_dir, existing_run):
        done = train(config, run_dir, *overrides)
        assert done.returncode == 2, done.stderr[-3000:]
        assert done.stderr.startswith("train.py: config error: ")
        assert message in done.stderr
        assert "Traceback" not in done.stderr
    assert not new_dir.exists()
    assert snapshot(existing_run) == before
    assert not marker.exists()  # the YAML tag was never executed


def test_missing_config_file_exits_2(tmp_path):
    done = train(tmp_path / "nope.yaml", tmp_path / "run")
    assert done.returncode == 2
    assert "config file not found: " in done.stderr and "nope.yaml" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("script", ["translate.py", "evaluate.py"])
def test_missing_model_dir_is_refused(script, tmp_path):
    done = run_cli(script, "--model-dir", tmp_path / "nope")
    assert done.returncode != 0
    assert (
        done.stderr.strip().splitlines()[-1] == f"error: model directory does not exist: {tmp_path / 'nope'}"
    )
    assert not (tmp_path / "nope").exists()


def test_model_dir_without_run_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    done = run_cli("translate.py", "--model-dir", tmp_path / "empty")
    assert done.returncode == 1
    assert "is not a run directory: config.yaml is missing" in done.stderr
    assert list((tmp_path / "empty").iterdir()) == []
