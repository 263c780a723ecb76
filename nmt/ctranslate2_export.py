"""Export a trained Transformer to CTranslate2: the same network, run by CTranslate2's C++ decoder.

    export_run_dir_ctranslate2("runs/base", "runs/base/ct2", quantization="int8")

    # then, with `nmt.ctranslate2_engine.CTranslate2Translator` (or plain ctranslate2 + sentencepiece):
    python translate.py --model-dir runs/base --engine ctranslate2 --engine-dir runs/base/ct2 < in.en

The model is built through CTranslate2's `TransformerSpec` from our weights, not through a converter of another
toolkit: Post-LN (or Pre-LN with its final norms), our layer and head counts, LayerNorm epsilon 1e-6, embeddings
scaled by sqrt(d_model), **our sinusoidal table written into the spec** (ours interleaves sin/cos per dimension
pair; CTranslate2's built-in table concatenates them), with position 0 the first source token and the decoder start
token (our BOS), as in ours. Keras kernels ``(in, out)`` become CTranslate2 weights ``(out, in)``; self-attention Q/K/V
are fused into one ``(3 d_model, d_model)`` linear, cross-attention K/V into one ``(2 d_model, d_model)``. Shared
and tied embeddings stay shared (CTranslate2 aliases equal arrays, int8 included).

PAD and BOS are never generated (as in `transformer.step_fns`): the output projection gets a bias of `FORBIDDEN_BIAS`
on those ids and 0 elsewhere, so their probability is exactly 0 in float32 (``exp(-1e9)`` underflows) and every
other log-probability is unchanged. The bias is part of the model (biases are never quantized), so any CTranslate2
client gets the same behaviour, without options.

The export directory holds CTranslate2's ``model.bin``, ``config.json`` and ``shared_vocabulary.json`` (or source and
target vocabularies: the SentencePiece pieces in id order, the embedding rows beyond the pieces as ``<nmt_unused_N>``),
our SentencePiece model(s) (``spm.model``, or ``spm.source.model`` and ``spm.target.model``) and `METADATA`
(``nmt_export.json``: languages, eval settings, maximum lengths, quantization, tokenizer fingerprint, weights). The
source EOS is added by CTranslate2 (``add_source_eos``), so a client feeds the SentencePiece pieces alone. Reading
and checking an export (`read_export_metadata`, `METADATA`, `ExportError`, ...) is `nmt.ctranslate2_format`'s,
re-exported here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from common.os_errors import naming
from common.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from nmt.checkpoints import checkpoint_digest
from nmt.ctranslate2_format import (  # noqa: F401 - re-exported: callers import them from here
    COMPUTE_TYPES,
    CTRANSLATE2_PIN,
    FORMAT,
    FORMAT_VERSION,
    METADATA,
    ExportError,
    import_ctranslate2,
    read_export_metadata,
    stored_checkpoints,
)
from nmt.publish import publish_directory, staging_directory

log = logging.getLogger(__name__)

__all__ = [
    "FORBIDDEN_BIAS",
    "METADATA",
    "QUANTIZATIONS",
    "ExportError",
    "UnsupportedModelError",
    "build_spec",
    "export_ctranslate2",
    "export_run_dir_ctranslate2",
    "import_ctranslate2",
    "read_export_metadata",
]

QUANTIZATIONS = ("float32", "int8")
FORBIDDEN_BIAS = -1.0e9  # the logit shift of PAD and BOS, like `transformer.step_fns`
# the names of the embedding rows past the SentencePiece pieces (vocabularies are padded to a multiple of 8)
UNUSED_PIECE = "<nmt_unused_{}>"


class UnsupportedModelError(ExportError):
    """The model has a feature CTranslate2 cannot run (a model problem, not a usage error: export.py exits 1)."""


def _check_supported(model) -> None:
    problems = []
    if not model.residual:
        problems.append("residual=False")
    if model.attention == "local":
        problems.append("attention='local' (a banded encoder mask)")
    if model.soft_cap is not None:
        problems.append(f"soft_cap={model.soft_cap}")
    if model.mask_fill != "auto":
        problems.append(f"mask_fill={model.mask_fill!r}")
    activation = model.encoder_layers[0].feed_forward.activation
    if activation != "relu":
        problems.append(f"activation={activation!r}")
    if problems:
        raise UnsupportedModelError(f"CTranslate2 has no equivalent of this model's {', '.join(problems)}")


def _vocabulary(model_proto: bytes, size: int) -> list[str]:
    """Pieces in id order, padded to `size` rows with unused names that collide with no piece."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_proto)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    taken, extra, index = set(pieces), [], len(pieces)
    while len(pieces) + len(extra) < size:
        name = UNUSED_PIECE.format(index)
        if name not in taken:
            extra.append(name)
        index += 1
    return pieces + extra


def _array(variable) -> np.ndarray:
    return np.asarray(variable.numpy(), np.float32)  # variables are float32 under every precision policy


def _linear(spec, dense) -> None:
    _fused(spec, [dense])


def _fused(spec, denses) -> None:
    """One linear from Dense layers, their outputs stacked in order (Q, K, V or K, V): CTranslate2 weights are
    ``(out, in)``, Keras kernels ``(in, out)``."""
    spec.weight = np.concatenate([_array(d.kernel).T for d in denses], axis=0)  # (n * out, in)
    spec.bias = np.concatenate([_array(d.bias) for d in denses], axis=0)  # (n * out,)


def _norm(spec, layer_norm) -> None:
    spec.gamma = _array(layer_norm.gamma)
    spec.beta = _array(layer_norm.beta)


def _attention(spec, attention, norm, *, self_attention: bool, scale) -> None:
    if self_attention:
        _fused(spec.linear[0], [attention.wq, attention.wk, attention.wv])
    else:
        _fused(spec.linear[0], [attention.wq])
        _fused(spec.linear[1], [attention.wk, attention.wv])
    _linear(spec.linear[-1], attention.wo)
    _norm(spec.layer_norm, norm)
    if scale is not None:
        spec.queries_scale = np.float32(scale)


def _ffn(spec, layer) -> None:
    _linear(spec.linear_0, layer.feed_forward.hidden)
    _linear(spec.linear_1, layer.feed_forward.output_dense)
    _norm(spec.layer_norm, layer.feed_forward_norm)


def build_spec(model, tokenizer):
    """A validated-ready ``ctranslate2.specs.TransformerSpec`` holding `model`'s weights (float32)."""
    import_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    from transformer.positional import positional_encoding

    _check_supported(model)
    pre_norm = model.norm == "pre"
    common = dict(pre_norm=pre_norm, activation=common_spec.Activation.RELU)
    encoder = transformer_spec.TransformerEncoderSpec(model.num_layers, model.num_heads, **common)
    decoder = transformer_spec.TransformerDecoderSpec(model.num_layers, model.num_heads, **common)
    spec = transformer_spec.TransformerSpec(encoder, decoder)

    table = positional_encoding(model.max_length, model.d_model)  # (max_length, d_model), ours: interleaved
    encoder.embeddings[0].weight = _array(model.source_embedding.embeddings)  # (V, d_model)
    encoder.position_encodings.encodings = table
    decoder.embeddings.weight = _array(model.target_embedding.embeddings)
    decoder.position_encodings.encodings = table
    scale = dict(scale=model.scale)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers):
        self_attention = (layer.self_attention, layer.self_attention_norm)
        _attention(layer_spec.self_attention, *self_attention, self_attention=True, **scale)
        _ffn(layer_spec.ffn, layer)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers):
        self_attention = (layer.self_attention, layer.self_attention_norm)
        _attention(layer_spec.self_attention, *self_attention, self_attention=True, **scale)
        cross_attention = (layer.cross_attention, layer.cross_attention_norm)
        _attention(layer_spec.attention, *cross_attention, self_attention=False, **scale)
        _ffn(layer_spec.ffn, layer)
    if pre_norm:
        _norm(encoder.layer_norm, model.encoder_norm)
        _norm(decoder.layer_norm, model.decoder_norm)

    vocab_size = model.target_vocab_size
    bias = np.zeros((vocab_size,), np.float32)
    bias[[PAD_ID, BOS_ID]] = FORBIDDEN_BIAS
    if model.tie_output:
        # (V, d_model), the same array: CTranslate2 stores it once (an alias), int8 scales included
        decoder.projection.weight = decoder.embeddings.weight
        decoder.projection.bias = bias
    else:
        _linear(decoder.projection, model.output_projection)
        decoder.projection.bias = decoder.projection.bias + bias

    source_model, target_model = tokenizer.models
    source_vocab = _vocabulary(source_model, model.source_vocab_size)
    target_vocab = source_vocab if target_model is None else _vocabulary(target_model, vocab_size)
    spec.register_source_vocabulary(source_vocab)
    spec.register_target_vocabulary(target_vocab)
    config = spec.config
    config.layer_norm_epsilon = 1e-6  # Keras LayerNormalization of transformer.residual.layer_norm
    config.unk_token = target_vocab[UNK_ID]
    config.bos_token = target_vocab[BOS_ID]
    config.eos_token = target_vocab[EOS_ID]
    config.decoder_start_token = target_vocab[BOS_ID]  # position 0 of the decoder, like our BOS
    config.add_source_bos = False
    config.add_source_eos = True  # our source is pieces + EOS
    return spec


def _metadata(
    model, tokenizer, quantization: str, *, eval_config=None, data_config=None, weights=None
) -> dict:
    import ctranslate2

    source_model, target_model = tokenizer.models
    digest = checkpoint_digest(weights) if weights else None
    record = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "ctranslate2_version": ctranslate2.__version__,
        "quantization": quantization,
        "compute_type": COMPUTE_TYPES[quantization],
        "max_source_length": int(model.max_length),  # source pieces + EOS fed to the encoder
        "position_table": int(model.max_length),  # decoder positions (BOS at 0)
        "tokenizer": {
            "files": ["spm.model"] if target_model is None else ["spm.source.model", "spm.target.model"],
            "fingerprint": tokenizer.fingerprint,
        },
        "vocab": {"source": int(model.source_vocab_size), "target": int(model.target_vocab_size)},
        "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
        "forbidden_ids": [PAD_ID, BOS_ID],
        # a stored checkpoint's absolute prefix (a relative one would be read from the current directory)
        "weights": os.path.abspath(weights) if digest else weights,
        # the weights' identity, whatever the run directory is called now (nmt.ctranslate2_engine checks it)
        "weights_digest": digest,
    }
    if eval_config is not None:
        record["eval"] = {
            key: getattr(eval_config, key)
            for key in ("beam_size", "alpha", "max_length_a", "max_length_b", "batch_size")
        }
    if data_config is not None:
        record["source_language"], record["target_language"] = data_config.source, data_config.target
    return record


def _names_our_format(directory: Path) -> bool:
    """Whether `directory`'s METADATA says it is this project's export, whatever else it holds."""
    try:
        return json.loads((directory / METADATA).read_text(encoding="utf-8")).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def ctranslate2_output_problem(output_dir: str | Path) -> str | None:
    """Why a CTranslate2 export cannot go to `output_dir` (an existing path that is neither empty nor an export,
    ours even damaged: never replaced), or None."""
    output = Path(os.path.abspath(output_dir))
    if output.exists() and not (output.is_dir() and not any(output.iterdir())):
        try:
            read_export_metadata(output)
        except ExportError as err:
            if not _names_our_format(output):  # ours, damaged or from older code: replaced, as engines advise
                return f"{output} exists and is not a CTranslate2 export ({err}): choose another --output"
    return None


def export_ctranslate2(
    model,
    tokenizer,
    output_dir: str | Path,
    *,
    quantization: str = "float32",
    eval_config=None,
    data_config=None,
    weights: str | None = None,
) -> Path:
    """Writes `model` (a built `transformer.model.Transformer`) and `tokenizer` as a CTranslate2 model directory.

    Args:
      quantization: "float32", or "int8" (int8 weights, float32 activations between the int8 matrix products).
      eval_config, data_config: the run's `EvalConfig` and `DataConfig`, recorded in `METADATA` (eval settings,
        languages) so the export can be used without the run directory.
      weights: the checkpoint the weights came from, recorded in `METADATA` (a stored one: absolute, and its digest).

    Returns:
      `output_dir`, made absolute. It is written through a staging directory and put in place at the end
      (`nmt.publish`); an existing export there is replaced, any other existing non-empty path is refused
      (ExportError) and left untouched.
    """
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    ctranslate2 = import_ctranslate2()
    output = Path(os.path.abspath(output_dir))  # "." has no name for a sibling staging directory
    staging = staging_directory(output, last=METADATA)  # first: removes killed exports' leftovers
    if problem := ctranslate2_output_problem(output):
        raise ExportError(problem)
    spec = build_spec(model, tokenizer)

    class _Converter(ctranslate2.converters.Converter):
        def _load(self):
            return spec

    try:
        with naming(output):  # the converter's writes name no file: a full disk said only "[Errno 28] ..."
            _Converter().convert(str(staging), quantization=COMPUTE_TYPES[quantization])
            tokenizer.save(staging)  # spm.model (joint) or spm.source.model + spm.target.model
            record = _metadata(
                model,
                tokenizer,
                quantization,
                eval_config=eval_config,
                data_config=data_config,
                weights=weights,
            )
            (staging / METADATA).write_text(
                json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8"
            )
            publish_directory(staging, output, last=METADATA)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("wrote the CTranslate2 model %s (%s)", output, quantization)
    return output


def export_run_dir_ctranslate2(
    model_dir: str | Path, output: str | Path, *, quantization: str = "float32", weights: str = "auto"
) -> Path:
    """Loads a run directory (config, tokenizer, weights `weights`) and exports it with `export_ctranslate2`."""
    from nmt.translator import Translator

    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {QUANTIZATIONS}, got {quantization!r}")
    import_ctranslate2()  # fail before loading anything
    translator = Translator.from_run_dir(model_dir, weights=weights)
    return export_ctranslate2(
        translator.model,
        translator.tokenizer,
        output,
        quantization=quantization,
        eval_config=translator.config.eval,
        data_config=translator.config.data,
        weights=translator.weights,
    )
