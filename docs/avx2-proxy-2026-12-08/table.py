"""The markdown table of ab.sh's rows: python table.py bench-ab.jsonl"""

import json
import statistics
import sys

rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
train = [r for r in rows if r.get("bench") == "train"]
by = {(r["tree"], r["round"]): r for r in train}
rounds = sorted({r["round"] for r in train})
print(
    "| round | base tok/s | change tok/s | base ratio | change ratio | gain (ratio) | base MFU | change MFU | peaks |"
)
print("|---|---|---|---|---|---|---|---|---|")
gains = []
for n in rounds:
    b, w = by[("base", n)], by[("wt", n)]
    gains.append(w["ratio"] / b["ratio"])
    print(
        f"| {n} | {b['tokens_per_sec']:,.0f} | {w['tokens_per_sec']:,.0f} | {b['ratio']:.3f} | {w['ratio']:.3f} "
        f"| {gains[-1]:.3f} | {b['mfu']:.1%} | {w['mfu']:.1%} | {b['peak_gflops']:.0f} / {w['peak_gflops']:.0f} |"
    )
print(f"\nmedian gain {statistics.median(gains):.3f}")
