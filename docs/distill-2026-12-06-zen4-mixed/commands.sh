#!/bin/bash
# Original and distilled targets together: the training sources twice, once with Multi30k's own German references
# and once with the first-round teacher's translations (/work/scratch/kd, built by ../distill-2026-12-05-zen4/),
# 58,000 pairs; validation and test2016 are the real pairs. The 12,000-step plan of
# ../distill-2026-12-05-zen4-12k/ (runs/kd-12k: test2016 40.99 cased, 41.39 lowercased tokenized, the best single run so far); only
# data.folder differs from runs/kd-12k's config (checked with diff on the two config.yaml files).
set -ex
cd "$(dirname "$0")/../.."
K=${KD_FOLDER:-/work/scratch/kd}
MIX=${MIX_FOLDER:-/work/scratch/kdmix}
M=../shared/data/multi30k
mkdir -p $MIX
(zcat $M/train.en.gz; cat $K/en.train.txt) > $MIX/en.train.txt
(zcat $M/train.de.gz; cat $K/de.train.txt) > $MIX/de.train.txt
cp $K/en.validation.txt $K/de.validation.txt $K/en.test.txt $K/de.test.txt $MIX/
wc -l $MIX/*    # 58,000 training lines per side
# 2026-12-06 07:18 UTC-, beside two read-only reviews (no timing is a result)
python train.py --config configs/base.yaml --model-dir runs/kdmix-12k --set data.dataset=folder data.folder=$MIX \
    train.max_minutes=0 train.max_steps=12000
# The second seed: started 2026-12-06 09:32 UTC, still training when that session ended; the same command resumes it
python train.py --config configs/base.yaml --model-dir runs/kdmix-12k-s1235 --set data.dataset=folder \
    data.folder=$MIX train.max_minutes=0 train.max_steps=12000 train.seed=1235
