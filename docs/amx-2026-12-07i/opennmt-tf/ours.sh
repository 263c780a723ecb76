#!/bin/bash
# Ours, 400 steps of the base config on Multi30k (bf16: precision auto on the AMX Xeon; then float32), dropout 0.1
# and feed-forward dropout 0.1 throughout as in OpenNMT-tf's model. Run from the repository; OUT: a scratch
# directory for the runs and their logs (this session: /work/scratch/onmt).
OUT=${OUT:-/tmp/onmt-compare}
for p in auto float32; do
  rm -rf $OUT/ours-$p
  .venv/bin/python train.py --config configs/base.yaml --model-dir $OUT/ours-$p \
    --set train.max_steps=400 train.max_minutes=0 train.eval_every=0 train.bleu_every=0 train.precision=$p \
          train.log_every=50 "train.dropout_by_plan=[]" "train.ffn_dropout_by_plan=[]" \
    > $OUT/ours-$p.log 2>&1
done
