#!/bin/bash
# 3 interleaved rounds: HEAD worktree, then the change; bench.py train rows, float32 and mixed_bfloat16
out=${OUT:-/work/scratch/amx/bench-ab.jsonl}; : > $out
for round in 1 2 3; do
  for tree in base wt; do
    cd /work/scratch/$tree
    PYTHONPATH=. /work/main/.venv/bin/python bench.py --only train --precisions float32,mixed_bfloat16 --xla off 2>>/work/scratch/amx/bench-ab.err \
      | sed "s/^{/{\"tree\": \"$tree\", \"round\": $round, /" >> $out
  done
done
echo done >> /work/scratch/amx/bench-ab.err
