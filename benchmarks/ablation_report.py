"""The ablation markdown: the protocol, a summary table, then per claim the claimed table next to the measured one."""

from __future__ import annotations

import datetime
import math
import os
import platform
from pathlib import Path

from benchmarks.variants import BASELINE, CLAIMS, GROUPS
from nmt.run_dir import write_atomic


def machine_description() -> str:
    """E.g. "2-core CPU (AMD EPYC), no GPU, Linux, TensorFlow 2.21.0"."""
    import tensorflow as tf

    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpus = tf.config.list_physical_devices("GPU")
    gpu = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cores}-core CPU ({model}), {gpu}, {platform.system()}, TensorFlow {tf.__version__}"


def _number(value, digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}{suffix}"


def _percent(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _table(columns, rows) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines + [""]


def _claimed(group: str) -> list[str]:
    claim = CLAIMS[group]
    return ["### Claimed", "", *_table(claim["columns"], claim["rows"])]


def _steps_to(entry: dict, target) -> str:
    from benchmarks.run_metrics import steps_to_loss

    if target is None or not entry.get("records"):
        return "n/a"
    hit = steps_to_loss(entry["records"], target)
    return "not reached" if hit is None else f"{hit[0]} ({hit[1]:.1f} min)"


def _speed(entry: dict, baseline: dict | None) -> str:
    rate, base = entry.get("tokens_per_sec"), (baseline or {}).get("tokens_per_sec")
    return "n/a" if not rate or not base else f"{rate / base:.2f}x"


def _entropy(entry: dict) -> str:
    entropy = entry.get("entropy")
    return "n/a" if not entropy else f"{entropy['entropy']:.2f} ({entropy['normalized']:.2f})"


def _summary(results: dict) -> list[str]:
    baseline = results.get(BASELINE)
    rows = []
    for name, e in results.items():
        status = e.get("error") or ("ok" if e.get("exit_code") == 0 else f"exit {e.get('exit_code')}")
        rows.append((
            name, ", ".join(e["overrides"]) or "-", e.get("steps", "n/a"), _number(e.get("train_minutes"), 1),
            _number(e.get("tokens_per_sec"), 0), _speed(e, baseline), _number(e.get("val_loss"), 3),
            _number(e.get("bleu"), 2), _percent((e.get("grad_norm_early") or {}).get("cv")), _entropy(e),
            e.get("skipped_steps", "n/a"), status,
        ))  # fmt: skip
    columns = ("variant", "overrides", "steps", "train min", "tokens/s", "speed", "val loss", "BLEU (greedy)",
               "grad-norm CV early", "cross-attn entropy (norm.)", "skipped steps", "status")  # fmt: skip
    return ["## Summary (measured)", "", *_table(columns, rows)]


def _group_rows(group: str, results: dict, options) -> list[str]:
    members = [name for name, e in results.items() if name == BASELINE or e["variant"].group == group]
    if not any(results[name]["variant"].group == group for name in members):
        return []
    baseline = results.get(BASELINE)
    lines = [f"## {GROUPS[group]}", "", *_claimed(group), "### Measured", ""]
    if group == "qkv":
        columns = ("variant", "BLEU (greedy)", "training speed (tokens/s vs baseline)", "tokens/s", "val loss",
                   "steps")  # fmt: skip
        rows = [(n, _number(results[n].get("bleu")), _speed(results[n], baseline),
                 _number(results[n].get("tokens_per_sec"), 0), _number(results[n].get("val_loss"), 3),
                 results[n].get("steps", "n/a")) for n in members]  # fmt: skip
    elif group == "scale":
        columns = ("variant", f"grad-norm CV, steps 1-{options.grad_steps}", "median step-to-step change",
                   "max/min", f"CV, last {options.grad_steps} steps", "cross-attn entropy nats (normalised)",
                   "val loss", "BLEU")  # fmt: skip
        rows = []
        for n in members:
            early, late = results[n].get("grad_norm_early") or {}, results[n].get("grad_norm_late") or {}
            rows.append((n, _percent(early.get("cv")), _percent(early.get("step_change")),
                         _number(early.get("max_over_min"), 1), _percent(late.get("cv")), _entropy(results[n]),
                         _number(results[n].get("val_loss"), 3), _number(results[n].get("bleu"))))  # fmt: skip
    elif group == "stability":
        target = (baseline or {}).get("val_loss")
        columns = ("variant", f"steps to the baseline's final val loss ({_number(target, 3)})", "final val loss",
                   "BLEU", "grad-norm CV early", "skipped steps")  # fmt: skip
        rows = [(n, _steps_to(results[n], target), _number(results[n].get("val_loss"), 3),
                 _number(results[n].get("bleu")), _percent((results[n].get("grad_norm_early") or {}).get("cv")),
                 results[n].get("skipped_steps", "n/a")) for n in members]  # fmt: skip
    else:  # trained mask-fill variants
        columns = ("variant", "val loss", "BLEU", "skipped steps", "steps")
        rows = [(n, _number(results[n].get("val_loss"), 3), _number(results[n].get("bleu")),
                 results[n].get("skipped_steps", "n/a"), results[n].get("steps", "n/a")) for n in members]  # fmt: skip
    return lines + _table(columns, rows)


def _mask_section(mask: dict, options) -> list[str]:
    from benchmarks.mask_fill import LOGIT_STDS

    lines = [
        f"## {GROUPS['mask'].split(',')[0]} (unit-level measurement)",
        "",
        *_claimed("mask"),
        "### Measured",
        "",
    ]
    lines += [
        "Attention mass on masked (padding) keys, mean over rows with at least one allowed key, from",
        "`transformer.attention.scaled_dot_product_attention(..., mask_fill=FILL)`. Synthetic: random logits of the",
        "given standard deviation, a quarter of the keys masked, one fully masked row (its total weight is shown:",
        "0 = exactly zero, 1 = it attends uniformly to padding). NaN = the output or weights hold NaN/Inf.",
        "",
    ]
    columns = (
        "fill",
        "dtype",
        *(f"leak, logits std {s:g}" for s in LOGIT_STDS),
        "NaN/Inf",
        "fully masked row",
    )
    grouped: dict[tuple, list] = {}
    for r in mask["synthetic"]:
        grouped.setdefault((r["fill"], r["dtype"]), []).append(r)
    rows = []
    for (fill, dtype), items in grouped.items():
        rows.append((fill, dtype, *(_leak(r) for r in items), "yes" if any(r["nonfinite"] for r in items) else "no",
                     _number(items[0]["fully_masked_rows_mass"], 2)))  # fmt: skip
    lines += ["#### Synthetic logits", "", *_table(columns, rows)]
    source = "the trained baseline" if mask["trained_activations"] else "a freshly initialised model"
    lines += [
        f"#### Real activations ({source}, first encoder self-attention, the most padded validation batch) and training",
        "",
        f"Training: {options.mask_steps} real `TrainStep` updates from a fresh model with that fill and precision",
        "(mixed_float16 with dynamic loss scaling); a step with a non-finite loss or gradient is skipped.",
        "",
    ]
    training = {(r["fill"], r["dtype"]): r for r in mask["training"]}
    rows = []
    for r in mask["activations"]:
        t = training[(r["fill"], r["dtype"])]
        rows.append((r["fill"], t["precision"], _leak(r), "yes" if r["nonfinite"] else "no",
                     _number(r["max_abs_logit"], 1), f"{t['applied']}/{t['steps']}", _number(t["last_loss"], 3),
                     "yes" if t["finite"] else "no"))  # fmt: skip
    columns = ("fill", "precision", "leak (real activations)", "NaN/Inf", "max abs logit", "updates applied",
               "last loss", "training finite")  # fmt: skip
    return lines + _table(columns, rows)


def _leak(record: dict) -> str:
    leak = record["leak"]
    if leak is None or not math.isfinite(leak):
        return "NaN"
    return "0" if leak == 0 else f"{leak:.2e}"


def write_report(path: Path, *, options, config, results: dict, mask: dict | None) -> None:
    """Writes the markdown report of an ablation run to `path`."""
    from benchmarks.ablation import protocol_overrides

    steps = [e.get("steps") for e in results.values() if isinstance(e.get("steps"), int)]
    minutes = [e["train_minutes"] for e in results.values() if e.get("train_minutes") is not None]
    lines = [
        "# Ablations: measured next to claimed",
        "",
        f"- Command: `{options.command or 'ablate.py'}`",
        f"- Config: `{options.config}`"
        + (f" with `{' '.join(options.overrides)}`" if options.overrides else ""),
        f"  (d_model {config.model.d_model}, {config.model.num_layers}+{config.model.num_layers} layers, "
        f"dataset {config.data.dataset} {config.data.source}->{config.data.target}), seed {config.train.seed}",
        f"- Budget: {options.budget_minutes:g} minutes of training step time per variant "
        f"(`train.max_minutes`: step time including the first step's tracing, evaluation excluded), "
        + (f"at most {options.max_steps} steps" if options.max_steps else "no step limit"),
        f"- Protocol overrides (every variant): `{' '.join(protocol_overrides(options))}`",
        f"- Machine: {machine_description()}",
        f"- Date: {datetime.datetime.now().isoformat(timespec='minutes')}",
        f"- BLEU: greedy, sacreBLEU (detokenized, cased) on {_bleu_scope(results)} validation sentences; "
        "val loss: cross-entropy per target token on the whole validation split (no label smoothing)",
        "",
        f"> **Caveat.** Each variant trained for {min(minutes, default=0):.1f}-{max(minutes, default=0):.1f} minutes "
        f"({min(steps, default=0)}-{max(steps, default=0)} optimizer steps) on this machine. The claims come from the "
        "100k-step regime on accelerators; budgets this short are far from it. The measurements compare the "
        "variants at equal, small wall-clock budgets: they can show direction and early-training behaviour, not "
        "confirm or refute the claimed final numbers."
        + (
            f" Every variant stayed inside the learning-rate warmup ({config.train.warmup_steps} steps)."
            if steps and max(steps) < config.train.warmup_steps
            else ""
        ),
        "",
        *_summary(results),
    ]
    for group in ("qkv", "scale", "stability", "mask"):
        if any(e["variant"].group == group for e in results.values()):
            lines += _group_rows(group, results, options)
    if mask is not None:
        lines += _mask_section(mask, options)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "\n".join(lines).rstrip() + "\n")  # an interrupted write keeps the previous report


def _bleu_scope(results: dict) -> str:
    counts = sorted({e["bleu_sentences"] for e in results.values() if "bleu_sentences" in e})
    return "/".join(str(c) for c in counts) or "n/a"
