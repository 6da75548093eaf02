"""Plain-PyTorch versions of every operator of the Qwen3.5 forward: the oracle.

Each function here is the definition that a Triton kernel in `qwen_lab.kernels` must match, and
the `backend="torch"` entry of the model's operator table. They favour clarity over speed, compute
in float32 and return the input's dtype (except where a result is fp32 by design: gates, states).

Conventions (batch 1, token-major):
- T tokens, H hidden size; attention heads Hq, KV heads Hkv, head_dim D;
  DeltaNet key heads Hk (dim Dk) and value heads Hv (dim Dv), Hv a multiple of Hk.
- `positions` is a LongTensor [T] on the device: the absolute position of each query token.
- Functions that update a cache or a state do it in place and say so.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- embedding


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out[t] = weight[ids[t]]. ids [T] int, weight [V, H] -> [T, H]."""
    return weight[ids]


# ---------------------------------------------------------------- norms


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: x * rsqrt(mean(x^2) + eps) * (1 + w).

    fp32 math, cast after the multiply. Serves the input, post-attention and final norms, and the
    per-head q/k norms (x [T, heads, D], weight [D]).
    """
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (1.0 + weight.float())).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float):
    """Fused residual add + RMSNorm: s = x + residual; returns (rms_norm(s), s). x, residual [T, H]."""
    s = (x.float() + residual.float()).to(x.dtype)
    return rms_norm(s, weight, eps), s


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """DeltaNet output norm: rmsnorm(x) * w * silu(z), plain w (not 1 + w). x, z [..., D], weight [D]."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float() * F.silu(z.float())).to(x.dtype)


# ---------------------------------------------------------------- matmuls


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """y = x @ weight^T with fp32 accumulation. x [M, K], weight [N, K] (Hugging Face layout) -> [M, N]."""
    return (x.float() @ weight.float().t()).to(x.dtype)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU: silu(gate) * up, where gate_up [M, 2I] = [gate | up] (the fused projection). -> [M, I]."""
    gate, up = gate_up.float().chunk(2, dim=-1)
    return (F.silu(gate) * up).to(gate_up.dtype)


def swiglu_down(gate_up: torch.Tensor, down_weight: torch.Tensor) -> torch.Tensor:
    """The MLP's second half: linear(silu_mul(gate_up), down_weight). gate_up [M, 2I], down [H, I] -> [M, H].

    At decode the GPU computes SwiGLU as the prologue of the down-projection GEMV, in one kernel.
    """
    return linear(silu_mul(gate_up), down_weight)


def linear_silu_mul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The MLP's first half: silu_mul(linear(x, weight)). x [M, K], weight [2I, K] = [W_gate; W_up] -> [M, I].

    At prefill the GPU computes SwiGLU in the epilogue of the gate/up GEMM: each program holds the gate and
    the up tile of the same columns, so the [M, 2I] projection never goes to memory. (Here the projection is
    rounded to x's dtype before the activation, as two separate kernels would; the fused kernel skips that
    rounding, a difference within the dtype's tolerance.)
    """
    return silu_mul(linear(x, weight))


def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor):
    """Residual add + RMSNorm + projection: (h, s) = add_rms_norm(x, residual, norm_weight, eps); returns
    (linear(h, weight), s). x, residual [M, H], norm_weight [H], weight [N, H] -> ([M, N], [M, H]).

    At decode the GPU computes the add and the norm as the prologue of the projection's GEMV, in one kernel.
    """
    h, s = add_rms_norm(x, residual, norm_weight, eps)
    return linear(h, weight), s


def linear_add_rms_norm(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor,
                        eps: float, residual_out: torch.Tensor | None = None):
    """A branch's projection joining the residual stream, and the next norm's part that needs no whole row:
    s = residual + linear(x, weight) (rounded as add_rms_norm rounds), h = s (1 + norm_weight), ss = each row's
    sum of s^2 (fp32, one slot: [M, 1]). x [M, K], weight [H, K], residual [M, H] -> (s, h, ss).

    Then rms_scaled_linear(h, ss, eps, W) = linear(rms_norm(s, norm_weight, eps), W) up to rounding: the norm's
    row factor 1 / rms(s) comes out of the next product. On the GPU both halves are GEMM epilogues (the
    kernel writes ss as one partial sum per output tile), and no norm kernel runs between the two GEMMs.
    """
    s = (residual.float() + linear(x, weight).float()).to(x.dtype)
    if residual_out is not None:
        s = residual_out.copy_(s)
    h = (s.float() * (1.0 + norm_weight.float())).to(x.dtype)
    return s, h, (s.float() ** 2).sum(-1, keepdim=True)


def rms_scaled_linear(h: torch.Tensor, ss: torch.Tensor, eps: float, weight: torch.Tensor,
                      swiglu: bool = False) -> torch.Tensor:
    """The projection after linear_add_rms_norm: (h weight^T) / sqrt(sum(ss) / K + eps) per row (K: h's width),
    the factor applied to the fp32 sums; with swiglu (weight = [W_gate; W_up]) to both, then silu(gate) * up."""
    y = (h.float() @ weight.float().t()) * torch.rsqrt(ss.sum(-1, keepdim=True) / h.shape[-1] + eps)
    if swiglu:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y.to(h.dtype)


def rms_norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor) -> torch.Tensor:
    """RMSNorm + projection: linear(rms_norm(x, norm_weight, eps), weight). x [M, H], weight [N, H] -> [M, N]."""
    return linear(rms_norm(x, norm_weight, eps), weight)


def gated_rms_norm_linear(o: torch.Tensor, z: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                          weight: torch.Tensor) -> torch.Tensor:
    """The DeltaNet output: linear(gated_rms_norm(o, z, norm_weight, eps).reshape(M, Hv * Dv), weight).

    o, z [M, Hv, Dv], norm_weight [Dv], weight [N, Hv * Dv] -> [M, N]. At decode one kernel on the GPU.
    """
    M = o.shape[0]
    return linear(gated_rms_norm(o, z, norm_weight, eps).reshape(M, -1), weight)


# ---------------------------------------------------------------- rotary embedding


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float):
    """cos, sin [T, rotary_dim // 2] for inv_freq_i = theta^(-2i / rotary_dim)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32)
                                / rotary_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """Partial rotate-half RoPE on the first `rotary_dim` dims of each head; the rest pass through.

    x [T, heads, D], positions [T]. With x1, x2 the two halves of x[..., :rotary_dim]:
    out1 = x1 cos - x2 sin, out2 = x2 cos + x1 sin.
    """
    cos, sin = rope_cos_sin(positions, rotary_dim, theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    xf = x.float()
    half = rotary_dim // 2
    x1, x2, rest = xf[..., :half], xf[..., half:rotary_dim], xf[..., rotary_dim:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], dim=-1)
    return out.to(x.dtype)


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float,
                 positions: torch.Tensor, rotary_dim: int, theta: float):
    """The attention layer's q/k preparation: per-head zero-centred RMSNorm, then partial RoPE, on both.

    q [T, Hq, D], k [T, Hkv, D], weights [D] -> (q, k). One fused kernel on the GPU; here, the composition.
    """
    q = rope(rms_norm(q, q_weight, eps), positions, rotary_dim, theta)
    k = rope(rms_norm(k, k_weight, eps), positions, rotary_dim, theta)
    return q, k


def qk_norm_rope_cache(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                       k_weight: torch.Tensor, eps: float, positions: torch.Tensor, rotary_dim: int, theta: float,
                       k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """qk_norm_rope, then kv_cache_write of the prepared k and of v, in one kernel on the GPU.

    q [Tq, Hq, D] for the last Tq of the T tokens (Tq <= T; Tq < T when only the last queries attend, as in a
    prompt's last layer), k, v [T, Hkv, D], caches [L, Hkv, D] (updated in place at `positions` [T]) -> the
    prepared q [Tq, Hq, D]. The attention that follows reads k and v from the cache, so only q comes back.
    """
    Tq = q.shape[0]
    q = rope(rms_norm(q, q_weight, eps), positions[positions.shape[0] - Tq:], rotary_dim, theta)
    k = rope(rms_norm(k, k_weight, eps), positions, rotary_dim, theta)
    kv_cache_write(k_cache, v_cache, k, v, positions)
    return q


# ---------------------------------------------------------------- gated attention


def kv_cache_write(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor) -> None:
    """In place: k_cache[positions] = k, v_cache[positions] = v. caches [L, Hkv, D], k, v [T, Hkv, D]."""
    k_cache[positions] = k.to(k_cache.dtype)
    v_cache[positions] = v.to(v_cache.dtype)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              scale: float | None = None, gate: torch.Tensor | None = None) -> torch.Tensor:
    """Causal grouped-query attention of T queries over a key/value cache.

    q [T, Hq, D]; k, v [L, Hkv, D] (L >= positions.max() + 1: the cache, or the prompt's own k, v);
    query t (at absolute position positions[t]) sees keys 0..positions[t]. Query head h reads KV head
    h // (Hq // Hkv). softmax(q k^T * scale) v with scale = D^-0.5 by default. -> [T, Hq, D].
    With `gate` ([T, Hq, D]), returns the gated output sigmoid_gate(o, gate) (the library's kernels: in the
    flash epilogue or the decode combine, or from attention.GATE_APART_FROM_TOKENS query tokens as a pass of its own).
    """
    T, Hq, D = q.shape
    Hkv = k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    S = int(positions.max().item()) + 1
    kf = k[:S].float().repeat_interleave(Hq // Hkv, dim=1)  # [S, Hq, D]
    vf = v[:S].float().repeat_interleave(Hq // Hkv, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), kf) * scale
    visible = torch.arange(S, device=q.device)[None, :] <= positions[:, None]  # [T, S]
    scores = scores.masked_fill(~visible[None], float("-inf"))
    p = torch.softmax(scores, dim=-1)
    o = torch.einsum("hts,shd->thd", p, vf).to(q.dtype)
    return o if gate is None else sigmoid_gate(o, gate)


def qk_norm_rope_cache_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_weight: torch.Tensor,
                                 k_weight: torch.Tensor, eps: float, positions: torch.Tensor, rotary_dim: int,
                                 theta: float, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                 gate: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """A decode token's attention from its raw projections: qk_norm_rope_cache, then attention (one kernel less on
    the GPU: the q/k preparation runs inside the attention's split kernel). q [1, Hq, D], k, v [1, Hkv, D],
    caches [L, Hkv, D] (updated in place) -> [1, Hq, D]."""
    q = qk_norm_rope_cache(q, k, v, q_weight, k_weight, eps, positions, rotary_dim, theta, k_cache, v_cache)
    return attention(q, k_cache, v_cache, positions, scale, gate)


def sigmoid_gate(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The attention output gate: o * sigmoid(gate), elementwise, same shapes."""
    return (o.float() * torch.sigmoid(gate.float())).to(o.dtype)


# ---------------------------------------------------------------- Gated DeltaNet


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Causal depthwise conv of width W, then SiLU; carries the last W-1 *inputs* in `state`.

    x [T, C], weight [C, W], state [C, W-1] (oldest first; zeros at the start of a sequence).
    y[t, c] = silu(sum_j weight[c, j] * xx[t + j, c]) with xx = [state^T ; x] ([W-1+T, C]).
    Updates `state` in place to the last W-1 rows of xx. -> y [T, C].
    """
    T, C = x.shape
    W = weight.shape[1]
    xx = torch.cat([state.t().float(), x.float()], dim=0)  # [W-1+T, C]
    y = sum(weight[:, j].float() * xx[j:j + T] for j in range(W))
    state.copy_(xx[T:].t().to(state.dtype))
    return F.silu(y).to(x.dtype)


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim, fp32 math."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


def deltanet_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """g = -exp(A_log) * softplus(a + dt_bias) (log of the decay, <= 0) and beta = sigmoid(b), both fp32.

    a, b [T, Hv]; A_log, dt_bias [Hv] -> (g [T, Hv], beta [T, Hv]).
    """
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def _delta_inputs(q, k, v, scale):
    """fp32, l2-normalised q and k (q also scaled), repeated so each value head has its q/k head."""
    rep = v.shape[1] // k.shape[1]
    qf = l2norm(q.float()) * (q.shape[-1] ** -0.5 if scale is None else scale)
    kf = l2norm(k.float())
    if rep > 1:  # q/k head h serves value heads h*rep .. h*rep + rep - 1
        qf, kf = qf.repeat_interleave(rep, dim=1), kf.repeat_interleave(rep, dim=1)
    return qf, kf, v.float()


def delta_rule_recurrent(q, k, v, g, beta, state, scale: float | None = None) -> torch.Tensor:
    """The gated delta rule one token at a time (decode form).

    q, k [T, Hk, Dk]; v [T, Hv, Dv]; g, beta [T, Hv] fp32; state [Hv, Dk, Dv] fp32, updated in place.
    q and k are l2-normalised here and q scaled by Dk^-0.5 (or `scale`). Per token and value head:
        S = S * exp(g);  S = S + k (x) beta * (v - S^T k);  o = S^T q
    -> o [T, Hv, Dv] in v's dtype.
    """
    qf, kf, vf = _delta_inputs(q, k, v, scale)
    S = state.float().clone()
    out = torch.empty_like(vf)
    for t in range(q.shape[0]):
        S = S * g[t].float().exp()[:, None, None]
        kv_mem = torch.einsum("hkv,hk->hv", S, kf[t])
        delta = (vf[t] - kv_mem) * beta[t].float()[:, None]
        S = S + kf[t][:, :, None] * delta[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", S, qf[t])
    state.copy_(S)
    return out.to(v.dtype)


def deltanet_decode_step(q, k, v, a, b, A_log, dt_bias, state, scale: float | None = None) -> torch.Tensor:
    """One decode step of the delta rule with its gates: deltanet_gates, then delta_rule_recurrent (fused on the GPU).

    q, k [T, Hk, Dk]; v [T, Hv, Dv]; a, b [T, Hv]; state [Hv, Dk, Dv] fp32, updated in place. -> o [T, Hv, Dv].
    """
    g, beta = deltanet_gates(a, b, A_log, dt_bias)
    return delta_rule_recurrent(q, k, v, g, beta, state, scale)


def deltanet_conv_decode_step(qkv, conv_weight, conv_state, a, b, A_log, dt_bias, state, num_k_heads: int,
                              head_k_dim: int, num_v_heads: int, head_v_dim: int,
                              scale: float | None = None) -> torch.Tensor:
    """One decode token of a Gated DeltaNet layer from its conv input: causal_conv1d, then deltanet_decode_step
    (one kernel on the GPU).

    qkv [1, C] with C = 2 Hk Dk + Hv Dv, the q | k | v channels before the conv (a column slice of the
    in-projection output); conv_weight [C, W]; conv_state [C, W-1], updated in place; a, b [1, Hv];
    A_log, dt_bias [Hv]; state [Hv, Dk, Dv] fp32, updated in place. -> o [1, Hv, Dv] in qkv's dtype.
    """
    y = causal_conv1d(qkv, conv_weight, conv_state)  # SiLU inside, y in qkv's dtype
    kd = num_k_heads * head_k_dim
    q = y[:, :kd].unflatten(1, (num_k_heads, head_k_dim))
    k = y[:, kd:2 * kd].unflatten(1, (num_k_heads, head_k_dim))
    v = y[:, 2 * kd:].unflatten(1, (num_v_heads, head_v_dim))
    return deltanet_decode_step(q, k, v, a, b, A_log, dt_bias, state, scale)


def delta_rule_chunked(q, k, v, g, beta, state, scale: float | None = None, chunk_size: int = 64) -> torch.Tensor:
    """The same function as `delta_rule_recurrent`, computed chunk by chunk (prefill form).

    Within a chunk of C tokens (cumulative log-decay G_i = sum_{j<=i} g_j):
        A = I + strict_tril((beta k) k^T * exp(G_i - G_j))       (unit lower-triangular)
        U = A^{-1} (beta v),   W = A^{-1} (beta k * exp(G))      (the UT transform)
        V' = U - W S0                                            (what the old state does not explain)
        O = (q * exp(G)) S0 + tril(q k^T * exp(G_i - G_j)) V'
        S1 = exp(G_C) S0 + (k * exp(G_C - G))^T V'
    Tail positions past T are padded with zeros and g = 0, so they change neither O nor S.
    """
    T = q.shape[0]
    qf, kf, vf = _delta_inputs(q, k, v, scale)
    gf, bf = g.float(), beta.float()
    C = chunk_size
    pad = (-T) % C
    if pad:
        qf, kf, vf = (F.pad(x, (0, 0, 0, 0, 0, pad)) for x in (qf, kf, vf))
        gf, bf = F.pad(gf, (0, 0, 0, pad)), F.pad(bf, (0, 0, 0, pad))
    n = (T + pad) // C
    Hv = vf.shape[1]
    # [heads, chunks, C, dim]
    qc, kc, vc = (x.reshape(n, C, Hv, -1).permute(2, 0, 1, 3) for x in (qf, kf, vf))
    gc, bc = (x.reshape(n, C, Hv).permute(2, 0, 1) for x in (gf, bf))
    G = gc.cumsum(-1)
    decay = (G[..., :, None] - G[..., None, :])
    lower = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    decay = torch.where(lower, decay, torch.full_like(decay, float("-inf"))).exp()
    eye = torch.eye(C, device=q.device)
    kb = kc * bc[..., None]
    A = eye + torch.tril((kb @ kc.transpose(-1, -2)) * decay, -1)
    U = torch.linalg.solve_triangular(A, vc * bc[..., None], upper=False, unitriangular=True)
    Wm = torch.linalg.solve_triangular(A, kb * G.exp()[..., None], upper=False, unitriangular=True)
    attn = (qc @ kc.transpose(-1, -2)) * decay
    S = state.float().clone()
    out = torch.empty_like(vc)
    for i in range(n):
        v_new = U[:, i] - Wm[:, i] @ S
        out[:, i] = (qc[:, i] * G[:, i, :, None].exp()) @ S + attn[:, i] @ v_new
        g_last = G[:, i, -1]
        k_decayed = kc[:, i] * (g_last[:, None] - G[:, i]).exp()[..., None]
        S = S * g_last.exp()[:, None, None] + k_decayed.transpose(-1, -2) @ v_new
    state.copy_(S)
    out = out.permute(1, 2, 0, 3).reshape(n * C, Hv, -1)[:T]
    return out.to(v.dtype)


def deltanet_chunked(q, k, v, a, b, A_log, dt_bias, state, scale: float | None = None,
                     chunk_size: int = 64) -> torch.Tensor:
    """The prefill form with its gates: deltanet_gates, then delta_rule_chunked (the gates inside the chunk prep
    on the GPU).

    q, k [T, Hk, Dk]; v [T, Hv, Dv]; a, b [T, Hv]; state [Hv, Dk, Dv] fp32, updated in place. -> o [T, Hv, Dv].
    """
    g, beta = deltanet_gates(a, b, A_log, dt_bias)
    return delta_rule_chunked(q, k, v, g, beta, state, scale, chunk_size)


# ---------------------------------------------------------------- sampling


def kept_tokens(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    """sample's filter: p = softmax(logits / temperature) [V] (temperature > 0) and the kept set, a bool [V] (see
    `sample` for the order-free definitions of top-k and top-p). -> (p, keep)."""
    x = logits.float()
    # the largest logit subtracted first: (x - max) / T is <= 0 and at worst -inf, never inf - inf = NaN, however
    # small T is (the same softmax)
    p = torch.softmax((x - x.max()) / temperature, dim=-1)
    asc = torch.sort(p).values
    upper = torch.searchsorted(asc, p, right=True)  # number of tokens with probability <= p_i
    n_greater = p.numel() - upper
    mass_greater = asc.sum() - torch.cumsum(asc, 0)[upper - 1]
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k > 0:
        keep &= n_greater < top_k
    if top_p < 1.0:
        keep &= mass_greater < top_p
    return p, keep


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, uniform: torch.Tensor) -> torch.Tensor:
    """Draw one token from logits [V] with temperature, top-k and top-p (nucleus) filtering.

    temperature == 0 means greedy: argmax, the lowest index on ties. Otherwise p = softmax(logits / T) and
    token i is kept when both hold (order-free definitions, so ties are kept together):
        top-k (k > 0):   fewer than k tokens are strictly more likely than i
        top-p (p < 1):   the tokens strictly more likely than i hold less than top_p of the mass
    The kept set is always {i : p_i >= tau} for some tau, and never empty (it holds the argmax).
    Sampling is inverse-CDF in index order: with M the kept mass, return the first index whose running
    kept mass exceeds uniform * M. The order changes no probability and needs no sort on the device.
    uniform: a 0-d tensor in [0, 1), drawn on the device. -> LongTensor [] on logits' device.
    """
    x = logits.float()
    if temperature == 0:
        return torch.argmax(x)
    p, keep = kept_tokens(logits, temperature, top_k, top_p)
    kept = torch.where(keep, p, torch.zeros_like(p))
    cdf = torch.cumsum(kept, 0)
    target = uniform.float() * cdf[-1]
    idx = torch.searchsorted(cdf, target.reshape(1), right=True)[0]
    last = keep.nonzero()[-1, 0]
    return torch.minimum(idx, last)
