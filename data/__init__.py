"""Config -> `tf.data.Dataset`s of token ids, and the tokenizer. The data flows one way:

    source (data.stream: TFDS catalog, Multi30k builder, folder) -> tokenizer (data.tokenizer)
      -> prepared data (data.prepare -> data.store, under data.cache keys) -> batches (data.batching, data.pipeline)

- `data.config`: `DataConfig` (the `data:` section) and `load_data_config` for the data CLIs.
- `data.multi30k`: a TFDS builder for Multi30k (WMT16 multimodal task 1, text only), offline from a mirror.
- `data.corpus`: `load_split`, `load_text_pairs`, `split_sizes` for Multi30k, TFDS catalog datasets and folders.
- `data.stream`: a split as a stream of raw pairs in bounded memory, and its identity (for cache keys).
- `data.cleaning`: empty, invalid UTF-8, over-long and one-sided pairs, counted and dropped.
- `data.tokenizer`: `Tokenizer` (SentencePiece models applied in-graph with tensorflow_text); `data.tokenizer_training`:
  `train_tokenizer` (SentencePiece, on a seeded sample of the train split).
- `data.prepare`: `python -m data.prepare --config CONFIG`: tokenizer trained once, splits tokenized once.
- `data.cache`, `data.store`: where prepared splits live, their token arrays and length index, and reading them.
- `data.batching`: the seeded, checkpointable sampler of bucketed batches over a prepared split.
- `data.pipeline`: `make_train_dataset`, `make_eval_dataset`, `bucket_edges` and composable transforms.
- `data.stats`: `python -m data.stats --config CONFIG` prints one JSON line of corpus and pipeline statistics.

Nothing is imported here, so `import data.corpus` does not pull in TensorFlow Text and vice versa. `data` imports
nothing from `nmt` or `transformer` (special ids and config loading come from the leaf package `common`).
"""
