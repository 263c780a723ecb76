"""The attention benchmark's memory (benchmarks/attention_memory.py, benchmarks/memory.py): each point measured on
its first run in a process of its own, the peak the kernel's high-water mark, a failing point recorded."""


def test_attention_peak_memory_holds_the_scores_of_full_attention():
    """Full attention at L = 2048 materialises float32 scores of heads x L x L x 4 bytes (64 MB with 4 heads): the
    recorded peak must be at least that. Before, the peak was read on a later call, after the first call's memory
    was freed and kept for reuse: 2 MB."""
    from benchmarks.attention_memory import bench_attention

    length, heads = 2048, 4
    (record,) = bench_attention(
        lambda r: r, lengths=(length,), variants=("full",), num_heads=heads, repeats=1, memory_budget_mb=1e6
    )
    assert record["status"] == "ok" and record["memory_method"]
    assert record["peak_memory_mb"] >= 1 * heads * length * length * 4 / 2**20


def test_chunked_and_local_points_full_attention_over_the_budget_and_a_failing_point():
    """Full attention over `memory_budget_mb` is skipped (4 heads x 64^2 x 4 bytes = 0.0625 MB > 0.05) without
    starting its process; a chunked and a local point are each measured in a process of their own. A point whose
    process fails (here an unknown variant, refused by the child's argparse before it imports TensorFlow: exit 2)
    is recorded so, with the last line of its stderr only (no usage text, no traceback), and the run goes on to
    the next points."""
    from benchmarks.attention_memory import bench_attention

    records = bench_attention(
        lambda r: r,
        lengths=(64,),
        variants=("full", "no-such-variant", "chunked", "local"),
        num_heads=4,
        chunk_size=32,
        window=8,
        memory_budget_mb=0.05,
        repeats=1,
    )
    full, failed, chunked, local = records
    assert (full["variant"], full["status"], full["peak_memory_mb"]) == (
        "full",
        "skipped: exceeds budget",
        None,
    )
    assert failed["variant"] == "no-such-variant" and failed["peak_memory_mb"] is None
    assert failed["status"].startswith("failed: exit 2: ") and "invalid choice" in failed["status"]
    assert "usage" not in failed["status"] and "\n" not in failed["status"]
    assert (chunked["variant"], chunked["chunk_size"], local["variant"], local["window"]) == (
        "chunked",
        32,
        "local",
        8,
    )
    for record in (chunked, local):
        assert record["status"] == "ok" and isinstance(record["seconds"], float)
        assert record["peak_memory_mb"] > 0 and record["memory_method"]


def test_peak_memory_of_a_call_is_the_kernels_high_water_mark():
    """100 MB written and freed inside the call: its peak is at least that, however loaded the machine (the kernel
    keeps the high-water mark; a sampler could miss a short peak)."""
    import sys

    import numpy as np

    from benchmarks.memory import RSS_HIGH_WATER, measure_peak

    def allocate():
        block = np.ones(100 * 2**20, np.uint8)  # written: resident
        return int(block[::4096].sum())

    peak_mb, method, result = measure_peak(allocate)
    assert result == 100 * 2**20 // 4096
    if sys.platform.startswith("linux"):
        assert method == RSS_HIGH_WATER
    assert peak_mb >= 99
