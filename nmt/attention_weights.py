"""The cross-attention weights of one translated line, for plotting (`nmt.attention_plot`).

`line_attention(translator, line)` is `nmt.translator.Translator.attention`: the line is translated by the
translator's own decoding (the line's first pieces, as `translate` takes them, and its length limits), then the model
is run once over the source and the translation to read each decoder layer's cross-attention weights.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from nmt.batch_decoding import start_pieces
from transformer.vocab import BOS_ID, EOS_ID, PAD_ID

__all__ = ["line_attention", "piece_labels"]


def line_attention(translator, line: str, *, beam_size: int | None = None) -> dict:
    """Translates one line with `translator` (a `Translator`) and returns its cross-attention weights.

    Returns:
      {"source": source pieces (EOS included), "target": output pieces (EOS included), "translation": str,
      "weights": one float32 array (heads, len(target), len(source)) per decoder layer}.
    """
    beam_size = translator.eval_config.beam_size if beam_size is None else beam_size
    tokenizer, max_source_length = translator.tokenizer, translator.max_source_length
    # From the line's start only, as `translate` does: memory bounded for a huge line.
    keep, chars = max_source_length - 1, tokenizer.source_chars_for(max_source_length)
    pieces = start_pieces([line], translator.encode, keep, chars)[0][0][:keep]
    ids, _ = translator._decode([pieces], beam_size, True, translator.uses_xla(1, beam_size))
    output = [int(i) for i in ids[0, 0]]
    output = output[: output.index(EOS_ID)] if EOS_ID in output else [i for i in output if i != PAD_ID]
    source = tf.constant([[*pieces, EOS_ID]], tf.int32)  # (1, S)
    target_in = tf.constant([[BOS_ID, *output]], tf.int32)  # (1, T): row t predicts output token t
    weights = [
        np.asarray(w[0], dtype=np.float32) for w in translator.model.cross_attention(source, target_in)
    ]
    translation = tokenizer.detokenize_target(tf.constant([output], tf.int32))[0].numpy()
    return {
        "source": [*piece_labels(tokenizer, pieces, source=True), "</s>"],
        "target": [*piece_labels(tokenizer, output, source=False), "</s>"],
        "translation": translation.decode("utf-8", errors="replace"),
        "weights": weights,
    }


def piece_labels(tokenizer, ids: list[int], *, source: bool) -> list[str]:
    """A readable label per subword id: its detokenized text, U+2581 for an empty one."""
    if not ids:
        return []
    detokenize = tokenizer.detokenize_source if source else tokenizer.detokenize_target
    texts = detokenize(tf.constant([[i] for i in ids], tf.int32)).numpy()
    return [text.decode("utf-8", errors="replace") or "\u2581" for text in texts]
