"""The decode chain (qwen_lab/kernels/chain.py): a token's projections between two mixers in one launch, against
qwen_lab.reference.gemv_chain and against the four operators the model otherwise runs; its errors; the grid's
size; the model's decode step with and without it."""

from types import SimpleNamespace

import pytest
import torch

from qwen_lab import checks, reference
from qwen_lab import model as model_module
from qwen_lab.errors import KernelError
from qwen_lab.kernels import chain, count_launches


def _case(H, I, Ka, N_next, rt, gated=True, Dv=16, last=False):
    """Ragged sizes: H, I and N_next are multiples of no block size; the gated head dim is a power of two."""
    def make(g):
        r = lambda *s, scale=1.0: checks.randn(*s, g=g, dtype=rt.dtype, device=rt.device, scale=scale)
        d = {}
        if gated:
            Hv = Ka // Dv
            d["o"] = r(1, Hv, Dv)
            d["z"] = r(1, 2 * Ka + 3)[:, 3:3 + Ka].unflatten(1, (Hv, Dv))   # a strided view, as in the model
            d["mixer_norm"] = r(Dv, scale=0.1)
        else:
            d["o"], d["z"], d["mixer_norm"] = r(1, Ka), None, None
        d.update(o_proj=r(H, Ka, scale=Ka ** -0.5), residual=r(1, H), post_norm=r(H, scale=0.1),
                 gate_up=r(2 * I, H, scale=H ** -0.5), down=r(H, I, scale=I ** -0.5), eps=1e-6)
        if not last:
            d.update(next_norm=r(H, scale=0.1), next_proj=r(N_next, H, scale=H ** -0.5))
        return d
    return make


@pytest.mark.parametrize("gated", [True, False], ids=["deltanet", "attention"])
@pytest.mark.parametrize("last", [False, True], ids=["next_layer", "last_layer"])
def test_chain_matches_reference(rt, gated, last):
    # 3 programs under the interpreter: each has a few rows of every phase, and some rows are left to no one
    # but the masks (N not a multiple of programs x rows per step)
    checks.check_kernel("gemv_chain", chain.gemv_chain, reference.gemv_chain,
                        [_case(40, 27, 48, 61, rt, gated=gated, last=last)], seed=3 + gated + 2 * last, quiet=True)


def test_chain_launches_one_kernel_per_phase_under_the_interpreter(rt, gen):
    # (on a GPU: one launch for the whole chain, test_gpu_chain_is_one_launch)
    args = _case(40, 27, 48, 61, rt)(gen)
    with count_launches() as n:
        chain.gemv_chain(**args)
    expected = 4 if rt.device.type == "cpu" else 1
    assert n["gemv_chain_kernel"] == expected, dict(n)


def test_chain_refuses_what_it_cannot_serve(rt, gen):
    args = _case(40, 27, 48, 61, rt)(gen)
    with pytest.raises(KernelError, match="chain.py.*rows.*one decode token"):
        chain.gemv_chain(**{**args, "o": args["o"].expand(2, -1, -1), "z": args["z"].expand(2, -1, -1)})
    with pytest.raises(KernelError, match="next_norm, next_proj.*together"):
        chain.gemv_chain(**{**args, "next_norm": None})
    with pytest.raises(KernelError, match=r"down must be a row-major \[40, 27\]"):
        chain.gemv_chain(**{**args, "down": args["down"][:, :20]})
    with pytest.raises(KernelError, match="o, z.*power-of-two"):
        o = checks.randn(1, 4, 12, g=gen, dtype=rt.dtype, device=rt.device)
        chain.gemv_chain(**{**args, "o": o, "z": o.clone(), "mixer_norm": o[0, 0],
                            "o_proj": args["o_proj"][:, :48]})
    with pytest.raises(KernelError, match=r"residual must be a contiguous \[1, 40\]"):
        chain.gemv_chain(**{**args, "residual": args["residual"].expand(2, -1)})


def test_resident_programs_counts_registers_threads_and_shared_memory():
    h200 = SimpleNamespace(regs_per_multiprocessor=65536, max_threads_per_multi_processor=2048,
                           shared_memory_per_multiprocessor=233472)
    # 146 registers round up to 152 per thread (256 per warp): 4 warps x 32 x 152 = 19456 -> 3 programs
    assert chain.resident_programs(146, 4, 128, h200) == 3
    assert chain.resident_programs(104, 8, 4096, h200) == 2
    assert chain.resident_programs(32, 4, 0, h200) == 16            # threads: 2048 / 128
    assert chain.resident_programs(32, 1, 0, h200) == 32            # the 32-block limit
    assert chain.resident_programs(40, 4, 100_000, h200) == 2       # shared memory
    assert chain.resident_programs(255, 32, 0, h200) == 0           # not even one fits


def test_model_decode_step_with_the_chain_matches_without(rt, monkeypatch):
    m = model_module.load_model("tiny", device=rt.device, dtype=rt.dtype)
    ids = torch.tensor([3, 17, 5], device=rt.device)
    logits, ops = {}, {}
    for on in (False, True):
        monkeypatch.setattr(model_module, "DECODE_CHAIN", on)
        cache = m.new_cache(4)
        with torch.inference_mode():
            m.step(ids[:2], torch.arange(2, device=rt.device), cache)
            logits[on] = m.step(ids[2:], torch.tensor([2], device=rt.device), cache).float()
        ops[on] = [name for _, name in model_module.record_operators(m, 2, decode=True)]
    n = m.config.num_hidden_layers
    assert ops[True].count("gemv_chain") == n
    # one chain for each layer's out-projection, its MLP's two GEMVs and the next layer's norm + in-projection
    # (the last layer's has no next layer: three operators)
    assert len(ops[False]) - len(ops[True]) == 3 * (n - 1) + 2, (ops[False], ops[True])
    tol = 1e-5 if rt.dtype == torch.float32 else 3e-2
    err = float((logits[True] - logits[False]).norm() / logits[False].norm())
    assert err < tol, f"decode logits with the chain differ from the operators' by {err:.2e}"


def test_the_model_runs_the_operators_when_an_entry_is_replaced(rt, monkeypatch):
    monkeypatch.setattr(model_module, "DECODE_CHAIN", True)
    m = model_module.load_model("tiny", device=rt.device, dtype=rt.dtype)
    assert m._chained(1) and not m._chained(2)
    m.ops["linear"] = reference.linear          # a learner's linear: the chain would hide it
    assert not m._chained(1)


# ---------------------------------------------------------------- GPU: the real shapes, the barrier, graphs

def _real_case(gated, last=False):
    from qwen_lab.config import QWEN35_0_8B as C
    rt = SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16)
    if gated:
        Ka = C.linear_value_dim
        N_next = C.linear_conv_dim + C.linear_value_dim + 2 * C.linear_num_value_heads
        return _case(C.hidden_size, C.intermediate_size, Ka, N_next, rt, True, C.linear_value_head_dim, last)
    return _case(C.hidden_size, C.intermediate_size, C.num_attention_heads * C.head_dim, 2 * C.attn_q_dim, rt,
                 False, last=last)


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [True, False], ids=["deltanet", "attention"])
@pytest.mark.parametrize("last", [False, True], ids=["next_layer", "last_layer"])
def test_gpu_chain_matches_the_operators_at_the_real_shapes(gated, last):
    from qwen_lab.kernels import activations, gemm
    g = torch.Generator().manual_seed(7)
    a = _real_case(gated, last)(g)
    if gated:
        y = gemm.gated_rms_norm_linear(a["o"], a["z"], a["mixer_norm"], a["eps"], a["o_proj"])
    else:
        y = gemm.linear(a["o"], a["o_proj"])
    gu, x1 = gemm.add_rms_norm_linear(y, a["residual"], a["post_norm"], a["eps"], a["gate_up"])
    m = activations.swiglu_down(gu, a["down"])
    want = (m, x1) if last else gemm.add_rms_norm_linear(m, x1, a["next_norm"], a["eps"], a["next_proj"])
    for _ in range(3):  # the barrier's counters must be back at zero after every launch
        got = chain.gemv_chain(**a)
        torch.cuda.synchronize()
        chain.check()
        for x, w, what in zip(got, want, ("output", "residual")):
            err = float((x.float() - w.float()).norm() / w.float().norm())
            assert err < 1e-2, f"{what}: relative difference {err:.2e} to the four operators"
    assert torch.equal(got[1], want[1])  # the residual add is the same bf16 rounding either way


@pytest.mark.gpu
def test_gpu_chain_is_one_launch():
    a = _real_case(True)(torch.Generator().manual_seed(1))
    chain.gemv_chain(**a)
    with count_launches() as n:
        chain.gemv_chain(**a)
    assert n["gemv_chain_kernel"] == 1, dict(n)


@pytest.mark.gpu
def test_gpu_chains_back_to_back_in_a_graph_repeat_bit_for_bit():
    # 8 chains in one CUDA Graph, launched with PDL one after another: each waits for the one before it, so the
    # barrier counter one resets is never read by the next too early. Two replays must give the same bits, which
    # one launch eagerly gives too.
    from qwen_lab.kernels import graph_time_us
    a = _real_case(True)(torch.Generator().manual_seed(2))
    want = [t.clone() for t in chain.gemv_chain(**a)]
    outs = []
    graph_time_us([lambda: outs.append(chain.gemv_chain(**a)) for _ in range(8)], warmup=True, replays=2)
    torch.cuda.synchronize()
    chain.check()
    for got in outs[-8:]:
        assert all(torch.equal(x, w) for x, w in zip(got, want))


@pytest.mark.gpu
def test_gpu_model_decode_with_the_chain_matches_without(monkeypatch):
    from qwen_lab.model import load_model
    m = load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([11, 220, 3405, 17, 99], device="cuda")
    logits = {}
    for on in (False, True):
        monkeypatch.setattr(model_module, "DECODE_CHAIN", on)
        cache = m.new_cache(8)
        with torch.inference_mode():
            m.step(ids[:4], torch.arange(4, device="cuda"), cache)
            logits[on] = m.step(ids[4:], torch.tensor([4], device="cuda"), cache).float()
    chain.check()
    err = float((logits[True] - logits[False]).norm() / logits[False].norm())
    assert err < 3e-2, f"decode logits with the chain differ from the operators' by {err:.2e}"
