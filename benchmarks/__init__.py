"""Benchmarks (`bench.py`) and ablations (`ablate.py`): the measuring code behind the two thin entry points.

A top-level package outside the product: it imports the product (`nmt`, `data`, `transformer`, `common`), and
nothing in the product imports it (tests/benchmarks/test_layering.py enforces this).

Benchmarks, each printing one JSON object per measured setting:

- `train_speed`: our training step against a Keras-layers reference model of the same size (`reference_model`),
  per precision and XLA setting, with model FLOPs utilisation (`flops`).
- `decode_speed`: translation throughput (greedy / beam, cached / full recompute, XLA on / off).
- `decode_engines`: the same model in CTranslate2 (float32, int8) and TensorFlow int8, with BLEU, speed-ups
  against the TensorFlow rows and sacreBLEU's paired bootstrap (`significance`).
- `attention_memory`: time and peak memory of full, chunked and local self-attention over sequence lengths.
- `input_speed`: the input pipeline alone, against what training consumes.
- `input_scale`: preparation and first batch on synthetic corpora of 0.5M and 5M pairs (`synthetic_corpus`).
- `refusal`: how long train.py takes to refuse a run directory another training holds.

Ablations: `variants` (the configurations and the claims they test), `ablation` (train and evaluate each variant
with the real trainer), `mask_fill` (a unit-level check of the attention mask fill), `run_metrics` (what a run
directory recorded), `ablation_report` (the markdown).
"""
