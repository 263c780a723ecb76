#!/bin/bash
# The 12,000-step distilled student of ../distill-2026-12-05-zen4-12k/ again, with another seed (1235 instead of
# 1234: other initial weights, dropout masks and data order); everything else the same: the folder corpus (the
# two-run ensemble's beam-4 translations of the 29,000 training sources, real validation and test2016 pairs), the
# config, the 12,000-step plan (and with it cosine length, averaging window, dropout_by_plan 0.25).
set -ex
cd "$(dirname "$0")/../.."
K=${KD_FOLDER:-/work/scratch/kd}    # built by ../distill-2026-12-05-zen4/commands.sh (today: distill.py does it)
python train.py --config configs/base.yaml --model-dir runs/kd-12k-s1235 \
    --set data.dataset=folder data.folder=$K train.max_minutes=0 train.max_steps=12000 train.seed=1235   # 01:17 UTC-

# After eval.sh (03:15-03:27 UTC, beside a clean-clone make test): the two 12,000-step students translate the
# training sources for a second round of distillation (the folder is not committed; no student trained on it yet).
python distill.py --model-dir runs/kd-12k --ensemble runs/kd-12k-s1235 --output ${KD2_FOLDER:-/work/scratch/kd2} \
    --beam 4 --alpha 1.4
# printed: python train.py --config CONFIG --model-dir DIR --set data.dataset=folder data.folder=/work/scratch/kd2
#          data.source=en data.target=de data.train_split=train data.validation_split=validation data.test_split=test
