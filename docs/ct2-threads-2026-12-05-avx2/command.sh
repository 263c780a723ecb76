#!/bin/bash
# CTranslate2's thread split on this machine: one translation on 2 threads (--streams 1) against two in flight with
# one thread each (--streams 2, the default), float32 and int8, beam 4 and greedy; our TensorFlow decoder with the
# same streams as the same-run reference. 2 interleaved rounds, Multi30k test2016.
set -eu
cd "${REPO:-.}"
D=${RUN:-runs/main-2026-12-05b-avx2}
O=${OUT:-/tmp/ct2t}
PY=.venv/bin/python
mkdir -p "$O"
for q in float32 int8; do
  [ -d "$O/ct2-$q" ] || $PY export.py --model-dir "$D" --format ctranslate2 --quantization $q --output "$O/ct2-$q"
done
for round in 1 2; do
  for engine in ctranslate2-float32 ctranslate2-int8 tensorflow; do
    for beam in 4 1; do
      for streams in 1 2; do
        args=(--model-dir "$D" --split test --beam $beam --alpha 1.4 --streams $streams --json
              --output "$O/hyp-$engine-$beam-$streams.txt")
        case $engine in
          ctranslate2-*) args+=(--engine ctranslate2 --engine-dir "$O/ct2-${engine#ctranslate2-}") ;;
        esac
        $PY evaluate.py "${args[@]}" 2>>"$O/evaluate.err" | tail -1 |
          $PY -c "import json,sys; r=json.loads(sys.stdin.read()); r.update(round=$round, row='$engine beam $beam streams $streams'); print(json.dumps(r, sort_keys=True))"
      done
    done
  done
done
