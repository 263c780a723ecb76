"""Export a run directory as a SavedModel: raw strings in, translations out, tokenizer and beam search inside.

    module = TranslationModule(model, tokenizer, eval_config, beam_size=4)
    export_saved_model(module, "runs/base/export")

    import tensorflow as tf, tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
    serve = tf.saved_model.load("runs/base/export").signatures["serving_default"]
    serve(inputs=tf.constant(["A man sleeps."]))["outputs"]     # -> tf.string (1,)

The `serving_default` signature takes `inputs`, a 1-D tf.string tensor of sentences, and returns
`{"outputs": 1-D tf.string}`, one translation each (blank inputs give ""), as translate.py writes it (no surrounding
whitespace). It decodes exactly like `Translator`
(same truncation, per-sentence length limits and search), in one batch; the output buffer is the model's whole
position table, so the sequences never need a retrace.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import tensorflow as tf

from nmt.batch_decoding import MAX_CHARS_GROWTH
from nmt.publish import publish_directory, staging_directory
from nmt.translator import decode_batch, output_limits
from transformer.vocab import EOS_ID, PAD_ID

log = logging.getLogger(__name__)

# Python's whitespace (`str.isspace`: what `line.strip()` removes) as an RE2 class; tf.strings.strip knows ASCII only.
BLANK = r"[\t-\r\x{1c}-\x{20}\x{85}\p{Z}]*"


def strip_blanks(texts: tf.Tensor) -> tf.Tensor:
    """Python's `str.strip()` on a tf.string tensor: the whitespace of `BLANK` removed at both ends."""
    return tf.strings.regex_replace(texts, f"^{BLANK}|{BLANK}$", "")


class TranslationModule(tf.Module):
    """A tf.Module holding the tokenizer (SentencePiece as tracked resources and assets) and the model.

    Args:
      model: a built Transformer (its variables are tracked, not copied).
      tokenizer: a `data.tokenizer.Tokenizer`.
      eval_config: `EvalConfig` (alpha, max_length_a, max_length_b, and beam_size unless given).
      beam_size: beam width baked into the graph (1 = greedy).
      max_source_length: source subwords with EOS; default: the model's position table.
    """

    def __init__(
        self, model, tokenizer, eval_config, *, beam_size: int | None = None, max_source_length=None
    ):
        super().__init__(name="translator")
        self.model = model
        self.tokenizer = tokenizer
        self.model_variables = list(model.variables)  # explicit tracking, whatever Keras' own tracking does
        self.beam_size = int(beam_size or eval_config.beam_size)
        self.alpha = float(eval_config.alpha)
        self.max_length_a = float(eval_config.max_length_a)
        self.max_length_b = int(eval_config.max_length_b)
        self.max_target_length = int(model.max_length)
        self.max_source_length = int(min(max_source_length or model.max_length, model.max_length))
        # The characters of an input tokenized: the Translator's bound (`nmt.batch_decoding.source_ids`), beyond
        # which neither keeps more; memory stays bounded (before 2026-12-07d a 4 MB input took 650 MB).
        self.max_chars = MAX_CHARS_GROWTH * tokenizer.source_chars_for(self.max_source_length)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="inputs")], autograph=False)
    def serve(self, inputs):
        """inputs: tf.string (B,) -> {"outputs": tf.string (B,)}."""
        # Bytes first (a cheap bound: a character is at most 4, one cut in two at the end is past max_chars),
        # invalid UTF-8 replaced as translate.py reads files (Python's errors="replace": U+FFFD), then characters.
        start = tf.strings.substr(inputs, 0, 4 * self.max_chars + 4, unit="BYTE")
        start = tf.strings.unicode_transcode(start, "UTF-8", "UTF-8", errors="replace")
        start = tf.strings.substr(start, 0, self.max_chars, unit="UTF8_CHAR")
        pieces = self.tokenizer.tokenize_source(start)[:, : self.max_source_length - 1]  # (B, None)
        lengths = tf.cast(pieces.row_lengths(), tf.int32)  # (B,)
        eos = tf.fill([pieces.nrows(), 1], tf.constant(EOS_ID, tf.int32))
        source = tf.concat([pieces, eos], axis=1).to_tensor(default_value=PAD_ID)  # (B, S)
        limits = output_limits(lengths, self.max_length_a, self.max_length_b, self.max_target_length)
        ids, _ = decode_batch(
            self.model,
            source,
            limits,
            max_length=self.max_target_length,
            beam_size=self.beam_size,
            alpha=self.alpha,
        )  # (B, K, max_length)
        # translate.py's output line: no surrounding whitespace (a lossless detokenizer keeps a final "▁"'s space)
        texts = strip_blanks(self.tokenizer.detokenize_target(ids[:, 0]))  # (B,)
        blank = tf.strings.regex_full_match(inputs, BLANK)  # what Translator skips: `not line.strip()`
        return {"outputs": tf.where(blank, tf.constant("", tf.string), texts)}


def savedmodel_output_problem(output: str | Path) -> str | None:
    """Why a SavedModel cannot be exported to `output` (a file, or a non-empty directory that is not a SavedModel:
    never replaced), or None (absent, empty, or an export to replace)."""
    output = Path(os.path.abspath(output))
    if output.exists() and not (output / "saved_model.pb").is_file():
        if not output.is_dir() or any(output.iterdir()):
            return f"{output} exists and is not a SavedModel: choose another --output"
    return None


def export_saved_model(module: TranslationModule, output: str | Path) -> Path:
    """Writes the SavedModel to `output` through a staging directory (`nmt.publish`; an older export is replaced).

    Returns `output` made absolute (so "." or "dir/.." have a name to put the temporary directory next to).
    """
    output = Path(os.path.abspath(output))
    staging = staging_directory(output, last="saved_model.pb")  # first: removes killed exports' leftovers
    if problem := savedmodel_output_problem(output):
        raise FileExistsError(problem)
    try:
        signature = module.serve.get_concrete_function()
        tf.saved_model.save(module, str(staging), signatures={"serving_default": signature})
        publish_directory(staging, output, last="saved_model.pb")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return output


def export_run_dir(
    model_dir: str | Path, output: str | Path, *, beam_size: int | None = None, weights="auto"
):
    """Loads a run directory and exports it; returns (output path, the TranslationModule)."""
    from nmt.translator import Translator

    translator = Translator.from_run_dir(model_dir, weights=weights)
    module = TranslationModule(
        translator.model, translator.tokenizer, translator.eval_config, beam_size=beam_size
    )
    return export_saved_model(module, output), module


def load_exported(path: str | Path):
    """The `serving_default` function of an exported SavedModel (registers the tensorflow_text ops first)."""
    import tensorflow_text  # noqa: F401

    return tf.saved_model.load(str(path)).signatures["serving_default"]
