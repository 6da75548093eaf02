"""qwen_lab.tunings: picks recorded on disk by one process and read back by the next, only where they still apply."""

import json

import pytest
import torch
import triton
import triton.language as tl

from qwen_lab import tunings
from qwen_lab.kernels import deltanet, gemm
from qwen_lab.kernels.gemm import gemv as gemm_gemv, tuning as gemm_tuning

CONFIGS = [triton.Config({"BLOCK_N": 64}, num_warps=4, num_stages=2),
           triton.Config({"BLOCK_N": 32}, num_warps=4, num_stages=3),
           triton.Config({"BLOCK_N": 64}, num_warps=8, num_stages=3)]


@pytest.fixture
def store(tmp_path, monkeypatch):
    """The store on, in a folder of this test's own, with nothing read yet (as in a new process), and none of the
    course's switches set (the machine's own would change the file, and QWEN_LAB_TUNE=0 the launchers' timing)."""
    import os

    for name in [n for n in os.environ if n.startswith("QWEN_LAB_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(tunings.ENV, "1")
    monkeypatch.setattr(tunings, "cache_dir", lambda: tmp_path / tunings.FOLDER)
    monkeypatch.setattr(tunings, "_loaded", {})
    return tmp_path / tunings.FOLDER


def new_process(monkeypatch):
    """Forget what this process has read, as a new one would start."""
    monkeypatch.setattr(tunings, "_loaded", {})


def copies(configs):
    """Equal configs that are other objects, as a new process builds them."""
    return [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=c.num_stages) for c in configs]


def test_a_recorded_pick_is_read_back_by_the_next_process(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    key = (1, 1024, 3584, torch.bfloat16, torch.device("cpu"))
    times = {c: t for c, t in zip(CONFIGS, (3.1, 2.7, 4.0))}
    assert tunings.lookup("cpu", kernel, key, CONFIGS) is None, "nothing recorded yet"
    tunings.record("cpu", kernel, key, CONFIGS, CONFIGS[1], times)
    files = list(store.glob("*.json"))
    assert len(files) == 1 and files[0].name.startswith("cpu-"), f"one file per device kind, named after it: {files}"
    assert files[0].stat().st_mode & 0o777 == 0o666 & ~tunings._UMASK, \
        "the file must follow the umask (readable by the other users of a shared cache), not stay private"

    new_process(monkeypatch)
    candidates = copies(CONFIGS)
    found = tunings.lookup("cpu", kernel, key, candidates)
    assert found is not None, "the next process must find the pick"
    choice, read_times = found
    assert choice is candidates[1], f"the pick must come back as the caller's own candidate, got {choice}"
    assert read_times == {candidates[0]: 3.1, candidates[1]: 2.7, candidates[2]: 4.0}, read_times
    assert tunings.lookup("cpu", kernel, (2,) + key[1:], candidates) is None, "another tuning key has no pick"
    assert tunings.lookup("cpu", tunings.kernel_id(gemm.gemv_splitk_kernel), key, candidates) is None, \
        "another kernel has no pick"


def test_plans_of_split_and_config_round_trip(store, monkeypatch):
    plans = [(s, c) for s in (1, 4) for c in CONFIGS]
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel, gemm.gemv_splitk_kernel)
    tunings.record("cpu", kernel, ("k",), plans, plans[4], {p: float(i) for i, p in enumerate(plans)})
    new_process(monkeypatch)
    again = [(s, c) for s in (1, 4) for c in copies(CONFIGS)]
    choice, times = tunings.lookup("cpu", kernel, ("k",), again)
    assert choice is again[4] and choice[0] == 4, choice
    assert times[again[0]] == 0.0 and times[again[5]] == 5.0 and len(times) == 6


def test_a_pick_made_over_other_candidates_is_not_used(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    tunings.record("cpu", kernel, ("k",), CONFIGS, CONFIGS[2], {CONFIGS[2]: 1.0, CONFIGS[0]: 2.0})
    new_process(monkeypatch)
    assert tunings.lookup("cpu", kernel, ("k",), copies(CONFIGS[:2])) is None, \
        "a recorded choice outside today's candidates (a config removed, or pruned for this call) must be timed anew"
    more = copies(CONFIGS) + [triton.Config({"BLOCK_N": 128}, num_warps=8, num_stages=2)]
    assert tunings.lookup("cpu", kernel, ("k",), more) is None, \
        "a candidate added since the pick was made has never been timed: the call must time them all"
    assert tunings.lookup("cpu", kernel, ("k",), copies(CONFIGS)[::-1])[0].num_warps == 8, \
        "the same candidates in another order are the same offer"


def test_the_switches_that_change_kernels_select_another_file(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    tunings.record("cpu", kernel, ("k",), CONFIGS, CONFIGS[0])
    first = tunings.path("cpu")
    monkeypatch.setenv("QWEN_LAB_PDL", "0")
    assert tunings.path("cpu") != first, "QWEN_LAB_PDL changes the kernels: its picks need a file of their own"
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS) is None
    monkeypatch.delenv("QWEN_LAB_PDL")
    monkeypatch.setenv("QWEN_LAB_MODEL", "tiny")
    assert tunings.path("cpu") == first, "the model a notebook loads changes no kernel"
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS)[0] is CONFIGS[0]


def test_switched_off_nothing_is_read_or_written(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    tunings.record("cpu", kernel, ("k",), CONFIGS, CONFIGS[0])
    monkeypatch.setenv(tunings.ENV, "0")
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS) is None, "QWEN_LAB_TUNING_CACHE=0 must read nothing"
    tunings.record("cpu", kernel, ("other",), CONFIGS, CONFIGS[1])
    monkeypatch.setenv(tunings.ENV, "1")
    new_process(monkeypatch)
    assert tunings.lookup("cpu", kernel, ("other",), CONFIGS) is None, "QWEN_LAB_TUNING_CACHE=0 must write nothing"


def test_records_of_two_processes_are_merged(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    tunings._entries(tunings.path("cpu"))            # this process read the (empty) file first
    other = dict(tunings._loaded)
    monkeypatch.setattr(tunings, "_loaded", {})      # another process records meanwhile
    tunings.record("cpu", kernel, ("a",), CONFIGS, CONFIGS[0])
    monkeypatch.setattr(tunings, "_loaded", other)   # back in the first one
    tunings.record("cpu", kernel, ("b",), CONFIGS, CONFIGS[1])
    new_process(monkeypatch)
    assert tunings.lookup("cpu", kernel, ("a",), CONFIGS)[0] is CONFIGS[0], "the other process's record was lost"
    assert tunings.lookup("cpu", kernel, ("b",), CONFIGS)[0] is CONFIGS[1]


def test_an_unreadable_file_counts_as_empty_and_clear_removes_the_files(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    store.mkdir(parents=True)
    tunings.path("cpu").write_text("{ not json")
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS) is None
    tunings.record("cpu", kernel, ("k",), CONFIGS, CONFIGS[2])
    assert json.loads(tunings.path("cpu").read_text())["entries"], "the record replaces the broken file"
    assert tunings.clear() == 1 and not list(store.glob("*.json"))
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS) is None, "cleared: nothing to find, in this process too"


def test_an_edited_kernel_has_another_id(tmp_path):
    import importlib.util

    def kernel_from(name, body):
        (tmp_path / f"{name}.py").write_text("import triton\n\n\n@triton.jit\ndef k(x_ptr):\n" + body)
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.k
    before, after = kernel_from("before", "    x = 1\n"), kernel_from("after", "    x = 2\n")
    assert tunings.kernel_id(before).startswith("k:")
    assert tunings.kernel_id(before) != tunings.kernel_id(after), "a kernel's id must follow its source"
    assert tunings.kernel_id(before) == tunings.kernel_id(kernel_from("again", "    x = 1\n"))


def test_the_autotuner_hook_times_once_then_reads_the_record(store, monkeypatch):
    """_autotuner_check stands in for Triton's check_disk_cache: the first process times and records, the next one
    takes the record without timing; with the store off it times every time."""
    def make_tuner():
        return triton.autotune(configs=copies(CONFIGS), key=["N"])(gemm.gemv_rows_kernel)
    timed = []

    def bench_for(tuner):
        def bench():
            timed.append(tuner)
            tuner.configs_timings = {c: float(i + 1) for i, c in enumerate(tuner.configs)}
            tuner.cache[(1024,)] = tuner.configs[2]
        return bench
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tunings, "_device_identity", lambda device: ("Test GPU", "sm_90"))
    first = make_tuner()
    assert tunings._autotuner_check(first, (1024,), first.configs, bench_for(first)) is False, "nothing to read yet"
    assert timed == [first]
    new_process(monkeypatch)
    second = make_tuner()
    assert tunings._autotuner_check(second, (1024,), second.configs, bench_for(second)) is True, \
        "the next process must read the record instead of timing"
    assert timed == [first], "it timed again"
    assert second.cache[(1024,)] is second.configs[2], "the pick must be the tuner's own config object"
    assert second.configs_timings[second.configs[0]] == 1.0, "the measured times come back with the pick"
    assert list(store.glob("test-gpu-*.json")), "the file is named after the GPU"

    monkeypatch.setenv(tunings.ENV, "0")
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "0")
    third = make_tuner()
    third._triton_cache_results = False
    assert tunings._autotuner_check(third, (1024,), third.configs, bench_for(third)) is False
    assert timed == [first, third], "with the store off the call must be timed"

    # the store off and Triton's own switch on (the GPU test runs share tunings that way): Triton's disk cache
    asked = []
    monkeypatch.setattr(triton.runtime.autotuner.Autotuner, "check_disk_cache",
                        lambda self, key, configs, bench: asked.append(key) or True)
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    fourth = make_tuner()
    assert tunings._autotuner_check(fourth, (1024,), fourth.configs, bench_for(fourth)) is True
    assert asked == [(1024,)] and timed == [first, third], "Triton's own disk cache must answer"


def test_the_scan_pick_of_one_process_serves_the_next(store, monkeypatch):
    """deltanet.tuning._pick_in_place (its timing replaced, as on a CPU): the first process times every config and records
    the fastest; a new process takes it from the record and launches nothing to time it."""
    kernel = "chunk_scan_kernel"
    configs = deltanet.autotune_configs(kernel, Dv=128)
    cost = {str(c): 10.0 + i for i, c in enumerate(configs)}
    cost[str(configs[3])] = 1.0
    launched = []

    def launch(config):
        launched.append(str(config))

    def timer(calls, warmup, replays):
        for call in calls:
            call()
        return cost[launched[-1]]
    monkeypatch.setattr(deltanet.tuning, "_time_in_graph", timer)
    monkeypatch.setitem(deltanet.tuning._PICKS, kernel, {})
    state = torch.zeros(3)
    key = (torch.device("cpu"), torch.bfloat16, 16, 128, 128, 64, 5, True, 200)
    assert str(deltanet.tuning._pick_in_place(kernel, key, launch, (state,), True, calls=2, Dv=128)) == str(configs[3])
    assert len(launched) == 2 * len(configs)

    new_process(monkeypatch)
    monkeypatch.setitem(deltanet.tuning._PICKS, kernel, {})
    launched.clear()
    assert str(deltanet.tuning._pick_in_place(kernel, key, launch, (state,), True, calls=2, Dv=128)) == str(configs[3])
    assert launched == [], f"the next process timed again: {launched}"


@triton.jit
def _scale_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)


def test_a_real_autotuner_goes_through_the_store(store, monkeypatch):
    """triton.autotune wrapped by tunings.stored, run as a launcher runs it (Autotuner.run): the first process times
    every config and records the fastest; the next one launches with that config and times nothing."""
    from qwen_lab import runtime

    configs = [triton.Config({"BLOCK": b}, num_warps=4) for b in (16, 32, 64)]
    cost = {16: 3.0, 32: 1.0, 64: 2.0}
    # the tensors where the kernel really runs: the interpreter's CPU, else the GPU (decided before the patch below)
    dev = "cpu" if runtime.interpreter_active() or not torch.cuda.is_available() else "cuda"

    def fake_bench(kernel_call, quantiles):  # the GPU's timer, here: run the candidate, give it a time
        kernel_call()
        return [cost[tuner.current_block]] * len(quantiles)
    monkeypatch.setattr(runtime, "interpreter_active", lambda: False)   # stored() hooks only where things are timed
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(tunings, "_device_identity", lambda device: ("Test GPU", "sm_90"))

    def make():
        t = tunings.stored(triton.autotune(configs=copies(configs), key=["N"], do_bench=fake_bench)(_scale_kernel))
        original = t._bench

        def bench(*args, config, **kwargs):
            t.current_block = config.kwargs["BLOCK"]
            return original(*args, config=config, **kwargs)
        t._bench = bench
        return t
    x = torch.arange(100, dtype=torch.float32, device=dev)
    out = torch.empty_like(x)
    tuner = make()
    assert tuner.cache_results, "stored() must make Triton ask the store for every new key"
    tuner[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
    assert tuner.best_config.kwargs["BLOCK"] == 32 and torch.equal(out, 2 * x)

    new_process(monkeypatch)
    tuner = make()

    def no_timing(*args, **kwargs):
        raise AssertionError("the next process timed the configs again instead of reading the record")
    tuner._bench = no_timing
    out.zero_()
    tuner[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
    assert tuner.best_config.kwargs["BLOCK"] == 32 and torch.equal(out, 2 * x)
    assert tuner.configs_timings[tuner.best_config] == [1.0, 1.0, 1.0]


def test_processes_recording_at_once_keep_every_record(store):
    """Four processes record 40 picks each into one file at the same time: all 160 must be there."""
    import subprocess
    import sys

    script = f"""
import sys, triton
from pathlib import Path
from qwen_lab import tunings
from qwen_lab.kernels import gemm
tunings.cache_dir = lambda: Path({str(store)!r})
configs = [triton.Config({{"BLOCK_N": 64}}, num_warps=4), triton.Config({{"BLOCK_N": 32}}, num_warps=4)]
kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
for i in range(40):
    tunings.record("cpu", kernel, (int(sys.argv[1]), i), configs, configs[i % 2])
"""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(p)]) for p in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    entries = json.loads(tunings.path("cpu").read_text())["entries"]
    assert len(entries) == 160, f"{160 - len(entries)} of 160 records lost between processes"


def test_a_file_of_another_shape_is_replaced_and_an_unreadable_one_left_alone(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    file = tunings.path("cpu")
    store.mkdir(parents=True)
    for content in ('{"entries": []}', '[1, 2]', '{"entries": {"x": 3, "y": {"times": 5}}}'):
        file.write_text(content)
        new_process(monkeypatch)
        assert tunings.lookup("cpu", kernel, ("k",), CONFIGS) is None, content
    tunings.record("cpu", kernel, ("k",), CONFIGS, CONFIGS[1])
    new_process(monkeypatch)
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS)[0] is CONFIGS[1], "the record replaces such a file"

    import pathlib
    read_text = pathlib.Path.read_text

    def refuse(self, *args, **kwargs):
        if self == file:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)
    monkeypatch.setattr(pathlib.Path, "read_text", refuse)
    new_process(monkeypatch)
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS) is None
    tunings.record("cpu", kernel, ("other",), CONFIGS, CONFIGS[0])
    monkeypatch.setattr(pathlib.Path, "read_text", read_text)
    new_process(monkeypatch)
    assert tunings.lookup("cpu", kernel, ("k",), CONFIGS)[0] is CONFIGS[1], \
        "a file this process could not read must not be overwritten with its records alone"


def test_candidates_no_text_tells_apart_are_always_timed(store, monkeypatch):
    kernel = tunings.kernel_id(gemm.gemv_rows_kernel)
    hooked = copies(CONFIGS)
    hooked[0].pre_hook = lambda nargs: None
    tunings.record("cpu", kernel, ("k",), hooked, hooked[1])
    assert tunings.lookup("cpu", kernel, ("k",), hooked) is None, "a pre-hook is not in any record"
    same = [CONFIGS[0], copies(CONFIGS)[0]]
    tunings.record("cpu", kernel, ("k",), same, same[1])
    assert tunings.lookup("cpu", kernel, ("k",), same) is None, "two candidates with one text cannot be told apart"
    assert not list(store.glob("*.json")), "neither set may be recorded"


def test_an_edit_of_the_kernel_modules_starts_a_new_file(store, monkeypatch):
    first = tunings.path("cpu")
    monkeypatch.setattr(tunings, "_code_digest", lambda: "edited")
    assert tunings.path("cpu") != first, "an edited launcher or timer must not reuse the old picks"


def test_triton_settings_that_change_compiled_code_start_a_new_file(store, monkeypatch):
    first = tunings.path("cpu")
    monkeypatch.setenv("MLIR_ENABLE_DUMP", "1")   # one of Triton's cache-invalidating settings
    assert tunings._triton_settings(), "Triton's list of code-changing settings was not read"
    assert tunings.path("cpu") != first


@pytest.mark.gpu
def test_gpu_a_decode_gemv_plan_is_read_back_and_computes_the_same(store, monkeypatch):
    """A real decode GEMV: its plan timed and recorded on the first call; after the process's own plans are
    forgotten, the next call takes the recorded plan (timing forbidden) and gives the same bits."""
    torch.manual_seed(0)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(3000, 1024, device="cuda", dtype=torch.bfloat16) / 32
    monkeypatch.setattr(gemm_tuning, "_plans", {})
    monkeypatch.setattr(gemm_tuning, "plan_times", {})
    first = gemm.linear(x, w)
    plan = gemm.gemv_plan(1, 3000, 1024, device="cuda")
    times = gemm.gemv_plan_times(1, 3000, 1024, device="cuda")
    assert plan is not None and times, "the first call must time its plans"

    new_process(monkeypatch)
    monkeypatch.setattr(gemm_tuning, "_plans", {})
    monkeypatch.setattr(gemm_tuning, "plan_times", {})

    def no_timing(*args, **kwargs):
        raise AssertionError("the plan was timed again instead of read from the store")
    monkeypatch.setattr(gemm_gemv, "_tune_plan", no_timing)
    again = gemm.linear(x, w)

    def text(plan):  # (SPLIT_K, config) as text (a tuple's str shows the config's address)
        return f"{plan[0]} {plan[1]}"
    assert text(gemm.gemv_plan(1, 3000, 1024, device="cuda")) == text(plan)
    assert {text(p): t for p, t in gemm.gemv_plan_times(1, 3000, 1024, device="cuda").items()} == \
        {text(p): t for p, t in times.items()}
    # the same plan; with atomic split-K the last bits may differ between two runs
    torch.testing.assert_close(again, first, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_gpu_the_prefill_gemm_tuning_is_read_back(store, monkeypatch):
    """Triton's autotuner around the prefill GEMM: a new key tuned and recorded; with the in-memory tuning forgotten,
    the next call reads the record (timing forbidden) and keeps the same config."""
    torch.manual_seed(0)
    x = torch.randn(200, 1024, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1536, 1024, device="cuda", dtype=torch.bfloat16) / 32
    tuner = gemm.matmul_kernel
    monkeypatch.setattr(tuner, "cache", {})
    first = gemm.linear(x, w)
    best = tuner.best_config
    assert list(store.glob("*.json")), "the tuning must be recorded"

    new_process(monkeypatch)
    monkeypatch.setattr(tuner, "cache", {})

    def no_timing(*args, **kwargs):
        raise AssertionError("the GEMM was tuned again instead of read from the store")
    monkeypatch.setattr(tuner, "_bench", no_timing)
    again = gemm.linear(x, w)
    assert str(tuner.best_config) == str(best)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_the_command_line_lists_and_clears(store, monkeypatch, capsys):
    tunings.record("cpu", tunings.kernel_id(gemm.gemv_rows_kernel), ("a",), CONFIGS, CONFIGS[0])
    tunings.record("cpu", tunings.kernel_id(gemm.gemv_rows_kernel), ("b",), CONFIGS, CONFIGS[1])
    new_process(monkeypatch)
    assert tunings.main([]) == 0
    out = capsys.readouterr().out
    assert f"{tunings.path('cpu').name}: 2 pick(s)" in out and "on;" in out, out
    assert tunings.main(["--clear"]) == 0
    assert "deleted 1 tuning file(s)" in capsys.readouterr().out
    tunings.main([])
    assert "no file yet" in capsys.readouterr().out
