"""Weights: read a Hugging Face snapshot of Qwen3.5, check it against its config, fuse it for the kernels.

A snapshot is a directory holding `config.json`, the weights in safetensors files (one
`model.safetensors`, or shards listed by `model.safetensors.index.json`) and the tokenizer files.
Two key layouts occur:

- causal LM (`Qwen3_5ForCausalLM`):             `model.layers.N....`, `model.embed_tokens.weight`, ...
- multimodal (`Qwen3_5ForConditionalGeneration`): `model.language_model.layers.N....`, ...; the vision tower
  (`model.visual.*`) and the multi-token-prediction head (`mtp.*`) are ignored.

`lm_head.weight` sits at the top level in both, and only when the embeddings are untied. (As in transformers,
a tied config with a stored `lm_head.weight` ties it only when it equals the embedding, and uses it untied
otherwise; one stored without the embedding serves as both.) The layout is decided by where the embedding lives.

Everything is checked from the safetensors headers before a single weight is read: every tensor the
config implies is present with its exact shape, no text-model tensor is left over (that would mean the
config and the weights disagree) and no tensor lies outside the text model but the ignored parts, every
file's byte ranges tile its data exactly (none truncated, overlapping or with gaps). Each problem raises
one `CheckpointError` that names the file, the tensor and what was expected.

What the model consumes is a `ModelWeights`: per layer, the projections that read the same input are
fused into one matrix so that one GEMM serves them (rows stacked in this order):

    gate_up  = [mlp.gate_proj ; mlp.up_proj]                              [2I, H]
    in_proj  = [in_proj_qkv ; in_proj_z ; in_proj_b ; in_proj_a]          [2*Hk*Dk + 2*Hv*Dv + 2*Hv, H]
    qkv_proj = [q_proj (per head: D query rows, D gate rows) ; k_proj ; v_proj]   [2*Hq*D + 2*Hkv*D, H]

Matrices, the conv filter and the embedding are kept in the model dtype; every 1-D parameter (norm
weights, A_log, dt_bias) in float32, since the kernels do that math in fp32 anyway.

Without a snapshot, `random_weights` draws seeded weights of any config's shapes (the `qwen3.5-0.8b`
preset), and `build_tiny_checkpoint` writes the tiny model the course runs on a CPU as a real snapshot:
`python -m qwen_lab.weights build-tiny DIR`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import struct
import sys
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from . import runtime
from .config import LINEAR, PRESETS, TINY, Qwen35Config
from .errors import CheckpointError

TINY_DIR = Path(__file__).resolve().parent / "data" / "tiny"
"""The committed tiny snapshot, loaded through the same code as any downloaded one."""

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "merges.txt", "vocab.json"]
"""What `snapshot_download` fetches for a hub id: configs, weights and the tokenizer files."""

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
IGNORED_PREFIXES = ("model.visual.", "mtp.", "model.mtp.")
LAYOUT_PREFIX = {"causal": "model.", "multimodal": "model.language_model."}
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


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


# ------------------------------------------------------------------ the checkpoint's tensors, from the config


def _tensor_specs(c: Qwen35Config) -> dict[str, tuple[tuple[int, str], ...]]:
    """Every checkpoint tensor (name without the layout prefix) -> its dims, each with the config fields behind it."""
    V = (c.vocab_size, f"vocab_size={c.vocab_size}")
    H = (c.hidden_size, f"hidden_size={c.hidden_size}")
    I = (c.intermediate_size, f"intermediate_size={c.intermediate_size}")
    conv = (c.linear_conv_dim, f"linear_conv_dim={c.linear_conv_dim} = 2 x linear_num_key_heads="
            f"{c.linear_num_key_heads} x linear_key_head_dim={c.linear_key_head_dim} + linear_num_value_heads="
            f"{c.linear_num_value_heads} x linear_value_head_dim={c.linear_value_head_dim}")
    vdim = (c.linear_value_dim, f"linear_num_value_heads={c.linear_num_value_heads} x linear_value_head_dim="
            f"{c.linear_value_head_dim}")
    Hv = (c.linear_num_value_heads, f"linear_num_value_heads={c.linear_num_value_heads}")
    Dv = (c.linear_value_head_dim, f"linear_value_head_dim={c.linear_value_head_dim}")
    W = (c.linear_conv_kernel_dim, f"linear_conv_kernel_dim={c.linear_conv_kernel_dim}")
    one = (1, "depthwise conv: 1 input channel per group")
    q2 = (c.attn_q_dim, f"2 x num_attention_heads={c.num_attention_heads} x head_dim={c.head_dim} "
          "(query and gate rows)")
    kv = (c.attn_kv_dim, f"num_key_value_heads={c.num_key_value_heads} x head_dim={c.head_dim}")
    D = (c.head_dim, f"head_dim={c.head_dim}")
    qo = (c.num_attention_heads * c.head_dim, f"num_attention_heads={c.num_attention_heads} x head_dim={c.head_dim}")

    specs = {"embed_tokens.weight": (V, H)}
    for i, kind in enumerate(c.layer_types):
        p = f"layers.{i}."
        specs[p + "input_layernorm.weight"] = (H,)
        specs[p + "post_attention_layernorm.weight"] = (H,)
        if kind == LINEAR:
            a = p + "linear_attn."
            specs[a + "in_proj_qkv.weight"] = (conv, H)
            specs[a + "in_proj_z.weight"] = (vdim, H)
            specs[a + "in_proj_b.weight"] = (Hv, H)
            specs[a + "in_proj_a.weight"] = (Hv, H)
            specs[a + "conv1d.weight"] = (conv, one, W)
            specs[a + "A_log"] = (Hv,)
            specs[a + "dt_bias"] = (Hv,)
            specs[a + "norm.weight"] = (Dv,)
            specs[a + "out_proj.weight"] = (H, vdim)
        else:
            a = p + "self_attn."
            specs[a + "q_proj.weight"] = (q2, H)
            specs[a + "k_proj.weight"] = (kv, H)
            specs[a + "v_proj.weight"] = (kv, H)
            specs[a + "q_norm.weight"] = (D,)
            specs[a + "k_norm.weight"] = (D,)
            specs[a + "o_proj.weight"] = (H, qo)
        specs[p + "mlp.gate_proj.weight"] = (I, H)
        specs[p + "mlp.up_proj.weight"] = (I, H)
        specs[p + "mlp.down_proj.weight"] = (H, I)
    specs["norm.weight"] = (H,)
    if not c.tie_word_embeddings:
        specs["lm_head.weight"] = (V, H)
    return specs


def expected_tensors(config: Qwen35Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of `config` holds (names without the layout prefix) and its exact shape.

    Names read like "embed_tokens.weight", "layers.3.linear_attn.A_log", "norm.weight", and
    "lm_head.weight" when the embeddings are untied (that one sits at the top level in both layouts).
    """
    return {name: tuple(d for d, _ in dims) for name, dims in _tensor_specs(config).items()}


def _shape_reason(config: Qwen35Config, name: str) -> str:
    seen = []
    for _, why in _tensor_specs(config)[name]:
        if why not in seen:
            seen.append(why)
    return ", ".join(seen)


def _full_name(name: str, prefix: str) -> str:
    return name if name == "lm_head.weight" else prefix + name


# ------------------------------------------------------------------ safetensors headers, parsed by hand

# safetensors dtype code -> (torch dtype, bytes per element)
_ST_DTYPES = {
    "F64": (torch.float64, 8), "F32": (torch.float32, 4), "F16": (torch.float16, 2), "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8), "I32": (torch.int32, 4), "I16": (torch.int16, 2), "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1),
    "F8_E4M3": (getattr(torch, "float8_e4m3fn", None), 1), "F8_E5M2": (getattr(torch, "float8_e5m2", None), 1),
}
_FLOAT_CODES = ("F64", "F32", "F16", "BF16")
_TORCH_TO_ST = {v[0]: k for k, v in _ST_DTYPES.items() if v[0] is not None}
_MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it."""
    file: Path
    name: str
    dtype: str                  # safetensors code: "BF16", "F32", ...
    shape: tuple[int, ...]
    offsets: tuple[int, int]    # [begin, end) within the data section


def read_safetensors_header(path) -> dict[str, TensorInfo]:
    """Parse a safetensors header (8-byte little-endian length, then JSON) and check it against the file size.

    Raises CheckpointError for a file that cannot be read or is too short, a header that is not JSON or not a
    safetensors header (shapes and offsets lists of non-negative integers, `__metadata__` an object of strings), a
    tensor whose byte range disagrees with its dtype and shape, one that ends past the end of the file (a truncated
    download), and byte ranges that leave a gap, overlap, or do not end exactly at the end of the file: the rules
    the safetensors library itself enforces when it opens the file, checked here before any weight is read.
    Reads no tensor data.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: only {size} bytes, too short for a safetensors file (it starts with "
                                      "an 8-byte header length); the file is truncated or empty, download it again")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, _MAX_HEADER):
                raise CheckpointError(f"{path}: the header length field says {n} bytes, more than a header can take "
                                      f"here ({min(size - 8, _MAX_HEADER)} bytes: the rest of the file, at most 100 "
                                      "MiB); the file is truncated or is not a safetensors file")
            raw = f.read(n)
    except OSError as e:  # permissions, an I/O error: name the file rather than fail with a bare traceback
        raise CheckpointError(f"{path}: could not read the file ({e.strerror or e})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header, expected {n} bytes of JSON ({e}); "
                              "the file is damaged, download it again") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header, expected a JSON object mapping tensor names "
                              f"to dtype/shape/data_offsets, got {type(header).__name__}")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{path}: corrupt safetensors header, '__metadata__' is {meta!r}; expected an object "
                              "of string values (the safetensors library refuses to open this file)")
    data_size = size - 8 - n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor '{name}'"
        try:
            code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            # JSON integers only, as the safetensors library reads them: 48.9 or true is a corrupt header
            if not (isinstance(shape, list) and isinstance(offsets, list) and len(offsets) == 2
                    and all(_is_uint(s) for s in shape + offsets)):
                raise TypeError
        except (TypeError, KeyError):
            raise CheckpointError(f"{where}: corrupt header entry {info!r}; expected {{'dtype': ..., 'shape': "
                                  "[non-negative integers], 'data_offsets': [begin, end]}") from None
        shape, (begin, end) = tuple(shape), offsets
        if code not in _ST_DTYPES:
            raise CheckpointError(f"{where}: unknown dtype {code!r}; expected one of {sorted(_ST_DTYPES)}")
        if begin > end:
            raise CheckpointError(f"{where}: corrupt header entry (shape {list(shape)}, data_offsets "
                                  f"[{begin}, {end}])")
        need = math.prod(shape) * _ST_DTYPES[code][1]
        if end - begin != need:
            raise CheckpointError(f"{where}: data_offsets [{begin}, {end}] span {end - begin} bytes, but dtype "
                                  f"{code} x shape {list(shape)} needs {need}; the header is corrupt")
        out[name] = TensorInfo(path, name, code, shape, (begin, end))
    cut = sorted((info for info in out.values() if info.offsets[1] > data_size), key=lambda info: info.offsets)
    if cut:
        first = cut[0]
        raise CheckpointError(
            f"{path}: tensor '{first.name}' ends at byte {8 + n + first.offsets[1]} but the file has only {size} bytes"
            f"{f' ({len(cut) - 1} more tensors lie past the end)' if len(cut) > 1 else ''}; the file is truncated "
            "(an interrupted download?), download it again")
    # The byte ranges, in offset order (not the header's order, which is free), must tile the data section:
    # the first starts at 0, each starts where the one before ends, the last ends at the end of the file.
    # Tensors with no elements take no bytes and may share an offset. An overlap is reported before a gap: two
    # tensors given the same bytes leave a gap where one of them should be, and the overlap names the culprit.
    pos, before, wrong = 0, None, {}
    for info in sorted(out.values(), key=lambda info: info.offsets):
        begin, end = info.offsets
        if begin != pos:
            after = f"the previous tensor '{before.name}' ends at {pos}" if before else "the data starts at 0"
            problem = f"a gap of {begin - pos} bytes" if begin > pos else f"{pos - begin} bytes overlap"
            wrong.setdefault(begin < pos, f"{path}: tensor '{info.name}' has data_offsets [{begin}, {end}] but "
                             f"{after} ({problem}); expected each tensor's bytes to follow the previous one's, so "
                             "the header is corrupt")
        if end >= pos:
            pos, before = end, info
    if wrong:
        raise CheckpointError(wrong.get(True, wrong.get(False)))
    if pos != data_size:
        raise CheckpointError(f"{path}: {data_size - pos} bytes follow the last tensor's data (the header covers "
                              f"{pos} of the {data_size} data bytes); expected the file to end where its last "
                              "tensor ends, so it is damaged or not a safetensors file")
    return out


def _is_uint(value) -> bool:
    """A non-negative JSON integer (a bool is not one, though Python's bool subclasses int)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_safetensors(path, tensors: dict[str, Tensor], metadata: dict[str, str] | None = None) -> None:
    """Write tensors as a safetensors file, byte for byte the same for the same input.

    Tensors are laid out by decreasing element size, then by name, so every one stays aligned to its dtype.
    """
    order = sorted(tensors, key=lambda k: (-tensors[k].element_size(), k))
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    blobs, offset = [], 0
    for name in order:
        t = tensors[name].detach().to("cpu").contiguous()
        if t.dtype not in _TORCH_TO_ST:
            raise CheckpointError(f"{path}: tensor '{name}' has dtype {t.dtype}, which safetensors cannot store")
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {"dtype": _TORCH_TO_ST[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)


# ------------------------------------------------------------------ where the weights come from


def resolve_source(source, allow_patterns=None) -> Path | Qwen35Config:
    """A directory, "tiny", a preset name or a hub id -> the snapshot directory (or the preset's config).

    "tiny" is the committed snapshot `qwen_lab/data/tiny`; other presets have no files and come back as their
    config (random weights). A hub id ("Org/Name") that is not a local directory is fetched with
    `huggingface_hub.snapshot_download` (only `allow_patterns`, by default configs, weights and tokenizer files).
    A local directory holding a config.json wins over a preset of the same name: `hf download Qwen/Qwen3.5-0.8B
    --local-dir Qwen3.5-0.8B` makes one, and its real weights are what its name asks for.
    """
    if isinstance(source, os.PathLike):
        return _existing_dir(Path(source))
    if not isinstance(source, str):
        raise CheckpointError(f"source={source!r}: expected a snapshot directory, a preset name "
                              f"({', '.join(PRESETS)}) or a hub id such as 'Qwen/Qwen3.5-0.8B'")
    if not source.strip():  # Path("") is the current directory: an empty --model would quietly mean "."
        raise CheckpointError(f"source={source!r} is empty; expected a snapshot directory, a preset name "
                              f"({', '.join(PRESETS)}) or a hub id such as 'Qwen/Qwen3.5-0.8B'")
    path = Path(source).expanduser()
    if (path / "config.json").is_file():  # (a folder named like a preset but holding no snapshot does not count)
        return path
    key = source.strip().lower()
    if key == "tiny":
        if not (TINY_DIR / "config.json").is_file():
            raise CheckpointError(f"{TINY_DIR}: the tiny snapshot that ships with qwen_lab is missing; rebuild it with "
                                  f"`python -m qwen_lab.weights build-tiny {TINY_DIR}`")
        return TINY_DIR
    if key in PRESETS:
        return PRESETS[key]
    if path.exists():
        return _existing_dir(path)
    if HUB_ID.match(source):
        return _download(source, allow_patterns or WEIGHT_PATTERNS)
    raise CheckpointError(f"{source}: no such directory; expected a snapshot directory (holding config.json and "
                          f"*.safetensors), a preset name ({', '.join(PRESETS)}) or a hub id such as "
                          "'Qwen/Qwen3.5-0.8B'")


def _existing_dir(path: Path) -> Path:
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path}: is a file; expected the snapshot directory that holds config.json and the "
                              "*.safetensors files")
    raise CheckpointError(f"{path}: no such directory; expected a snapshot directory holding config.json and the "
                          "*.safetensors files")


def _download(repo_id: str, allow_patterns) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise CheckpointError(f"'{repo_id}' is not a local directory and looks like a hub id, but huggingface_hub "
                              "is not installed: `pip install huggingface_hub`, or download the snapshot elsewhere "
                              "and pass its directory") from None
    try:
        return Path(snapshot_download(repo_id=repo_id, allow_patterns=list(allow_patterns)))
    except Exception as e:  # offline, unknown repo, gated repo: the hub client raises many kinds
        raise CheckpointError(
            f"'{repo_id}' is not a local directory, and this machine could not fetch it from the Hugging Face hub "
            f"({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else 'no details'}). "
            f"Download it where there is a network, e.g. `hf download {repo_id} --local-dir DIR`, bring the "
            "directory here and pass it instead (`--model DIR` on the command line, load_model('DIR') in "
            "Python)") from None


# ------------------------------------------------------------------ reading a snapshot


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
    if where == TINY_DIR and isinstance(source, str) and source.strip().lower() == "tiny":
        config = config.replace(name="tiny")
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


def open_snapshot(directory) -> tuple[Qwen35Config, "SnapshotReader"]:
    """Read config.json and every safetensors header of a snapshot, and check them against each other.

    Returns the config and a reader of the text model's tensors (by unprefixed name); no tensor data is read.
    """
    directory = Path(directory)
    if not directory.is_dir():
        _existing_dir(directory)
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{directory}: no config.json; a snapshot directory holds config.json beside the "
                              "*.safetensors files (was the download interrupted, or is this the wrong folder?)")
    config = Qwen35Config.from_file(directory / "config.json")
    files, weight_map, index = _weight_files(directory)
    infos: dict[str, TensorInfo] = {}
    for f in files:
        for name, info in read_safetensors_header(f).items():
            if name in infos:
                raise CheckpointError(f"{f}: tensor '{name}' is also stored in {infos[name].file}; expected each "
                                      "tensor in exactly one file")
            infos[name] = info
    if weight_map is not None:
        for name, shard in weight_map.items():
            if name not in infos or infos[name].file.name != Path(shard).name:
                raise CheckpointError(f"{directory / shard}: tensor '{name}' is listed for this file in {index} "
                                      "but the file does not hold it; the index and the shards disagree")
    prefix = _detect_prefix(infos)
    text = _check_against_config(config, infos, prefix, directory, files, index)
    return config, SnapshotReader(text)


def _weight_files(directory: Path) -> tuple[list[Path], dict | None, Path | None]:
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            text = index.read_text()
        except OSError as e:  # permissions, an I/O error: name the file rather than fail with a bare traceback
            raise CheckpointError(f"{index}: could not read the file ({e.strerror or e})") from None
        try:
            weight_map = json.loads(text)["weight_map"]
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise TypeError
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError):
            raise CheckpointError(f"{index}: expected a JSON object with a 'weight_map' from tensor name to shard "
                                  "file name") from None
        shards = sorted(set(weight_map.values()))
        for shard in shards:
            if not (directory / shard).is_file():
                example = next(k for k, v in weight_map.items() if v == shard)
                raise CheckpointError(f"{directory / shard}: missing shard; {index.name} lists it as holding "
                                      f"{sum(v == shard for v in weight_map.values())} tensors (e.g. '{example}'); "
                                      "the download is incomplete, fetch the snapshot again")
        return [directory / s for s in shards], weight_map, index
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE], None, None
    found = sorted(directory.glob("*.safetensors"))
    if found:
        return found, None, None
    raise CheckpointError(f"{directory}: no {SINGLE_FILE} and no {INDEX_FILE}; expected the weights in safetensors "
                          "files (.bin/.pt checkpoints are not supported)")


def _detect_prefix(infos: dict[str, TensorInfo]) -> str:
    """The key layout's prefix, decided by where the embedding lives, not by any one key: a stray tensor of the
    other layout is then reported by name instead of turning the whole snapshot into the other layout."""
    causal, mm = LAYOUT_PREFIX["causal"], LAYOUT_PREFIX["multimodal"]
    # the embedding; without one, the final norm (a tied checkpoint may store its embedding as lm_head.weight)
    for anchor in ("embed_tokens.weight", "norm.weight"):
        found = [info for info in (infos.get(mm + anchor), infos.get(causal + anchor)) if info is not None]
        if len(found) == 2:
            a, b = found
            raise CheckpointError(f"{b.file}: holds tensor '{b.name}' (the causal LM layout) and {a.file} holds "
                                  f"'{a.name}' (the multimodal layout); expected the text model under one prefix "
                                  f"('{causal}' or '{mm}'), not both")
        if found:
            return mm if found[0].name.startswith(mm) else causal
    # neither (the missing tensors are reported next): the prefix most of the tensors use
    n_mm = sum(k.startswith(mm) for k in infos)
    return mm if n_mm > sum(k.startswith(causal) for k in infos) - n_mm else causal


def _text_tensors(infos: dict[str, TensorInfo], prefix: str) -> dict[str, TensorInfo]:
    """The text model's tensors by unprefixed name (lm_head.weight kept under its own name)."""
    out = {}
    for name, info in infos.items():
        if name.startswith(IGNORED_PREFIXES):
            continue
        if name == "lm_head.weight":
            out[name] = info
        elif name.startswith(prefix):
            out[name[len(prefix):]] = info
    return out


_LAYER = re.compile(r"^layers\.(\d+)\.")


def _check_against_config(config: Qwen35Config, infos: dict[str, TensorInfo], prefix: str, directory: Path,
                          files: list[Path], index: Path | None) -> dict[str, TensorInfo]:
    specs = expected_tensors(config)
    text = _text_tensors(infos, prefix)
    n = config.num_hidden_layers
    src = "config.json"
    tied = config.tie_word_embeddings
    if tied and "lm_head.weight" in text and "embed_tokens.weight" not in text:
        # a tied checkpoint that stores its one matrix as lm_head.weight alone: transformers ties the embedding
        # to it (tie_weights swaps source and target when the source is missing), so the embedding is read from it
        text["embed_tokens.weight"] = text.pop("lm_head.weight")

    def check(info, shape, why):
        if info.shape != shape:
            raise CheckpointError(f"{info.file}: tensor '{info.name}' has shape {info.shape}, expected {shape} "
                                  f"from {src} ({why})")
        if info.dtype not in _FLOAT_CODES:
            raise CheckpointError(f"{info.file}: tensor '{info.name}' has dtype {info.dtype}, expected a floating "
                                  f"point dtype ({', '.join(_FLOAT_CODES)}); quantized checkpoints are not supported")

    # 1. more layers in the weights than in the config
    for name, info in sorted(text.items(), key=lambda kv: kv[0]):
        m = _LAYER.match(name)
        if m and int(m.group(1)) >= n:
            raise CheckpointError(
                f"{info.file}: tensor '{info.name}' belongs to layer {m.group(1)}, but {src} has num_hidden_layers="
                f"{n} (layers 0..{n - 1}); the config disagrees with the weights")

    # 2. every expected tensor present, with its exact shape and a float dtype
    missing = [k for k in specs if k not in text and k != "lm_head.weight"]
    for name, shape in specs.items():
        info = text.get(name)
        if info is None:
            full = _full_name(name, prefix)
            if name == "lm_head.weight":
                raise CheckpointError(
                    f"{directory}: no file holds 'lm_head.weight' (expected shape {shape}); {src} does not tie "
                    "the LM head to the embedding (tie_word_embeddings false, or absent: transformers reads absent "
                    "as false), so the head must be stored beside the embedding")
            if index is not None:
                where = f"{index}: does not list"
            elif len(files) == 1:
                where = f"{files[0]}: no"
            else:
                where = f"{directory}: none of the {len(files)} safetensors files holds"
            more = f" ({len(missing) - 1} other expected tensors are missing too)" if len(missing) > 1 else ""
            raise CheckpointError(f"{where} tensor '{full}' (expected shape {shape} from {src}: "
                                  f"{_shape_reason(config, name)}){more}{_layer_hint(config, name, text)}")
        check(info, shape, _shape_reason(config, name))
    if tied and "lm_head.weight" in text:
        # stored beside the embedding of a tied config: transformers uses it when it differs (see _assemble),
        # so it must have the embedding's shape
        check(text["lm_head.weight"], specs["embed_tokens.weight"],
              f"{_shape_reason(config, 'embed_tokens.weight')}: the LM head has the embedding's shape")

    # 3. nothing left over in the text model
    for name, info in text.items():
        if name not in specs and name != "lm_head.weight":
            raise CheckpointError(
                f"{info.file}: tensor '{info.name}' is not part of the Qwen3.5 text model that {src} describes"
                f"{_layer_hint(config, name, text)}; the config disagrees with the weights")

    # 4. nor beside it: only the parts of a Qwen3.5 snapshot that qwen_lab ignores (vision tower, MTP head)
    for name, info in infos.items():
        if not (name.startswith((prefix,) + IGNORED_PREFIXES) or name == "lm_head.weight"):
            raise CheckpointError(
                f"{info.file}: tensor '{info.name}' is not part of the Qwen3.5 text model, whose tensors are named "
                f"'{prefix}*' in this snapshot (the prefix of its embedding), nor one of the parts qwen_lab "
                f"ignores ({', '.join(p + '*' for p in IGNORED_PREFIXES)}); expected no other tensor")
    return {k: v for k, v in text.items() if k in specs or k == "lm_head.weight"}


def _layer_hint(config: Qwen35Config, name: str, text: dict) -> str:
    m = _LAYER.match(name)
    if not m:
        return ""
    i = int(m.group(1))
    kind = config.layer_types[i]
    other = "self_attn" if kind == LINEAR else "linear_attn"
    if any(k.startswith(f"layers.{i}.{other}.") for k in text):
        return f"; layer {i} holds {other} tensors but config.json says layer_types[{i}]='{kind}'"
    if not any(k.startswith(f"layers.{i}.") for k in text):
        last = max((int(_LAYER.match(k).group(1)) for k in text if _LAYER.match(k)), default=-1)
        return (f"; the weights hold no tensor of layer {i} at all (they stop at layer {last}) while config.json "
                f"says num_hidden_layers={config.num_hidden_layers}")
    return ""


class SnapshotReader:
    """Reads a validated snapshot's tensors by unprefixed name, each file opened once (memory-mapped)."""

    def __init__(self, infos: dict[str, TensorInfo]):
        self.infos = infos
        self._open: dict[Path, object] = {}

    def get(self, name: str) -> Tensor:
        from safetensors import SafetensorError, safe_open

        info = self.infos[name]
        try:
            if info.file not in self._open:
                self._open[info.file] = safe_open(str(info.file), framework="pt", device="cpu")
            return self._open[info.file].get_tensor(info.name)
        except (SafetensorError, OSError) as e:
            raise CheckpointError(f"{info.file}: could not read tensor '{info.name}' ({e})") from None

    def close(self):
        self._open.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


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


def _layout_prefix(layout) -> str:
    """The name prefix of a checkpoint `layout` ("causal" or "multimodal"); CheckpointError for anything else."""
    if not isinstance(layout, str) or layout not in LAYOUT_PREFIX:
        raise CheckpointError(f"layout={layout!r}; expected one of {sorted(LAYOUT_PREFIX)} (the flat causal LM "
                              "snapshot, or the multimodal one with the text model under model.language_model.)")
    return LAYOUT_PREFIX[layout]


def random_state_dict(config: Qwen35Config, seed: int = 0, layout: str = "causal",
                      dtype: torch.dtype = torch.bfloat16) -> dict[str, Tensor]:
    """The random weights of `random_weights(config, seed=seed)` as Hugging Face names and unfused tensors (CPU).

    `layout` "causal" names them `model.*`, "multimodal" `model.language_model.*`; `lm_head.weight` (untied only)
    at the top level. Matrices, embedding, conv and (1 + w) norms are in `dtype`; A_log and the gated-norm weight
    stay float32, as in the released checkpoints.
    """
    prefix = _layout_prefix(layout)
    out = {}
    for name, shape in expected_tensors(config).items():
        t = _draw(name, shape, seed, "cpu")
        keep32 = name.endswith(_FP32_IN_CHECKPOINT)
        out[_full_name(name, prefix)] = t if keep32 else t.to(dtype)
    return out


def to_hf_state_dict(config: Qwen35Config, weights: ModelWeights, layout: str = "causal") -> dict[str, Tensor]:
    """The inverse of the fusion: `weights` as Hugging Face names and unfused tensors (views, same device; the
    conv filter a contiguous copy).

    Lets transformers' own model run on exactly the weights qwen_lab runs (the benchmark's eager row, parity
    notebooks). 1-D parameters come back as float32.
    """
    prefix = _layout_prefix(layout)
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
    return {_full_name(name, prefix): t for name, t in out.items()}


# ------------------------------------------------------------------ writing snapshots


def _write_json(path: Path, obj) -> None:
    """Sorted keys, UTF-8, "\n" line ends on every OS: the same object gives the same bytes."""
    path.write_bytes((json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def _tiny_vision_config(text_hidden: int) -> dict:
    """A small vision tower config: the multimodal layout needs one, the loader ignores it."""
    return {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": text_hidden, "num_position_embeddings": 16, "hidden_act": "gelu_pytorch_tanh"}


def hf_config_dict(config: Qwen35Config, layout: str = "causal") -> dict:
    """config.json for `config`: flat (causal LM) or the multimodal form with the text part under text_config."""
    _layout_prefix(layout)
    flat = config.to_hf_dict()
    if layout == "causal":
        return flat
    text = {k: v for k, v in flat.items() if k not in ("architectures", "torch_dtype")}
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text,
            "vision_config": _tiny_vision_config(config.hidden_size),
            "tie_word_embeddings": config.tie_word_embeddings, "torch_dtype": flat.get("torch_dtype", "bfloat16")}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "special_tokens_map.json")


def save_snapshot(directory, config: Qwen35Config, state_dict: dict[str, Tensor], *, layout: str = "causal",
                  max_shard_bytes: int | None = None, tokenizer_dir=None) -> Path:
    """Write a snapshot: config.json, the weights (one file, or shards of at most `max_shard_bytes` + an index),
    and the tokenizer files of `tokenizer_dir` when given. Returns the directory."""
    _layout_prefix(layout)  # before anything is written
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / "config.json", hf_config_dict(config, layout))
    names = list(state_dict)
    if max_shard_bytes is None:
        write_safetensors(directory / SINGLE_FILE, state_dict)
    else:
        shards, current, size = [], [], 0
        for name in names:
            nb = state_dict[name].numel() * state_dict[name].element_size()
            if current and size + nb > max_shard_bytes:
                shards.append(current)
                current, size = [], 0
            current.append(name)
            size += nb
        if current:
            shards.append(current)
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(directory / fname, {k: state_dict[k] for k in shard})
            for k in shard:
                weight_map[k] = fname
                total += state_dict[k].numel() * state_dict[k].element_size()
        _write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    if tokenizer_dir is not None:
        for fname in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / fname
            if src.is_file():
                shutil.copyfile(src, directory / fname)
    return directory


def tiny_config() -> Qwen35Config:
    """config.TINY with the special-token ids of the tiny tokenizer (eos: <|im_end|>, <|endoftext|>; pad)."""
    from .tokenizer import TINY_SPECIAL_IDS

    eot, im_end = TINY_SPECIAL_IDS["<|endoftext|>"], TINY_SPECIAL_IDS["<|im_end|>"]
    return TINY.replace(eos_token_ids=(im_end, eot), pad_token_id=eot, bos_token_id=None, name="tiny")


def build_tiny_checkpoint(directory) -> Path:
    """Write the tiny model as a real snapshot: config.json (flat), model.safetensors (random_state_dict(TINY, 0):
    bf16 matrices, fp32 A_log and gated norm), tokenizer.json, tokenizer_config.json, generation_config.json.

    Deterministic: two builds give byte-identical files. The result is committed as qwen_lab/data/tiny.
    """
    from .tokenizer import write_tiny_tokenizer

    config = tiny_config()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _write_json(directory / "config.json", config.to_hf_dict())
    write_safetensors(directory / SINGLE_FILE, random_state_dict(config, seed=0))
    write_tiny_tokenizer(directory)
    gen = {"eos_token_id": list(config.eos_token_ids), "pad_token_id": config.pad_token_id, "do_sample": False}
    _write_json(directory / "generation_config.json", gen)
    return directory


# ------------------------------------------------------------------ command line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qwen_lab.weights", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tiny", help="write the tiny snapshot (the committed qwen_lab/data/tiny) to DIR")
    b.add_argument("directory")
    c = sub.add_parser("check", help="validate a snapshot against its config and list its tensors")
    c.add_argument("source")
    args = p.parse_args(argv)
    try:
        if args.cmd == "build-tiny":
            out = build_tiny_checkpoint(args.directory)
            for f in sorted(out.iterdir()):
                print(f"{f}  {f.stat().st_size} bytes")
        else:
            where = resolve_source(args.source)
            if isinstance(where, Qwen35Config):
                print(f"{args.source}: a preset without files (random weights)")
                return 0
            config, reader = open_snapshot(where)
            total = 0
            for name, info in reader.infos.items():
                total += math.prod(info.shape)
                print(f"{info.name:64s} {info.dtype:5s} {list(info.shape)}")
            print(f"{where}: OK, {len(reader.infos)} tensors, {total:,} parameters")
    except Exception as e:
        from .errors import QwenLabError

        # (an OSError here is one no read above turned into a CheckpointError: writing build-tiny's DIR, say)
        if isinstance(e, (QwenLabError, OSError)):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
