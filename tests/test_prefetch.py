"""The L2 prefetch of the next projections' weights (qwen_lab.kernels.prefetch) by the decode kernels.

A prefetch is a hint: the kernels that take one must compute exactly what they compute without it. CPU: the
argument checks, and the kernels through the interpreter (where the prefetch is off) with and without it.
GPU: bitwise equal outputs and states with the prefetch on and off, one launch either way, and a model's decode.
"""

import pytest
import torch

import qwen_lab
from qwen_lab import KernelError, checks
from qwen_lab.config import QWEN35_0_8B as C
from qwen_lab.kernels import attention as A
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.deltanet import deltanet_conv_decode_step
from qwen_lab.kernels.prefetch import prefetch_enabled, prefetch_regions


def _conv_step_inputs(Hk, Hv, Dk, Dv, W, gen, rt):
    n = 2 * Hk * Dk + Hv * Dv
    f = lambda *s, scale=1.0, dtype=rt.dtype: checks.randn(*s, g=gen, dtype=dtype, device=rt.device, scale=scale)  # noqa: E731
    return dict(qkv=f(1, n), conv_weight=f(n, W, scale=0.5), conv_state=f(n, W - 1), a=f(1, Hv), b=f(1, Hv),
                A_log=f(Hv, dtype=torch.float32, scale=0.5), dt_bias=f(Hv, scale=0.5),
                state=f(Hv, Dk, Dv, dtype=torch.float32, scale=0.5))


def _conv_step(d, heads, prefetch):
    conv_state, state = d["conv_state"].clone(), d["state"].clone()
    with count_launches() as launches:
        o = deltanet_conv_decode_step(d["qkv"], d["conv_weight"], conv_state, d["a"], d["b"], d["A_log"],
                                      d["dt_bias"], state, *heads, prefetch=prefetch)
    return o, conv_state, state, sum(launches.values())


def _weights(gen, rt, *shapes):
    return tuple(checks.randn(*s, g=gen, dtype=rt.dtype, device=rt.device) for s in shapes)


def test_prefetch_regions_name_what_is_wrong(rt, gen):
    w = checks.randn(8, 4, g=gen, device=rt.device)
    with pytest.raises(KernelError, match=r"attention: prefetch takes up to 2 tensors, got 3"):
        prefetch_regions("attention", (w, w, w), rt.device, 2)
    with pytest.raises(KernelError, match=r"prefetch\[1\] is a list, expected a tensor"):
        prefetch_regions("attention", (w, [1, 2]), rt.device, 2)
    with pytest.raises(KernelError, match=r"prefetch\[0\] of shape \(4, 8\) is not contiguous"):
        prefetch_regions("attention", (w.t(),), rt.device, 2)
    with pytest.raises(KernelError, match=r"prefetch\[0\] is on meta"):
        prefetch_regions("attention", (torch.empty(4, device="meta"),), rt.device, 2)


def test_prefetch_is_off_without_a_gpu_or_when_switched_off(rt, gen, monkeypatch):
    w = checks.randn(8, 4, g=gen, device=rt.device)
    assert not prefetch_enabled("cpu")
    if rt.device.type == "cuda":
        assert prefetch_enabled(rt.device)
        assert prefetch_regions("x", (w,), rt.device, 2) == [(w, w.numel() * w.element_size()), (None, 0)]
        monkeypatch.setenv("QWEN_LAB_L2_PREFETCH", "0")
        assert not prefetch_enabled(rt.device)
    assert prefetch_regions("x", (w,), rt.device, 2) == [(None, 0), (None, 0)]


def test_conv_decode_step_computes_the_same_with_a_prefetch(rt, gen):
    Hk, Hv, Dk, Dv, W = 2, 4, 16, 16, 4
    d = _conv_step_inputs(Hk, Hv, Dk, Dv, W, gen, rt)
    weights = _weights(gen, rt, (24, 16), (40, 16))
    plain = _conv_step(d, (Hk, Dk, Hv, Dv), ())
    warmed = _conv_step(d, (Hk, Dk, Hv, Dv), weights)
    for name, a, b in zip(("o", "conv_state", "state"), plain[:3], warmed[:3]):
        assert torch.equal(a, b), f"{name} differs with the prefetch"
    assert plain[3] == warmed[3] == 1


def test_decode_attention_computes_the_same_with_a_prefetch(rt, gen):
    Hq, Hkv, D, L = 4, 2, 32, 40
    q = checks.randn(1, Hq, D, g=gen, dtype=rt.dtype, device=rt.device)
    gate = checks.randn(1, Hq, D, g=gen, dtype=rt.dtype, device=rt.device)
    k = checks.randn(L, Hkv, D, g=gen, dtype=rt.dtype, device=rt.device)
    v = checks.randn(L, Hkv, D, g=gen, dtype=rt.dtype, device=rt.device)
    pos = torch.tensor([30], device=rt.device)
    plain = A.attention(q, k, v, pos, gate=gate)
    warmed = A.attention(q, k, v, pos, gate=gate, prefetch=_weights(gen, rt, (24, 16), (40, 16)))
    assert torch.equal(plain, warmed)


@pytest.mark.gpu
def test_gpu_conv_decode_step_prefetch_changes_no_bit(rt, gen):
    heads = (C.linear_num_key_heads, C.linear_key_head_dim, C.linear_num_value_heads, C.linear_value_head_dim)
    d = _conv_step_inputs(heads[0], heads[2], heads[1], heads[3], C.linear_conv_kernel_dim, gen, rt)
    # the model's: the out-projection [H, Hv Dv] and the MLP's gate/up [2 I, H]
    weights = _weights(gen, rt, (C.hidden_size, C.linear_value_dim), (2 * C.intermediate_size, C.hidden_size))
    plain = _conv_step(d, heads, ())
    for _ in range(3):
        warmed = _conv_step(d, heads, weights)
        for name, a, b in zip(("o", "conv_state", "state"), plain[:3], warmed[:3]):
            assert torch.equal(a, b), f"{name} differs with the prefetch"
        assert warmed[3] == 1


@pytest.mark.gpu
def test_gpu_decode_attention_prefetch_changes_no_bit(rt, gen):
    Hq, Hkv, D, L = C.num_attention_heads, C.num_key_value_heads, C.head_dim, 2048
    q = checks.randn(1, Hq, D, g=gen, dtype=rt.dtype, device=rt.device)
    gate = checks.randn(1, Hq, D, g=gen, dtype=rt.dtype, device=rt.device)
    k = checks.randn(L, Hkv, D, g=gen, dtype=rt.dtype, device=rt.device)
    v = checks.randn(L, Hkv, D, g=gen, dtype=rt.dtype, device=rt.device)
    weights = _weights(gen, rt, (C.hidden_size, Hq * D), (2 * C.intermediate_size, C.hidden_size))
    for p in (0, 700, L - 1):
        pos = torch.tensor([p], device=rt.device)
        plain = A.attention(q, k, v, pos, gate=gate)
        with count_launches() as launches:
            warmed = A.attention(q, k, v, pos, gate=gate, prefetch=weights)
        assert torch.equal(plain, warmed), f"position {p}: the output differs with the prefetch"
        assert sum(launches.values()) == 2  # split + combine, as without


@pytest.mark.gpu
def test_gpu_model_decode_prefetch_changes_no_token(monkeypatch):
    """Greedy tokens and the last logits of a graph-replayed generation, prefetch on and off (deterministic split-K,
    so the two runs launch the same arithmetic)."""
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "1")
    model = qwen_lab.load_model("tiny", device="cuda")
    prompt = torch.randint(0, model.config.vocab_size, (11,), generator=torch.Generator().manual_seed(3))
    runs = {}
    for setting in ("1", "0"):
        monkeypatch.setenv("QWEN_LAB_L2_PREFETCH", setting)
        runs[setting] = qwen_lab.generate(model, prompt, max_new_tokens=12, eos_token_ids=()).tolist()
    assert runs["1"] == runs["0"]
