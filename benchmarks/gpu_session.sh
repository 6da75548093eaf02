#!/usr/bin/env bash
# Everything a GPU session checks, in one command on the device machine (the lease is short: one call).
#   bash benchmarks/gpu_session.sh [tests|bench|all]     results under $OUT (or ./gpu_out)
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
what=${1:-all}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg
if ls .whl/*.whl >/dev/null 2>&1; then   # carried wheels (flash-linear-attention for the comparisons)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

if [ "$what" = bench ] || [ "$what" = all ]; then
  timeout 300 python3 -m qwen_lab.bench --model qwen3.5-0.8b --prefill-len 2048 --decode-steps 64 \
      --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee "$OUT/bench.txt"
  timeout 150 python3 benchmarks/bench_gemv.py --out "$OUT" 2>&1 | tail -n 60 | tee "$OUT/gemv.txt"
  timeout 120 python3 benchmarks/bench_deltanet.py --out "$OUT" 2>&1 | tail -n 40 | tee "$OUT/deltanet.txt"
fi
if [ "$what" = tests ] || [ "$what" = all ]; then
  timeout ${TEST_TIMEOUT:-420} python3 -m pytest tests -q -n 8 -p no:cacheprovider --timeout 400 \
      -k "${TEST_FILTER:-}" 2>&1 | tail -n 80 | tee "$OUT/tests.txt"
fi
