"""sacreBLEU's scores of a corpus of hypotheses: BLEU and chrF as sacreBLEU computes them for the target language,
with their signatures, and the lowercased tokenized BLEU (`bleu_lc_tok`) papers report.

Used by evaluate.py (`nmt.evaluation`), the trainer's validation BLEU and the decoding benchmarks: one definition of
the numbers the project prints.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Sequence

log = logging.getLogger(__name__)


# sacreBLEU's own tokenizer for a target language (`BLEU(trg_lang=...)`); 13a, its default, for every other one.
LANGUAGE_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}


@functools.cache
def bleu_tokenizer(target_language: str) -> str:
    """The tokenizer sacreBLEU's BLEU uses for `target_language` (e.g. "de", "ja", "zh-TW"); 13a, with a warning
    naming what to install, where that tokenizer's extra dependencies (MeCab for ja and ko) are missing: the
    signature then says tok:13a, which is what was measured."""
    from sacrebleu.metrics import BLEU

    tokenize = LANGUAGE_TOKENIZERS.get(re.split(r"[-_]", target_language.lower())[0], "13a")
    try:
        BLEU(tokenize=tokenize)
    except (ImportError, RuntimeError) as err:
        extra = target_language.lower()[:2]
        log.warning(
            "BLEU for %r: sacreBLEU's tokenizer %s is not installed (%s; pip install 'sacrebleu[%s]'): scoring with "
            "13a instead (the signature says so; not comparable with %s scores)", target_language, tokenize, err,
            extra, tokenize,
        )  # fmt: skip
        return "13a"
    return tokenize


def score_corpus(
    hypotheses: Sequence[str], references: Sequence[str], target_language: str = "", lowercase: bool = False
) -> dict:
    """sacreBLEU BLEU (cased, detokenized, sacreBLEU's tokenizer for the target language: `bleu_tokenizer`), chrF
    and the lowercased tokenized BLEU, with signatures.

    `lowercase`: the hypotheses come from a model trained on lowercased text; BLEU and chrF ignore case. Both
    sides are first lowercased as the tokenizer lowercases (character by character,
    `data.tokenizer_training.lowercase_table`), then by sacreBLEU: its `str.lower()` of a line writes a final
    sigma where the model, trained on the tokenizer's lowercasing, writes σ (before 2026-12-07d a model reproducing
    "ΜΑΣ" as "μασ" lost that word)."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    hypotheses, references = list(hypotheses), list(references)
    if lowercase:
        from data.tokenizer_training import lowercase_table

        table = lowercase_table()
        hypotheses, references = (
            [h.translate(table) for h in hypotheses],
            [r.translate(table) for r in references],
        )
    references = [references]
    tokenize = bleu_tokenizer(target_language)
    bleu_metric, chrf_metric = BLEU(tokenize=tokenize, lowercase=lowercase), CHRF(lowercase=lowercase)
    lc_metric = BLEU(lowercase=True, tokenize=tokenize)
    bleu = bleu_metric.corpus_score(hypotheses, references)
    chrf = chrf_metric.corpus_score(hypotheses, references)
    lc = lc_metric.corpus_score(hypotheses, references)
    return {
        "bleu": bleu.score,
        "chrf": chrf.score,
        "signature": str(bleu_metric.get_signature()),
        "bleu_detail": str(bleu),
        "chrf_signature": str(chrf_metric.get_signature()),
        "bleu_lc_tok": lc.score,
        "bleu_lc_tok_signature": str(lc_metric.get_signature()),
        **({"lowercase": True} if lowercase else {}),
    }
