set -x
cd /work/main
D=runs/ema-2026-12-04c-avx2
.venv/bin/python -c "import json; from benchmarks.machine import machine_facts; from benchmarks.flops import matmul_peak_gflops; print(json.dumps({'machine': machine_facts(), 'peak_gflops': {p: round(matmul_peak_gflops(p),1) for p in ('float32','mixed_bfloat16')}}))" > /work/scratch/ema-peak.json
date -u
time .venv/bin/python train.py --config configs/base.yaml --model-dir $D --set train.ema_decay=0.998
date -u
.venv/bin/python evaluate.py --model-dir $D --split validation
.venv/bin/python evaluate.py --model-dir $D --split test --beam 4
date -u
