"""The ablation variants (config overrides), grouped by the claim they test, and the claims themselves.

Every variant is the config under test plus its overrides, trained from the same seed for the same wall-clock
budget; `baseline` (the config as is: Post-LN, independent Q/K/V, 1/sqrt(d_k), dtype-aware mask fill, clipnorm on,
residuals on) is shared by every group. The mask-fill group is measured at unit level (`benchmarks.mask_fill`); its
trained variants exist but are not in the default list.
"""

from __future__ import annotations

import dataclasses

BASELINE = "baseline"


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    group: str
    overrides: tuple[str, ...]  # `--set` overrides on top of the config; "{d_head}" is replaced per config
    description: str


VARIANTS = (
    Variant(BASELINE, "all", (), "the config as is (Post-LN, independent Q/K/V, 1/sqrt(d_k), auto fill, clip, residual)"),
    Variant("qkv_qk", "qkv", ("model.share_qkv=qk",), "Q and K share one projection (self-attention)"),
    Variant("qkv_all", "qkv", ("model.share_qkv=all",), "Q, K and V share one projection (self-attention)"),
    Variant("scale_unscaled", "scale", ("model.scale=1.0",), "no 1/sqrt(d_k) scaling"),
    Variant("scale_over", "scale", ("model.scale={over_scale}",), "over-scaled by 1/d_k"),
    Variant("pre_ln", "stability", ("model.norm=pre",), "Pre-LN (with clip and residual: all three)"),
    Variant("no_clip", "stability", ("train.clipnorm=0",), "no gradient clipping"),
    Variant("no_residual", "stability", ("model.residual=false",), "no residual connections"),
    Variant("mask_1e9", "mask", ("model.mask_fill=-1.0e+9",), "additive -1e9 fill (float32)"),
    Variant("mask_1e3", "mask", ("model.mask_fill=-1000.0",), "additive -1e3 fill (float32)"),
    Variant("fp16", "mask", ("train.precision=mixed_float16",), "dtype-aware fill, mixed_float16"),
    Variant("mask_1e9_fp16", "mask", ("model.mask_fill=-1.0e+9", "train.precision=mixed_float16"), "-1e9 fill, fp16"),
    Variant("mask_1e3_fp16", "mask", ("model.mask_fill=-1000.0", "train.precision=mixed_float16"), "-1e3 fill, fp16"),
)  # fmt: skip

BY_NAME = {variant.name: variant for variant in VARIANTS}
DEFAULT_VARIANTS = ("baseline", "qkv_qk", "qkv_all", "scale_unscaled", "scale_over", "pre_ln", "no_clip",
                    "no_residual")  # fmt: skip
QUICK_VARIANTS = ("baseline", "scale_unscaled")

GROUPS = {
    "qkv": "Q/K/V projections: independent vs QK-shared vs all-shared",
    "scale": "Attention scaling: 1/sqrt(d_k) vs unscaled vs over-scaled (1/d_k)",
    "stability": "Post-LN vs Pre-LN, gradient clipping, residual connections",
    "mask": "Mask fill: dtype-aware vs -1e9 vs -1e3, float32 and mixed_float16 (trained)",
}

# What is claimed, verbatim enough to compare; None = no number claimed for that cell.
CLAIMS = {
    "qkv": {
        "columns": ("variant", "BLEU", "training speed"),
        "rows": (("baseline (independent)", "28.7", "1.0x"), ("qkv_qk", "26.1", "1.2x"), ("qkv_all", "23.4", "1.5x")),
    },
    "scale": {
        "columns": ("variant", "early grad-norm fluctuation", "attention"),
        "rows": (
            ("baseline (1/sqrt(d_k))", "within +-5%", "-"),
            ("scale_unscaled (1.0)", "> 300%", "-"),
            ("scale_over (1/d_k)", "-", "flattened (higher entropy)"),
        ),
    },
    "mask": {
        "columns": ("fill", "claim"),
        "rows": (("-1e3", "leaks attention onto padding"), ("-1e9", "the balance"), ("-1e20", "unstable")),
    },
    "stability": {
        "columns": ("setting", "steps to baseline validation loss", "final validation loss"),
        "rows": (("baseline (Post-LN)", "100k", "2.31"), ("pre_ln (Pre-LN + clipping + residual: all three)", "60k", "2.19")),
    },
}  # fmt: skip


def resolve_overrides(variant: Variant, config) -> list[str]:
    """The variant's `--set` overrides for `config` (fills in the over-scaling factor 1/d_k)."""
    d_head = config.model.d_model // config.model.num_heads
    return [text.replace("{over_scale}", repr(1.0 / d_head)) for text in variant.overrides]


def select(names) -> list[Variant]:
    """Variants by name, in the order given (baseline first if present); KeyError names an unknown one."""
    unknown = [name for name in names if name not in BY_NAME]
    if unknown:
        raise KeyError(f"unknown variant(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    ordered = sorted(dict.fromkeys(names), key=lambda name: name != BASELINE)
    return [BY_NAME[name] for name in ordered]
