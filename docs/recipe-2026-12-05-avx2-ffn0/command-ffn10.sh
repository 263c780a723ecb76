set -x
cd /work/main
D=runs/ffn10-4211-2026-12-05-avx2
.venv/bin/python -c "import json; from benchmarks.machine import machine_facts; from benchmarks.flops import matmul_peak_gflops; print(json.dumps({'machine': machine_facts(), 'peak_gflops': {p: round(matmul_peak_gflops(p),1) for p in ('float32','mixed_bfloat16')}}))" > ffn10-peak.json
git rev-parse HEAD
date -u
time .venv/bin/python train.py --config configs/base.yaml --model-dir $D --set train.max_minutes=0 train.max_steps=4211 "train.ffn_dropout_by_plan=[]"
date -u
for s in validation test; do
  .venv/bin/python evaluate.py --model-dir $D --split $s --beam 4 --weights average --output $D/hypotheses.$s.average.txt --json > ffn10-eval-$s.json 2> ffn10-eval-$s.err
done
date -u
