"""CUDA Graph replay and the benchmark table.

On a CPU: the benchmark runs end to end on the tiny model (its times mean nothing there) and reports the graph
row as skipped; a graph capture is refused with a clear message. On a GPU: graph replay generates exactly the
tokens eager decoding does, and a capture that synchronises with the host fails with a useful message.
"""

import json

import pytest
import torch

import qwen_lab
from qwen_lab import bench
from qwen_lab.graph import GraphCaptureError, capture


def test_bench_runs_on_the_tiny_model_and_writes_json(tmp_path):
    result = bench.run("tiny", prefill_len=9, decode_steps=2, rows=["triton", "triton+cuda-graph", "triton+persistent"],
                       progress=False)
    names = [r["name"] for r in result["rows"]]
    assert "triton" in names
    row = result["rows"][names.index("triton")]
    assert row["prefill_ms"] > 0 and row["decode_ms"] > 0 and row["tokens_per_s"] > 0
    assert row["kernels_decode"] > 0 and row["kernels_prefill"] >= row["kernels_decode"]
    if not torch.cuda.is_available():
        assert any("cuda-graph" in s for s in result["skipped"])
        assert any(s.startswith("triton+persistent: ") for s in result["skipped"])
    else:   # the persistent row: one kernel per token, one graph replay
        row = result["rows"][names.index("triton+persistent")]
        assert row["kernels_decode"] == 1 and row["host_launches_decode"] == 1 and row["decode_ms"] > 0
    table = bench.format_table(result)
    assert "| triton |" in table
    line = next(x for x in table.splitlines() if x.startswith("| triton |"))
    assert line.endswith(f"| {row['host_launches_prefill']} / {row['host_launches_decode']} |"), \
        f"the last column is the host launches of a prefill and of a decode step: {line}"
    path = tmp_path / "bench.json"
    bench.main(["--model", "tiny", "--prefill-len", "5", "--decode-steps", "1", "--rows", "triton",
                "--json", str(path), "--plot", str(tmp_path / "bench.png")])
    data = json.loads(path.read_text())
    assert set(data) >= {"gpu", "config", "floors", "rows", "torch", "triton", "commit", "switches"}
    assert data["switches"]["deterministic"] in (True, False)   # the switches it ran under, as data
    assert data["rows"][0]["name"] == "triton" and data["rows"][0]["prefill_ms"] > 0
    assert (tmp_path / "bench.png").stat().st_size > 1000


def test_table_keeps_significant_digits_of_slow_rates():
    row = dict(prefill_ms=2894.1, decode_ms=2894.4, kernels_prefill=120, kernels_decode=118,
               host_launches_prefill=120, host_launches_decode=118)
    result = {"config": "tiny", "gpu": "cpu", "dtype": "float32", "prefill_len": 9, "date": "2026-12-03",
              "floors": {}, "skipped": [],
              "rows": [{"name": "cpu-slow", **row, "tokens_per_s": 0.3455},
                       {"name": "mid", **row, "tokens_per_s": 2.5},
                       {"name": "gpu-fast", **row, "tokens_per_s": 1456.2}]}
    table = bench.format_table(result)
    cells = {x.split(" | ")[0][2:]: x.split(" | ") for x in table.splitlines() if x.startswith("| ")}
    assert cells["row"][3] == "tokens/s"
    rate = {name: cells[name][3] for name in ("cpu-slow", "mid", "gpu-fast")}
    assert rate == {"cpu-slow": "0.345", "mid": "2.50", "gpu-fast": "1456"}, table
    assert [bench.format_rate(x) for x in (0.052, 9.5, 10.0, 187.6, None)] == ["0.0520", "9.50", "10", "188", "-"]


def test_model_costs_match_the_documented_floors():
    from qwen_lab.config import QWEN35_0_8B
    from qwen_lab.weights import expected_tensors

    class W:  # only nbytes() is read
        @staticmethod
        def nbytes():
            return 2 * sum(torch.Size(s).numel() for s in expected_tensors(QWEN35_0_8B).values())
    costs = bench.model_costs(QWEN35_0_8B, W, 2048)
    assert abs(costs["weight_bytes"] / 1e9 - 1.505) < 0.002       # QWEN35.md: 1.505 GB read once per token
    assert 2.0e12 < costs["prefill_flops"] < 2.5e12                # QWEN35.md: about 2.25 TFLOP


@pytest.mark.skipif(not qwen_lab.runtime.interpreter_active(), reason="the note is for the interpreter's runs")
def test_benchmarking_the_real_model_on_a_cpu_says_how_long_before_the_wait(monkeypatch, capsys):
    """The README's headline command on a laptop: a bar that never moves, unless the run says first what it is."""
    from qwen_lab.config import QWEN35_0_8B, TINY
    from qwen_lab.weights import expected_tensors

    class W:
        @staticmethod
        def nbytes():
            return 2 * sum(torch.Size(s).numel() for s in expected_tensors(QWEN35_0_8B).values())
    real = bench.model_costs(QWEN35_0_8B, W, 2048)["prefill_flops"]
    note = bench.interpreter_note(QWEN35_0_8B, 2048, real)
    assert note and "qwen3.5-0.8b with a 2048-token prefill" in note and "hours" in note and "tiny" in note
    tiny = bench.model_costs(TINY, qwen_lab.weights.random_weights(TINY), 16)["prefill_flops"]
    assert bench.interpreter_note(TINY, 16, tiny) is None
    # run() prints it before anything takes long (here the run is stopped at the floors, which come next)
    monkeypatch.setattr(bench, "model_costs", lambda *a: {"prefill_flops": real})
    monkeypatch.setattr(bench, "measure_floors", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        bench.run("tiny", prefill_len=16, decode_steps=1)
    assert "can take hours" in capsys.readouterr().err


def test_capture_without_a_gpu_is_refused_clearly():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: see the gpu tests")
    with pytest.raises(GraphCaptureError, match="NVIDIA GPU"):
        capture(lambda: None)


@pytest.mark.gpu
def test_graph_replay_generates_what_eager_decoding_does(monkeypatch):
    """After the same prefill, the captured decode step (sampling inside the graph) picks exactly the tokens that
    eager decode steps pick from the same uniform numbers: same kernels, same plans, fixed-order split-K."""
    from qwen_lab.graph import DecodeGraph

    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")  # atomics could flip a near-tie between the two runs
    from qwen_lab.plan import fast_plan

    model = fast_plan(qwen_lab.load_model("qwen3.5-0.8b"))   # the eager steps on the route the graph captures
    dev = model.device
    T = 37
    prompt = torch.randint(0, 1000, (T,), generator=torch.Generator().manual_seed(3)).to(dev)
    sample = model.ops["sample"]
    for temperature, top_k, top_p, steps in ((0.0, 0, 1.0, 24), (0.8, 0, 0.9, 16), (0.7, 20, 1.0, 8)):
        uniforms = torch.rand(steps + 2, generator=torch.Generator(device=dev).manual_seed(5), device=dev)
        runs = []
        for use_graph in (False, True):
            with torch.inference_mode():
                cache = model.new_cache(T + steps + 2)
                runner = DecodeGraph(model, cache, temperature, top_k, top_p, uniforms) if use_graph else None
                logits = model.step(prompt, torch.arange(T, device=dev), cache)[-1]
                token = sample(logits, temperature, top_k, top_p, uniforms[0]).reshape(1)
                position = torch.tensor([T], device=dev)
                if runner is not None:
                    runner.prime(token, T, 1)
                tokens = [int(token)]
                for n in range(steps - 1):
                    if runner is not None:
                        token = runner.replay().clone()
                    else:
                        logits = model.step(token, position, cache)[-1]
                        token = sample(logits, temperature, top_k, top_p, uniforms[n + 1]).reshape(1)
                        position += 1
                    tokens.append(int(token))
            runs.append(tokens)
        assert runs[1] == runs[0], (f"temperature {temperature}, top_k {top_k}, top_p {top_p}: "
                                    f"graph {runs[1]}, eager {runs[0]}")


@pytest.mark.gpu
def test_capturing_a_host_sync_names_the_likely_cause():
    x = torch.ones(4, device="cuda")
    with pytest.raises(GraphCaptureError, match=r"\.item\(\)"):
        capture(lambda: (x * 2).sum().item())


def test_cli_rejects_bad_arguments_in_one_line(capsys):
    from qwen_lab import bench

    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--model", "tiny", "--prefill-len", "0"])
    assert exit_info.value.code == 2 and "--prefill-len 0: expected at least 1" in capsys.readouterr().err
    assert bench.main(["--model", "/no/such/snapshot", "--prefill-len", "4", "--decode-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "/no/such/snapshot" in err and "Traceback" not in err


def test_cli_checks_rows_and_output_paths_before_the_run(capsys, monkeypatch, tmp_path):
    from qwen_lab import bench, model
    from qwen_lab.errors import ConfigError

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded before the arguments were checked")
    monkeypatch.setattr(model, "load_model", never)
    for argv, fragment in ((["--rows", "bogus"], "invalid choice: 'bogus'"),
                           (["--json", str(tmp_path / "no" / "x.json")], "--json"),
                           (["--plot", str(tmp_path / "no" / "x.png")], "--plot")):
        with pytest.raises(SystemExit) as exit_info:
            bench.main(["--model", "tiny", *argv])
        assert exit_info.value.code == 2 and fragment in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown \\['bogus'\\]"):
        bench.run("tiny", rows=["triton", "bogus"])


def test_runtime_names_a_device_or_dtype_it_cannot_serve():
    from qwen_lab import runtime
    from qwen_lab.errors import DeviceError, QwenLabError

    with pytest.raises(DeviceError, match="dtype='bfloat'; expected one of bf16"):
        runtime.choose(dtype="bfloat")
    with pytest.raises(DeviceError, match="device='nope'"):
        runtime.choose(device="nope")
    if not torch.cuda.is_available():
        with pytest.raises(QwenLabError, match="no CUDA GPU"):
            runtime.choose(device="cuda")


def test_runtime_refuses_devices_the_kernels_cannot_run_on():
    """'mps', 'meta' and the like failed later with torch's own errors (or, 'meta', loaded and then failed)."""
    from qwen_lab import runtime
    from qwen_lab.errors import DeviceError

    for device in ("mps", "meta", "xpu", torch.device("meta")):
        with pytest.raises(DeviceError, match="expected 'cpu' or 'cuda'"):
            runtime.choose(device=device)
    with pytest.raises(DeviceError, match="device='meta'"):
        qwen_lab.load_model("tiny", device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's bf16 tl.dot: a CPU-only machine")
def test_bf16_under_the_interpreter_is_refused_for_the_triton_backend():
    """The interpreter's tl.dot on bf16 operands is wrong: such a model's logits were garbage, with no error."""
    from qwen_lab.errors import DeviceError

    with pytest.raises(DeviceError, match="bfloat16 with backend='triton' under the Triton interpreter"):
        qwen_lab.load_model("tiny", dtype="bf16")
    model = qwen_lab.load_model("tiny", dtype="bf16", backend="torch")  # the reference computes bf16 on the CPU
    assert model.dtype == torch.bfloat16 and torch.isfinite(model.forward([1, 2, 3])).all()


def test_bench_refuses_a_prompt_past_the_models_positions(monkeypatch):
    from qwen_lab.errors import ConfigError

    def never(*args, **kwargs):
        raise AssertionError("the floors were measured before the lengths were checked")
    monkeypatch.setattr(bench, "measure_floors", never)
    limit = qwen_lab.load_model("tiny", backend="torch").config.max_position_embeddings
    with pytest.raises(ConfigError, match=f"prefill_len={limit} \\+ decode_steps=4 .* max_position_embeddings="):
        bench.run("tiny", prefill_len=limit, decode_steps=4, progress=False)


def test_a_plot_with_no_measured_row_is_skipped_with_a_reason(tmp_path, capsys, monkeypatch):
    """Every row skipped (the graph row on a CPU): the table prints, and --plot says why it drew nothing instead of
    failing inside matplotlib (it log-scaled an empty axis)."""
    from qwen_lab.errors import ConfigError

    monkeypatch.setattr(bench, "measure_floors", lambda device, dtype: {"copy_GBps": None, "matmul_TFLOPs": None})
    empty = {"rows": [], "skipped": ["triton+cuda-graph: CUDA Graphs need an NVIDIA GPU"], "floors": {},
             "prefill_len": 4, "config": "tiny", "gpu": "cpu"}
    with pytest.raises(ConfigError, match="no measured row to draw \\(triton\\+cuda-graph: CUDA Graphs"):
        bench.plot(empty)
    if torch.cuda.is_available():
        return  # there the graph row runs; the rest is the CPU's case
    path = tmp_path / "bench.png"
    assert bench.main(["--model", "tiny", "--prefill-len", "4", "--decode-steps", "1", "--rows", "triton+cuda-graph",
                       "--plot", str(path)]) == 0
    assert "not drawn, no row was measured" in capsys.readouterr().err and not path.exists()


@pytest.mark.skipif(not qwen_lab.runtime.interpreter_active(), reason="the Triton interpreter's NumPy math")
def test_the_interpreter_overflows_silently_as_a_gpu_does():
    """exp of a large gate overflows to inf in NumPy with a RuntimeWarning that a GPU never gives, and the kernels
    expect the inf (a tl.where keeps the finite branch): a learner's CPU notebook showed the warning under correct
    kernels (chapter 08's library check)."""
    import warnings

    from qwen_lab.kernels import deltanet

    a = torch.tensor([[100.0, -100.0]])
    with warnings.catch_warnings(record=True) as seen:
        # (what importing qwen_lab does in a learner's process; pytest restored the filters after its import)
        qwen_lab.runtime.ensure_interpreter()
        g, beta = deltanet.deltanet_gates(a, a, torch.zeros(2), torch.zeros(2))
    assert torch.isfinite(g).all() and torch.isfinite(beta).all()
    assert not [w for w in seen if issubclass(w.category, RuntimeWarning)], [str(w.message) for w in seen]
