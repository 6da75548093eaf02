"""Programmatic dependent launch: when it is on, and that the decode step computes the same with it as without it."""

import pytest
import torch

import qwen_lab
from qwen_lab import kernels
from qwen_lab.plan import fast_plan


@pytest.mark.parametrize("capability, env, expected", [((9, 0), None, True), ((10, 0), "1", True),
                                                        ((8, 9), None, False), ((9, 0), "0", False)])
def test_pdl_on_hopper_and_newer_unless_turned_off(monkeypatch, capability, env, expected):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(kernels, "_capability", lambda index: capability)
    if env is None:
        monkeypatch.delenv("QWEN_LAB_PDL", raising=False)
    else:
        monkeypatch.setenv("QWEN_LAB_PDL", env)
    cuda = torch.device("cuda", 0)
    assert kernels.pdl_enabled(cuda) is expected
    assert kernels.pdl_options(cuda) == ({"USE_PDL": True, "launch_pdl": True} if expected else {})


def test_pdl_never_on_the_cpu_or_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(kernels, "_capability", lambda index: (9, 0))
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernels.pdl_options("cpu") == {}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert kernels.pdl_options(torch.device("cuda", 0)) == {}


def _decode_logits(model, ids, forced, graph: bool):
    """Prefill `ids`, then one decode step per token of `forced` (eager, or replayed from a captured step), fed the
    same tokens whatever the logits say (so a near tie cannot send two runs down different paths); their logits."""
    from qwen_lab.graph import capture

    T, steps = ids.numel(), forced.numel()
    cache = model.new_cache(T + steps + 1)
    token = torch.zeros(1, dtype=torch.long, device=model.device)
    pos = torch.zeros(1, dtype=torch.long, device=model.device)
    out = []
    with torch.inference_mode():
        if graph:
            g, logits = capture(lambda: model.step(token, pos, cache), warmup=2)
            cache.reset()
        model.step(ids, torch.arange(T, device=model.device), cache)
        pos.fill_(T)
        for n in range(steps):
            token.copy_(forced[n:n + 1])
            if graph:
                g.replay()
                step_logits = logits[-1].float().clone()
            else:
                step_logits = model.step(token, pos, cache)[-1].float()
            out.append(step_logits)
            pos.add_(1)
    return torch.stack(out)


@pytest.mark.gpu
def test_gpu_decode_with_pdl_equals_decode_without(monkeypatch):
    """The whole decode step of Qwen3.5-0.8B's shapes, replayed from a CUDA Graph with every kernel launched early
    (PDL on), against the same model launched plainly (PDL off), eager and in a graph. PDL changes when a kernel
    starts, never what it computes: with the same GEMV plans (first-call timing off, so PDL on and off cannot pick
    different block shapes and split-K orders) and fixed-order split-K the logits must agree to rounding noise;
    a kernel that read its input before the previous kernel had written it would not."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or newer")
    monkeypatch.setenv("QWEN_LAB_TUNE", "0")
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")
    model = fast_plan(qwen_lab.load_model("qwen3.5-0.8b", backend="triton"))   # the route the graphs capture
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (37,), generator=g).to(model.device)
    forced = torch.randint(0, model.config.vocab_size, (6,), generator=g).to(model.device)
    monkeypatch.setenv("QWEN_LAB_PDL", "0")
    plain = _decode_logits(model, ids, forced, graph=False)
    plain_graph = _decode_logits(model, ids, forced, graph=True)
    monkeypatch.setenv("QWEN_LAB_PDL", "1")
    early = _decode_logits(model, ids, forced, graph=True)
    early_eager = _decode_logits(model, ids, forced, graph=False)
    for name, got in (("graph, PDL off", plain_graph), ("graph, PDL on", early), ("eager, PDL on", early_eager)):
        err = ((got - plain).norm() / plain.norm()).item()
        assert err < 1e-3, f"{name}: relative error {err:.3g} against eager without PDL"


@pytest.mark.gpu
def test_gpu_prefill_with_pdl_equals_prefill_without(monkeypatch):
    """A prompt through every prefill kernel (tiled GEMMs, conv, chunked delta rule, flash attention, the norms),
    replayed from a CUDA Graph with each kernel launched early (PDL on), against the same prompt launched plainly:
    the same logits to rounding noise. A prefill kernel that touched its input before its wait would not."""
    from qwen_lab.graph import capture

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0 or newer")
    monkeypatch.setenv("QWEN_LAB_TUNE", "0")
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")
    model = fast_plan(qwen_lab.load_model("qwen3.5-0.8b", backend="triton"))   # the route the graphs capture
    ids = torch.randint(0, model.config.vocab_size, (300,), generator=torch.Generator().manual_seed(1)).to(model.device)
    positions = torch.arange(ids.numel(), device=model.device)
    cache = model.new_cache(ids.numel())
    with torch.inference_mode():
        monkeypatch.setenv("QWEN_LAB_PDL", "0")
        cache.reset()
        plain = model.step(ids, positions, cache).float()
        monkeypatch.setenv("QWEN_LAB_PDL", "1")
        g, logits = capture(lambda: model.step(ids, positions, cache), warmup=2)
        cache.reset()
        g.replay()
        early = logits.float()
    err = ((early - plain).norm() / plain.norm()).item()
    assert err < 1e-3, f"prefill, graph with PDL on: relative error {err:.3g} against eager without PDL"


def _pdl_kernels():
    """Every @triton.jit kernel of the library that takes USE_PDL (may be launched with programmatic dependent
    launch), as (module, name, function)."""
    import importlib

    import triton

    found = []
    for mod_name in ("attention", "conv1d", "deltanet", "embedding", "gemm", "norms", "rope", "sampling"):
        mod = importlib.import_module(f"qwen_lab.kernels.{mod_name}")
        for name in dir(mod):
            obj = getattr(mod, name)
            while isinstance(obj, triton.runtime.Autotuner):
                obj = obj.fn
            fn = getattr(obj, "fn", None)
            if callable(fn) and "USE_PDL" in getattr(obj, "arg_names", ()):
                found.append((mod_name, name, fn))
    return found


def _memory_calls(node):
    import ast

    for sub in ast.walk(node):
        if not (isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute)
                and isinstance(sub.func.value, ast.Name) and sub.func.value.id == "tl"):
            continue
        if sub.func.attr in ("load", "store") or sub.func.attr.startswith("atomic"):
            yield sub


# Kernels that do not wait for the whole previous kernel but for its pieces, through counters it releases:
# name -> (the counters' pointer, the loads allowed before the first wait: what older kernels wrote)
_WAITS_ON_COUNTERS = {"chunk_scan_kernel": ("ready_ptr", ("tl.load(s_ptrs",))}


def _check_counter_wait(mod_name, name, body, counters, allowed):
    """The kernel has no gdc_wait; before its chunk loop it only reads `allowed`; in the loop every load comes after
    a `while` that polls the counters with an acquire (so the producer's stores are visible to it)."""
    import ast

    where = f"{mod_name}.{name}"
    assert not any("gdc_wait" in ast.unparse(st) for st in body), f"{where} waits on counters and on gdc_wait"
    loop = next(i for i, st in enumerate(body) if isinstance(st, ast.For))
    for st in body[:loop]:
        for call in _memory_calls(st):
            assert call.func.attr == "load" and ast.unparse(call).startswith(allowed), (
                f"{where}: `{ast.unparse(call)}` runs before the first wait on {counters}")
    inner = body[loop].body
    polls = [i for i, st in enumerate(inner) if isinstance(st, ast.While)
             and "sem='acquire'" in ast.unparse(st) and "atomic" in ast.unparse(st)]
    assert polls, f"{where}: no `while` polling the counters with sem='acquire' in its chunk loop"
    assert any(counters in ast.unparse(st) for st in body[:loop]) and "counters" in ast.unparse(inner[polls[0]]), (
        f"{where}: its poll does not read {counters}")
    for st in inner[:polls[0]]:
        for call in _memory_calls(st):
            assert call.func.attr.startswith("atomic") and "sem='acquire'" in ast.unparse(call), (
                f"{where}: `{ast.unparse(call)}` runs before its poll of the counters")


def test_every_pdl_kernel_waits_before_it_reads_what_the_previous_kernel_wrote():
    """Before its `if USE_PDL: gdc_wait()` a kernel may only read its weights (which no kernel writes): any other
    load, store or atomic there could race with the kernel launched just before it."""
    import ast
    import inspect
    import textwrap

    kernels = _pdl_kernels()
    assert {name for _, name, _ in kernels} >= {
        "gemv_splitk_kernel", "conv_decode_step_kernel", "embedding_kernel", "qk_norm_rope_kernel",
        "flash_decode_split_kernel",
        # the prefill's kernels: over 230 launches in a row, each started while the one before it drains
        "matmul_kernel", "chunk_prep_kernel", "chunk_scan_kernel", "conv1d_prefill_kernel", "flash_attention_kernel",
        "sigmoid_gate_kernel", "add_rms_norm_kernel", "gated_rms_norm_kernel"}
    weights = ("tl.load(w_rows", "tl.load(conv_w_ptr", "tl.load(A_log_ptr", "tl.load(dt_bias_ptr")
    # with STATE_SETTLED the caller promises the previous writer of these has finished (see deltanet.py)
    settled_states = ("tl.load(s_ptrs", "tl.load(conv_state_ptr")
    checked_settled = False
    for mod_name, name, fn in kernels:
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        if name in _WAITS_ON_COUNTERS:
            _check_counter_wait(mod_name, name, body, *_WAITS_ON_COUNTERS[name])
            continue
        waits = [(i, ast.unparse(st.test)) for i, st in enumerate(body) if isinstance(st, ast.If)
                 and "USE_PDL" in ast.unparse(st.test) and "gdc_wait" in ast.unparse(st)]
        assert waits, f"{mod_name}.{name} takes USE_PDL but has no top-level `if USE_PDL: gdc_wait()`"
        # one wait per mode: the plain `USE_PDL` one, or a pair split on STATE_SETTLED
        modes = {"": waits[0][0]} if len(waits) == 1 else {
            "not STATE_SETTLED": next(i for i, t in waits if "not STATE_SETTLED" in t),
            "STATE_SETTLED": next(i for i, t in waits if "STATE_SETTLED" in t and "not STATE_SETTLED" not in t)}
        for mode, wait in modes.items():
            allowed = weights + (settled_states if mode == "STATE_SETTLED" else ())
            checked_settled |= mode == "STATE_SETTLED"
            for st in body[:wait]:
                if isinstance(st, ast.If) and "gdc_wait" in ast.unparse(st):
                    continue  # the other mode's wait
                for call in _memory_calls(st):
                    text = ast.unparse(call)
                    assert call.func.attr == "load" and text.startswith(allowed), (
                        f"{mod_name}.{name}{' with ' + mode if mode else ''}: `{text}` runs before the PDL wait; "
                        f"only {', '.join(a.removeprefix('tl.load(') for a in allowed)} may be read there")
    assert checked_settled, "conv_decode_step_kernel's STATE_SETTLED wait was not found"
