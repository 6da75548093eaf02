"""qwen_lab.course.syncguard: every synchronising call is caught and named, nothing else is, and the guard leaves no
trace.

All on the CPU: the guard exists so that the capture rules can be taught and checked without a GPU.
"""

import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import qwen_lab
from qwen_lab import reference
from qwen_lab.course.syncguard import (HostSyncError, ShapeChangeError, allow_host_sync, allowing_host_sync,
                                       assert_same_shapes, find_host_syncs, forbid_host_sync, record_shapes)

X = torch.arange(6, dtype=torch.float32)
S = torch.tensor(3.0)
I = torch.tensor(2)
# where the course's kernels run: a GPU, or the CPU standing in for it under the interpreter. A move to the host is a
# synchronisation only from there (on a GPU machine, X.cpu() of a CPU tensor moves nothing), and a Triton kernel
# takes only tensors on that device.
DEV = "cuda" if torch.cuda.is_available() and not qwen_lab.runtime.interpreter_active() else "cpu"
XD = X.to(DEV)

SYNCS = {
    "tensor.item()": lambda: S.item(),
    "tensor.tolist()": lambda: X.tolist(),
    "tensor.numpy()": lambda: X.numpy(),
    "numpy.asarray(tensor)": lambda: np.asarray(X),
    "tensor.cpu()": lambda: XD.cpu(),
    "tensor.to('cpu')": lambda: XD.to("cpu"),
    "int(tensor)": lambda: int(I),
    "float(tensor)": lambda: float(S),
    "Python index": lambda: [10, 20, 30][I],
    "bool(tensor)": lambda: 1 if S > 0 else 0,
    "print(tensor)": lambda: print(X),
    "formatting a tensor": lambda: f"{S:.3f}",
    "torch.equal": lambda: torch.equal(X, X),
    "torch.allclose": lambda: torch.allclose(X, X),
    "tensor.nonzero()": lambda: X.nonzero(),
    "torch.nonzero": lambda: torch.nonzero(X),
    "torch.masked_select": lambda: torch.masked_select(X, X > 2),
    "torch.unique": lambda: torch.unique(X),
    "boolean-mask indexing": lambda: X[X > 2],
    "boolean-mask assignment": lambda: X.clone().__setitem__(X > 2, 0.0),
    "torch.where(cond) with one argument": lambda: torch.where(X > 2),
    "torch.tensor(python data)": lambda: torch.tensor([1, 2]),
    "torch.as_tensor(python data)": lambda: torch.as_tensor([1.0]),
    "torch.cuda.synchronize()": lambda: torch.cuda.synchronize(),
    "torch.accelerator.synchronize()": lambda: torch.accelerator.synchronize(),
    "torch.bincount(x)": lambda: torch.bincount(I.reshape(1)),
    "repeat_interleave with a tensor of repeats": lambda: X[:2].repeat_interleave(I.repeat(2)),
}

# a tensor's value read in C++ below a Python call that does not synchronise by its name: each fetches the value
# from the GPU (the H200 refuses every one of these in a capture), and each was missed before the dispatch mode
SCALAR_READS = {
    "x[...]": lambda: X[:I],
    "x[...] ": lambda: X[I],
    "x[...]  ": lambda: X[I.reshape(1)[0]],
    "torch.arange()": lambda: torch.arange(I),
    "torch.full()": lambda: torch.full((2,), S),
    "torch.topk()": lambda: torch.topk(X, I),
    "tensor.narrow()": lambda: X.narrow(0, 0, I),
}


@pytest.mark.parametrize("call", sorted(SCALAR_READS))
def test_a_tensor_read_as_a_number_below_python_is_named_with_its_call(call):
    with pytest.raises(HostSyncError, match=f"a tensor read as a number inside {re.escape(call.strip())} .*\n  at "
                                            rf".*test_syncguard.py:\d+"):
        with forbid_host_sync():
            SCALAR_READS[call]()


def test_a_call_named_once_is_not_reported_again_for_its_own_read():
    """.item() reads the value through the same ATen operation the dispatch mode watches: one report, not two."""
    with find_host_syncs() as found:
        S.item()
        int(I)
        _ = X[I.reshape(1)]  # a LongTensor index stays on the device: nothing
    assert [f.call for f in found] == ["tensor.item()", "int(tensor)"]


@pytest.mark.parametrize("label", sorted(SYNCS))
def test_each_synchronising_call_raises_naming_it_and_the_line(label):
    with pytest.raises(HostSyncError) as info:
        with forbid_host_sync():
            SYNCS[label]()
    text = str(info.value)
    assert label in text
    assert "test_syncguard.py" in text and "instead:" in text  # the caller's line, and what to do


@pytest.mark.parametrize("read", [lambda: S.item(), lambda: int(I), lambda: X[:I]],
                         ids=["item", "int", "slice bound"])
def test_a_cpu_tensor_read_where_a_gpu_runs_the_step_is_told_as_frozen_not_as_a_wait(read, monkeypatch):
    """Where the step runs on a GPU, reading a CPU tensor's value waits for nothing, but a graph replays the number it
    had during the capture: the message says that, not that the host waits for the GPU. (Where no GPU is in use, the
    CPU tensors stand for the GPU's, and the same read is told as a fetch.)"""
    import qwen_lab.course.syncguard as syncguard

    with pytest.raises(HostSyncError, match="until the GPU has finished"):
        with forbid_host_sync():
            with monkeypatch.context() as m:
                m.setattr(syncguard, "_gpu_in_use", lambda: False)
                read()
    monkeypatch.setattr(syncguard, "_gpu_in_use", lambda: True)
    with pytest.raises(HostSyncError) as info:
        with forbid_host_sync():
            read()
    text = str(info.value)
    assert "it reads a CPU tensor, so nothing waits for the GPU" in text and "during the capture" in text, text
    assert "until the GPU has finished" not in text, text


def test_a_sync_under_another_mode_is_placed_at_its_callers_line():
    """A check may watch the step's calls with a TorchFunctionMode of its own inside the guard (chapter 12's watch of
    the uniform drawn); every call then passes through that mode's __torch_function__, and the sync must still be
    placed at the line of the code under test, not at the mode's `return func(...)`."""
    class PassOn(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with pytest.raises(HostSyncError) as info:
        with forbid_host_sync(), PassOn():
            S.item()   # the line the message must name
    text = str(info.value)
    assert "in test_a_sync_under_another_mode_is_placed_at_its_callers_line():  S.item()" in text, text


def test_device_side_code_passes_untouched():
    """Everything a capturable step does: arithmetic, reductions kept on the device, fixed-shape selection,
    in-place writes into static buffers, index_select with a device index, argmax, dtype casts."""
    logits = torch.randn(50, generator=torch.Generator().manual_seed(0))
    token = torch.zeros(1, dtype=torch.long)
    position = torch.tensor([4])
    with forbid_host_sync():
        p = torch.softmax(logits / 0.7, dim=-1)
        kept = torch.where(p >= p.max() * 0.1, p, torch.zeros_like(p))
        cdf = torch.cumsum(kept, 0)
        idx = torch.searchsorted(cdf, (cdf[-1] * 0.5).reshape(1))
        token.copy_(torch.minimum(idx, torch.argmax(p).reshape(1)))
        position.add_(1)
        picked = torch.index_select(logits, 0, position)
        _ = logits.to(torch.float64)  # a cast on the device
        _ = position.to(token)  # follows its argument: on a GPU both live there, and nothing moves
        _ = position.to(device=token.device, dtype=torch.int32)
        _ = logits.masked_fill(logits > 0, 0.0)
        _ = logits[position]  # a LongTensor index has a fixed shape
        n = logits.shape[0] + len(logits)  # shapes are host metadata, never a sync
    assert n == 100 and picked.shape == (1,) and position.tolist() == [5]


def test_find_host_syncs_lists_every_call_without_stopping():
    with find_host_syncs() as found:
        a = S.item()
        b = X.tolist()
        c = X.nonzero()
    assert [f.call for f in found] == ["tensor.item()", "tensor.tolist()", "tensor.nonzero()"]
    assert a == 3.0 and b[-1] == 5.0 and c.shape == (5, 1)  # the code still ran normally
    assert all(f.filename.endswith("test_syncguard.py") and f.line > 0 for f in found)
    assert "S.item()" in found[0].source


def test_the_guard_leaves_no_trace_after_the_block():
    original = torch.cuda.synchronize
    with pytest.raises(HostSyncError):
        with forbid_host_sync():
            with forbid_host_sync():  # nested guards restore the patched functions once, at the end
                pass
            S.item()
    assert torch.cuda.synchronize is original
    assert S.item() == 3.0 and X.tolist()[0] == 0.0  # no mode left behind


def test_allow_host_sync_exempts_a_block_and_a_wrapped_function():
    with forbid_host_sync():
        with allow_host_sync():
            assert S.item() == 3.0
        wrapped = allowing_host_sync(lambda t: t.tolist())
        assert wrapped(X)[1] == 1.0
        with pytest.raises(HostSyncError, match="item"):
            S.item()  # the exemption ended with its block


def test_allowed_code_is_left_out_of_the_shape_record():
    with record_shapes() as ops:
        X + 1
        with allow_host_sync():
            X[: int(I)].sum()
    assert [o.op for o in ops] == ["aten.add.Tensor"]


def test_reference_operators_that_synchronise_are_named():
    """The PyTorch oracle is not capturable: attention reads the longest position on the host, and sampling
    asks for the last kept index with nonzero. The course's kernels exist to remove exactly these."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 8, generator=g), torch.randn(6, 1, 8, generator=g), torch.randn(6, 1, 8, generator=g))
    positions = torch.tensor([5])
    with pytest.raises(HostSyncError, match=r"tensor\.item\(\)[\s\S]*reference\.py:\d+ in attention"):
        with forbid_host_sync():
            reference.attention(q, k, v, positions)
    logits, u = torch.randn(40, generator=g), torch.tensor(0.3)
    with pytest.raises(HostSyncError, match="nonzero"):
        with forbid_host_sync():
            reference.sample(logits, 0.8, 5, 0.9, u)
    with forbid_host_sync():  # greedy is a plain argmax
        reference.sample(logits, 0.0, 0, 1.0, u)


_INTERPRETER_LAUNCH = """
import torch
from qwen_lab.kernels.embedding import embedding
from qwen_lab.course.syncguard import forbid_host_sync

w = torch.randn(20, 8)
ids = torch.tensor([3, 0, 19])
with forbid_host_sync():
    out = embedding(ids, w)
torch.testing.assert_close(out, w[ids])
"""


def test_triton_interpreter_launches_are_not_counted_as_syncs():
    # The interpreter reads CPU tensors on the host by design; the guard must not call that a sync.
    # On a GPU machine (interpreter off in this process) the same check runs in a child process with it on.
    if qwen_lab.runtime.interpreter_active():
        exec(_INTERPRETER_LAUNCH, {})
    else:
        import os
        import subprocess
        import sys

        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        done = subprocess.run([sys.executable, "-c", _INTERPRETER_LAUNCH], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]


def test_record_shapes_accepts_a_frozen_step_and_names_the_first_change():
    cache = torch.zeros(8, 4)

    def frozen(pos):  # writes row `pos` with index_copy: the same shapes whatever pos holds
        cache.index_copy_(0, pos, torch.ones(1, 4) * pos)
        return cache.sum(0)

    def growing(pos):  # reads the rows written so far: the slice grows with the position
        return cache[: int(pos) + 1].sum(0)

    with record_shapes() as a:
        frozen(torch.tensor([2]))
    with record_shapes() as b:
        frozen(torch.tensor([5]))
    assert len(a) > 0
    assert_same_shapes(a, b)
    with record_shapes() as a:
        growing(torch.tensor([2]))
    with record_shapes() as b:
        growing(torch.tensor([5]))
    with pytest.raises(ShapeChangeError, match=r"aten\.slice.*\[3, 4\][\s\S]*\[6, 4\]"):
        assert_same_shapes(a, b)


def test_record_shapes_reports_a_different_number_of_operations():
    with record_shapes() as a:
        X + 1
    with record_shapes() as b:
        X + 1
        X * 2
    with pytest.raises(ShapeChangeError, match="1 and 2 operations"):
        assert_same_shapes(a, b)


def test_the_torch_backend_decode_step_is_caught_and_shapes_change():
    """The model on the reference operators: its decode step synchronises, and its attention slices the cache
    to the current length, so two decode steps differ in shape: both classic capture errors, found on a CPU."""
    model = qwen_lab.load_model("tiny", device="cpu", dtype=torch.float32, backend="torch")
    cache = model.new_cache(8)
    ids = torch.tensor([5, 6, 7])
    with torch.inference_mode():
        model.step(ids, torch.arange(3), cache)
        token, pos = torch.tensor([8]), torch.tensor([3])
        with find_host_syncs() as found:
            model.step(token, pos, cache)
        assert [f.function for f in found] == ["attention"] * model.config.num_full_layers
        with record_shapes() as a:
            model.step(token, pos, cache)
        pos.add_(1)
        with record_shapes() as b:
            model.step(token, pos, cache)
    with pytest.raises(ShapeChangeError, match="attention"):
        assert_same_shapes(a, b, "the decode step")


@triton.jit
def _scale_kernel(x_ptr, n, factor, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * factor, mask=offs < n)


def test_record_shapes_sees_a_triton_launchs_grid_and_numbers():
    """On the Triton backend a step is almost all launches, which no tensor operation records: a graph freezes
    each launch's grid and the Python numbers passed to it, so a length handed over as an int changes the step."""
    x = torch.ones(40, device=DEV)

    def step(n, factor=2.0):
        _scale_kernel[(triton.cdiv(n, 16),)](x, n, factor, BLOCK=16)
    runs = []
    for n in (20, 20, 40):
        with record_shapes() as ops:
            step(n)
        runs.append(ops)
    assert [op.op for op in runs[0]] == ["triton _scale_kernel(2,)(20, 2.0, BLOCK=16)"]
    assert runs[0][0].shapes == ((40,),) and "test_syncguard.py" in runs[0][0].where
    assert_same_shapes(runs[0], runs[1])
    with pytest.raises(ShapeChangeError, match=r"triton _scale_kernel\(2,\)\(20.*\n.*triton _scale_kernel\(3,\)\(40"):
        assert_same_shapes(runs[0], runs[2])


def test_the_triton_decode_step_records_the_same_launches_twice():
    """The model's Triton decode step reads positions from device memory: two steps launch the same kernels with
    the same grids and numbers (what lets generate() capture it once and replay it)."""
    model = qwen_lab.load_model("tiny", backend="triton")
    dev = model.device
    cache = model.new_cache(16)
    with torch.inference_mode():
        model.step(torch.tensor([5, 6, 7], device=dev), torch.arange(3, device=dev), cache)
        token, pos = torch.tensor([8], device=dev), torch.tensor([3], device=dev)
        model.step(token, pos, cache)  # warm-up: on a GPU the first call of each shape tunes (launches of its own)
        pos.add_(1)
        with record_shapes() as a:
            model.step(token, pos, cache)
        pos.add_(1)
        with record_shapes() as b:
            model.step(token, pos, cache)
    launches = [op for op in a if op.op.startswith("triton ")]
    assert len(launches) >= model.config.num_hidden_layers, [str(op) for op in a]
    assert_same_shapes(a, b, "the Triton decode step")


@pytest.mark.gpu
def test_on_a_gpu_transfers_are_caught_and_the_triton_decode_step_is_clean():
    x = torch.ones(4, device="cuda")
    for label, fn in (("tensor.to('cpu')", lambda: x.to("cpu")), ("tensor.cpu()", lambda: x.cpu()),
                      ("copying a CPU tensor to the GPU", lambda: torch.ones(2).cuda()),
                      ("stream.synchronize()", lambda: torch.cuda.current_stream().synchronize()),
                      ("stream.query()", lambda: torch.cuda.current_stream().query()),
                      ("cpu_tensor.copy_(gpu_tensor)", lambda: torch.empty(4).copy_(x)),
                      ("gpu_tensor.copy_(cpu_tensor)", lambda: x.copy_(torch.zeros(4))),
                      ("a tensor read as a number inside x[...]", lambda: x[:x.sum().long()])):
        with pytest.raises(HostSyncError, match=re.escape(label)):
            with forbid_host_sync():
                fn()
    with forbid_host_sync():
        y = x.to("cuda") * 2  # already there: no transfer
    from qwen_lab.plan import fast_plan

    model = qwen_lab.load_model("qwen3.5-0.8b")
    plan = fast_plan(model)   # the route generation runs, fused kernels included
    ids = torch.randint(0, 1000, (16,), device="cuda")
    cache = model.new_cache(32)
    token, pos = ids[-1:].clone(), torch.tensor([16], device="cuda")
    with torch.inference_mode():
        plan.step(ids, torch.arange(16, device="cuda"), cache)
        plan.step(token, pos, cache)  # warm-up: Triton compiles and autotunes (which synchronises) here
        pos.add_(1)
        with find_host_syncs() as found:
            plan.step(token, pos, cache)
    # every operator is a Triton kernel: none may synchronise
    kernels = [str(f) for f in found if not f.filename.endswith("reference.py")]
    assert not kernels, f"Triton launchers synchronise with the host: {kernels}"
    assert found == []
    assert float(y.sum()) == 8.0


def test_a_guard_watches_its_own_thread_and_every_nested_guard_sees_a_sync():
    """torch.cuda.synchronize is patched process-wide: another thread's call used to reach this thread's guard
    (while that thread's .item() did not), and of two nested guards only the innermost saw it."""
    import threading

    errors = []

    def other_thread():
        try:
            S.item()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    with find_host_syncs() as found:
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    # (the other thread's own call runs as it would unguarded: on a machine without CUDA, torch's own error)
    assert not any(isinstance(e, HostSyncError) for e in errors) and found == []
    with pytest.raises(HostSyncError, match=re.escape("torch.cuda.synchronize()")):
        with forbid_host_sync():
            with find_host_syncs() as inner:
                torch.cuda.synchronize()
    assert [f.call for f in inner] == ["torch.cuda.synchronize()"]
