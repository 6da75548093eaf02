"""The L2 prefetch of the next projections' weights (qwen_lab/kernels/prefetch.py, model.L2_PREFETCH): what it
refuses, that it does nothing where there is no L2 to warm, and on a GPU that it is one launch and changes no
result, eagerly and inside the decode step's CUDA Graph. (That it survives the compiler, after the PDL wait:
tests/test_sm90_compile.py.)"""

import pytest
import torch

from qwen_lab import model as model_module
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches, prefetch


def test_l2_prefetch_refuses_what_it_cannot_walk(rt):
    w = torch.zeros(8, 16, dtype=rt.dtype, device=rt.device)
    with pytest.raises(KernelError, match="prefetch.py.*1 to 3 tensors, got 4"):
        prefetch.l2_prefetch(w, w, w, w)
    with pytest.raises(KernelError, match=r"tensors\[1\] of shape \(16, 8\) is not contiguous"):
        prefetch.l2_prefetch(w, w.t())
    with pytest.raises(KernelError, match=r"tensors\[0\] spans 15 bytes.*multiples of 16"):
        prefetch.l2_prefetch(torch.zeros(15, dtype=torch.int8, device=rt.device))
    with pytest.raises(KernelError, match=r"tensors\[0\] is a list"):
        prefetch.l2_prefetch([1, 2])


def test_l2_prefetch_launches_nothing_where_there_is_no_l2_to_warm(rt):
    w = torch.zeros(64, 32, dtype=rt.dtype, device=rt.device)
    with count_launches() as n:
        prefetch.l2_prefetch(w, w)
    assert prefetch.available(rt.device) == (n["l2_prefetch_kernel"] == 1), dict(n)
    assert not prefetch.available("cpu")


def test_model_decode_with_the_prefetch_switch_on_matches_off(rt, monkeypatch):
    # on a CPU the prefetch does nothing; this checks the model's decode path with the switch on (both layer kinds
    # name their out-projection) and, on a GPU, that the hint leaves the logits unchanged bit for bit
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")
    m = model_module.load_model("tiny", device=rt.device, dtype=rt.dtype)
    ids = torch.tensor([3, 17, 5], device=rt.device)
    logits = {}
    for on in (False, True):
        monkeypatch.setattr(model_module, "L2_PREFETCH", on)
        cache = m.new_cache(4)
        with torch.inference_mode(), count_launches() as n:
            m.step(ids[:2], torch.arange(2, device=rt.device), cache)
            before = n["l2_prefetch_kernel"]
            logits[on] = m.step(ids[2:], torch.tensor([2], device=rt.device), cache)
        assert before == 0, "a prompt of two tokens must not prefetch (only decode steps do)"
        expected = m.config.num_hidden_layers if on and prefetch.available(rt.device) else 0
        assert n["l2_prefetch_kernel"] == expected, dict(n)
    assert torch.equal(logits[True], logits[False])


@pytest.mark.gpu
def test_gpu_decode_graph_with_the_prefetch_is_bitwise_the_eager_step(monkeypatch):
    # Qwen3.5-0.8B's shapes: the prefetch kernel sits between every in-projection and the mixer's first kernel,
    # under PDL; the DeltaNet step reads its states before its own wait, trusting the kernel before it to have
    # waited first. A replayed graph must give the eager step's logits, and both the logits without the prefetch.
    from qwen_lab import graph
    from qwen_lab.model import load_model
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")  # a split-K GEMV's atomic sums would differ in the last bits
    m = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, m.config.vocab_size, (9,), generator=torch.Generator().manual_seed(3)).cuda()
    outs = {}
    for on in (False, True):
        monkeypatch.setattr(model_module, "L2_PREFETCH", on)
        cache = m.new_cache(16)
        token, position = ids[8:].clone(), torch.tensor([8], device="cuda")
        with torch.inference_mode():
            m.step(ids[:8], torch.arange(8, device="cuda"), cache)
            saved = [t.clone() for t in cache.recurrent_state + cache.conv_state if t is not None]
            eager = m.step(token, position, cache).clone()
            g, static = graph.capture(lambda: m.step(token, position, cache))   # (its warm-up steps the states)
            for t, s in zip([t for t in cache.recurrent_state + cache.conv_state if t is not None], saved):
                t.copy_(s)
            g.replay()
            torch.cuda.synchronize()
        assert torch.equal(static, eager), f"L2_PREFETCH={on}: the replayed step differs from the eager one"
        outs[on] = eager
    assert torch.equal(outs[True], outs[False])
