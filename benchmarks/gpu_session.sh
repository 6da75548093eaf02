#!/usr/bin/env bash
# Everything a GPU session checks, in one command on the device machine (the lease is short: one call).
#   bash benchmarks/gpu_session.sh [all] [tests] [bench] [kernels] [notebooks]    results under $OUT (or ./gpu_out)
set -u
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
what=" ${*:-all} "
want() { [[ "$what" == *" $1 "* || "$what" == *" all "* ]]; }
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" MPLBACKEND=Agg
# Carried wheels (flash-linear-attention) go on the path of the benchmarks only: once importable, transformers
# swaps its PyTorch delta-rule functions for fla's Triton ones, which the parity tests must not compare against.
FLA_PATH="$PYTHONPATH"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/fla .whl/*.whl
  FLA_PATH="$PYTHONPATH:/tmp/fla"
fi
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

if want bench; then
  PYTHONPATH="$FLA_PATH" timeout 300 python3 -m qwen_lab.bench --model qwen3.5-0.8b --prefill-len 2048 --decode-steps 64 \
      --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | grep -v "falling back" | tee "$OUT/bench.txt"
fi
if want kernels; then
  timeout 150 python3 benchmarks/bench_gemv.py --out "$OUT" 2>&1 | tail -n 60 | tee "$OUT/gemv.txt"
  PYTHONPATH="$FLA_PATH" timeout 120 python3 benchmarks/bench_deltanet.py --out "$OUT" 2>&1 | tail -n 40 | tee "$OUT/deltanet.txt"
fi
if want tests; then
  # one process per test file, so a kernel that faults cannot poison the CUDA context of other files' tests
  mkdir -p /tmp/testlogs
  ls tests/test_*.py | timeout ${TEST_TIMEOUT:-420} xargs -P ${TEST_JOBS:-6} -I{} sh -c \
      'python3 -m pytest {} -q -p no:cacheprovider --timeout 300 --tb=short -k "${TEST_FILTER:-}" > /tmp/testlogs/$(basename {} .py).txt 2>&1; echo "$(basename {}): $(tail -n 1 /tmp/testlogs/$(basename {} .py).txt)"' \
      | sort | tee "$OUT/tests_summary.txt"
  for f in /tmp/testlogs/*.txt; do echo "=== $f"; grep -E "^(FAILED|ERROR)|Error|error:|^E " "$f" | head -n 40; done > "$OUT/tests_failures.txt"
  tail -n 30 "$OUT/tests_failures.txt"
fi
if want notebooks; then
  timeout ${NB_TIMEOUT:-500} python3 benchmarks/run_notebooks.py solutions/*.ipynb 2>&1 | tee "$OUT/notebooks.txt"
fi
