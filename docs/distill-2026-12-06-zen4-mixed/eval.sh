#!/bin/bash
# The student of original and distilled targets together (beam 4, alpha 1.4): each run of RUNS is evaluated on
# validation and test2016, then compared with sacreBLEU's paired bootstrap against the first-round 7,000-step
# student (runs/kd-7k) and the first-round 12,000-step students (runs/kd-12k, runs/kd-12k-s1235): the second
# round's eval.sh, with its records written here.
# Usage: eval.sh RUN...   (appends to student.eval.jsonl and bootstrap.jsonl here)
cd "$(dirname "$0")/../.."
EVAL_DIR=docs/distill-2026-12-06-zen4-mixed exec bash docs/distill-2026-12-06-zen4-round2/eval.sh "$@"
