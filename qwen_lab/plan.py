"""The fast route: an execution plan of the model's graph, built beside `model.py` from the same weights and the
same operator table.

The plain model (qwen_lab.model) runs one operator per box of the diagram. The plan computes the same logits with
fewer launches and less memory traffic:

- fusions: neighbouring operators run as one kernel where the library's kernels are in the table. The residual add
  and the norm become the prologue of the next projection's GEMV (decode) or stay one kernel before the GEMM
  (prompt); SwiGLU runs in the gate/up GEMM's epilogue (prompt) or the down GEMV's prologue (decode); the DeltaNet
  conv, gates and recurrence are one decode kernel, the gates sit inside the chunk prep at prefill; the q/k norm,
  RoPE and the cache write are one kernel (prompt) or run inside the decode attention's split kernel;
- the last row alone: a step that returns only the last position's logits (a prompt's prefill, a decode step)
  computes everything after the last layer's mixer for the last row only; an attention layer there projects k and
  v for every row and q and its gate for the last row alone;
- split norms (the `split_norms` switch, off unless set): a prompt's residual add + RMSNorm split between the
  GEMM before it and the GEMM after it, no norm kernel between two prompt GEMMs.

The kernels chain themselves with programmatic dependent launch on Hopper (qwen_lab.kernels.pdl_options), and
qwen_lab.graph captures the plan's steps as CUDA Graphs (the decode step; the prefill in buckets).

A fusion applies only where every operator it replaces is still the library's kernel. Where a learner put their own
function in an entry of `model.ops`, the plan runs the plain route for the operators around it, so the learner's
function is called exactly where the plain model calls it, and it says so once per entry.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Callable, NamedTuple

import torch

from .cache import Cache
from .config import LINEAR
from .model import Qwen35Model, check_step, triton_ops
from .switches import switches


class LastQuery(NamedTuple):
    """The last attention layer's projection in a step that wants the last row alone: every row's k and v (for the
    cache), q and the gate of the last row only (the other rows' queries would feed nothing)."""
    kv: torch.Tensor           # [T, 2 * attn_kv_dim]: k | v
    q_and_gate: torch.Tensor   # [1, attn_q_dim]: (q_h | gate_h) per head


class Pending(NamedTuple):
    """A branch's output projection x @ weight^T not computed yet (split norms): the GEMM that computes it also adds
    it to the residual stream and does the next norm's per-row part."""
    x: torch.Tensor
    weight: torch.Tensor


def _fused_kernels() -> dict[str, Callable]:
    from .kernels import activations, attention, deltanet, gemm, rope

    return {
        "rms_norm_linear": gemm.rms_norm_linear, "add_rms_norm_linear": gemm.add_rms_norm_linear,
        "gated_rms_norm_linear": gemm.gated_rms_norm_linear, "linear_add_rms_norm": gemm.linear_add_rms_norm,
        "rms_scaled_linear": gemm.rms_scaled_linear, "swiglu_down": activations.swiglu_down,
        "linear_silu_mul": activations.linear_silu_mul, "qk_norm_rope_cache": rope.qk_norm_rope_cache,
        "qk_norm_rope_cache_attention": attention.qk_norm_rope_cache_attention,
        "deltanet_decode_step": deltanet.deltanet_decode_step,
        "deltanet_conv_decode_step": deltanet.deltanet_conv_decode_step, "deltanet_chunked": deltanet.deltanet_chunked,
    }


class FastPlan:
    """The model's forward as the fast route: `step(ids, positions, cache, all_logits=False, logits_out=None)`, the
    same contract as Qwen35Model.step. `observe(layer, name, output)`, when set, sees every call the plan makes
    (fused kernels by their names), as `model.trace` sees the plain route's operators."""

    def __init__(self, model: Qwen35Model):
        self.model = model
        self.config, self.weights = model.config, model.weights
        self.device, self.dtype, self.backend, self.runtime = model.device, model.dtype, model.backend, model.runtime
        kernels = model.backend == "triton"
        self.stock = triton_ops() if kernels else {}          # the library's kernel of each base operator
        self.fused = _fused_kernels() if kernels else {}
        if kernels:
            from .kernels import gemm
            self.gemv_rows = gemm.GEMV_MAX_M  # prompts longer than this run their projections as tiled GEMMs
        else:
            self.gemv_rows = 0
        self.observe: Callable | None = None
        self.layer_index = -1
        self.last_row_only = False
        self._told: set[str] = set()

    @property
    def ops(self):
        return self.model.ops

    def new_cache(self, max_len: int) -> Cache:
        return self.model.new_cache(max_len)

    def check_ids(self, input_ids) -> torch.Tensor:
        return self.model.check_ids(input_ids)

    def __repr__(self) -> str:
        return f"FastPlan({self.model!r})"

    # ---------------------------------------------------------------- which route
    def _fused(self, *names: str) -> bool:
        """Whether these entries of the table are still the library's kernels (so the fusion over them applies);
        an entry that is not is told once."""
        ops, ok = self.model.ops, True
        for n in names:
            if ops[n] is not self.stock.get(n):
                ok = False
                if self.stock and n not in self._told:
                    self._told.add(n)
                    warnings.warn(f"qwen_lab.plan: model.ops[{n!r}] is not the library's kernel, so the fast route "
                                  f"runs the plain operators around it (your function is called where the plain "
                                  f"model calls it)", stacklevel=4)
        return ok and bool(self.stock)

    def _splits_norms(self, rows: int) -> bool:
        """Whether a branch output of `rows` rows is left Pending: the split_norms switch on, a prompt's GEMM rows,
        the library's linear and norms in the table."""
        return switches.split_norms and rows > self.gemv_rows and self._fused("linear", "add_rms_norm", "rms_norm")

    def _run(self, name: str, fn: Callable, *args, **kwargs):
        out = fn(*args, **kwargs)
        if self.observe is not None:
            self.observe(self.layer_index, name, out)
        return out

    def _op(self, name: str, *args, **kwargs):
        return self._run(name, self.model.ops[name], *args, **kwargs)

    def _kernel(self, name: str, *args, **kwargs):
        return self._run(name, self.fused[name], *args, **kwargs)

    # ---------------------------------------------------------------- the graph
    def step(self, ids: torch.Tensor, positions: torch.Tensor, cache: Cache, all_logits: bool = False,
             logits_out: torch.Tensor | None = None) -> torch.Tensor:
        """Qwen35Model.step on the fast route; `logits_out` [rows, V] receives the logits (a graph's static buffer).
        Nothing here synchronises with the host on the triton backend."""
        check_step(ids, positions, cache)
        W = self.weights
        self.layer_index = -1
        x = self._op("embedding", ids, W.embed)                       # the residual stream [T, H]
        y = None                                                       # the last branch output, not yet in x
        for i, layer in enumerate(W.layers):
            self.layer_index = i
            # Only the last position's logits are wanted: past the last layer's token mixing (which still runs over
            # every token, for the cache and the states) nothing mixes positions, so that layer's mixer output,
            # residual and MLP are computed for the last row alone.
            self.last_row_only = not all_logits and i == len(W.layers) - 1
            if self._projects_last_query(layer, y, x):   # the last attention layer of a prompt: q for one row
                proj, x = self.project_last_query(layer, y, x)
            else:                                          # x += y; norm; project
                w_in = layer.in_proj if layer.kind == LINEAR else layer.qkv_proj
                proj, x = self.norm_linear(y, x, layer.input_norm, w_in)
            y = self.mixer(i, layer, proj, positions, cache)
            if self.last_row_only:
                y, x = y[-1:], x[-1:]
            y, x = self.mlp(layer, y, x)                               # x += y; norm; SwiGLU MLP
        self.layer_index, self.last_row_only = len(W.layers), False
        logits, _ = self.norm_linear(y, x, W.final_norm, W.lm_head, out=logits_out)
        return logits

    def mixer(self, i: int, layer, proj, positions: torch.Tensor, cache: Cache) -> torch.Tensor:
        """The layer's mixer on the fast route, or a block a learner put in place of the model's method (chapter
        10), which gets the whole projection and may return every row (the step keeps the last)."""
        if layer.kind == LINEAR:
            if "gated_deltanet" in vars(self.model):
                return self.model.gated_deltanet(i, layer, proj, cache)
            return self.gated_deltanet(i, layer, proj, cache)
        if "gated_attention" in vars(self.model):   # (never a LastQuery: _projects_last_query leaves it whole)
            return self.model.gated_attention(i, layer, proj, positions, cache)
        return self.gated_attention(i, layer, proj, positions, cache)

    def _linear(self, h: torch.Tensor, weight: torch.Tensor, out=None) -> torch.Tensor:
        """ops["linear"], into `out` when given (a learner's linear may take no `out`: its result is copied)."""
        if out is None:
            return self._op("linear", h, weight)
        if self.model.ops["linear"] is self.stock.get("linear"):
            return self._op("linear", h, weight, out=out)
        return out.copy_(self._op("linear", h, weight))

    def _norm(self, y, x: torch.Tensor, norm_weight: torch.Tensor):
        """x = x + y (y None: x as is), then RMSNorm (1 + w), each its own kernel: -> (the normed rows, x)."""
        eps = self.config.rms_norm_eps
        if y is None:
            return self._op("rms_norm", x, norm_weight, eps), x
        return self._op("add_rms_norm", y, x, norm_weight, eps)

    def norm_linear(self, y, x: torch.Tensor, norm_weight: torch.Tensor, weight: torch.Tensor, out=None):
        """x = x + y (y None: x as is), then RMSNorm (1 + w), then the projection: -> (h @ weight^T, x).

        With the library's kernels, a decode token (or a prompt of up to GEMV_MAX_M rows) runs the add and the norm
        as the prologue of the projection's GEMV (not before the LM head, too wide for it); a longer prompt runs the
        norm kernel, then the GEMM. y Pending: its projection runs here, adding itself to x in the GEMM's epilogue.
        """
        eps = self.config.rms_norm_eps
        kw = {} if out is None else {"out": out}
        if isinstance(y, Pending):
            x, h, ss = self._kernel("linear_add_rms_norm", y.x, y.weight, x, norm_weight, eps)
            return self._kernel("rms_scaled_linear", h, ss, eps, weight, **kw), x
        if self._fused("rms_norm", "add_rms_norm", "linear"):
            if y is None:
                return self._kernel("rms_norm_linear", x, norm_weight, eps, weight, **kw), x
            return self._kernel("add_rms_norm_linear", y, x, norm_weight, eps, weight, **kw)
        h, x = self._norm(y, x, norm_weight)
        return self._linear(h, weight, out), x

    def _projects_last_query(self, layer, y, x: torch.Tensor) -> bool:
        """Whether this layer's attention projection is split (project_last_query): the last layer of a step that
        wants the last row alone, an attention layer, a prompt of GEMM rows (for a few rows the split saves
        nothing), the library's kernels in the table and the plan's own attention block, nothing Pending."""
        return (self.last_row_only and layer.kind != LINEAR and x.shape[0] > self.gemv_rows
                and not isinstance(y, Pending) and "gated_attention" not in vars(self.model)
                and self._fused("rms_norm", "add_rms_norm", "linear", "rope", "kv_cache_write", "attention"))

    def project_last_query(self, layer, y, x: torch.Tensor):
        """x = x + y, RMSNorm, then the fused q/gate/k/v projection split in two: k and v for every row (the cache
        needs them), q and the gate for the last row alone. At 2048 tokens four fifths of the layer's projection
        GEMM become a one-row GEMV. -> (LastQuery, x)."""
        qd = self.config.attn_q_dim
        h, x = self._norm(y, x, layer.input_norm)
        w = layer.qkv_proj                               # [q_and_gate | k | v] rows: two row slices, no copy
        return LastQuery(self._op("linear", h, w[qd:]), self._op("linear", h[-1:], w[:qd])), x

    def _branch_output(self, x: torch.Tensor, weight: torch.Tensor):
        """A branch's output projection: x @ weight^T now, or Pending for the next norm's GEMMs (split norms)."""
        return Pending(x, weight) if self._splits_norms(x.shape[0]) else self._op("linear", x, weight)

    def gated_deltanet(self, i: int, layer, proj: torch.Tensor, cache: Cache):
        """Model.gated_deltanet on the fast route (last_row_only: the gated norm and the out-projection of the last
        token alone)."""
        cfg = self.config
        T = proj.shape[0]
        Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        Dk, Dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
        kd, vd, cd = cfg.linear_key_dim, cfg.linear_value_dim, cfg.linear_conv_dim
        qkv, z = proj[:, :cd], proj[:, cd:cd + vd].unflatten(1, (Hv, Dv))
        b, a = proj[:, cd + vd:cd + vd + Hv], proj[:, cd + vd + Hv:]
        state = cache.recurrent_state[i]                               # [Hv, Dk, Dv] fp32, updated in place
        if T == 1 and self._fused("causal_conv1d", "deltanet_gates", "delta_rule_recurrent"):
            # conv, gates and recurrence in one launch. state_settled: the in-projection just launched comes
            # between two steps of this layer, so the kernel may read the states before it waits for its output
            o = self._kernel("deltanet_conv_decode_step", qkv, layer.conv, cache.conv_state[i], a, b, layer.A_log,
                             layer.dt_bias, state, Hk, Dk, Hv, Dv, state_settled=True)
        else:
            qkv = self._op("causal_conv1d", qkv, layer.conv, cache.conv_state[i])  # SiLU inside
            q = qkv[:, :kd].unflatten(1, (Hk, Dk))
            k = qkv[:, kd:2 * kd].unflatten(1, (Hk, Dk))
            v = qkv[:, 2 * kd:].unflatten(1, (Hv, Dv))
            rule = "delta_rule_recurrent" if T == 1 else "delta_rule_chunked"
            if self._fused("deltanet_gates", rule):   # the gates inside the decode step or the chunk prep
                o = self._kernel("deltanet_decode_step" if T == 1 else "deltanet_chunked", q, k, v, a, b, layer.A_log,
                                 layer.dt_bias, state)
            else:
                g, beta = self._op("deltanet_gates", a, b, layer.A_log, layer.dt_bias)
                o = self._op(rule, q, k, v, g, beta, state)            # [T, Hv, Dv]; l2norm of q, k inside
        if self.last_row_only:
            o, z = o[-1:], z[-1:]
        if self._fused("gated_rms_norm", "linear") and not self._splits_norms(o.shape[0]):  # norm as prologue
            return self._kernel("gated_rms_norm_linear", o, z, layer.norm, cfg.rms_norm_eps, layer.out_proj)
        o = self._op("gated_rms_norm", o, z, layer.norm, cfg.rms_norm_eps)  # rmsnorm(o) * w * silu(z)
        return self._branch_output(o.reshape(o.shape[0], vd), layer.out_proj)

    def gated_attention(self, i: int, layer, proj, positions: torch.Tensor, cache: Cache):
        """Model.gated_attention on the fast route (last_row_only: every key and value goes to the cache, the last
        query alone attends)."""
        cfg, eps = self.config, self.config.rms_norm_eps
        Hq, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        qd, kvd = cfg.attn_q_dim, cfg.attn_kv_dim
        if isinstance(proj, LastQuery):   # (a prompt's last layer: q and the gate of the last row alone)
            q_and_gate, kv = proj.q_and_gate, proj.kv
        else:
            q_and_gate, kv = proj[:, :qd], proj[:, qd:]
        T = kv.shape[0]
        q_and_gate = q_and_gate.unflatten(1, (Hq, 2 * D))
        q, gate = q_and_gate[..., :D], q_and_gate[..., D:]
        k = kv[:, :kvd].unflatten(1, (Hkv, D))
        v = kv[:, kvd:].unflatten(1, (Hkv, D))
        k_cache, v_cache = cache.key[i], cache.value[i]
        rope_args = (positions, cfg.rotary_dim, cfg.rope_theta)
        if T == 1 and self._fused("rms_norm", "rope", "kv_cache_write", "attention", "sigmoid_gate"):
            # the q/k preparation and the cache write inside the attention's split kernel: the prepared q never
            # goes through memory
            o = self._kernel("qk_norm_rope_cache_attention", q, k, v, layer.q_norm, layer.k_norm, eps, *rope_args,
                             k_cache, v_cache, gate=gate)
        else:
            if self._fused("rms_norm", "rope", "kv_cache_write"):   # all of it in one launch
                q = self._kernel("qk_norm_rope_cache", q, k, v, layer.q_norm, layer.k_norm, eps, *rope_args,
                                 k_cache, v_cache)
            else:
                q = self._op("rope", self._op("rms_norm", q, layer.q_norm, eps), *rope_args)
                k = self._op("rope", self._op("rms_norm", k, layer.k_norm, eps), *rope_args)
                self._op("kv_cache_write", k_cache, v_cache, k, v, positions)
            if self.last_row_only:
                q, gate, positions = q[-1:], gate[-1:], positions[-1:]
            if self._fused("attention", "sigmoid_gate"):            # the gate in the attention's epilogue
                o = self._op("attention", q, k_cache, v_cache, positions, gate=gate)
            else:
                o = self._op("sigmoid_gate", self._op("attention", q, k_cache, v_cache, positions), gate)
        return self._branch_output(o.reshape(o.shape[0], Hq * D), layer.o_proj)

    def mlp(self, layer, y, x: torch.Tensor):
        """x = x + y, RMSNorm, then SwiGLU from the fused gate/up projection: down(silu(gate) * up).
        -> (the MLP's output, the new residual x); y and the output may be Pending."""
        eps = self.config.rms_norm_eps
        if isinstance(y, Pending):  # (split norms) the branch's projection adds itself to x and prepares the norm
            x, h, ss = self._kernel("linear_add_rms_norm", y.x, y.weight, x, layer.post_norm, eps)
            gated = self._kernel("rms_scaled_linear", h, ss, eps, layer.gate_up, swiglu=True)
            return self._branch_output(gated, layer.down), x
        if x.shape[0] > self.gemv_rows and self._fused("add_rms_norm", "linear", "silu_mul"):
            # a prompt: SwiGLU in the gate/up GEMM's epilogue, so the [T, 2I] projection never goes to memory
            h, x = self._norm(y, x, layer.post_norm)
            return self._branch_output(self._kernel("linear_silu_mul", h, layer.gate_up), layer.down), x
        gate_up, x = self.norm_linear(y, x, layer.post_norm, layer.gate_up)
        if self._fused("linear", "silu_mul"):                         # SwiGLU as the down GEMV's prologue
            return self._kernel("swiglu_down", gate_up, layer.down), x
        return self._op("linear", self._op("silu_mul", gate_up), layer.down), x


_plans: "weakref.WeakKeyDictionary[Qwen35Model, FastPlan]" = weakref.WeakKeyDictionary()


def fast_plan(model) -> FastPlan:
    """The model's plan, made once per model (a plan given is returned as it is)."""
    if isinstance(model, FastPlan):
        return model
    plan = _plans.get(model)
    if plan is None:
        plan = _plans[model] = FastPlan(model)
    return plan


__all__ = ["FastPlan", "LastQuery", "Pending", "fast_plan"]
