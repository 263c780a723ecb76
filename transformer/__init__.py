"""The Transformer model and its decoding, and nothing else (no files, no configs except in `model.build_model`).

- `attention`: scaled dot-product, chunked and local attention, mask builders (pure functions).
- `multi_head`: `MultiHeadAttention` (projections, Q/K/V sharing, KV cache).
- `feed_forward`, `positional`, `residual`, `encoder_layer`, `decoder_layer`: the layers; `dropout`: their dropout;
  `layer_norm`: their layer normalisation (float32 math, a written-out gradient).
- `model`: `Transformer` (`encode`, `init_cache`, `decode_step`, ...) and `build_model(config, ...)`.
- `decoding`: greedy and beam search over a step function (`search_ops`: what the two share); `step_fns`: step
  functions from a model.
- `vocab`: the special token ids.
"""
