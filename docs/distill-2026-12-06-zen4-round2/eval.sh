#!/bin/bash
# Second-round distilled students (beam 4, alpha 1.4): each run of RUNS is evaluated on validation and test2016,
# then compared with sacreBLEU's paired bootstrap against the first-round 7,000-step student (runs/kd-7k: same
# plan, same seed 1234 for runs/kd2-7k) and the first-round 12,000-step students (runs/kd-12k, runs/kd-12k-s1235).
# Usage: eval.sh RUN...   (appends to student.eval.jsonl and bootstrap.jsonl here)
set -x
cd "$(dirname "$0")/../.."
D=${EVAL_DIR:-docs/distill-2026-12-06-zen4-round2}   # where the records go (the mixed-targets folder reuses this script)
date -u
for K in "$@"; do
  for S in validation test; do
    python evaluate.py --model-dir $K --split $S --beam 4 --alpha 1.4 --output $K/hypotheses.$S.txt --json \
        >> $D/student.eval.jsonl
  done
  cp $K/metrics.jsonl $D/$(basename $K).metrics.jsonl
  for S in validation test; do
    REF=$([ $S = validation ] && echo ../shared/data/multi30k/val.de.gz || echo ../shared/data/multi30k/test_2016_flickr.de.gz)
    for BASE in runs/kd-7k runs/kd-12k runs/kd-12k-s1235; do
      for CASE in "" --lowercase; do
        python -m benchmarks.significance --baseline $BASE/hypotheses.$S.txt --system $K/hypotheses.$S.txt \
            --references $REF --target-language de $CASE >> $D/bootstrap.jsonl
      done
    done
  done
done
date -u
