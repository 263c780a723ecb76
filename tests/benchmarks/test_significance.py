"""benchmarks.significance: sacreBLEU's paired bootstrap of two systems, as a function and as a command."""

import json

import pytest


def test_paired_bootstrap_reports_sacrebleus_bleu_difference_and_a_verdict():
    """BLEU and its difference against sacreBLEU's corpus_bleu; identical systems are said to be identical (sacreBLEU
    gives them a small p-value on purpose); a system that drops most of the words loses significantly."""
    import random

    import sacrebleu

    from benchmarks.significance import paired_bootstrap

    rng = random.Random(0)
    words = "ein mann eine frau der hund die katze sieht mag hat das haus den ball heute".split()
    references = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 9))) for _ in range(60)]
    close = [ref if i % 3 else " ".join(ref.split()[:-1]) for i, ref in enumerate(references)]
    poor = [" ".join(ref.split()[:2]) for ref in references]

    same = paired_bootstrap(close, close, references, "de", samples=200)
    assert same["bleu_delta"] == 0 and same["same_translations"] == 60 == same["sentences"]
    assert same["verdict"] == "identical translations"

    loss = paired_bootstrap(close, poor, references, "de", samples=200)
    expected = (
        sacrebleu.corpus_bleu(poor, [references]).score - sacrebleu.corpus_bleu(close, [references]).score
    )
    assert loss["bleu_delta"] == pytest.approx(expected, abs=0.006) and expected < -10
    assert loss["baseline_bleu"] == pytest.approx(sacrebleu.corpus_bleu(close, [references]).score, abs=0.006)
    assert 0 < loss["p_value"] < 0.05 and loss["verdict"] == "significant loss" and loss["samples"] == 200


def test_lowercase_bootstrap_ignores_case():
    """With lowercase, a lowercased copy of the references ties them (the cased test calls it a loss)."""
    import sacrebleu

    from benchmarks.significance import paired_bootstrap

    references = ["Ein Mann sieht den Hund.", "Die Katze mag das Haus.", "Eine Frau hat den Ball heute."] * 10
    lowered = [line.lower() for line in references]
    cased = paired_bootstrap(references, lowered, references, "de", samples=100)
    assert cased["bleu_delta"] < -10 and not cased["lowercase"]
    tied = paired_bootstrap(references, lowered, references, "de", samples=100, lowercase=True)
    assert tied["bleu_delta"] == 0 and tied["lowercase"] and tied["verdict"] == "identical translations"
    assert cased["same_translations"] == 0 and tied["same_translations"] == len(references)
    assert tied["bleu"] == round(sacrebleu.corpus_bleu(lowered, [references], lowercase=True).score, 2) == 100


def test_the_bootstrap_scores_bleu_as_score_corpus_does():
    """A lowercased run's BLEU, in the row and in its bootstrap alike: the tokenizer's lowercasing (Σ -> σ) on both
    sides first (before 2026-12-07d the bootstrap's str.lower() wrote a final ς: 31.6 where the row said 100)."""
    from benchmarks.significance import paired_bootstrap
    from data.tokenizer_training import lowercase_table
    from nmt.scores import score_corpus

    references = ["ΑΥΤΟΣ ΕΙΝΑΙ Ο ΔΡΟΜΟΣ ΜΑΣ ΣΗΜΕΡΑ ΕΔΩ", "Ο ΑΝΘΡΩΠΟΣ ΠΕΡΠΑΤΑΕΙ ΣΤΟΝ ΔΡΟΜΟ ΤΩΡΑ"] * 10
    system = [line.translate(lowercase_table()) for line in references]
    baseline = ["ο ανθρωποσ"] * len(references)
    result = paired_bootstrap(baseline, system, references, "el", samples=100, lowercase=True)
    assert result["bleu"] == round(score_corpus(system, references, "el", lowercase=True)["bleu"], 2) == 100
    assert result["baseline_bleu"] == round(
        score_corpus(baseline, references, "el", lowercase=True)["bleu"], 2
    )


def test_different_translations_of_equal_bleu_are_neither_a_gain_nor_a_loss(capsys):
    """Each system right on the half the other gets wrong, with the same counts: BLEU equal to the last digit (a
    delta of 0 was called a "significant loss" whenever the bootstrap's p-value fell under 0.05)."""
    from benchmarks.significance import main, paired_bootstrap

    references = [f"w{i}a w{i}b w{i}c w{i}d w{i}e" for i in range(40)]
    garbage = [f"x{i}a x{i}b x{i}c x{i}d x{i}e" for i in range(40)]
    baseline = references[:20] + garbage[20:]
    system = garbage[:20] + references[20:]
    result = paired_bootstrap(baseline, system, references, "de", samples=200)
    assert result["bleu_delta"] == 0 and result["bleu"] == result["baseline_bleu"] > 0
    assert result["verdict"] == "equal BLEU"
    assert main(["--baseline", "a", "--system", "b", "--references", "c", "--samples", "0"]) == 2
    assert "--samples must be at least 1, got 0" in capsys.readouterr().err


def test_significance_command_prints_the_bootstrap_of_two_files_and_refuses_misaligned_ones(tmp_path, capsys):
    """`python -m benchmarks.significance`: the JSON line is `paired_bootstrap` of the files' lines (references
    read from .gz too); files of different lengths are an error that names the counts."""
    import gzip

    from benchmarks.significance import main, paired_bootstrap

    references = [f"der hund {i} sieht das haus" for i in range(30)]
    baseline = [ref if i % 2 else "der hund" for i, ref in enumerate(references)]
    system = [ref if i % 5 else "das haus" for i, ref in enumerate(references)]
    for name, lines in (("baseline.txt", baseline), ("system.txt", system)):
        (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "ref.de.gz", "wt", encoding="utf-8") as f:
        f.write("\n".join(references) + "\n")
    args = ["--baseline", str(tmp_path / "baseline.txt"), "--system", str(tmp_path / "system.txt")]
    assert main([*args, "--references", str(tmp_path / "ref.de.gz"), "--samples", "100"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "baseline": args[1],
        "system": args[3],
        **paired_bootstrap(baseline, system, references, samples=100),
    }
    assert printed["bleu_delta"] > 0
    (tmp_path / "short.txt").write_text("\n".join(references[:-1]) + "\n", encoding="utf-8")
    assert main([*args, "--references", str(tmp_path / "short.txt")]) == 2
    assert "same number of lines" in capsys.readouterr().err
    assert main([*args, "--references", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
