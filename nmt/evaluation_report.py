"""The human-readable report of an evaluation record (`nmt.evaluation.evaluate`), as evaluate.py prints it."""

from __future__ import annotations

import re

NO_WEIGHTS = "not measured: no TensorFlow weights"


def format_report(record: dict) -> str:
    """The human-readable report of an `evaluate` record."""

    def number(key: str, digits: int = 2) -> str:
        value = record.get(key)
        return "n/a" if value is None else f"{value:.{digits}f}"

    lc_tokenizer = re.search(r"tok:([^|]+)", record.get("bleu_lc_tok_signature") or "")
    lc_tokenizer = lc_tokenizer.group(1) if lc_tokenizer else "?"
    lines = [
        f"model dir      {record.get('model_dir', '')} (weights {record.get('weights', '')})",
        f"data           {record.get('split', '')}: {record['num_sentences']} sentences, beam {record['beam']}"
        + (f", alpha {record['alpha']}" if record.get("alpha") is not None and record["beam"] > 1 else ""),
        f"BLEU           {number('bleu')}   sacreBLEU, detokenized, "
        + (
            "LOWERCASED: the run was trained on lowercased text (data.lowercase)"
            if record.get("lowercase")
            else "cased (the number to report)"
        ),
        f"  signature    {record['signature']}",
        f"  detail       {record['bleu_detail']}",
        f"chrF           {number('chrf')}   {record['chrf_signature']}",
        f"bleu_lc_tok    {number('bleu_lc_tok')}   lowercased, tokenized (tok:{lc_tokenizer}), only to compare with "
        "papers",
        (
            f"loss           {number('loss', 4)} per target token, no label smoothing ({record.get('loss_tokens')} "
            "tokens"
            + (
                f"; {record['loss_pairs_cut']} pairs cut to data.max_length - 1 pieces)"
                if record.get("loss_pairs_cut")
                else ")"
            )
            if record.get("loss") is not None
            # measured over no token (every pair blank), or not measured (a CTranslate2 export alone)
            else f"loss           n/a ({record['loss_note'] if record.get('loss_tokens') == 0 else NO_WEIGHTS})"
        ),
        f"perplexity     {number('perplexity')}",
        f"decoding       {number('seconds', 1)} s, {number('sentences_per_sec', 1)} sentences/s",
    ]
    if record.get("ensemble"):
        lines.insert(
            1, f"ensemble       with {', '.join(record['ensemble'])} (the mean of the models' probabilities)"
        )
    if record.get("engine") == "ctranslate2":
        loss_from = (
            f"loss from the TensorFlow weights {record['loss_weights']}"
            if record.get("loss_weights")
            else record.get("loss_note", "no loss")
        )
        lines.append(
            f"engine         ctranslate2 {record.get('engine_dir')} ({record.get('compute_type')}); {loss_from}"
        )
    if record.get("hypotheses"):
        lines.append(f"hypotheses     {record['hypotheses']}")
    elif record.get("hypotheses_error"):
        lines.append(f"hypotheses     NOT WRITTEN: {record['hypotheses_error']}")
    return "\n".join(lines)
