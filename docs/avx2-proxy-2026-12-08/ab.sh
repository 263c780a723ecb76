#!/bin/bash
# float32 training step on an AVX-512/AMX CPU made to run the code an AVX2-only CPU runs: oneDNN capped at AVX2
# (ONEDNN_MAX_CPU_ISA=AVX2, its matmuls and softmax) and our dropout kernels on their AVX2 paths
# (NMT_KERNELS_ISA=avx2). ROUNDS interleaved rounds of `bench.py --only train --precisions float32 --xla off`, the
# tree $ROOT/base (before the issue-16 work) then $ROOT/wt (the change), one JSON line per tree and round.
# Usage: ROOT=/path/with/base-and-wt-worktrees OUT=rows.jsonl PY=/path/to/.venv/bin/python bash ab.sh
root=${ROOT:?}; out=${OUT:?}; py=${PY:?}; rounds=${ROUNDS:-4}; : > "$out"
export ONEDNN_MAX_CPU_ISA=AVX2 NMT_KERNELS_ISA=avx2
for round in $(seq "$rounds"); do
  for tree in base wt; do
    cd "$root/$tree" || exit 1
    PYTHONPATH=. "$py" bench.py --only train --precisions float32 --xla off 2>>"$out.err" \
      | sed "s/^{/{\"tree\": \"$tree\", \"round\": $round, /" >> "$out"
  done
done
echo done >> "$out.err"
