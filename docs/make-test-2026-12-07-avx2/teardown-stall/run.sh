#!/bin/bash
# two CPU hogs beside the module, as under make test's other worker
cd /work/main
yes > /dev/null & Y1=$!
yes > /dev/null & Y2=$!
STALL_DIR=/work/scratch/stall PYTHONPATH=/work/scratch/stall .venv/bin/python -m pytest tests/nmt/test_budget_runs.py -p stallgdb -p no:cacheprovider --durations=0 --durations-min=1 > /work/scratch/stall/pytest-$1.log 2>&1
kill $Y1 $Y2
