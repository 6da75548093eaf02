"""The Qwen3.5 text model, written as the architecture diagram reads.

    x = embed[ids]
    for each layer:   h = norm(x);  x = x + mixer(h)          (Gated DeltaNet, or gated attention)
                      h = norm(x);  x = x + mlp(h)            (SwiGLU)
    logits = norm(x) @ lm_head^T

A step that returns only the last position's logits (a prompt's prefill, a decode step) stops the other rows
after the last layer's mixer: from there on every operation is row by row. (If that layer is attention and the
prompt takes the GEMM path, more than GEMV_MAX_M rows with the library's kernels, only the last row's query and
gate are projected: the other rows give it their keys and values.)

Every computation goes through a table of named operators, `model.ops`. The same graph therefore runs
with `backend="torch"` (qwen_lab.reference, the oracle) or `backend="triton"` (qwen_lab.kernels), and a
learner can put their own kernel in one entry: `model.ops["rms_norm"] = my_rms_norm`. Four entries run only inside
others (RUNS_INSIDE: rope, silu_mul, sigmoid_gate, delta_rule_recurrent); putting a kernel there warns.

Shapes (batch 1, token-major): T tokens in a step, H hidden, V vocab. All sizes come from the config.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from typing import Callable, NamedTuple

import torch

from . import reference, runtime
from .cache import Cache
from .config import LINEAR, Qwen35Config
from .errors import ConfigError, DeviceError, GenerationError
from .kernels import env_on

# operator -> the kernel module that implements it under backend="triton"
KERNEL_MODULES = {
    "embedding": "embedding",
    "rms_norm": "norms",
    "add_rms_norm": "norms",
    "gated_rms_norm": "norms",
    "linear": "gemm",
    "rms_norm_linear": "gemm",
    "add_rms_norm_linear": "gemm",
    "gated_rms_norm_linear": "gemm",
    "linear_add_rms_norm": "gemm",
    "rms_scaled_linear": "gemm",
    "silu_mul": "activations",
    "swiglu_down": "activations",
    "linear_silu_mul": "activations",
    "rope": "rope",
    "qk_norm_rope": "rope",
    "qk_norm_rope_cache": "rope",
    "kv_cache_write": "attention",
    "attention": "attention",
    "qk_norm_rope_cache_attention": "attention",
    "sigmoid_gate": "attention",
    "causal_conv1d": "conv1d",
    "deltanet_gates": "deltanet",
    "delta_rule_recurrent": "deltanet",
    "deltanet_decode_step": "deltanet",
    "deltanet_conv_decode_step": "deltanet",
    "delta_rule_chunked": "deltanet",
    "deltanet_chunked": "deltanet",
    "sample": "sampling",
}
OPERATORS = tuple(KERNEL_MODULES)
BACKENDS = ("torch", "triton")
# Entries the forward never calls on its own: each runs inside other operators (on both backends), so a kernel put
# in one of them changes nothing the model computes. Test such a kernel with checks.check_kernel; to see it in the
# model, replace the entry that runs it.
RUNS_INSIDE = {
    "rope": "qk_norm_rope, qk_norm_rope_cache and qk_norm_rope_cache_attention",
    "silu_mul": "swiglu_down and linear_silu_mul",
    "sigmoid_gate": "attention (its gate=) and qk_norm_rope_cache_attention",
    "delta_rule_recurrent": "deltanet_decode_step and deltanet_conv_decode_step",
}


class OperatorTable(dict):
    """`model.ops`: operator name -> function. Putting a function in an entry of RUNS_INSIDE warns, naming the
    entries that run it: the forward would not see it."""

    def __setitem__(self, name, fn):
        if name in RUNS_INSIDE:
            warnings.warn(f"model.ops[{name!r}]: the forward never calls this entry on its own ({name} runs inside "
                          f"{RUNS_INSIDE[name]}), so this function changes nothing the model computes; test it with "
                          f"checks.check_kernel, or replace one of those entries", stacklevel=2)
        super().__setitem__(name, fn)
# A prompt's residual add + RMSNorm split between the GEMM before it and the GEMM after it (linear_add_rms_norm,
# rms_scaled_linear; see Pending): no norm kernel between two prompt GEMMs. None: the QWEN_LAB_SPLIT_NORMS switch
# decides, read at each step like the library's other switches (off unless set); True / False override it. Off: on
# the H200 the model's prefill measured the same both ways (benchmarks/probe_norm_split.py, docs/perf-log.md).
SPLIT_NORMS = None


class LastQuery(NamedTuple):
    """The last attention layer's projection in a step that wants the last row's output alone (a prompt's
    prefill): every row's k and v, which go to the cache, and q and the gate of the last row only (the other
    rows' queries would feed nothing). See Qwen35Model.project_last_query."""
    kv: torch.Tensor           # [T, 2 * attn_kv_dim]: k | v
    q_and_gate: torch.Tensor   # [1, attn_q_dim]: (q_h | gate_h) per head


class Pending(NamedTuple):
    """A branch's output projection x @ weight^T, not yet computed (SPLIT_NORMS): the GEMM that computes it also
    adds it to the residual stream and does the next norm's per-row part (`norm_linear`, `mlp`)."""
    x: torch.Tensor
    weight: torch.Tensor


def _check_backend(backend) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r}; expected one of {BACKENDS}")


def torch_ops() -> dict[str, Callable]:
    """The operator table of backend="torch": qwen_lab.reference."""
    return {name: getattr(reference, name) for name in OPERATORS}


def triton_ops() -> tuple[dict[str, Callable], list[str]]:
    """The operator table of backend="triton", and the operators that still fall back to the reference."""
    ops, fallbacks = {}, []
    for name, module in KERNEL_MODULES.items():
        try:
            ops[name] = getattr(importlib.import_module(f"qwen_lab.kernels.{module}"), name)
        except (ImportError, AttributeError):
            ops[name] = getattr(reference, name)
            fallbacks.append(name)
    return ops, fallbacks


def _check_weights_match(weights, device: torch.device, dtype: torch.dtype) -> None:
    """The forward mixes the weights with activations and caches made in the model's dtype on its device: weights
    drawn or loaded for another one would fail deep inside a kernel (a bf16 q against a float32 cache), so say it
    here, where the fix is plain."""
    embed = weights.embed
    if embed.dtype != dtype or embed.device.type != device.type:
        raise ConfigError(f"weights: the embedding is {str(embed.dtype).removeprefix('torch.')} on {embed.device}, "
                          f"but the model runs in {str(dtype).removeprefix('torch.')} on {device}: draw or load the "
                          f"weights with the model's device and dtype (random_weights(config, device=..., dtype=...), "
                          f"load_weights(source, device=..., dtype=...)), or use load_model, which does both")


class Qwen35Model:
    """A loaded Qwen3.5 text model: config, weights, an operator table, and the forward graph."""

    def __init__(self, config: Qwen35Config, weights, device=None, dtype=None, backend: str = "triton"):
        _check_backend(backend)
        self.config = config
        self.weights = weights
        self.runtime = runtime.choose(device, dtype)
        self.device, self.dtype = self.runtime.device, self.runtime.dtype
        _check_weights_match(weights, self.device, self.dtype)
        if backend == "triton" and self.device.type == "cpu" and not self.runtime.interpreter:
            raise DeviceError("backend='triton' on a CPU needs the Triton interpreter: set TRITON_INTERPRET=1 "
                              "before importing qwen_lab, or use backend='torch'")
        self.backend = backend
        if backend == "torch":
            ops, self.fallbacks = torch_ops(), []
        else:
            ops, self.fallbacks = triton_ops()
        self.ops = OperatorTable(ops)
        self._stock = dict(self.ops) if backend == "triton" else {}
        # prompts longer than this run their projections as tiled GEMMs (the kernels' GEMV path serves up to it)
        self._gemv_rows = importlib.import_module("qwen_lab.kernels.gemm").GEMV_MAX_M if backend == "triton" else 0
        self.trace: Callable | None = None  # trace(layer, op_name, tensor): see divergence_report
        self.layer_index = -1                # the layer being computed (-1: embedding; num_layers: the head)
        self.last_row_only = False           # the layer's output is wanted for the last row only (see step)

    # ---------------------------------------------------------------- public API
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
        cache = self.new_cache(ids.numel())
        positions = torch.arange(ids.numel(), device=self.device)
        return self.step(ids, positions, cache, all_logits=True).float()

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
    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache: Cache, all_logits: bool = False,
             logits_out: torch.Tensor | None = None) -> torch.Tensor:
        """Run T tokens at `positions` through the model, reading and updating `cache`.

        ids, positions: LongTensor [T] on the device. Returns logits [T, V] (all_logits) or [1, V] for the last
        position, in the model dtype. Nothing here synchronises with the host on the triton backend.
        The shapes are checked on the host: more tokens than the cache holds is an error. The positions' values live
        on the device and are not: a position at or past cache.max_len is not written to the cache and its logits mean
        nothing (generate and the prefill graphs check start + T against max_len before they call this).
        """
        T = ids.shape[0]
        if T > cache.max_len:
            raise GenerationError(f"ids: {T} tokens, but the cache holds max_len={cache.max_len} positions; "
                                  f"make the cache with model.new_cache(n) for n >= {T}")
        if positions.shape != ids.shape:
            raise GenerationError(f"positions: shape {tuple(positions.shape)}, expected {tuple(ids.shape)} "
                                  f"(one position per id)")
        W, ops = self.weights, self.ops
        self.layer_index = -1
        x = ops["embedding"](ids, W.embed)                             # the residual stream [T, H]
        self._t(-1, "embedding", x)
        y = None                                                       # the last branch output, not yet in x
        for i, layer in enumerate(W.layers):
            self.layer_index = i
            # Only the last position's logits are wanted: past the last layer's token mixing (which still runs over
            # every token, for the cache and the states) nothing mixes positions, so that layer's mixer output,
            # residual and MLP are computed for the last row alone. (The mixers read last_row_only; a mixer put in
            # their place may compute every row: its output is cut here.)
            self.last_row_only = not all_logits and i == len(W.layers) - 1
            if self._projects_last_query(layer, y, x):   # the last attention layer of a prompt: q for one row
                proj, x = self.project_last_query(i, layer, y, x)
            else:                                          # x += y; norm; project
                w_in = layer.in_proj if layer.kind == LINEAR else layer.qkv_proj
                proj, x = self.norm_linear(i, "input_norm", y, x, layer.input_norm, w_in)
            if layer.kind == LINEAR:
                y = self.gated_deltanet(i, layer, proj, cache)
            else:
                y = self.gated_attention(i, layer, proj, positions, cache)
            if self.last_row_only:
                y, x = y[-1:], x[-1:]
            y, x = self.mlp(i, layer, y, x)                            # x += y; norm; SwiGLU MLP
        self.layer_index, self.last_row_only = len(W.layers), False
        logits, _ = self.norm_linear(len(W.layers), "final_norm", y, x, W.final_norm, W.lm_head, out=logits_out)
        self._t(len(W.layers), "lm_head", logits)
        return logits

    def norm_linear(self, i: int, name: str, y, x, norm_weight, weight, out=None):
        """x = x + y (y None: x as is), then RMSNorm (1 + w), then the projection: -> (h @ weight^T, x).

        With the library's own kernels in the table, a decode token (or a prompt of up to 16 rows) runs the residual
        add and the norm as the prologue of the projection's GEMV (one launch; not before the LM head, too wide for
        it); a longer prompt runs the norm kernel, then the GEMM; a table holding anyone else's norm or linear runs
        them apart.
        y Pending (SPLIT_NORMS): its projection runs here, adding itself to x in the GEMM's epilogue.
        """
        ops, eps = self.ops, self.config.rms_norm_eps
        kw = {} if out is None else {"out": out}
        if isinstance(y, Pending):  # the branch's projection adds itself to x; its epilogue and the next's do the norm
            x, h, ss = ops["linear_add_rms_norm"](y.x, y.weight, x, norm_weight, eps)
            return ops["rms_scaled_linear"](h, ss, eps, weight, **kw), x
        if self._fused("rms_norm", "add_rms_norm", "linear"):
            if y is None:
                return ops["rms_norm_linear"](x, norm_weight, eps, weight, **kw), x
            return ops["add_rms_norm_linear"](y, x, norm_weight, eps, weight, **kw)
        h, x = self._norm(i, name, y, x, norm_weight)
        return ops["linear"](h, weight, **kw), x

    def _norm(self, i: int, name: str, y, x, norm_weight):
        """x = x + y (y None: x as is), then RMSNorm (1 + w), each its own kernel: -> (the normed rows, x)."""
        ops, eps = self.ops, self.config.rms_norm_eps
        if y is None:
            h = ops["rms_norm"](x, norm_weight, eps)
        else:
            h, x = ops["add_rms_norm"](y, x, norm_weight, eps)
        self._t(i, name, h)
        return h, x

    def _projects_last_query(self, layer, y, x: torch.Tensor) -> bool:
        """Whether this layer's attention projection is split (project_last_query): the last layer of a step that
        wants the last row alone, an attention layer, a prompt of GEMM rows (for a few rows the split saves
        nothing), the library's kernels in the table and the model's own attention block (a block put in its place
        gets the whole projection), nothing traced or Pending."""
        return (self.last_row_only and layer.kind != LINEAR and x.shape[0] > self._gemv_rows
                and self.trace is None and not isinstance(y, Pending) and "gated_attention" not in vars(self)
                and self._fused("rms_norm", "add_rms_norm", "linear", "qk_norm_rope", "kv_cache_write",
                                "attention"))

    def project_last_query(self, i: int, layer, y, x: torch.Tensor):
        """x = x + y, RMSNorm, then the fused q/gate/k/v projection split in two: k and v for every row (the cache
        needs them), q and the gate for the last row alone (the only query whose output is wanted). At 2048
        tokens, four fifths of the layer's projection GEMM become a one-row GEMV. -> (LastQuery, x)."""
        ops, qd = self.ops, self.config.attn_q_dim
        h, x = self._norm(i, "input_norm", y, x, layer.input_norm)
        w = layer.qkv_proj                               # [q_and_gate | k | v] rows: two row slices, no copy
        return LastQuery(ops["linear"](h, w[qd:]), ops["linear"](h[-1:], w[:qd])), x

    @contextlib.contextmanager
    def wrapped_ops(self, wrap: Callable):
        """For the `with` block, every entry `fn` of the operator table replaced by `wrap(name, fn)` (to count or
        time calls), the model still taking the routes it takes without the wrappers.

        Assigning wrappers to `model.ops` directly would hide the library's own kernels from `_fused`, so the
        model would fall back to its unfused routes (more operators, more launches) while being observed.
        """
        ops, stock = self.ops, self._stock
        wrapped = {name: wrap(name, fn) for name, fn in ops.items()}
        # an entry that was the library's own kernel stays "the library's own", as its wrapper
        self._stock = {name: wrapped[name] if ops.get(name) is fn else fn for name, fn in stock.items()}
        self.ops = wrapped
        try:
            yield self
        finally:
            self.ops, self._stock = ops, stock

    def _fused(self, *names: str) -> bool:
        """Whether these table entries are still the library's own Triton kernels (so their fusion applies)."""
        return self.backend == "triton" and all(self.ops[n] is self._stock.get(n) for n in names)

    def _splits_norms(self, rows: int) -> bool:
        """Whether a branch output of `rows` rows is left Pending: SPLIT_NORMS, a prompt's GEMM rows, the library's
        kernels in the table, nothing traced (a trace wants every norm's output)."""
        on = env_on("QWEN_LAB_SPLIT_NORMS", False) if SPLIT_NORMS is None else SPLIT_NORMS
        return (on and rows > self._gemv_rows and self.trace is None
                and self._fused("linear", "linear_add_rms_norm", "rms_scaled_linear"))

    def _branch_output(self, x: torch.Tensor, weight: torch.Tensor):
        """A branch's output projection: x @ weight^T now, or Pending for the next norm's GEMMs (_splits_norms)."""
        return Pending(x, weight) if self._splits_norms(x.shape[0]) else self.ops["linear"](x, weight)

    def gated_deltanet(self, i: int, layer, proj: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Gated DeltaNet mixer, from its fused in-projection: causal conv, gates, the delta rule, gated norm,
        out-projection (last_row_only: the gated norm and the out-projection of the last token alone)."""
        cfg, ops = self.config, self.ops
        T = proj.shape[0]
        Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        Dk, Dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kd, vd, cd = cfg.linear_key_dim, cfg.linear_value_dim, cfg.linear_conv_dim
        self._t(i, "in_proj", proj)                                    # [T, qkv | z | b | a]
        qkv, z = proj[:, :cd], proj[:, cd:cd + vd].unflatten(1, (Hv, Dv))
        b, a = proj[:, cd + vd:cd + vd + Hv], proj[:, cd + vd + Hv:]
        state = cache.recurrent_state[i]                               # [Hv, Dk, Dv] fp32, updated in place
        if T == 1 and self._fused("causal_conv1d", "deltanet_decode_step"):
            # decode with the library's own conv and decode step: conv, gates and recurrence in one launch
            # state_settled: the in-projection just launched comes between two steps of this layer, so the
            # kernel may read the states before it waits for the in-projection's output
            o = ops["deltanet_conv_decode_step"](qkv, layer.conv, cache.conv_state[i], a, b, layer.A_log,
                                                 layer.dt_bias, state, Hk, Dk, Hv, Dv, state_settled=True)
            # The conv output never leaves the kernel, so there is no "conv1d" tensor to trace here; what can
            # be seen of the conv is its updated state (this token's input in the last column).
            self._t(i, "conv_state", cache.conv_state[i])
        else:
            qkv = ops["causal_conv1d"](qkv, layer.conv, cache.conv_state[i])  # SiLU inside
            self._t(i, "conv1d", qkv)
            q = qkv[:, :kd].unflatten(1, (Hk, Dk))
            k = qkv[:, kd:2 * kd].unflatten(1, (Hk, Dk))
            v = qkv[:, 2 * kd:].unflatten(1, (Hv, Dv))
            if T == 1:  # decode: the recurrent form, its gates computed inside the same kernel
                o = ops["deltanet_decode_step"](q, k, v, a, b, layer.A_log, layer.dt_bias, state)
            elif self._fused("deltanet_gates", "delta_rule_chunked"):  # prefill, the gates inside the chunk prep
                o = ops["deltanet_chunked"](q, k, v, a, b, layer.A_log, layer.dt_bias, state)
            else:       # prefill: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias), then the chunked form
                g, beta = ops["deltanet_gates"](a, b, layer.A_log, layer.dt_bias)
                o = ops["delta_rule_chunked"](q, k, v, g, beta, state)  # [T, Hv, Dv]; l2norm of q, k inside
        self._t(i, "delta_rule", o)
        if self.last_row_only:
            o, z = o[-1:], z[-1:]
        if self._fused("gated_rms_norm", "linear") and not self._splits_norms(o.shape[0]):  # the norm as its prologue
            y = ops["gated_rms_norm_linear"](o, z, layer.norm, cfg.rms_norm_eps, layer.out_proj)
        else:
            o = ops["gated_rms_norm"](o, z, layer.norm, cfg.rms_norm_eps)  # rmsnorm(o) * w * silu(z)
            self._t(i, "gated_norm", o)
            y = self._branch_output(o.reshape(o.shape[0], vd), layer.out_proj)
        self._t(i, "out_proj", y)
        return y

    def gated_attention(self, i: int, layer, proj: torch.Tensor, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """Gated attention mixer, from its fused q/gate/k/v projection: q/k norm, partial RoPE, causal GQA, sigmoid
        gate, output projection (last_row_only: every key and value goes to the cache, the last query alone
        attends)."""
        cfg, ops = self.config, self.ops
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qd, kvd = cfg.attn_q_dim, cfg.attn_kv_dim
        if isinstance(proj, LastQuery):   # (a prompt's last layer: q and the gate of the last row alone)
            q_and_gate, kv = proj.q_and_gate, proj.kv
        else:
            self._t(i, "qkv_proj", proj)                               # [T, (q_h | gate_h) per head | k | v]
            q_and_gate, kv = proj[:, :qd], proj[:, qd:]
        T = kv.shape[0]
        q_and_gate = q_and_gate.unflatten(1, (Hq, 2 * D))
        q, gate = q_and_gate[..., :D], q_and_gate[..., D:]
        k = kv[:, :kvd].unflatten(1, (Hkv, D))
        v = kv[:, kvd:].unflatten(1, (Hkv, D))
        # per-head RMSNorm (1 + w) of q and k, then RoPE on their first rotary_dim dims; k and v into the cache
        k_cache, v_cache = cache.key[i], cache.value[i]
        if T == 1 and self._fused("qk_norm_rope", "kv_cache_write", "attention"):
            # decode with the library's kernels: the q/k preparation and the cache write run inside the attention's
            # split kernel, so the prepared q never goes through memory (and there is no "qk_norm_rope" to trace)
            o = ops["qk_norm_rope_cache_attention"](q, k, v, layer.q_norm, layer.k_norm, cfg.rms_norm_eps,
                                                    positions, cfg.rotary_dim, cfg.rope_theta, k_cache, v_cache,
                                                    gate=gate)
        else:
            if self._fused("qk_norm_rope", "kv_cache_write"):  # the library's kernels: all of it in one launch
                q = ops["qk_norm_rope_cache"](q, k, v, layer.q_norm, layer.k_norm, cfg.rms_norm_eps, positions,
                                              cfg.rotary_dim, cfg.rope_theta, k_cache, v_cache)
            else:
                q, k = ops["qk_norm_rope"](q, k, layer.q_norm, layer.k_norm, cfg.rms_norm_eps, positions,
                                           cfg.rotary_dim, cfg.rope_theta)
                ops["kv_cache_write"](k_cache, v_cache, k, v, positions)
            self._t(i, "qk_norm_rope", q)
            if self.last_row_only:
                q, gate, positions = q[-1:], gate[-1:], positions[-1:]
            o = ops["attention"](q, k_cache, v_cache, positions, gate=gate)   # softmax(q k^T / sqrt(D)) v * σ(gate)
        self._t(i, "gated_attention", o)
        y = self._branch_output(o.reshape(o.shape[0], Hq * D), layer.o_proj)
        self._t(i, "o_proj", y)
        return y

    def mlp(self, i: int, layer, y, x: torch.Tensor):
        """x = x + y, RMSNorm, then SwiGLU from the fused gate/up projection (the input read once):
        down(silu(gate) * up). -> (the MLP's output, the new residual x); y and the output may be Pending."""
        ops, eps = self.ops, self.config.rms_norm_eps
        if isinstance(y, Pending):  # (SPLIT_NORMS) the branch's projection adds itself to x and prepares the norm
            x, h, ss = ops["linear_add_rms_norm"](y.x, y.weight, x, layer.post_norm, eps)
            y = self._branch_output(ops["rms_scaled_linear"](h, ss, eps, layer.gate_up, swiglu=True), layer.down)
        elif x.shape[0] > self._gemv_rows and self._fused("add_rms_norm", "linear", "swiglu_down", "linear_silu_mul"):
            # a prompt: the projections are tiled GEMMs, and SwiGLU runs in the gate/up GEMM's epilogue, so the
            # [T, 2I] projection never goes to memory. (A few rows take the GEMV path below, whose prologues
            # already fuse the norm and SwiGLU.)
            h, x = self._norm(i, "post_attention_norm", y, x, layer.post_norm)
            y = self._branch_output(ops["linear_silu_mul"](h, layer.gate_up), layer.down)
        else:
            gate_up, x = self.norm_linear(i, "post_attention_norm", y, x, layer.post_norm, layer.gate_up)
            self._t(i, "gate_up", gate_up)
            y = ops["swiglu_down"](gate_up, layer.down)
        self._t(i, "mlp", y)
        return y, x

    def _t(self, layer: int, name: str, t: torch.Tensor) -> None:
        if self.trace is not None:
            self.trace(layer, name, t)

    def __repr__(self) -> str:
        c = self.config
        return (f"Qwen35Model({c.name}: {c.num_hidden_layers} layers ({c.num_linear_layers} Gated DeltaNet, "
                f"{c.num_full_layers} gated attention), hidden {c.hidden_size}, vocab {c.vocab_size}; "
                f"backend={self.backend}, {self.device}, {str(self.dtype).removeprefix('torch.')})")


def load_model(source="tiny", device=None, dtype=None, backend: str = "triton") -> Qwen35Model:
    """A snapshot directory, a preset ("tiny", "qwen3.5-0.8b") or a hub id -> a ready Qwen35Model."""
    from .weights import load_weights

    _check_backend(backend)  # before the weights are read
    rt = runtime.choose(device, dtype)
    if backend == "triton" and rt.interpreter and rt.dtype == torch.bfloat16:
        # NumPy has no bf16: the interpreter's tl.dot on bf16 operands returns garbage, and so would every logit
        raise DeviceError("dtype=bfloat16 with backend='triton' under the Triton interpreter (a CPU): the "
                          "interpreter computes tl.dot on bf16 operands wrongly; use float32 (the default here) or "
                          "float16, or backend='torch'")
    config, weights = load_weights(source, device=rt.device, dtype=rt.dtype)
    return Qwen35Model(config, weights, device=rt.device, dtype=rt.dtype, backend=backend)


def record_operators(model: Qwen35Model, num_tokens: int, decode: bool = False) -> list[tuple[int, str]]:
    """The (layer, operator) calls of one prefill of num_tokens tokens, or of one decode step after it.

    Layer -1 is the embedding, num_hidden_layers the final norm and LM head. Counted by running the model with
    every entry of its operator table wrapped (`wrapped_ops`, so the fused routes the model takes are the ones
    counted), so the count is the graph's, not a hand tally.
    """
    calls: list[tuple[int, str]] = []

    def wrap(name, fn):
        def counted(*args, **kwargs):
            calls.append((model.layer_index, name))
            return fn(*args, **kwargs)
        return counted

    ids = torch.zeros(num_tokens, dtype=torch.long, device=model.device)
    cache = model.new_cache(num_tokens + 1)
    with torch.inference_mode():
        if decode:
            model.step(ids, torch.arange(num_tokens, device=model.device), cache)
        with model.wrapped_ops(wrap):
            if decode:
                model.step(ids[:1], torch.tensor([num_tokens], device=model.device), cache)
            else:
                model.step(ids, torch.arange(num_tokens, device=model.device), cache)
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
    # pair the two runs by (layer, operator), in the oracle's order: a model whose replaced method traces fewer
    # points is still compared where both traced the same thing
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


__all__ = ["BACKENDS", "KERNEL_MODULES", "OPERATORS", "Qwen35Model", "divergence_report", "load_model",
           "record_operators",
           "torch_ops", "triton_ops"]
