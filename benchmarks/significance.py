"""sacreBLEU's paired bootstrap of two systems' translations of the same sentences, so noise is not read as a change."""

from __future__ import annotations

import logging

BOOTSTRAP_SAMPLES = 1000  # sacreBLEU's default for the paired bootstrap
SIGNIFICANCE = 0.05


def paired_bootstrap(
    baseline: list[str],
    system: list[str],
    references: list[str],
    target_language: str = "",
    samples: int = BOOTSTRAP_SAMPLES,
) -> dict:
    """sacreBLEU's paired bootstrap resampling (`sacrebleu.significance.PairedTest`, ``test_type="bs"``; its seed,
    ``SACREBLEU_SEED``, defaults to 12345) of `system` against `baseline`, BLEU with the signature of `score_corpus`.

    Returns `bleu_delta` (system - baseline), sacreBLEU's `p_value` (that a difference this large arises from the
    sentences sampled, not the systems), `ci95` (half-width of the system's 95% bootstrap interval), the number of
    identical translations and a `verdict`. sacreBLEU gives identical systems a small p-value on purpose (a zero
    difference is "not attributed to chance"), so identical outputs have the verdict "identical translations".
    """
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # one INFO line per step of the test otherwise
    tokenize = "zh" if target_language.lower().startswith("zh") else None
    test = PairedTest(
        [("baseline", list(baseline)), ("system", list(system))],
        {"BLEU": BLEU(tokenize=tokenize)},
        references=[list(references)],
        test_type="bs",
        n_samples=samples,
    )
    _, scores = test()
    base, result = scores["BLEU"]
    same = sum(a == b for a, b in zip(baseline, system))
    delta = result.score - base.score
    if same == len(system):
        verdict = "identical translations"
    elif result.p_value < SIGNIFICANCE:
        verdict = "significant gain" if delta > 0 else "significant loss"
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
        "verdict": verdict,
    }
