set -x
cd /work/main
D=runs/ema999-seed2-2026-12-04d-avx2
.venv/bin/python -c "import json; from benchmarks.machine import machine_facts; from benchmarks.flops import matmul_peak_gflops; print(json.dumps({'machine': machine_facts(), 'peak_gflops': {p: round(matmul_peak_gflops(p),1) for p in ('float32','mixed_bfloat16')}}))" > /work/scratch/ema2-peak.json
date -u
time .venv/bin/python train.py --config configs/base.yaml --model-dir $D --set train.ema_decay=0.999 train.seed=2
date -u
for w in average ema; do for s in validation test; do
  .venv/bin/python evaluate.py --model-dir $D --split $s --beam 4 --weights $w --output $D/hypotheses.$s.$w.txt --json > /work/scratch/eval2-$w-$s.json 2> /work/scratch/eval2-$w-$s.err
done; done
date -u
