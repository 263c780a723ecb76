"""Config -> `tf.data.Dataset`s of token ids, and the tokenizer.

- `data.multi30k`: a TFDS builder for Multi30k (WMT16 multimodal task 1, text only), offline from a mirror.
- `data.corpus`: `load_split`, `load_text_pairs`, `split_sizes` for Multi30k, TFDS catalog datasets and folders.
- `data.tokenizer`: `train_tokenizer` (SentencePiece) and `Tokenizer` (applied in-graph with tensorflow_text).
- `data.batching`: the tokenized corpus kept in memory and its seeded, checkpointable bucketed batch sampler.
- `data.pipeline`: `make_train_dataset`, `make_eval_dataset`, `bucket_edges` and composable transforms.
- `data.stats`: `python -m data.stats --config CONFIG` prints one JSON line of corpus and pipeline statistics.

Nothing is imported here, so `import data.corpus` does not pull in TensorFlow Text and vice versa.
"""
