"""The Qwen3.5 text model, written as the architecture diagram reads.

    x = embed[ids]                                                     x: the residual stream [T, H]
    for each layer:   h = norm(x);  x = x + mixer(h @ W_in^T)           Gated DeltaNet, or gated attention
                      h = norm(x);  x = x + down(silu(gate) * up)        the SwiGLU MLP, gate | up = h @ W_gate_up^T
    logits = norm(x) @ lm_head^T

Every computation goes through `model.ops`, a table from an operator's name to a function with the signature of
`qwen_lab.reference`. The same graph runs with `backend="torch"` (the reference, the oracle) or `backend="triton"`
(the course's kernels), and a learner changes one operator by putting a kernel in its entry:
`model.ops["rms_norm"] = my_rms_norm`. Every entry is called by the forward (or, `sample`, by generation).

This is the plain route: one operator per box of the diagram. The fast route (fused kernels, the last row alone
after the last mixer, the CUDA Graphs) is an execution plan built beside it from the same weights and the same
table: `qwen_lab.plan`.

Shapes (batch 1, token-major): T tokens in a step, H hidden, V vocab. All sizes come from the config.
"""

from __future__ import annotations

from typing import Callable

import torch

from . import reference, runtime
from .cache import Cache
from .config import LINEAR, Qwen35Config
from .errors import ConfigError, DeviceError, GenerationError

# The base operators, in the order the forward first calls them.
OPERATORS = ("embedding", "rms_norm", "add_rms_norm", "linear", "causal_conv1d", "deltanet_gates",
             "delta_rule_chunked", "delta_rule_recurrent", "gated_rms_norm", "rope", "kv_cache_write", "attention",
             "sigmoid_gate", "silu_mul", "sample")
BACKENDS = ("torch", "triton")


def torch_ops() -> dict[str, Callable]:
    """The operator table of backend="torch": qwen_lab.reference."""
    return {name: getattr(reference, name) for name in OPERATORS}


def triton_ops() -> dict[str, Callable]:
    """The operator table of backend="triton": the course's kernels, one family folder each (qwen_lab.kernels)."""
    from .kernels import activations, attention, conv1d, deltanet, embedding, gemm, norms, rope, sampling

    return {
        "embedding": embedding.embedding,
        "rms_norm": norms.rms_norm,
        "add_rms_norm": norms.add_rms_norm,
        "linear": gemm.linear,
        "causal_conv1d": conv1d.causal_conv1d,
        "deltanet_gates": deltanet.deltanet_gates,
        "delta_rule_chunked": deltanet.delta_rule_chunked,
        "delta_rule_recurrent": deltanet.delta_rule_recurrent,
        "gated_rms_norm": norms.gated_rms_norm,
        "rope": rope.rope,
        "kv_cache_write": attention.kv_cache_write,
        "attention": attention.attention,
        "sigmoid_gate": attention.sigmoid_gate,
        "silu_mul": activations.silu_mul,
        "sample": sampling.sample,
    }


class OperatorTable(dict):
    """`model.ops`: operator name -> function. An entry the forward does not have (a typo) is refused by name."""

    def __setitem__(self, name, fn):
        if name not in OPERATORS:
            raise ConfigError(f"model.ops[{name!r}]: the forward calls no operator of that name; expected one of "
                              f"{', '.join(OPERATORS)}")
        super().__setitem__(name, fn)


def _check_backend(backend) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}; expected one of {BACKENDS}")


def _check_weights_match(weights, device: torch.device, dtype: torch.dtype) -> None:
    """Weights in another dtype or on another device would fail deep inside a kernel (a bf16 q against a float32
    cache), so say it here, where the fix is plain."""
    embed = weights.embed
    if embed.dtype != dtype or embed.device.type != device.type:
        raise ConfigError(f"weights: the embedding is {str(embed.dtype).removeprefix('torch.')} on {embed.device}, "
                          f"but the model runs in {str(dtype).removeprefix('torch.')} on {device}: draw or load the "
                          f"weights with the model's device and dtype (random_weights(config, device=..., dtype=...), "
                          f"load_weights(source, device=..., dtype=...)), or use load_model, which does both")


class Qwen35Model:
    """A loaded Qwen3.5 text model: config, weights, an operator table, and the forward graph.

    `rt`: a runtime already chosen (qwen_lab.runtime.choose), in place of device and dtype."""

    def __init__(self, config: Qwen35Config, weights, device=None, dtype=None, backend: str = "triton", *,
                 rt: runtime.Runtime | None = None):
        _check_backend(backend)
        self.config, self.weights, self.backend = config, weights, backend
        self.runtime = rt if rt is not None else runtime.choose(device, dtype)
        self.device, self.dtype = self.runtime.device, self.runtime.dtype
        _check_weights_match(weights, self.device, self.dtype)
        if backend == "triton" and self.device.type == "cpu" and not self.runtime.interpreter:
            raise DeviceError("backend='triton' on a CPU needs the Triton interpreter: set TRITON_INTERPRET=1 "
                              "before importing qwen_lab, or use backend='torch'")
        self.ops = OperatorTable(torch_ops() if backend == "torch" else triton_ops())
        self.trace: Callable | None = None  # trace(layer, name, tensor) after each operator: see divergence_report
        self.layer_index = -1                # the layer being computed (-1: embedding; num_layers: the head)

    def new_cache(self, max_len: int) -> Cache:
        """Preallocated KV cache, conv state and recurrent state for sequences of up to max_len tokens."""
        return Cache(self.config, max_len, self.device, self.dtype)

    @torch.inference_mode()
    def forward(self, input_ids) -> torch.Tensor:
        """Logits for every position of a prompt, with no cache kept: ids [T] or [1, T] -> float32 [T, V]."""
        ids = self.check_ids(input_ids)
        limit = self.config.max_position_embeddings
        if ids.numel() > limit:  # as generate() refuses: positions past the limit were never trained
            raise GenerationError(f"input_ids: {ids.numel()} tokens exceed the model's max_position_embeddings="
                                  f"{limit} ({self.config.name})")
        positions = torch.arange(ids.numel(), device=self.device)
        return self.step(ids, positions, self.new_cache(ids.numel()), all_logits=True).float()

    __call__ = forward

    def check_ids(self, input_ids) -> torch.Tensor:
        """Validate prompt ids on the host (once per prompt) and return them as a LongTensor [T] on the device."""
        if not isinstance(input_ids, torch.Tensor):
            try:
                input_ids = torch.tensor(input_ids)
            except (TypeError, ValueError, RuntimeError):
                raise GenerationError(f"input_ids: expected a sequence of integer token ids, got "
                                      f"{type(input_ids).__name__}") from None
        if input_ids.dim() == 2 and input_ids.shape[0] == 1:
            input_ids = input_ids[0]
        if input_ids.dim() != 1:
            raise GenerationError(f"input_ids: expected shape [T] or [1, T], got {tuple(input_ids.shape)}")
        if input_ids.numel() == 0:
            raise GenerationError("input_ids: the prompt is empty; expected at least one token id")
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise GenerationError(f"input_ids: expected integer token ids, got dtype {input_ids.dtype}")
        if input_ids.dtype in (torch.uint16, torch.uint32, torch.uint64):  # torch has no min/max for these
            values = input_ids.tolist()
            lo, hi = min(values), max(values)
        else:
            lo, hi = int(input_ids.min()), int(input_ids.max())
        if lo < 0 or hi >= self.config.vocab_size:
            bad = lo if lo < 0 else hi
            raise GenerationError(f"input_ids: token id {bad} is outside [0, {self.config.vocab_size}) "
                                  f"(vocab_size of {self.config.name})")
        return input_ids.to(device=self.device, dtype=torch.long)

    # ---------------------------------------------------------------- the graph
    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache: Cache, all_logits: bool = False) -> torch.Tensor:
        """Run T tokens at `positions` through the model, reading and updating `cache`.

        ids, positions: LongTensor [T] on the device. Returns logits [T, V] (all_logits) or [1, V] for the last
        position, in the model dtype. More tokens than the cache holds is an error; the positions' values live on
        the device and are not checked (a position at or past cache.max_len is not written to the cache).
        """
        check_step(ids, positions, cache)
        W, ops, n = self.weights, self.ops, len(self.weights.layers)
        self.layer_index = -1
        x = self._t("embedding", ops["embedding"](ids, W.embed))
        y = None                                      # a branch's output, added to x by the norm that follows
        for i, layer in enumerate(W.layers):
            self.layer_index = i
            h, x = self.add_norm("input_norm", y, x, layer.input_norm)
            if layer.kind == LINEAR:
                y = self.gated_deltanet(i, layer, self._t("in_proj", ops["linear"](h, layer.in_proj)), cache)
            else:
                proj = self._t("qkv_proj", ops["linear"](h, layer.qkv_proj))
                y = self.gated_attention(i, layer, proj, positions, cache)
            h, x = self.add_norm("post_attention_norm", y, x, layer.post_norm)
            y = self.mlp(layer, h)
        self.layer_index = n
        h, _ = self.add_norm("final_norm", y, x, W.final_norm)
        return self._t("lm_head", ops["linear"](h if all_logits else h[-1:], W.lm_head))

    def add_norm(self, name: str, y, x: torch.Tensor, weight: torch.Tensor):
        """x = x + y (y None: x as is), then RMSNorm (1 + w): -> (the normed rows, the new x)."""
        eps = self.config.rms_norm_eps
        if y is None:
            return self._t(name, self.ops["rms_norm"](x, weight, eps)), x
        h, x = self.ops["add_rms_norm"](y, x, weight, eps)
        return self._t(name, h), x

    def gated_deltanet(self, i: int, layer, proj: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Gated DeltaNet mixer, from its in-projection [T, qkv | z | b | a]: causal conv (SiLU inside), the gates,
        the delta rule (chunked for a prompt, recurrent for one token; l2norm of q and k inside), the gated norm,
        the out-projection -> [T, H]."""
        cfg, ops = self.config, self.ops
        Hk, Hv, Dk, Dv = cfg.linear_num_key_heads, cfg.linear_num_value_heads, cfg.linear_key_head_dim, \
            cfg.linear_value_head_dim
        kd, vd, cd = cfg.linear_key_dim, cfg.linear_value_dim, cfg.linear_conv_dim
        T = proj.shape[0]
        qkv, z = proj[:, :cd], proj[:, cd:cd + vd].unflatten(1, (Hv, Dv))
        b, a = proj[:, cd + vd:cd + vd + Hv], proj[:, cd + vd + Hv:]
        qkv = self._t("conv1d", ops["causal_conv1d"](qkv, layer.conv, cache.conv_state[i]))
        q, k = qkv[:, :kd].unflatten(1, (Hk, Dk)), qkv[:, kd:2 * kd].unflatten(1, (Hk, Dk))
        v = qkv[:, 2 * kd:].unflatten(1, (Hv, Dv))
        g, beta = ops["deltanet_gates"](a, b, layer.A_log, layer.dt_bias)   # decay g <= 0, write strength beta
        rule = ops["delta_rule_recurrent"] if T == 1 else ops["delta_rule_chunked"]
        o = self._t("delta_rule", rule(q, k, v, g, beta, cache.recurrent_state[i]))   # [T, Hv, Dv]
        o = self._t("gated_norm", ops["gated_rms_norm"](o, z, layer.norm, cfg.rms_norm_eps))  # norm(o) w silu(z)
        return self._t("out_proj", ops["linear"](o.reshape(T, vd), layer.out_proj))

    def gated_attention(self, i: int, layer, proj: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Gated attention mixer, from its projection [T, (q_h | gate_h) per head | k | v]: per-head RMSNorm of q
        and k, partial RoPE, k and v into the cache, causal GQA over the cache, the sigmoid gate, the output
        projection -> [T, H]."""
        cfg, ops, eps = self.config, self.ops, self.config.rms_norm_eps
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qd, kvd = cfg.attn_q_dim, cfg.attn_kv_dim
        T = proj.shape[0]
        q_and_gate = proj[:, :qd].unflatten(1, (Hq, 2 * D))
        q, gate = q_and_gate[..., :D], q_and_gate[..., D:]               # strided views: no copy
        k, v = proj[:, qd:qd + kvd].unflatten(1, (Hkv, D)), proj[:, qd + kvd:].unflatten(1, (Hkv, D))
        q = ops["rope"](ops["rms_norm"](q, layer.q_norm, eps), positions, cfg.rotary_dim, cfg.rope_theta)
        k = ops["rope"](ops["rms_norm"](k, layer.k_norm, eps), positions, cfg.rotary_dim, cfg.rope_theta)
        self._t("qk_norm_rope", q)
        ops["kv_cache_write"](cache.key[i], cache.value[i], k, v, positions)   # before attention reads the cache
        o = ops["attention"](q, cache.key[i], cache.value[i], positions)     # softmax(q k^T / sqrt(D)) v
        o = self._t("gated_attention", ops["sigmoid_gate"](o, gate))         # o * sigmoid(gate)
        return self._t("o_proj", ops["linear"](o.reshape(T, Hq * D), layer.o_proj))

    def mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        """SwiGLU from the fused gate/up projection (the input read once): down(silu(gate) * up) -> [T, H]."""
        gate_up = self._t("gate_up", self.ops["linear"](h, layer.gate_up))
        return self._t("mlp", self.ops["linear"](self.ops["silu_mul"](gate_up), layer.down))

    def _t(self, name: str, t: torch.Tensor) -> torch.Tensor:
        if self.trace is not None:
            self.trace(self.layer_index, name, t)
        return t

    def __repr__(self) -> str:
        c = self.config
        return (f"Qwen35Model({c.name}: {c.num_hidden_layers} layers ({c.num_linear_layers} Gated DeltaNet, "
                f"{c.num_full_layers} gated attention), hidden {c.hidden_size}, vocab {c.vocab_size}; "
                f"backend={self.backend}, {self.device}, {str(self.dtype).removeprefix('torch.')})")


def check_step(ids: torch.Tensor, positions: torch.Tensor, cache: Cache) -> None:
    """A step's shapes against its cache, on the host: more tokens than the cache holds would leave rows unwritten
    and return wrong logits without a word."""
    T = ids.shape[0]
    if T > cache.max_len:
        raise GenerationError(f"ids: {T} tokens, but the cache holds max_len={cache.max_len} positions; "
                              f"make the cache with model.new_cache(n) for n >= {T}")
    if positions.shape != ids.shape:
        raise GenerationError(f"positions: shape {tuple(positions.shape)}, expected {tuple(ids.shape)} "
                              f"(one position per id)")


def load_model(source="tiny-english", device=None, dtype=None, backend: str = "triton", *,
               rt: runtime.Runtime | None = None) -> Qwen35Model:
    """A snapshot directory, a preset ("tiny-english", "tiny", "qwen3.5-0.8b") or a hub id -> a ready Qwen35Model.
    `rt`: a runtime already chosen, in place of device and dtype."""
    from .weights import load_weights

    _check_backend(backend)  # before the weights are read
    rt = rt if rt is not None else runtime.choose(device, dtype)
    if backend == "triton" and rt.interpreter and rt.dtype == torch.bfloat16:
        # NumPy has no bf16: the interpreter's tl.dot on bf16 operands returns garbage, and so would every logit
        raise DeviceError("dtype=bfloat16 with backend='triton' under the Triton interpreter (a CPU): the "
                          "interpreter computes tl.dot on bf16 operands wrongly; use float32 (the default here) or "
                          "float16, or backend='torch'")
    config, weights = load_weights(source, device=rt.device, dtype=rt.dtype)
    return Qwen35Model(config, weights, backend=backend, rt=rt)


def record_operators(model: Qwen35Model, num_tokens: int, decode: bool = False) -> list[tuple[int, str]]:
    """The (layer, operator) calls of one prefill of num_tokens tokens, or of one decode step after it.

    Layer -1 is the embedding, num_hidden_layers the final norm and LM head. Counted by running the model with
    every entry of its table wrapped, so the count is the graph's, not a hand tally.
    """
    calls: list[tuple[int, str]] = []

    def counted(name, fn):
        def run(*args, **kwargs):
            calls.append((model.layer_index, name))
            return fn(*args, **kwargs)
        return run

    ids = torch.zeros(num_tokens, dtype=torch.long, device=model.device)
    cache = model.new_cache(num_tokens + 1)
    with torch.inference_mode():
        if decode:
            model.step(ids, torch.arange(num_tokens, device=model.device), cache)
        table = dict(model.ops)
        try:
            for name, fn in table.items():
                model.ops[name] = counted(name, fn)
            calls.clear()
            if decode:
                model.step(ids[:1], torch.tensor([num_tokens], device=model.device), cache)
            else:
                model.step(ids, torch.arange(num_tokens, device=model.device), cache)
        finally:
            model.ops.update(table)
    return calls


def divergence_report(model: Qwen35Model, oracle: Qwen35Model, input_ids, rtol: float | None = None) -> str:
    """Run both models on the same prompt and name the first (layer, operator) whose output leaves tolerance.

    Typical use: `oracle` is the same weights with backend="torch"; `model` has a learner's kernel in one entry.
    """
    records: list[list] = [[], []]
    for m, rec in ((model, records[0]), (oracle, records[1])):
        m.trace = lambda layer, name, t, rec=rec: rec.append((layer, name, t.detach().float().clone()))
        try:
            m.forward(input_ids)
        finally:
            m.trace = None
    rtol = rtol if rtol is not None else (1e-3 if model.dtype == torch.float32 else 3e-2)
    # paired by (layer, operator), in the model's order: a replaced method that traces fewer points is still
    # compared where both traced the same thing
    theirs = {(layer, name): t for layer, name, t in records[1]}
    compared = 0
    for layer, name, a in records[0]:
        b = theirs.get((layer, name))
        if b is None or b.shape != a.shape:
            continue
        compared += 1
        err = float((a - b).norm() / b.norm().clamp_min(1e-30))
        if not torch.isfinite(a).all() or err > rtol:
            n = model.config.num_hidden_layers
            where = "embedding" if layer < 0 else ("final" if layer >= n else f"layer {layer}")
            kind = "" if layer < 0 or layer >= n else f" ({model.config.layer_types[layer]})"
            return (f"first divergence: {where}{kind}, operator '{name}': relative error {err:.3g} > {rtol:g}"
                    + ("" if torch.isfinite(a).all() else " (NaN or inf in the output)"))
    return f"no divergence: all {compared} traced outputs within relative error {rtol:g}"


__all__ = ["BACKENDS", "OPERATORS", "OperatorTable", "Qwen35Model", "check_step", "divergence_report", "load_model",
           "record_operators", "torch_ops", "triton_ops"]
