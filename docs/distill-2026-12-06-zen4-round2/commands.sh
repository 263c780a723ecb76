#!/bin/bash
# Second round of distillation: the two 12,000-step first-round students (runs/kd-12k, seed 1234, and
# runs/kd-12k-s1235) decode the 29,000 training sources together as an ensemble (validation 41.97 against the
# first round's teacher's 41.30), and new students learn from those translations: the 7,000-step plan of
# ../distill-2026-12-05-zen4/ (runs/kd-7k: validation 41.65), two seeds. Only data.folder differs from runs/kd-7k's
# config (checked with diff on the two config.yaml files).
set -ex
cd "$(dirname "$0")/../.."
K2=${KD2_FOLDER:-/work/scratch/kd2}
# 2026-12-06 03:27 UTC (previous session; 738 s of translation): 29,000 lines
python distill.py --model-dir runs/kd-12k --ensemble runs/kd-12k-s1235 --output $K2 --beam 4 --alpha 1.4
# 04:10-05:25 UTC, beside tests and reviews (no timing is a result)
python train.py --config configs/base.yaml --model-dir runs/kd2-7k --set data.dataset=folder data.folder=$K2 \
    data.source=en data.target=de data.train_split=train data.validation_split=validation data.test_split=test \
    train.max_minutes=0 train.max_steps=7000
# 05:27 UTC-, beside two clean-clone make test runs
python train.py --config configs/base.yaml --model-dir runs/kd2-7k-s1235 --set data.dataset=folder data.folder=$K2 \
    data.source=en data.target=de data.train_split=train data.validation_split=validation data.test_split=test \
    train.max_minutes=0 train.max_steps=7000 train.seed=1235
