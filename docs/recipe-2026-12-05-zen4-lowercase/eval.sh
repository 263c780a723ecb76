#!/bin/bash
set -x
cd /work/main
D=docs/recipe-2026-12-05-zen4-lowercase
R=runs/p7k-lc
date -u
for S in validation test; do
  .venv/bin/python evaluate.py --model-dir $R --split $S --beam 4 --alpha 1.4 --json >> $D/p7k-lc.eval.jsonl
done
cp $R/metrics.jsonl $D/p7k-lc.metrics.jsonl
B=runs/ema-2026-12-05-zen4
for S in validation test; do
  REF=$([ $S = validation ] && echo ../shared/data/multi30k/val.de.gz || echo ../shared/data/multi30k/test_2016_flickr.de.gz)
  .venv/bin/python -m benchmarks.significance --lowercase --baseline $B/hypotheses.$S.average.txt --system $R/hypotheses.$S.txt --references $REF --target-language de >> $D/bootstrap.jsonl
done
date -u
