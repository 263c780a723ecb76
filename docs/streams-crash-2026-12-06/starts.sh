#!/bin/bash
# translate.py started N times on a run directory, as tests/test_e2e.py runs it (greedy, the input on stdin);
# prints how many starts failed (a SIGSEGV is exit 139) and keeps each failure's faulthandler trace.
# usage: N=20 docs/streams-crash-2026-12-06/starts.sh RUN_DIR INPUT_FILE [translate.py options, e.g. --streams 2]
cd "$(dirname "$0")/../.."
RUN=$1; INPUT=$2; shift 2
OUT=${OUT:-/tmp/streams-crash}; mkdir -p "$OUT"
failed=0
for i in $(seq 1 "${N:-10}"); do
  TF_CPP_MIN_LOG_LEVEL=2 CUDA_VISIBLE_DEVICES= python -X faulthandler translate.py --model-dir "$RUN" --beam 1 "$@" \
      < "$INPUT" > /dev/null 2> "$OUT/stderr.txt"
  rc=$?
  if [ $rc -ne 0 ]; then failed=$((failed + 1)); cp "$OUT/stderr.txt" "$OUT/crash.$failed.txt"; fi
done
echo "{\"starts\": ${N:-10}, \"failed\": $failed, \"args\": \"$*\"}"
