"""Weights: what the kernels consume, fused from a snapshot's tensors (or drawn at random), and back.

`load_weights(source)` finds the snapshot and checks it against its config (`qwen_lab.snapshot`: a directory,
"tiny", a preset, a hub id), reads its tensors with the `safetensors` library and fuses them into a
`ModelWeights`: per layer, the projections that read the same input are fused into one matrix so that one GEMM
serves them (rows stacked in this order):

    gate_up  = [mlp.gate_proj ; mlp.up_proj]                              [2I, H]
    in_proj  = [in_proj_qkv ; in_proj_z ; in_proj_b ; in_proj_a]          [2*Hk*Dk + 2*Hv*Dv + 2*Hv, H]
    qkv_proj = [q_proj (per head: D query rows, D gate rows) ; k_proj ; v_proj]   [2*Hq*D + 2*Hkv*D, H]

Matrices, the conv filter and the embedding are kept in the model dtype; every 1-D parameter (norm
weights, A_log, dt_bias) in float32, since the kernels do that math in fp32 anyway.

Without a snapshot, `random_weights` draws seeded weights of any config's shapes (the `qwen3.5-0.8b`
preset); `random_state_dict` draws the same values under their Hugging Face names, and `to_hf_state_dict` undoes
the fusion, so that transformers can run on exactly the weights qwen_lab runs. The tiny model the course runs on
a CPU is built by `qwen_lab.tiny`; snapshots are written by `qwen_lab.export.save_snapshot`.
"""

from __future__ import annotations

import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from . import runtime
from .config import LINEAR, Qwen35Config
from .export import save_snapshot
from .snapshot import HUB_ID, SHIPPED, TINY_DIR, expected_tensors, full_name, layout_prefix, open_snapshot, resolve_source

__all__ = ["LayerWeights", "ModelWeights", "load_weights", "random_weights", "random_state_dict",
           "to_hf_state_dict",
           # kept importable from here, where they lived before the loader was split (notebooks and scripts use them)
           "TINY_DIR", "expected_tensors", "resolve_source", "save_snapshot"]


# ------------------------------------------------------------------ what the model consumes


@dataclass(repr=False)
class LayerWeights:
    kind: str                       # "linear_attention" or "full_attention" (config.LINEAR / config.FULL)
    input_norm: Tensor              # [H] float32
    post_norm: Tensor               # [H] float32
    gate_up: Tensor                 # [2I, H]: mlp.gate_proj rows, then mlp.up_proj rows
    down: Tensor                    # [H, I]
    # linear_attention only (None otherwise)
    in_proj: Tensor | None = None   # [cfg.linear_in_proj_dim, H]: in_proj_qkv, in_proj_z, in_proj_b, in_proj_a rows
    conv: Tensor | None = None      # [cfg.linear_conv_dim, W] (conv1d.weight [C, 1, W] squeezed), a view of
                                    # [W, C] storage: strides (1, C)
    A_log: Tensor | None = None     # [Hv] float32
    dt_bias: Tensor | None = None   # [Hv] float32
    norm: Tensor | None = None      # [Dv] float32 (gated RMSNorm weight, plain w)
    out_proj: Tensor | None = None  # [H, value_dim]
    # full_attention only
    qkv_proj: Tensor | None = None  # [cfg.attn_in_proj_dim, H]: q_proj rows as stored (per head: D query rows then
                                    # D gate rows), then k_proj, then v_proj
    q_norm: Tensor | None = None    # [D] float32
    k_norm: Tensor | None = None    # [D] float32
    o_proj: Tensor | None = None    # [H, Hq*D]

    def tensors(self) -> dict[str, Tensor]:
        """The fields that hold a tensor, by name."""
        return {k: v for k, v in vars(self).items() if isinstance(v, Tensor)}

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={_describe(v)}" for k, v in self.tensors().items())
        return f"LayerWeights({self.kind}: {parts})"


@dataclass(repr=False)
class ModelWeights:
    embed: Tensor                   # [V, H]
    final_norm: Tensor              # [H] float32
    lm_head: Tensor                 # [V, H]; the very same tensor object as `embed` when tied
    layers: list[LayerWeights]

    def tensors(self):
        """Every (name, tensor), the tied head included (it is the same object as `embed`)."""
        yield "embed", self.embed
        for i, layer in enumerate(self.layers):
            for k, v in layer.tensors().items():
                yield f"layers.{i}.{k}", v
        yield "final_norm", self.final_norm
        yield "lm_head", self.lm_head

    def nbytes(self) -> int:
        """Bytes held by the distinct tensors (a tied LM head is counted once)."""
        seen, total = set(), 0
        for _, t in self.tensors():
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
        return total

    @property
    def tied(self) -> bool:
        return self.lm_head is self.embed

    def __repr__(self) -> str:
        kinds = "".join("L" if layer.kind == LINEAR else "F" for layer in self.layers)
        return (f"ModelWeights(embed={_describe(self.embed)}, layers={len(self.layers)} [{kinds}], "
                f"lm_head={'tied to embed' if self.tied else _describe(self.lm_head)}, "
                f"{self.nbytes() / 2**20:.1f} MiB)")


def _describe(t: Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


# ------------------------------------------------------------------ loading


def load_weights(source, device=None, dtype=None, *, seed: int = 0,
                 progress: bool = True) -> tuple[Qwen35Config, ModelWeights]:
    """Load (config, weights) from a snapshot directory, "tiny", a preset (random weights) or a hub id.

    Device and dtype default to `qwen_lab.runtime.choose()` (a GPU in bf16, else the CPU in float32).
    `seed` only matters for presets without files; `progress=False` silences the progress bar.
    """
    rt = runtime.choose(device, dtype)
    where = resolve_source(source)
    if isinstance(where, Qwen35Config):
        return where, random_weights(where, rt.device, rt.dtype, seed=seed, progress=progress)
    config, reader = open_snapshot(where)
    if isinstance(source, str) and SHIPPED.get(source.strip().lower()) == where:
        config = config.replace(name=source.strip().lower())
    elif isinstance(source, str) and HUB_ID.match(source) and not Path(source).exists():
        config = config.replace(name=source)
    with reader:
        weights = _assemble(config, reader.get, rt.device, rt.dtype, progress=progress,
                            desc=f"loading {config.name}", stored_head="lm_head.weight" in reader.infos)
    if config.tie_word_embeddings and not weights.tied:
        # the config asked for a tied head, but the checkpoint stores a different one, which transformers uses
        # (untied, with a warning): say so in the config too, so that what is built from it (to_hf_state_dict,
        # the benchmark's transformers model) has the same head
        config = config.replace(tie_word_embeddings=False)
    return config, weights


# ------------------------------------------------------------------ fusing into what the kernels want


def _assemble(config: Qwen35Config, fetch: Callable[[str], Tensor], device, dtype, *, progress: bool = False,
              desc: str = "weights", stored_head: bool = False) -> ModelWeights:
    """Build ModelWeights from a fetch(name) of unprefixed checkpoint tensors.

    Fusion happens where fetch returns its tensors (the host for a snapshot, in the checkpoint dtype), then each
    result moves to the device in one copy. `stored_head`: fetch also serves "lm_head.weight" though the config
    ties the head; as transformers does, it is tied only if equal to the embedding, and used untied otherwise.
    """
    from tqdm import tqdm

    tied_but_stored = config.tie_word_embeddings and stored_head
    bar = tqdm(total=len(expected_tensors(config)) + tied_but_stored, desc=desc, unit="tensor",
               disable=not progress, leave=False, delay=0.5)  # shown only when loading takes a while

    def get(name):
        t = fetch(name)
        bar.update(1)
        return t

    def mat(*names):
        parts = [get(n) for n in names]
        t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        return t.to(device=device, dtype=dtype).contiguous()

    def vec(name):
        return get(name).to(device=device, dtype=torch.float32).contiguous()

    try:
        embed = mat("embed_tokens.weight")
        layers = []
        for i, kind in enumerate(config.layer_types):
            p = f"layers.{i}."
            lw = dict(kind=kind, input_norm=vec(p + "input_layernorm.weight"),
                      post_norm=vec(p + "post_attention_layernorm.weight"))
            if kind == LINEAR:
                a = p + "linear_attn."
                lw.update(in_proj=mat(a + "in_proj_qkv.weight", a + "in_proj_z.weight", a + "in_proj_b.weight",
                                      a + "in_proj_a.weight"),
                          # stored tap by tap ([W, C]) and kept as its [C, W] view: each tap's weights
                          # are one contiguous vector, which the prefill conv loads once per program
                          conv=mat(a + "conv1d.weight").squeeze(1).t().contiguous().t(),
                          A_log=vec(a + "A_log"), dt_bias=vec(a + "dt_bias"), norm=vec(a + "norm.weight"),
                          out_proj=mat(a + "out_proj.weight"))
            else:
                a = p + "self_attn."
                lw.update(qkv_proj=mat(a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"),
                          q_norm=vec(a + "q_norm.weight"), k_norm=vec(a + "k_norm.weight"),
                          o_proj=mat(a + "o_proj.weight"))
            lw.update(gate_up=mat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
                      down=mat(p + "mlp.down_proj.weight"))
            layers.append(LayerWeights(**lw))
        final_norm = vec("norm.weight")
        lm_head = embed if config.tie_word_embeddings else mat("lm_head.weight")
        if tied_but_stored:
            # transformers (PreTrainedModel.tie_weights) compares the two as loaded, in the model dtype: equal, it
            # ties them (one tensor in memory); different, it keeps the stored head untied and warns
            head = mat("lm_head.weight")
            if not torch.equal(head, embed):
                warnings.warn(f"{config.name}: tie_word_embeddings is true, but the checkpoint stores an "
                              "lm_head.weight that differs from the embedding; using it as an untied LM head, as "
                              "transformers does", stacklevel=3)
                lm_head = head
    finally:
        bar.close()
    return ModelWeights(embed=embed, final_norm=final_norm, lm_head=lm_head, layers=layers)


# ------------------------------------------------------------------ random weights


def _init_kind(name: str) -> str:
    if name in ("embed_tokens.weight", "lm_head.weight"):
        return "embed"
    if name.endswith("linear_attn.norm.weight"):
        return "gated_norm"
    if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")) or name == "norm.weight":
        return "norm"
    if name.endswith("A_log"):
        return "A_log"
    if name.endswith("dt_bias"):
        return "dt_bias"
    if name.endswith("conv1d.weight"):
        return "conv"
    return "matrix"


def _draw(name: str, shape: tuple[int, ...], seed: int, device) -> Tensor:
    """One float32 tensor, seeded by (seed, name): independent of which other tensors are drawn, or in which order."""
    device = torch.device(device)
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**62)
    t = torch.empty(shape, device=device, dtype=torch.float32)
    kind = _init_kind(name)
    if kind in ("embed", "matrix"):
        return t.normal_(0.0, 0.02, generator=g)
    if kind == "norm":        # used as (1 + w): a forgotten +1 changes the output
        return t.normal_(0.0, 0.1, generator=g)
    if kind == "gated_norm":  # used as plain w
        return t.normal_(1.0, 0.1, generator=g)
    if kind == "A_log":       # decay rates exp(A_log) in [1, 16]
        return t.uniform_(1.0, 16.0, generator=g).log_()
    if kind == "dt_bias":
        return t.uniform_(0.5, 1.5, generator=g)
    return t.normal_(0.0, 0.2, generator=g)  # conv


def random_weights(config: Qwen35Config, device=None, dtype=None, seed: int = 0, *,
                   progress: bool = True) -> ModelWeights:
    """Seeded random weights of `config`'s shapes, drawn directly on the device (with a progress bar where the
    draw takes a while, as the real shapes' does on a CPU; `progress=False` silences it).

    Deterministic for (config, seed, device type). Scales are realistic: matrices and embedding N(0, 0.02), the
    (1 + w) norms N(0, 0.1), the gated norm 1 + N(0, 0.1), A_log = log U(1, 16), dt_bias U(0.5, 1.5), conv N(0, 0.2).
    On the CPU they are the values of `random_state_dict(config, seed, dtype=torch.float32)`, fused.
    """
    rt = runtime.choose(device, dtype)
    specs = expected_tensors(config)
    return _assemble(config, lambda name: _draw(name, specs[name], seed, rt.device), rt.device, rt.dtype,
                     progress=progress, desc=f"drawing {config.name}")


# tensors a real checkpoint keeps in float32 beside bf16 matrices
_FP32_IN_CHECKPOINT = ("linear_attn.A_log", "linear_attn.norm.weight")


def random_state_dict(config: Qwen35Config, seed: int = 0, layout: str = "causal",
                      dtype: torch.dtype = torch.bfloat16) -> dict[str, Tensor]:
    """The random weights of `random_weights(config, seed=seed)` as Hugging Face names and unfused tensors (CPU).

    `layout` "causal" names them `model.*`, "multimodal" `model.language_model.*`; `lm_head.weight` (untied only)
    at the top level. Matrices, embedding, conv and (1 + w) norms are in `dtype`; A_log and the gated-norm weight
    stay float32, as in the released checkpoints.
    """
    prefix = layout_prefix(layout)
    out = {}
    for name, shape in expected_tensors(config).items():
        t = _draw(name, shape, seed, "cpu")
        keep32 = name.endswith(_FP32_IN_CHECKPOINT)
        out[full_name(name, prefix)] = t if keep32 else t.to(dtype)
    return out


# ------------------------------------------------------------------ back to Hugging Face names


def to_hf_state_dict(config: Qwen35Config, weights: ModelWeights, layout: str = "causal") -> dict[str, Tensor]:
    """The inverse of the fusion: `weights` as Hugging Face names and unfused tensors (views, same device; the
    conv filter a contiguous copy).

    Lets transformers' own model run on exactly the weights qwen_lab runs (the benchmark's eager row, parity
    notebooks). 1-D parameters come back as float32.
    """
    prefix = layout_prefix(layout)
    c = config
    out = {"embed_tokens.weight": weights.embed, "norm.weight": weights.final_norm}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = weights.lm_head
    for i, lw in enumerate(weights.layers):
        p = f"layers.{i}."
        out[p + "input_layernorm.weight"] = lw.input_norm
        out[p + "post_attention_layernorm.weight"] = lw.post_norm
        gate, up = lw.gate_up.split(c.intermediate_size)
        out.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": lw.down})
        if lw.kind == LINEAR:
            a = p + "linear_attn."
            qkv, z, b, a_ = lw.in_proj.split([c.linear_conv_dim, c.linear_value_dim, c.linear_num_value_heads,
                                              c.linear_num_value_heads])
            out.update({a + "in_proj_qkv.weight": qkv, a + "in_proj_z.weight": z, a + "in_proj_b.weight": b,
                        a + "in_proj_a.weight": a_, a + "conv1d.weight": lw.conv.unsqueeze(1).contiguous(),
                        a + "A_log": lw.A_log, a + "dt_bias": lw.dt_bias, a + "norm.weight": lw.norm,
                        a + "out_proj.weight": lw.out_proj})
        else:
            a = p + "self_attn."
            q, k, v = lw.qkv_proj.split([c.attn_q_dim, c.attn_kv_dim, c.attn_kv_dim])
            out.update({a + "q_proj.weight": q, a + "k_proj.weight": k, a + "v_proj.weight": v,
                        a + "q_norm.weight": lw.q_norm, a + "k_norm.weight": lw.k_norm,
                        a + "o_proj.weight": lw.o_proj})
    return {full_name(name, prefix): t for name, t in out.items()}

