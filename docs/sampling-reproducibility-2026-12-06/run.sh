#!/bin/bash
# How often a sampled line differs when only the decoding path changes (XLA, batch size and chunks), same seed:
# the first 120 validation sources of Multi30k, the run RUN (default runs/kd-7k), two sampling settings. Prints
# one JSON line per comparison (lines that differ of 120). Usage: run.sh [RUN] > counts.jsonl
set -e
cd "$(dirname "$0")/../.."
RUN=${1:-runs/kd-7k}
T=$(mktemp -d)
zcat ../shared/data/multi30k/val.en.gz | head -120 > $T/src.en
for SETTING in "--sampling-topk 10" "--sampling-topk 0 --sampling-temperature 1.3"; do
  NAME=$(echo "$SETTING" | tr -d ' -')
  python translate.py --model-dir $RUN --input $T/src.en --output $T/$NAME.ref $SETTING --seed 1 --xla off 2>/dev/null
  python translate.py --model-dir $RUN --input $T/src.en --output $T/$NAME.xla $SETTING --seed 1 --xla on 2>/dev/null
  python translate.py --model-dir $RUN --input $T/src.en --output $T/$NAME.b4 $SETTING --seed 1 --xla off \
      --batch-size 4 --chunk-size 10 2>/dev/null
  for OTHER in xla b4; do
    DIFFER=$(paste $T/$NAME.ref $T/$NAME.$OTHER | awk -F '\t' '$1 != $2' | wc -l)
    echo "{\"run\": \"$RUN\", \"setting\": \"$SETTING --seed 1\", \"reference\": \"--xla off\", \"other\": \"$([ $OTHER = xla ] && echo '--xla on' || echo '--xla off --batch-size 4 --chunk-size 10')\", \"lines\": 120, \"lines_that_differ\": $DIFFER}"
  done
done
rm -r $T
