#!/usr/bin/env bash
# Everything a GPU run checks, in one command on the GPU machine; name targets to run only some of them.
#   bash benchmarks/gpu_session.sh [all] [tests] [bench] [kernels] [families] [ab] [profile] [probes] [notebooks]
#        [persistent | persistent_tests | persistent_bench | persistent_trace]  (the persistent decode step; only
#        when named)
#   results under $OUT (or ./gpu_out).
#   TEST_SHARD=0/2 bash benchmarks/gpu_session.sh tests      (then 1/2 in a second run: half the test files each)
#   TEST_FILES="tests/test_conv1d.py tests/test_attention.py" bash benchmarks/gpu_session.sh tests   (chosen files)
#   SAVE_TRITON_CACHE=1 bash benchmarks/gpu_session.sh tests   (then .tcache/triton-cache.tar.xz for the next call)
#   FAMILIES="norms rope" bash benchmarks/gpu_session.sh families   (some of the kernel families' benchmarks)
#   bash benchmarks/gpu_session.sh kernels   (the gemm and deltanet families' benchmarks alone)
#   AB_SWITCH=QWEN_LAB_DETERMINISTIC=0,1 AB_ROUNDS=3 bash benchmarks/gpu_session.sh ab   (one switch's A/B)
#   bash benchmarks/gpu_session.sh record   (not part of all: the notebooks' recorded GPU results, into $OUT/records)
# On a machine with two GPUs, run the timing targets on one and the tests and notebooks on the other:
#   CUDA_VISIBLE_DEVICES=1 bash benchmarks/gpu_session.sh tests notebooks & CUDA_VISIBLE_DEVICES=0 bash benchmarks/gpu_session.sh bench profile
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
# The Triton cache of an earlier call of the session, carried: a fresh machine otherwise compiles every kernel
# again, 1.5-2.5 minutes of each call. SAVE_TRITON_CACHE=1 leaves this call's cache in $OUT/triton-cache.tar.xz
# (the compiled binaries, their metadata and PTX, the tunings, and the launchers Triton builds with the host's C
# compiler for each kernel signature; not the other IR, which a cache hit never reads);
# copy it to .tcache/ and name .tcache in the next call's carry. The cache's own keys (source, compiler, GPU, options)
# decide what is reused; its index holds absolute paths, so both calls use the same TRITON_CACHE_DIR.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tcache}
if [ -f .tcache/triton-cache.tar.xz ]; then
  mkdir -p "$TRITON_CACHE_DIR"
  if tar -xJf .tcache/triton-cache.tar.xz -C "$TRITON_CACHE_DIR"; then
    echo "Triton cache restored: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) compiled kernels" | tee "$OUT/cache.txt"
  else
    echo "Triton cache not restored: the kernels compile afresh" | tee "$OUT/cache.txt"
  fi
fi
# The tuning picks (qwen_lab.tunings) travel on their own too: a few KB that come back even when the archive is too
# large to (then copy $OUT/qwen_lab-tunings/ to .tcache/qwen_lab-tunings/ for the next call).
if ls .tcache/qwen_lab-tunings/*.json >/dev/null 2>&1; then
  mkdir -p "$TRITON_CACHE_DIR/qwen_lab-tunings"
  cp .tcache/qwen_lab-tunings/*.json "$TRITON_CACHE_DIR/qwen_lab-tunings/"
  echo "tuning picks restored: $(ls .tcache/qwen_lab-tunings/*.json | wc -l) file(s)" | tee -a "$OUT/cache.txt"
fi
save_cache() {
  [ "${SAVE_TRITON_CACHE:-0}" = 1 ] && [ -d "$TRITON_CACHE_DIR" ] || return 0
  local archive; archive="$(cd "$OUT" && pwd)/triton-cache.tar.xz"
  (cd "$TRITON_CACHE_DIR" && find . -type f \( -name '*.cubin' -o -name '*.json' -o -name '*.ptx' -o -name '*.so' \) -print0 \
      | tar --null -T - -cf - | xz -T0 -6 > "$archive")
  local bytes; bytes=$(stat -c %s "$archive")
  # (a file over 16 MiB does not come back from the device machine)
  echo "Triton cache saved: $bytes bytes$([ "$bytes" -gt 16777216 ] && echo ', too large to come back')" | tee -a "$OUT/cache.txt"
  if ls "$TRITON_CACHE_DIR"/qwen_lab-tunings/*.json >/dev/null 2>&1; then
    mkdir -p "$OUT/qwen_lab-tunings"
    cp "$TRITON_CACHE_DIR"/qwen_lab-tunings/*.json "$OUT/qwen_lab-tunings/"
    echo "tuning picks saved: $(ls "$OUT"/qwen_lab-tunings/*.json | wc -l) file(s)" | tee -a "$OUT/cache.txt"
  fi
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

if want bench; then
  # on a fresh machine the first row's warm-up compiles and tunes every kernel (about 150 s of the ~270 s in all)
  PYTHONPATH="$FLA_PATH" timeout ${BENCH_TIMEOUT:-420} python3 -m qwen_lab.bench --model qwen3.5-0.8b --prefill-len 2048 --decode-steps 64 \
      --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | grep -v "falling back" | tee "$OUT/bench.txt"
fi
# one benchmark per kernel family on the shared harness (benchmarks/harness.py): each implementation checked against
# the reference, then timed in a CUDA Graph; a table each, and $OUT/bench_<family>.json. `kernels`: the two longest,
# gemm (every projection's decode plans, the prefill GEMMs, the SPLIT_K sweep) and deltanet (flash-linear-attention
# beside the chunked rule, where its wheel is carried); `families`: every family (FAMILIES: some of them)
families=""
if want families; then families="${FAMILIES:-norms attention rope embedding conv1d activations sampling gemm deltanet}"; fi
if want kernels; then for f in gemm deltanet; do [[ " $families " == *" $f "* ]] || families="$families $f"; done; fi
for family in $families; do
  # gemm compiles and times every decode plan of six shapes: the longest (its sweep stops adding cases at 150 s)
  limit=${FAMILY_TIMEOUT:-$([ "$family" = gemm ] && echo 300 || echo 180)}
  PYTHONPATH="$FLA_PATH" timeout "$limit" python3 benchmarks/bench_$family.py --json "$OUT/bench_$family.json" \
      2>"$OUT/bench_$family.log" | tee "$OUT/bench_$family.txt"
  tail -n 3 "$OUT/bench_$family.log"   # a failed check, or an error
done
if want ab; then
  # the same-process A/B of one public switch (python -m qwen_lab.bench ab), prefill and decode, both orders
  timeout ${AB_TIMEOUT:-480} python3 -m qwen_lab.bench ab --switch "${AB_SWITCH:-QWEN_LAB_PDL=0,1}" \
      --rounds ${AB_ROUNDS:-3} --json "$OUT/ab.json" 2>&1 | grep -v "falling back" | tee "$OUT/ab.txt"
fi
# nbformat and IPython (the exercise tests read the notebooks through qwen_lab.course.exercises; the notebooks'
# cells display through IPython) where the image lacks them: carried as Python 3.12 wheels in .whl/test
# (pip download --python-version 3.12 --only-binary=:all: -d .whl/test nbformat ipython pytest-xdist pytest-timeout),
# with pytest-xdist and pytest-timeout, which spread the tests over workers and limit each test
if [[ "$what" == *" record "* ]] || want tests || want notebooks; then
  for pkg in nbformat:nbformat IPython:ipython xdist:pytest-xdist pytest_timeout:pytest-timeout nbclient:nbclient \
             ipykernel:ipykernel; do
    if ! python3 -c "import ${pkg%%:*}" 2>/dev/null && ls .whl/test/*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --find-links .whl/test "${pkg#*:}"
    fi
  done
fi
if want tests; then
  # every test file in one pytest run spread test by test over worker processes (a worker that faults is replaced,
  # so a bad kernel cannot take the other tests down with it); the slowest file no longer bounds the wall time.
  # loadgroup: the tests marked xdist_group (the 0.8B graph and parity tests) stay on one worker each, which builds
  # their module's model and graphs once
  # TRITON_CACHE_AUTOTUNING: the workers share Triton's autotuning results through its disk cache instead of each
  # tuning the same shapes again (only the tests, which record nothing in qwen_lab.tunings either: the benchmarks
  # tune on a quiet GPU, or take what an earlier run recorded there; the kernel benchmarks always time afresh)
  # (a per-test limit where pytest-timeout is installed: one hung kernel then fails its test, not the whole run;
  # PER_TEST_TIMEOUT raises it on a machine whose Triton cache is empty, where the 0.8B tests that tune every GEMM
  # shape while eleven other workers compile took over 300 s)
  per_test=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout ${PER_TEST_TIMEOUT:-300}")
  # TEST_SHARD=i/n runs every n-th test file from the i-th (0-based): the whole suite takes ~8 minutes with 12
  # workers, so where a run's time is limited two runs can take it in halves.
  # (More workers than 12 on 16 cores made compilation alone pass the per-test limit.)
  # TEST_FILES="tests/test_a.py tests/test_b.py" runs those files instead (the checks of one change)
  files=${TEST_FILES:-$(ls tests/test_*.py | awk -v s="${TEST_SHARD:-0/1}" 'BEGIN { split(s, a, "/") } (NR - 1) % a[2] == a[1]')}
  # (live_report: each failure goes to $OUT/failures.txt as it happens, and each finished test to $OUT/finished.txt,
  # so a run cut short still says what failed and which tests it never reached)
  PYTHONPATH="$PWD/benchmarks:$PYTHONPATH" TRITON_CACHE_AUTOTUNING=1 timeout ${TEST_TIMEOUT:-480} \
      python3 -m pytest $files -q -p no:cacheprovider -p live_report -n ${TEST_JOBS:-12} --dist loadgroup $per_test --tb=short -rfE --durations=15 -k "${TEST_FILTER:-}" > "$OUT/tests.txt" 2>&1
  tail -n 3 "$OUT/tests.txt"  # a usage error (an option pytest does not know) shows here too
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | tail -n 40
fi
if want profile; then
  timeout 120 python3 -m qwen_lab.profile_step --out "$OUT" 2>&1 | tee "$OUT/profile.txt" | head -n 60
fi
if want probes; then
  # the two questions still open (docs/experiments.md): the chunked kernels at head dims 16 and 32, case by case,
  # and the prefill attention's gate apart below 64 tokens
  timeout 180 python3 benchmarks/probe_deltanet.py 2>&1 | tee "$OUT/probe_deltanet.txt"
  timeout 120 python3 benchmarks/probe_attention.py 2>&1 | tee "$OUT/probe_attention.txt"
fi
# the persistent decode step (issue 50): named only, not part of "all" while generate does not use it.
# "persistent" runs both halves; on a machine without a carried Triton cache run them as two calls
# (persistent_tests, then persistent_bench: the plan's warm-up at 2048 tokens tunes every GEMM first).
if [[ "$what" == *" persistent "* || "$what" == *" persistent_tests "* ]]; then
  # its tests (the GPU ones: one program per SM, 256 greedy tokens against the graph decode, bitwise repeats)
  timeout ${PERSIST_TEST_TIMEOUT:-280} python3 -m pytest tests/test_persistent.py -q -s -p no:cacheprovider -rfE \
      --tb=short > "$OUT/persistent_tests.txt" 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|first divergence" "$OUT/persistent_tests.txt" | tail -n 20
fi
if [[ "$what" == *" persistent "* || "$what" == *" persistent_bench "* ]]; then
  # its timing against the plan's graph decode in one process, rounds in both orders
  timeout ${PERSIST_BENCH_TIMEOUT:-300} python3 benchmarks/bench_persistent.py --json "$OUT/bench_persistent.json" \
      ${PERSIST_ARGS:-} 2>"$OUT/bench_persistent.log" | tee "$OUT/bench_persistent.txt"
  tail -n 5 "$OUT/bench_persistent.log"
fi
if [[ "$what" == *" persistent "* || "$what" == *" persistent_trace "* ]]; then
  # where its time goes: every item stamped with the GPU's clock, summed per kind (needs no plan warm-up)
  timeout ${PERSIST_TRACE_TIMEOUT:-150} python3 benchmarks/trace_persistent.py --json "$OUT/trace_persistent.json" \
      ${PERSIST_TRACE_ARGS:---variants 8:16x1024:n:c3:p64k:v8:r8x2048,8:16x1024:n:c3:p64k:v8:r8x2048:w:f} 2>&1 \
      | grep -v "falling back" | tee "$OUT/trace_persistent.txt"
fi
if want notebooks; then
  timeout ${NB_TIMEOUT:-500} python3 benchmarks/run_notebooks.py solutions/*.ipynb 2>&1 | tee "$OUT/notebooks.txt"
fi
if [[ "$what" == *" record "* ]]; then   # named only, not part of all: the records the notebooks show on a CPU
  # with flash-linear-attention on the path, as the benchmark runs: notebook 09's fla row, notebook 13's transformers
  PYTHONPATH="$FLA_PATH" timeout ${RECORD_TIMEOUT:-570} python3 benchmarks/record_notebooks.py --out "$OUT/records" \
    ${RECORD_ARGS:-} 2>&1 | tee "$OUT/record.txt"
fi
save_cache
