"""benchmarks/search_grid.py: the grid, the summary and the choice, and real decodings of the tiny run directory."""

from __future__ import annotations

import json

import pytest

from benchmarks import search_grid
from tests.run_fixture import tiny_corpus


def test_greedy_search_is_decoded_once_and_wider_beams_with_every_alpha():
    assert search_grid.grid([1, 4], [0.6, 1.4]) == [(1, None), (4, 0.6), (4, 1.4)]
    assert search_grid.parse_list("4, 8,4", int) == [4, 8]
    # `--beams 1 --alphas ""`
    assert search_grid.parse_list("", float) == search_grid.parse_list(" ", float) == []


def decoding(run, beam, alpha, bleu):
    return {"kind": "decoding", "run": run, "beam": beam, "alpha": alpha, "bleu": bleu}


def test_the_choice_is_the_highest_mean_over_runs_of_settings_every_run_decoded():
    decodings = [
        decoding("a", 4, 1.0, 30.0), decoding("a", 4, 1.4, 31.0), decoding("a", 8, 1.0, 40.0),
        decoding("b", 4, 1.0, 33.0), decoding("b", 4, 1.4, 31.0),
    ]  # fmt: skip
    rows, choice = search_grid.summarize(decodings, {"a": (4, 1.4), "b": (4, 1.4)})
    # (8, 1.0) was decoded for run a only: left out, though its BLEU is the highest
    assert [(row["beam"], row["alpha"], row["bleu_mean"]) for row in rows] == [(4, 1.0, 31.5), (4, 1.4, 31.0)]
    assert rows[0]["delta_from_configured"] == {"a": -1.0, "b": 2.0}
    assert rows[0]["bleu_min"] == 30.0
    assert choice == {
        "kind": "choice",
        "beam": 4,
        "alpha": 1.0,
        "bleu_mean": 31.5,
        "gain_over_configured": 0.5,
    }
    # a configured setting outside the grid has no difference; equal means keep the earlier setting
    rows, choice = search_grid.summarize(
        [decoding("a", 1, None, 5.0), decoding("a", 2, 0.0, 5.0)], {"a": (4, 1.4)}
    )
    assert rows[0]["delta_from_configured"] == {"a": None}
    assert (choice["beam"], choice["alpha"], choice["gain_over_configured"]) == (1, None, None)


def test_decodes_the_tiny_run_without_touching_its_hypotheses(tiny_run_dir, tmp_path, capsys):
    # The fixture memorised its validation split: greedy search and beam search with alpha <= 0.6 reproduce every
    # reference (tests/run_fixture.py), so every decoding scores BLEU 100 and the choice is the first setting.
    before = {p.name: p.stat().st_mtime_ns for p in tiny_run_dir.iterdir()}
    output = tmp_path / "grid.jsonl"
    argv = [
        "--model-dir",
        str(tiny_run_dir),
        f"{tiny_run_dir}/",  # the same run, spelled another way: decoded once
        "--beams",
        "1,2",
        "--alphas",
        "0.6",
        "--output",
        str(output),
    ]
    assert search_grid.main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [json.loads(line) for line in output.read_text().splitlines()]
    decodings = [line for line in lines if line["kind"] == "decoding"]
    assert [(d["beam"], d["alpha"]) for d in decodings] == [(1, None), (2, 0.6)]
    assert all(d["bleu"] == pytest.approx(100.0) and d["length_ratio"] == 1.0 for d in decodings)
    validation = len(
        tiny_corpus()["validation"]
    )  # every sentence of the split was decoded, and the line says so
    assert [d["num_sentences"] for d in decodings] == [validation, validation]
    # the fixture's config says beam 2, alpha 0.6 (in the grid): the greedy choice gains nothing over it
    expected = {
        "beam": 1,
        "alpha": None,
        "bleu_mean": pytest.approx(100.0),
        "gain_over_configured": pytest.approx(0),
    }
    assert lines[-1] == {"kind": "choice", **expected}
    assert {p.name: p.stat().st_mtime_ns for p in tiny_run_dir.iterdir()} == before


def test_a_failed_search_keeps_the_previous_output(tiny_run_dir, tmp_path, capsys):
    """--output is put in place at the end: a search that fails (or is interrupted) leaves the last results."""
    output = tmp_path / "grid.jsonl"
    output.write_text('{"kind": "choice"}\n')
    argv = ["--model-dir", str(tiny_run_dir), "--split", "nosuch", "--beams", "1", "--output", str(output)]
    assert search_grid.main(argv) == 2
    assert "nosuch" in capsys.readouterr().err
    assert output.read_text() == '{"kind": "choice"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["grid.jsonl"]  # no partial file left


def test_an_output_that_is_a_directory_is_refused_before_the_search(tiny_run_dir, tmp_path, capsys):
    argv = ["--model-dir", str(tiny_run_dir), "--beams", "1", "--output", str(tmp_path)]
    assert search_grid.main(argv) == 2
    assert f"--output {tmp_path} is a directory" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "split", ["test", "test[:100%]", "test[:5]"]
)  # a TFDS slice of it too (before: searched)
def test_the_test_split_is_refused(tiny_run_dir, capsys, split):
    assert search_grid.main(["--model-dir", str(tiny_run_dir), "--split", split]) == 2
    assert "chosen on validation" in capsys.readouterr().err


def test_a_missing_run_directory_is_named(tmp_path, capsys):
    assert search_grid.main(["--model-dir", str(tmp_path / "nope")]) == 2
    assert "nope" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, message",
    [
        (["--beams", "4,0"], "--beams: a beam size must be between 1 and 1024, got 0"),
        (["--alphas", "7"], "--alphas: alpha"),
        (
            ["--beams", "1,4", "--alphas", ""],
            "--alphas: give at least one length penalty for the beam sizes above 1",
        ),
    ],
)
def test_a_search_setting_out_of_range_is_refused(tmp_path, capsys, option, message):
    with pytest.raises(SystemExit) as caught:
        search_grid.main(["--model-dir", str(tmp_path), *option])
    assert caught.value.code == 2 and message in capsys.readouterr().err
