#!/bin/bash
# The 12,000-step student (beam 4, alpha 1.4) and sacreBLEU's paired bootstrap against the 7,000-step student
# and the ensemble that taught both.
set -x
cd "$(dirname "$0")/../.."
D=docs/distill-2026-12-05-zen4-12k
K=runs/kd-12k
S7=runs/kd-7k
E=runs/p7k-s1236            # its hypotheses.*.ensemble.txt: the two teachers decoding together
date -u
for S in validation test; do
  python evaluate.py --model-dir $K --split $S --beam 4 --alpha 1.4 --output $K/hypotheses.$S.txt --json >> $D/student.eval.jsonl
done
cp $K/metrics.jsonl $D/student.metrics.jsonl
for S in validation test; do
  REF=$([ $S = validation ] && echo ../shared/data/multi30k/val.de.gz || echo ../shared/data/multi30k/test_2016_flickr.de.gz)
  for BASE in $S7/hypotheses.$S.txt $E/hypotheses.$S.ensemble.txt; do
    python -m benchmarks.significance --baseline $BASE --system $K/hypotheses.$S.txt \
        --references $REF --target-language de >> $D/bootstrap.jsonl
    python -m benchmarks.significance --baseline $BASE --system $K/hypotheses.$S.txt \
        --references $REF --target-language de --lowercase >> $D/bootstrap.jsonl
  done
done
