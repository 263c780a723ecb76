"""Benchmarks (`bench.py`) and ablations (`ablate.py`): the measuring code behind the two thin entry points.

Benchmarks, each printing one JSON object per measured setting:

- `train_speed`: our training step against a Keras-layers reference model of the same size (`reference_model`),
  per precision and XLA setting, with model FLOPs utilisation (`flops`).
- `decode_speed`: translation throughput (greedy / beam, cached / full recompute, XLA on / off).
- `attention_memory`: time and peak memory of full, chunked and local self-attention over sequence lengths.
- `input_speed`: the input pipeline alone, against what training consumes.

Ablations: `variants` (the configurations and the claims they test), `ablation` (train and evaluate each variant
with the real trainer), `mask_fill` (a unit-level check of the attention mask fill), `run_metrics` (what a run
directory recorded), `ablation_report` (the markdown).
"""
