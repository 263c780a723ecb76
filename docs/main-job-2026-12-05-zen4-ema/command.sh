set -x
cd /work/main
D=runs/ema-2026-12-05-zen4
date -u
time .venv/bin/python train.py --config configs/base.yaml --model-dir $D --set train.ema_decay=0.999
date -u
.venv/bin/python evaluate.py --model-dir $D --split validation
.venv/bin/python evaluate.py --model-dir $D --split test --beam 4
for S in validation test; do for W in average ema; do
  .venv/bin/python evaluate.py --model-dir $D --split $S --beam 4 --weights $W --output $D/hypotheses.$S.$W.txt --json >> $D/eval.jsonl
done; done
date -u
