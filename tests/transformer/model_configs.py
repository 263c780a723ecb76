"""The `model:` section of a tiny Transformer, shared by the transformer tests (no config file, no `nmt`)."""

import types


def tiny_config(**overrides) -> types.SimpleNamespace:
    """A one-layer d_model-32 model with no dropout; `overrides` replace any field."""
    values = dict(
        d_model=32,
        num_heads=4,
        d_ff=64,
        num_layers=1,
        dropout=0.0,
        attention_dropout=0.0,
        norm="post",
        residual=True,
        share_embeddings=True,
        tie_output=True,
        share_qkv="none",
        attention="full",
        chunk_size=4,
        window=3,
        scale=None,
        mask_fill="auto",
        max_length=32,
    )
    values.update(overrides)
    return types.SimpleNamespace(**values)
