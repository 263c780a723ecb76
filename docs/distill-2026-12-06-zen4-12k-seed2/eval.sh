#!/bin/bash
# The seed-1235 student (beam 4, alpha 1.4) and sacreBLEU's paired bootstrap against the seed-1234 student of
# ../distill-2026-12-05-zen4-12k/ (same recipe) and the 7,000-step student; then the two 12,000-step students
# decoding together (an ensemble: not a single model, reported as such).
set -x
cd "$(dirname "$0")/../.."
D=docs/distill-2026-12-06-zen4-12k-seed2
K=runs/kd-12k-s1235
K1=runs/kd-12k
S7=runs/kd-7k
date -u
for S in validation test; do
  python evaluate.py --model-dir $K --split $S --beam 4 --alpha 1.4 --output $K/hypotheses.$S.txt --json >> $D/student.eval.jsonl
done
cp $K/metrics.jsonl $D/student.metrics.jsonl
for S in validation test; do
  REF=$([ $S = validation ] && echo ../shared/data/multi30k/val.de.gz || echo ../shared/data/multi30k/test_2016_flickr.de.gz)
  for BASE in $K1/hypotheses.$S.txt $S7/hypotheses.$S.txt; do
    python -m benchmarks.significance --baseline $BASE --system $K/hypotheses.$S.txt \
        --references $REF --target-language de >> $D/bootstrap.jsonl
    python -m benchmarks.significance --baseline $BASE --system $K/hypotheses.$S.txt \
        --references $REF --target-language de --lowercase >> $D/bootstrap.jsonl
  done
done
date -u
for S in validation test; do
  python evaluate.py --model-dir $K1 --ensemble $K --split $S --beam 4 --alpha 1.4 \
      --output $K/hypotheses.$S.ensemble.txt --json >> $D/ensemble.eval.jsonl
done
date -u
