#!/bin/bash
# Sequence-level knowledge distillation (Kim and Rush, 2016) from the two-run ensemble of ../ensemble-2026-12-05-zen4:
# the ensemble translates the Multi30k training sources (beam 4, alpha 1.4), and base.yaml trains on those
# translations for 7,000 steps (seed 1234), validated and tested on the real references.
set -ex
cd "$(dirname "$0")/../.."
K=${KD_FOLDER:-/work/scratch/kd}    # the folder corpus (not in the repository: data files are never committed)
A=runs/p7k-s1236                    # 7,000 steps, seed 1236
B=runs/ema-2026-12-05-zen4          # the day's make train hour on this VM (its final/: EMA weights)
M=../shared/data/multi30k
mkdir -p $K
zcat $M/train.en.gz > $K/en.train.txt
zcat $M/val.en.gz > $K/en.validation.txt; zcat $M/val.de.gz > $K/de.validation.txt
zcat $M/test_2016_flickr.en.gz > $K/en.test.txt; zcat $M/test_2016_flickr.de.gz > $K/de.test.txt
python translate.py --model-dir $A --ensemble $B --input $K/en.train.txt --output /tmp/de.train.txt \
    --beam 4 --alpha 1.4                                           # 20:40-20:49 UTC, 29,000 lines, 54 lines/s
cp /tmp/de.train.txt $K/de.train.txt
python train.py --config configs/base.yaml --model-dir runs/kd-7k \
    --set data.dataset=folder data.folder=$K train.max_minutes=0 train.max_steps=7000
