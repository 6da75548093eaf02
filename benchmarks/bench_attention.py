"""Gated attention's kernels (qwen_lab.kernels.attention) against PyTorch, at Qwen3.5-0.8B's shapes.

    python benchmarks/bench_attention.py [--json FILE] [--rounds N] [--only NAME]

attention over a prompt (flash attention, causal GQA over the prompt's own keys) and for one decode token over a
cache of the prompt's length (flash-decoding: the split kernel and the combine), against
torch.nn.functional.scaled_dot_product_attention (GQA) and qwen_lab.reference (eager: it reads the last position on
the host); the decode token's fused form qk_norm_rope_cache_attention (q/k norm, RoPE and the cache write inside the
split kernel) against the reference's preparation then SDPA; kv_cache_write and sigmoid_gate (the output gate) at a
prompt's rows. FLOPs: the two products of the visible (causal) scores; bytes: q, k, v and the output once each. On
the harness of benchmarks/harness.py.
"""

import sys

import torch
import torch.nn.functional as F

from harness import Case, main
from qwen_lab import reference
from qwen_lab.kernels import attention


def sdpa(q, k, v, causal):
    """softmax(q k^T / sqrt(D)) v by PyTorch: q [T, Hq, D], k, v [S, Hkv, D] (the visible keys) -> [T, Hq, D]."""
    # [1, heads, tokens, D], the layout its fused kernels take
    o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                       is_causal=causal, enable_gqa=True)
    return o[0].transpose(0, 1)


def cases(env):
    c, es = env.config, env.dtype.itemsize
    Hq, Hkv, D, T = c.num_attention_heads, c.num_key_value_heads, c.head_dim, env.tokens
    eps, rot, theta = c.rms_norm_eps, c.rotary_dim, c.rope_theta
    L = T + (128 if env.gpu else 8)     # a decode cache: the prompt, then room for the steps after it
    out = []

    def prompt(seed):
        return {"q": env.randn(T, Hq, D, seed=seed), "k": env.randn(T, Hkv, D, seed=seed + 1000),
                "v": env.randn(T, Hkv, D, seed=seed + 2000), "pos": torch.arange(T, device=env.device)}
    out.append(Case(
        "attention prefill", f"T={T} Hq={Hq} Hkv={Hkv} D={D}", prompt,
        {"triton": lambda d: attention.attention(d["q"], d["k"], d["v"], d["pos"]),
         "torch sdpa": lambda d: sdpa(d["q"], d["k"], d["v"], causal=True),
         "torch reference": lambda d: reference.attention(d["q"], d["k"], d["v"], d["pos"])},
        lambda d: reference.attention(d["q"], d["k"], d["v"], d["pos"]),
        bytes=(2 * T * Hq * D + 2 * T * Hkv * D) * es, flops=2 * 2 * Hq * D * T * (T + 1) // 2,
        eager=frozenset({"torch reference"})))

    p = T   # the decode token's position: it sees the prompt's T keys and its own
    def token(seed):
        q = env.randn(1, Hq, D, seed=seed)
        k, v = env.randn(L, Hkv, D, seed=seed + 1000), env.randn(L, Hkv, D, seed=seed + 2000)
        return {"q": q, "k": k, "v": v, "pos": torch.tensor([p], device=env.device),
                "ws": attention.decode_workspace(q, k)}
    out.append(Case(
        "attention decode", f"cache {p + 1} of L={L} Hq={Hq} Hkv={Hkv} D={D}", token,
        {"triton": lambda d: attention.attention(d["q"], d["k"], d["v"], d["pos"], workspace=d["ws"]),
         "torch sdpa": lambda d: sdpa(d["q"], d["k"][:p + 1], d["v"][:p + 1], causal=False),
         "torch reference": lambda d: reference.attention(d["q"], d["k"], d["v"], d["pos"])},
        lambda d: reference.attention(d["q"], d["k"], d["v"], d["pos"]),
        bytes=(2 * (p + 1) * Hkv * D + 2 * Hq * D) * es, flops=2 * 2 * Hq * D * (p + 1),
        eager=frozenset({"torch reference"})))

    def raw_token(seed):   # the decode token's raw projections, as the model passes them to the fused kernel
        d = token(seed)
        d.update(kn=env.randn(1, Hkv, D, seed=seed + 3000), vn=env.randn(1, Hkv, D, seed=seed + 4000),
                 gate=env.randn(1, Hq, D, seed=seed + 5000), qw=env.randn(D, seed=7, scale=0.1),
                 kw=env.randn(D, seed=8, scale=0.1))
        return d

    def torch_fused(d):
        q = reference.qk_norm_rope_cache(d["q"], d["kn"], d["vn"], d["qw"], d["kw"], eps, d["pos"], rot, theta,
                                         d["k"], d["v"])
        return reference.sigmoid_gate(sdpa(q, d["k"][:p + 1], d["v"][:p + 1], causal=False), d["gate"]), d["k"], d["v"]
    out.append(Case(
        "qk_norm_rope_cache_attention decode", f"cache {p + 1} of L={L} Hq={Hq} Hkv={Hkv} D={D}", raw_token,
        {"triton": lambda d: (attention.qk_norm_rope_cache_attention(
            d["q"], d["kn"], d["vn"], d["qw"], d["kw"], eps, d["pos"], rot, theta, d["k"], d["v"], gate=d["gate"],
            workspace=d["ws"]), d["k"], d["v"]),
         "torch reference prep + sdpa": torch_fused},
        lambda d: (reference.qk_norm_rope_cache_attention(d["q"], d["kn"], d["vn"], d["qw"], d["kw"], eps, d["pos"],
                                                          rot, theta, d["k"], d["v"], gate=d["gate"]), d["k"], d["v"]),
        bytes=(2 * (p + 1) * Hkv * D + 3 * Hq * D + 2 * Hkv * D) * es, flops=2 * 2 * Hq * D * (p + 1)))

    def cache_rows(seed):
        return {"kc": torch.zeros(L, Hkv, D, device=env.device, dtype=env.dtype),
                "vc": torch.zeros(L, Hkv, D, device=env.device, dtype=env.dtype),
                "k": env.randn(T, Hkv, D, seed=seed), "v": env.randn(T, Hkv, D, seed=seed + 1000),
                "pos": torch.arange(T, device=env.device)}

    def write(fn):
        return lambda d: (fn(d["kc"], d["vc"], d["k"], d["v"], d["pos"]), d["kc"], d["vc"])[1:]
    out.append(Case(
        "kv_cache_write", f"T={T} Hkv={Hkv} D={D}", cache_rows,
        {"triton": write(attention.kv_cache_write), "torch reference": write(reference.kv_cache_write)},
        write(reference.kv_cache_write), bytes=4 * T * Hkv * D * es))

    def gated(seed):
        return {"o": env.randn(T, Hq, D, seed=seed), "g": env.randn(T, Hq, D, seed=seed + 1000)}
    out.append(Case(
        "sigmoid_gate", f"T={T} Hq={Hq} D={D}", gated,
        {"triton": lambda d: attention.sigmoid_gate(d["o"], d["g"]),
         "torch reference": lambda d: reference.sigmoid_gate(d["o"], d["g"]),
         "torch": lambda d: d["o"] * torch.sigmoid(d["g"])},
        lambda d: reference.sigmoid_gate(d["o"], d["g"]), bytes=3 * T * Hq * D * es))
    return out


if __name__ == "__main__":
    sys.exit(main("bench_attention", cases, __doc__))
