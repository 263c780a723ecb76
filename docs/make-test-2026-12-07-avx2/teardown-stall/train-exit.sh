#!/bin/bash
# train.py on a tiny config for $1 steps; prints when the last log line came and when the process exited
HERE=$(cd "$(dirname "$0")" && pwd)
cd /work/main
rm -rf /work/scratch/exitstall/run
.venv/bin/python "$HERE/train-exit-config.py" $1
.venv/bin/python train.py --config /work/scratch/exitstall/tiny.yaml --model-dir /work/scratch/exitstall/run 2>&1 | while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N | cut -c1-14)" "$line"; done > /work/scratch/exitstall/log-$1.txt
echo "$(date +%s.%N | cut -c1-14) EXIT" >> /work/scratch/exitstall/log-$1.txt
