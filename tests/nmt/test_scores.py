"""sacreBLEU's scores (nmt.scores): BLEU, chrF and the lowercased tokenized BLEU exactly as sacreBLEU computes them,
with the tokenizer sacreBLEU picks for the target language."""

import pytest
import sacrebleu

from nmt.scores import score_corpus


def test_scores_are_sacrebleu_scores():
    hyps = ["The cat sat on the mat.", "A dog barks loudly!", "hello World"]
    refs = ["The cat sat on a mat.", "The dog barks loudly!", "Hello world"]
    scores = score_corpus(hyps, refs, "en")
    assert scores["bleu"] == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert scores["chrf"] == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert scores["bleu_lc_tok"] == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True, tokenize="13a").score
    assert scores["bleu_lc_tok"] > scores["bleu"]  # case differences only count in the cased score
    assert "case:mixed" in scores["signature"] and "tok:13a" in scores["signature"]
    assert "case:lc" in scores["bleu_lc_tok_signature"]
    with pytest.raises(ValueError, match="2 hypotheses but 3 references"):
        score_corpus(hyps[:2], refs)


@pytest.mark.parametrize("language", ["zh", "zh-TW", "ja", "ko", "de"])
def test_bleu_tokenizes_each_target_language_as_sacrebleu_does(language, caplog):
    """sacreBLEU's BLEU(trg_lang=...) picks zh for Chinese, MeCab for Japanese and Korean, 13a for the rest. Where
    MeCab is not installed, 13a with a warning, and a signature that says tok:13a."""
    from sacrebleu.metrics import BLEU

    from nmt.scores import bleu_tokenizer

    bleu_tokenizer.cache_clear()  # its warning comes once per process and language
    hyps, refs = ["你好世界。 こんにちは 안녕하세요"], ["你好 世界。 こんにちは 안녕"]
    try:
        expected_metric = BLEU(trg_lang=language.split("-")[0])
    except (ImportError, RuntimeError):  # sacreBLEU's tokenizer needs packages not installed here
        expected_metric = BLEU(tokenize="13a")
        missing = True
    else:
        missing = False
    scores = score_corpus(hyps, refs, language)
    assert scores["bleu"] == expected_metric.corpus_score(hyps, [refs]).score
    tokenizer = expected_metric.get_signature().info["tok"]
    assert f"tok:{tokenizer}" in scores["signature"] and f"tok:{tokenizer}" in scores["bleu_lc_tok_signature"]
    assert tokenizer == {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}.get(language[:2], "13a") or missing
    assert (f"BLEU for {language!r}: sacreBLEU's tokenizer" in caplog.text) == missing


def test_lowercase_scores_ignore_case_and_say_so():
    """A run trained on lowercased text (data.lowercase) is scored case-insensitively, with a signature that says it."""
    hyps = ["the cat sat on the mat.", "a dog barks loudly!"]
    refs = ["The cat sat on a mat.", "The dog barks loudly!"]
    scores = score_corpus(hyps, refs, "en", lowercase=True)
    assert scores["bleu"] == sacrebleu.corpus_bleu(hyps, [refs], lowercase=True).score
    assert scores["chrf"] == sacrebleu.metrics.CHRF(lowercase=True).corpus_score(hyps, [refs]).score
    assert scores["bleu"] == scores["bleu_lc_tok"] > score_corpus(hyps, refs, "en")["bleu"]
    assert "case:lc" in scores["signature"] and "lc" in scores["chrf_signature"] and scores["lowercase"]
    assert "lowercase" not in score_corpus(hyps, refs, "en")


def test_lowercase_scores_lower_both_sides_as_the_tokenizer_does():
    """The lowercasing tokenizer writes every Σ as σ (character by character); sacreBLEU's `str.lower()` of a line
    writes a final ς. A model reproducing its references exactly scores 100 (before 2026-12-07d: "μασ" against
    "μας", a word lost)."""
    from data.tokenizer_training import lowercase_table

    refs = ["ΤΟ ΣΠΊΤΙ ΤΟΥ ΦΊΛΟΥ ΜΑΣ.", "Ο ΣΚΎΛΟΣ ΤΡΈΧΕΙ ΣΤΟ ΠΆΡΚΟ ΜΑΣ ΣΉΜΕΡΑ."]
    hyps = [ref.translate(lowercase_table()) for ref in refs]
    assert "μασ." in hyps[0] and "μας." in refs[0].lower()  # the two lowercasings differ here
    scores = score_corpus(hyps, refs, "el", lowercase=True)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0), scores
