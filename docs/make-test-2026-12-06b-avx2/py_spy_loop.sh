#!/bin/bash
for i in $(seq 1 400); do
  for pid in $(pgrep -f "sys.stdin.readline"); do
    out=$(/work/scratch/spy/bin/py-spy dump --pid $pid 2>/dev/null)
    if echo "$out" | grep -q "test_budget_runs.py"; then
      echo "=== $(date +%s.%N) pid $pid $(head -1 /proc/stat)" >> /work/scratch/spy.log
      echo "$out" | grep -v "^ *$" | grep -v "site-packages/_pytest\|pluggy\|execnet\|xdist" | head -30 >> /work/scratch/spy.log
    fi
  done
  sleep 1.5
done
