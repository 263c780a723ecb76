#!/bin/bash
# (this session's scratch paths: worktrees of the two commits at /work/scratch/base and /work/scratch/wt)
# alternate train_profile runs in the base and wt worktrees; print wall and matmul-only
for round in 1 2 3; do
  for tree in base wt; do
    cd /work/scratch/$tree
    PYTHONPATH=. /work/main/.venv/bin/python -m benchmarks.train_profile --config configs/base.yaml --precision ${PREC:-mixed_bfloat16} --steps 6 > /work/scratch/amx/pab-$tree-$round.txt 2>/dev/null
    echo "$round $tree $(grep 'wall time per step' /work/scratch/amx/pab-$tree-$round.txt | awk -F'|' '{print $3}') $(grep 'matmul-only' /work/scratch/amx/pab-$tree-$round.txt)"
  done
done
