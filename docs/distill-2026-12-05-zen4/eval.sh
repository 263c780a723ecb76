#!/bin/bash
# The student alone (beam 4, alpha 1.4) and sacreBLEU's paired bootstrap against each teacher and the ensemble.
set -x
cd "$(dirname "$0")/../.."
D=docs/distill-2026-12-05-zen4
K=runs/kd-7k
A=runs/p7k-s1236
B=runs/ema-2026-12-05-zen4
date -u
for S in validation test; do
  python evaluate.py --model-dir $K --split $S --beam 4 --alpha 1.4 --output $K/hypotheses.$S.txt --json >> $D/student.eval.jsonl
done
cp $K/metrics.jsonl $D/student.metrics.jsonl
for S in validation test; do
  REF=$([ $S = validation ] && echo ../shared/data/multi30k/val.de.gz || echo ../shared/data/multi30k/test_2016_flickr.de.gz)
  for BASE in $A/hypotheses.$S.txt $B/hypotheses.$S.ema.txt $A/hypotheses.$S.ensemble.txt; do
    python -m benchmarks.significance --baseline $BASE --system $K/hypotheses.$S.txt \
        --references $REF --target-language de >> $D/bootstrap.jsonl
  done
done
