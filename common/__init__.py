"""Leaf modules shared by every package (`transformer`, `data`, `nmt`); they import none of them.

- `common.special_ids`: the special token ids (PAD, UNK, BOS, EOS).
- `common.sampling`: sampling settings for decoding (top-k, top-p, temperature, seed), checked.
- `common.config_tree`: YAML config files with inheritance and `--set` overrides; `common.config_build`: the strict
  typed dataclass building and value checks.
- `common.os_errors`: OS errors of writes raised again naming the file they were for.
- `common.progress_bars`: tqdm bars that write whole lines in a log file (`bar_settings`), log records above a
  terminal's bars.
"""
