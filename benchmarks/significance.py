"""sacreBLEU's paired bootstrap of two systems' translations of the same sentences, so noise is not read as a change.

Also a command: ``python -m benchmarks.significance --baseline A.txt --system B.txt --references REF[.gz]`` prints
one JSON line (the files named, then `paired_bootstrap`'s result), e.g. for two runs' ``hypotheses.test.txt``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

BOOTSTRAP_SAMPLES = 1000  # sacreBLEU's default for the paired bootstrap
SIGNIFICANCE = 0.05


def paired_bootstrap(
    baseline: list[str],
    system: list[str],
    references: list[str],
    target_language: str = "",
    samples: int = BOOTSTRAP_SAMPLES,
    lowercase: bool = False,
) -> dict:
    """sacreBLEU's paired bootstrap resampling (`sacrebleu.significance.PairedTest`, ``test_type="bs"``; its seed,
    ``SACREBLEU_SEED``, defaults to 12345) of `system` against `baseline`, BLEU with the signature of `score_corpus`.

    Returns `bleu_delta` (system - baseline), sacreBLEU's `p_value` (that a difference this large arises from the
    sentences sampled, not the systems), `ci95` (half-width of the system's 95% bootstrap interval), the number of
    identical translations and a `verdict`. sacreBLEU gives identical systems a small p-value on purpose (a zero
    difference is "not attributed to chance"), so identical outputs have the verdict "identical translations".
    `lowercase`: case-insensitive BLEU (that of `score_corpus`'s `bleu_lc_tok`, and of a run trained with
    `data.lowercase`), e.g. to compare such a run with a cased one; identical then means up to case.
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    from nmt.scores import bleu_tokenizer

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # one INFO line per step of the test otherwise
    # score_corpus' tokenizer (MeCab for ja/ko too) and, with `lowercase`, its lowercasing: the tokenizer's own
    # rule on both sides first (before 2026-12-07d a final sigma scored otherwise than the row's own BLEU)
    tokenize = bleu_tokenizer(target_language)
    if lowercase:
        from data.tokenizer_training import lowercase_table

        table = lowercase_table()
        baseline, system = [t.translate(table) for t in baseline], [t.translate(table) for t in system]
        references = [t.translate(table) for t in references]
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU(tokenize=tokenize, lowercase=lowercase)},
        references=[list(references)],
        test_type="bs",
        n_samples=samples,
    )
    _, scores = test()
    base, result = scores["BLEU"]
    fold = str.lower if lowercase else str  # what BLEU compares
    same = sum(fold(a) == fold(b) for a, b in zip(baseline, system))
    delta = result.score - base.score
    if same == len(system):
        verdict = "identical translations"
    elif result.p_value < SIGNIFICANCE and delta:
        verdict = "significant gain" if delta > 0 else "significant loss"
    elif not delta:
        verdict = "equal BLEU"
    else:
        verdict = f"not significant (p >= {SIGNIFICANCE})"
    return {
        "bleu_delta": round(delta, 2),
        "p_value": round(float(result.p_value), 4),
        "baseline_bleu": round(base.score, 2),
        "bleu": round(result.score, 2),
        "ci95": round(float(result.ci), 2),
        "same_translations": same,
        "sentences": len(system),
        "samples": samples,
        "lowercase": lowercase,
        "verdict": verdict,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.significance",
        description="sacreBLEU's paired bootstrap of SYSTEM's translations against BASELINE's (the same sentences, "
        "line by line); prints one JSON line: bleu_delta (system - baseline), p_value, verdict, ...",
    )
    parser.add_argument("--baseline", required=True, help="the baseline's translations, one per line")
    parser.add_argument("--system", required=True, help="the compared system's translations, one per line")
    parser.add_argument("--references", required=True, help="references, line-aligned (.gz is read as gzip)")
    parser.add_argument("--target-language", default="", help="e.g. zh for sacreBLEU's Chinese tokenizer")
    parser.add_argument("--samples", type=int, default=BOOTSTRAP_SAMPLES, help="bootstrap resamples")
    parser.add_argument(
        "--lowercase",
        action="store_true",
        help="case-insensitive BLEU (evaluate.py's bleu_lc_tok), e.g. against a run trained with data.lowercase",
    )
    args = parser.parse_args(argv)
    # gzip-aware, and splits on "\n" only, as the hypothesis files are written (not on other Unicode breaks)
    from data.errors import DataError
    from data.multi30k import read_lines

    if args.samples < 1:
        print(f"significance: --samples must be at least 1, got {args.samples}", file=sys.stderr)
        return 2
    try:
        texts = {name: read_lines(getattr(args, name)) for name in ("baseline", "system", "references")}
    except DataError as error:
        print(f"significance: {error}", file=sys.stderr)
        return 2
    counts = {name: len(lines) for name, lines in texts.items()}
    if len(set(counts.values())) != 1 or not counts["references"]:
        print(
            f"significance: the files must have the same number of lines (and some): {counts}",
            file=sys.stderr,
        )
        return 2
    result = paired_bootstrap(
        texts["baseline"],
        texts["system"],
        texts["references"],
        args.target_language,
        args.samples,
        args.lowercase,
    )
    print(json.dumps({"baseline": args.baseline, "system": args.system, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
