"""The kernel families' benchmarks on the shared harness (benchmarks/harness.py), and `python -m qwen_lab.bench ab`.

On a CPU each benchmark runs the tiny config's shapes through the interpreter: a row per implementation of every
case with the harness's keys, each implementation checked against the reference before it is timed (one that
disagrees is reported and never timed), and the JSON written reads back. `bench ab` refuses bad switches and, on a
CPU, anything but its dry run. On a GPU (marked gpu) each benchmark and the A/B run briefly and measure.
"""

import json
import math
import os
import sys

import pytest
import torch

from qwen_lab import bench, bench_ab, runtime

FAMILIES = ("norms", "attention", "rope", "embedding", "conv1d", "activations", "sampling", "gemm", "deltanet")
ROW_KEYS = {"case", "shape", "impl", "error", "tol", "ok", "bytes", "flops", "us", "us_rounds", "timing", "GBps",
            "TFLOPs", "copy_share", "matmul_share", "copies", "note"}
RESULT_KEYS = {"benchmark", "gpu", "torch", "triton", "commit", "switches", "date", "dtype", "config", "tokens", "rounds",
               "floors", "measured", "rows", "skipped"}
GPU = torch.cuda.is_available() and not runtime.interpreter_active()


def load(benchmark_module, family):
    """benchmarks/bench_<family>.py and the harness module it imported (the one its cases are made with)."""
    module = benchmark_module(f"bench_{family}")
    return module, sys.modules["harness"]


@pytest.mark.parametrize("family", FAMILIES)
def test_each_benchmark_checks_and_times_every_implementation_of_every_case(family, benchmark_module):
    module, harness = load(benchmark_module, family)
    result = harness.run(module.cases, f"bench_{family}", rounds=1, progress=False)
    assert set(result) == RESULT_KEYS and result["benchmark"] == f"bench_{family}"
    assert result["measured"] == GPU and result["config"] == ("qwen3.5-0.8b" if GPU else "tiny")
    rows = result["rows"]
    assert rows, f"bench_{family}: no case ran"
    for r in rows:
        assert set(r) == ROW_KEYS, sorted(set(r) ^ ROW_KEYS)
        where = f"bench_{family}: {r['case']} ({r['shape']}) {r['impl']}"
        # the check against the reference ran and passed before the timing
        assert r["ok"] and math.isfinite(r["error"]) and r["error"] <= r["tol"], where
        assert r["us"] > 0 and r["us_rounds"] and r["bytes"] > 0, where
        assert r["GBps"] == pytest.approx(r["bytes"] / (r["us"] * 1e-6) / 1e9), where
        assert (r["TFLOPs"] is None) == (r["flops"] == 0), where
        if not GPU:   # the interpreter's wall clock, labelled as such, and no floor to hold it against
            assert r["timing"] == harness.WALL and "not a measurement" in r["timing"], where
            assert r["copy_share"] is None and r["matmul_share"] is None, where
    cases = {(r["case"], r["shape"]) for r in rows}
    for case in cases:   # the library's kernel and at least one PyTorch implementation beside it
        impls = [r["impl"] for r in rows if (r["case"], r["shape"]) == case]
        assert "triton" in impls and any(i.startswith("torch") for i in impls), (case, impls)


def test_the_json_reads_back_and_the_table_says_what_the_times_are(benchmark_module, tmp_path, capsys):
    module, harness = load(benchmark_module, "norms")
    path = tmp_path / "norms.json"
    assert module.main("bench_norms", module.cases, module.__doc__, ["--json", str(path), "--only", "add_rms_norm",
                                                                      "--rounds", "1"]) == 0
    data = json.loads(path.read_text())
    assert set(data) == RESULT_KEYS and data["benchmark"] == "bench_norms"
    assert data["torch"] == torch.__version__ and data["date"].endswith("Z")
    assert data["rows"] and {r["case"] for r in data["rows"]} == {"add_rms_norm"}
    assert all(set(r) == ROW_KEYS for r in data["rows"])
    out = capsys.readouterr().out
    assert "| add_rms_norm |" in out and "| triton |" in out
    if not GPU:
        assert "NOT A MEASUREMENT" in out


def test_an_implementation_that_disagrees_with_the_reference_is_reported_and_not_timed(benchmark_module, capsys):
    from qwen_lab import reference
    from qwen_lab.kernels import norms

    _, harness = load(benchmark_module, "norms")
    calls = {"wrong": 0, "right": 0, "raises": 0}

    def raises(d):
        raise ValueError("x: expected [T, H]")

    def counted(name, fn):
        def run(d):
            calls[name] += 1
            return fn(d)
        return run

    def cases(env):
        H = env.config.hidden_size
        return [harness.Case(
            "rms_norm", f"T=3 H={H}", lambda seed: {"x": env.randn(3, H, seed=seed), "w": env.randn(H, seed=7)},
            {"right": counted("right", lambda d: norms.rms_norm(d["x"], d["w"], 1e-6)),
             "wrong": counted("wrong", lambda d: norms.rms_norm(d["x"], d["w"], 1e-6) * 1.1),
             "raises": counted("raises", raises)},
            lambda d: reference.rms_norm(d["x"], d["w"], 1e-6), bytes=6 * H * 4)]
    rc = harness.main("bench_wrong", cases, "A benchmark with a wrong implementation.", ["--rounds", "1"])
    assert rc == 1
    assert "checks failed (not timed): rms_norm (T=3 H=" in capsys.readouterr().err
    result = harness.run(cases, "bench_wrong", rounds=1, progress=False)
    right, wrong, raised = result["rows"]
    assert right["ok"] and right["us"] > 0 and right["note"] is None
    assert not wrong["ok"] and wrong["error"] > wrong["tol"]
    assert not raised["ok"] and raised["error"] == math.inf and raised["note"] == "ValueError: x: expected [T, H]"
    for r in (wrong, raised):
        assert r["us"] is None and r["us_rounds"] == [] and r["timing"] is None
    assert calls["wrong"] == calls["raises"] == 2, "each ran once per run, for its check, and was never timed"
    assert calls["right"] >= 4


def test_a_case_may_carry_notes_a_time_limit_or_run_on_request_only(benchmark_module, capsys):
    """What the sweeps of bench_gemm and bench_deltanet need: a note asked once its implementation is timed (what a
    tuning picked), a case left out past its time limit, a case that runs only when --only names it; a case left
    out is listed with why."""
    from qwen_lab import reference
    from qwen_lab.kernels import norms

    _, harness = load(benchmark_module, "norms")
    asked = []

    def note():
        asked.append(1)
        return "picked BLOCK=64"

    def cases(env):
        def rows(seed):
            return {"x": env.randn(3, 8, seed=seed), "w": env.randn(8, seed=7)}
        impls = {"triton": lambda d: norms.rms_norm(d["x"], d["w"], 1e-6),
                 "torch reference": lambda d: reference.rms_norm(d["x"], d["w"], 1e-6)}
        truth = lambda d: reference.rms_norm(d["x"], d["w"], 1e-6)  # noqa: E731
        wrong = {**impls, "wrong": lambda d: impls["triton"](d) * 1.1}
        return [harness.Case("noted", "T=3 H=8", rows, wrong, truth, bytes=100, notes={"triton": note, "wrong": note}),
                harness.Case("late sweep", "T=3 H=8", rows, impls, truth, bytes=100, time_limit_s=0.0),
                harness.Case("long sweep", "T=3 H=8", rows, impls, truth, bytes=100, on_request=True,
                             notes={"triton": lambda: 1 / 0})]

    result = harness.run(cases, "bench_extra", rounds=1, progress=False)
    assert [(r["case"], r["impl"]) for r in result["rows"]] == [
        ("noted", "triton"), ("noted", "torch reference"), ("noted", "wrong")]
    triton, torch_row, wrong = result["rows"]
    assert triton["note"] == "picked BLOCK=64" and torch_row["note"] is None
    assert not wrong["ok"] and wrong["note"] is None and len(asked) == 1, "asked once timed, never for a failed check"
    skipped = {s["case"]: s for s in result["skipped"]}
    assert set(skipped) == {"late sweep", "long sweep"} and skipped["late sweep"]["shape"] == "T=3 H=8"
    assert "past its time limit" in skipped["late sweep"]["why"]
    assert skipped["long sweep"]["why"] == "runs on request only: --only 'long sweep'"

    result = harness.run(cases, "bench_extra", rounds=1, only="long sweep", progress=False)
    assert {r["case"] for r in result["rows"]} == {"long sweep"} and result["skipped"] == []
    assert all(r["ok"] and r["us"] > 0 for r in result["rows"])
    assert result["rows"][0]["note"].startswith("note failed: ZeroDivisionError"), "a note that fails is said"

    assert harness.main("bench_extra", cases, "A benchmark with notes and sweeps.", ["--rounds", "1"]) == 1
    out = capsys.readouterr().out
    assert "; picked BLOCK=64 |" in out, "the note beside the row's error"
    assert "skipped: late sweep (T=3 H=8): past its time limit" in out
    assert "skipped: long sweep (T=3 H=8): runs on request only" in out


def test_bench_gemm_times_every_tiled_gemm_config_on_request(benchmark_module):
    """The sweep over the tiled GEMM's configurations (gemm.matmul_candidates, each through matmul_with_config) runs
    only when --only names it, each configuration checked against the reference like any implementation."""
    module, harness = load(benchmark_module, "gemm")
    result = harness.run(module.cases, "bench_gemm", rounds=1, only="matmul configs", progress=False)
    cases = {(r["case"], r["shape"]) for r in result["rows"]}
    assert cases and {case for case, _ in cases} == {"matmul configs"} and result["skipped"] == []
    assert any("+silu" in shape for _, shape in cases), "the gate/up projection with its SwiGLU epilogue"
    for case in cases:
        impls = [r["impl"] for r in result["rows"] if (r["case"], r["shape"]) == case]
        assert "triton" in impls and any(i.startswith("triton BLOCK_M=") for i in impls), (case, impls)
    assert all(r["ok"] and r["us"] > 0 for r in result["rows"])
    default = harness.run(module.cases, "bench_gemm", rounds=1, only="matmul", progress=False)
    assert {r["case"] for r in default["rows"]} == {"matmul prefill", "matmul configs"}


def test_what_the_benchmarks_read_of_the_tuning_is_public():
    """bench_gemm and bench_deltanet reach no private name: the tiled GEMM's candidates and the DeltaNet's picks have
    public readers, which return copies and name what they expect."""
    from qwen_lab.kernels import gemm
    from qwen_lab.kernels.deltanet import tuning

    x = torch.zeros(4, 64)
    configs = gemm.matmul_candidates(x, torch.zeros(32, 64))
    assert configs and all({"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(c.kwargs) for c in configs)
    assert gemm.matmul_candidates(x, torch.zeros(64, 64), swiglu=True)
    for kernel in ("chunk_scan_kernel", "conv_decode_step_kernel"):
        picks = tuning.picks(kernel)
        assert isinstance(picks, dict)
        picks["not a call"] = None
        assert "not a call" not in tuning.picks(kernel), "a copy"
    with pytest.raises(KeyError, match="expected one of chunk_scan_kernel, conv_decode_step_kernel"):
        tuning.picks("chunk_prep_kernel")


def test_relative_error_compares_every_output_and_refuses_another_shape(benchmark_module):
    _, harness = load(benchmark_module, "norms")
    a, b = torch.ones(4), torch.ones(4)
    assert harness.relative_error(a, b) == 0
    assert harness.relative_error((a, b * 2), (a, b)) == pytest.approx(1.0)   # the worst of the outputs
    assert harness.relative_error(a, torch.ones(5)) == math.inf
    assert harness.relative_error((a,), (a, b)) == math.inf
    assert harness.relative_error(a * float("nan"), b) == math.inf


def test_bench_ab_parses_its_switch_and_refuses_what_it_cannot_time(capsys, tmp_path):
    assert bench_ab.parse_switch("QWEN_LAB_PDL=0,1") == ("QWEN_LAB_PDL", ("0", "1"))
    assert bench_ab.parse_switch("split_norms=On,off") == ("split_norms", ("on", "off"))
    assert bench_ab.order(3) == [0, 1, 1, 0, 0, 1]   # A B, B A, A B: both orders
    bad = {"QWEN_LAB_PDL": "expected NAME=A,B", "QWEN_LAB_NOPE=0,1": "unknown switch 'QWEN_LAB_NOPE'",
           "QWEN_LAB_PDL=1": "expected two settings", "QWEN_LAB_PDL=0,1,0": "expected two settings",
           "QWEN_LAB_PDL=0,maybe": "setting 'maybe' is neither on", "QWEN_LAB_PDL=1,on": "the same setting"}
    for text, message in bad.items():
        with pytest.raises(SystemExit) as e:
            bench.main(["ab", "--switch", text, "--cpu-dry-run"])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err, (text, err)
        if "unknown" in message:
            assert all(name in err or (s.env and s.env in err) for name, s in bench_ab.SWITCHES.items()), err
    for argv, message in ((["--rounds", "0"], "--rounds 0: expected at least 1"),
                          (["--json", str(tmp_path / "missing" / "ab.json")], "does not exist")):
        with pytest.raises(SystemExit):
            bench.main(["ab", "--switch", "QWEN_LAB_PDL=0,1", *argv])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["ab"])   # --switch is required
    assert "--switch" in capsys.readouterr().err
    if not GPU:   # timing needs a GPU: one line, status 2
        assert bench.main(["ab", "--switch", "QWEN_LAB_PDL=0,1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "NVIDIA GPU" in err and "--cpu-dry-run" in err, err


def test_bench_ab_sets_each_setting_for_its_run_in_both_orders_and_restores_the_switch(monkeypatch):
    """The alternation, the medians and the difference, with the timed run replaced by one that reports what it ran
    under (so this runs in no time, on any machine)."""
    from qwen_lab.switches import switches

    seen = []

    def timed(model, prefill_len, decode_steps, graph, gen, status=None):
        persist, split = switches.gemv_persist, switches.split_norms
        seen.append((persist, split))
        fast = persist is True or split is True
        return {"prefill_ms": 10.0 if fast else 20.0, "decode_ms": 1.0 if fast else 4.0}
    monkeypatch.setattr(bench, "bench_qwen_lab", timed)
    monkeypatch.setenv("QWEN_LAB_GEMV_PERSIST", "0")
    r = bench_ab.run("QWEN_LAB_GEMV_PERSIST", ("0", "1"), rounds=2, source="tiny", prefill_len=4, decode_steps=1,
                     log=lambda line: None)
    # one untimed run of each setting, then A B, B A
    assert [p for p, _ in seen] == [False, True, False, True, True, False] and r["order"] == ["0", "1", "1", "0"]
    assert switches.set_in_code() == {} and switches.gemv_persist is False, "the switch is left as it was"
    assert r["runs"]["0"]["prefill_ms"] == [20.0, 20.0] and r["runs"]["1"]["decode_ms"] == [1.0, 1.0]
    assert r["diff_pct"] == {"prefill_ms": -50.0, "decode_ms": -75.0}
    # a switch read at a shape's first call: the A/B says that it timed the first setting's picks both ways
    assert any("first call" in n and "QWEN_LAB_GEMV_PERSIST=0" in n for n in r["notes"]), r["notes"]

    seen.clear()
    r = bench_ab.run("split_norms", ("off", "on"), rounds=1, source="tiny", prefill_len=4, decode_steps=1,
                     log=lambda line: None)
    assert [s for _, s in seen] == [False, True, False, True]
    assert r["diff_pct"]["prefill_ms"] == -50.0 and not any("first call" in n for n in r["notes"])
    assert switches.set_in_code() == {}, "nothing left set"
    assert bench_ab.parse_switch("scan_group=8,4") == ("scan_group", ("8", "4"))


@pytest.mark.skipif(GPU, reason="the dry run is the CPU's; a GPU times for real (test_bench_ab_on_the_gpu)")
def test_bench_ab_cpu_dry_run_alternates_the_settings_and_writes_every_run(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("QWEN_LAB_PDL", raising=False)
    path = tmp_path / "ab.json"
    assert bench.main(["ab", "--switch", "QWEN_LAB_PDL=0,1", "--cpu-dry-run", "--json", str(path)]) == 0
    assert "QWEN_LAB_PDL" not in os.environ, "the switch is left as it was"
    data = json.loads(path.read_text())
    assert {"gpu", "torch", "triton", "commit", "date"} <= set(data)
    assert data["switch"] == "QWEN_LAB_PDL" and data["settings"] == ["0", "1"] and data["order"] == ["0", "1"]
    for value in ("0", "1"):
        runs = data["runs"][value]
        assert len(runs["prefill_ms"]) == len(runs["decode_ms"]) == 1 and runs["prefill_ms"][0] > 0
        assert data["median"][value]["decode_ms"] == runs["decode_ms"][0]
    expect = (data["median"]["1"]["prefill_ms"] / data["median"]["0"]["prefill_ms"] - 1) * 100
    assert data["diff_pct"]["prefill_ms"] == pytest.approx(expect)
    assert any("mean nothing" in n for n in data["notes"])
    out = capsys.readouterr().out
    assert "| 1 against 0 |" in out and "%" in out


# ---------------------------------------------------------------- on a GPU


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_each_benchmark_measures_on_the_gpu(family, benchmark_module, tmp_path):
    module, harness = load(benchmark_module, family)
    path = tmp_path / f"bench_{family}.json"
    # bench_gemm whole compiles and times every decode plan of six shapes, then its SPLIT_K sweep (minutes, the
    # `kernels` target of gpu_session.sh): here its decode GEMVs with their fused forms
    only = ["--only", "decode"] if family == "gemm" else []
    assert module.main(f"bench_{family}", module.cases, module.__doc__,
                       ["--rounds", "1", "--json", str(path), *only]) == 0
    data = json.loads(path.read_text())
    assert data["measured"] and data["config"] == "qwen3.5-0.8b" and data["floors"]["copy_GBps"] > 0
    for r in data["rows"]:
        where = f"{r['case']} ({r['shape']}) {r['impl']}"
        assert r["ok"] and r["us"] > 0 and r["copy_share"] > 0, where
        assert r["timing"] in (harness.GRAPH, harness.EAGER), where
        if r["impl"] == "triton":   # every library kernel is captured, as the model's graphs capture it
            assert r["timing"] == harness.GRAPH, where


@pytest.mark.gpu
def test_bench_ab_on_the_gpu(tmp_path):
    result = bench_ab.run("QWEN_LAB_PDL", ("0", "1"), rounds=2, prefill_len=64, decode_steps=4, log=lambda s: None)
    assert result["order"] == ["0", "1", "1", "0"] and result["method"] == "triton+cuda-graph"
    for value in ("0", "1"):
        assert len(result["runs"][value]["prefill_ms"]) == 2 and result["median"][value]["decode_ms"] > 0
    assert set(result["diff_pct"]) == {"prefill_ms", "decode_ms"}
