#!/bin/bash
# Two cased runs of base.yaml on the Zen 4 VM (the same tokenizer), alone and as an ensemble; beam 4, alpha 1.4.
set -x
cd "$(dirname "$0")/../.."
D=docs/ensemble-2026-12-05-zen4
A=runs/p7k-s1236              # 7,000 steps, seed 1236 (this session)
B=runs/ema-2026-12-05-zen4    # the day's make train hour, 7,713 steps (its final/: the EMA weights)
date -u
for S in validation test; do
  python evaluate.py --model-dir $A --split $S --beam 4 --alpha 1.4 --json >> $D/single-s1236.eval.jsonl
  python evaluate.py --model-dir $A --ensemble $B --split $S --beam 4 --alpha 1.4 \
      --output $A/hypotheses.$S.ensemble.txt --json >> $D/ensemble.eval.jsonl
done
cp $A/metrics.jsonl $D/single-s1236.metrics.jsonl
for S in validation test; do
  REF=$([ $S = validation ] && echo ../shared/data/multi30k/val.de.gz || echo ../shared/data/multi30k/test_2016_flickr.de.gz)
  for BASE in $A/hypotheses.$S.txt $B/hypotheses.$S.ema.txt; do
    python -m benchmarks.significance --baseline $BASE --system $A/hypotheses.$S.ensemble.txt \
        --references $REF --target-language de >> $D/bootstrap.jsonl
  done
done
date -u
