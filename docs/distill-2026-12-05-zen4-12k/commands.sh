#!/bin/bash
# The distilled student of ../distill-2026-12-05-zen4/ trained for 12,000 steps instead of 7,000: the same folder
# corpus (the two-run ensemble's beam-4 translations of the 29,000 training sources, real validation and test2016
# pairs), the same config and seed; only the planned steps change (and with them what base.yaml derives from the
# plan: the cosine schedule's length, the averaging window, dropout_by_plan 0.25 and ffn_dropout_by_plan 0.25).
set -ex
cd "$(dirname "$0")/../.."
K=${KD_FOLDER:-/work/scratch/kd}    # built by ../distill-2026-12-05-zen4/commands.sh (today: distill.py does it)
python train.py --config configs/base.yaml --model-dir runs/kd-12k \
    --set data.dataset=folder data.folder=$K train.max_minutes=0 train.max_steps=12000   # 22:33 UTC-
