"""Snapshots: find one (a directory, a preset, a hub id), read its safetensors headers, check them against its config.

A snapshot is a directory holding `config.json`, the weights in safetensors files (one
`model.safetensors`, or shards listed by `model.safetensors.index.json`) and the tokenizer files.
Two key layouts occur:

- causal LM (`Qwen3_5ForCausalLM`):             `model.layers.N....`, `model.embed_tokens.weight`, ...
- multimodal (`Qwen3_5ForConditionalGeneration`): `model.language_model.layers.N....`, ...; the vision tower
  (`model.visual.*`) and the multi-token-prediction head (`mtp.*`) are ignored.

`lm_head.weight` sits at the top level in both, and only when the embeddings are untied. (As in transformers,
a tied config with a stored `lm_head.weight` ties it only when it equals the embedding, and uses it untied
otherwise; one stored without the embedding serves as both.) The layout is decided by where the embedding lives.

Everything is checked from the safetensors headers before a single weight is read: every file opens in the
`safetensors` library (its byte ranges tile its data exactly: none truncated, overlapping or with gaps), every
tensor the config implies is present with its exact shape, no text-model tensor is left over (that would mean the
config and the weights disagree) and no tensor lies outside the text model but the ignored parts. Each problem
raises one `CheckpointError` that names the file, the tensor and what was expected. `SnapshotReader` then reads the
tensors with the library; `qwen_lab.weights` fuses them for the kernels.

    python -m qwen_lab.snapshot SOURCE     # validate a snapshot against its config and list its tensors
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

from torch import Tensor

from .config import LINEAR, PRESETS, Qwen35Config
from .errors import CheckpointError, QwenLabError
from .safetensors_file import FLOAT_CODES, TensorInfo, read_safetensors_header

TINY_DIR = Path(__file__).resolve().parent / "data" / "tiny"
"""The committed tiny snapshot (random weights), loaded through the same code as any downloaded one."""
TINY_ENGLISH_DIR = Path(__file__).resolve().parent / "data" / "tiny_english"
"""The committed tiny-english snapshot: trained on English prose by scripts/train_tiny.py; the CPU default."""
SHIPPED = {"tiny": TINY_DIR, "tiny-english": TINY_ENGLISH_DIR}
"""The presets that ship as snapshots in the package (the others are shapes with random weights)."""

WEIGHT_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "merges.txt", "vocab.json"]
"""What `snapshot_download` fetches for a hub id: configs, weights and the tokenizer files."""

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
IGNORED_PREFIXES = ("model.visual.", "mtp.", "model.mtp.")
LAYOUT_PREFIX = {"causal": "model.", "multimodal": "model.language_model."}
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def layout_prefix(layout) -> str:
    """The name prefix of a checkpoint `layout` ("causal" or "multimodal"); CheckpointError for anything else."""
    if not isinstance(layout, str) or layout not in LAYOUT_PREFIX:
        raise CheckpointError(f"layout={layout!r}; expected one of {sorted(LAYOUT_PREFIX)} (the flat causal LM "
                              "snapshot, or the multimodal one with the text model under model.language_model.)")
    return LAYOUT_PREFIX[layout]


def full_name(name: str, prefix: str) -> str:
    """A tensor's name in a checkpoint whose text model sits under `prefix` (lm_head.weight: at the top level)."""
    return name if name == "lm_head.weight" else prefix + name


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


# ------------------------------------------------------------------ where the weights come from


def resolve_source(source, allow_patterns=None) -> Path | Qwen35Config:
    """A directory, "tiny", a preset name or a hub id -> the snapshot directory (or the preset's config).

    "tiny" and "tiny-english" are the committed snapshots `qwen_lab/data/tiny` and `qwen_lab/data/tiny_english`;
    other presets have no files and come back as their config (random weights). A hub id ("Org/Name") that is not a local directory is fetched with
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
    if key in SHIPPED:
        where = SHIPPED[key]
        if not (where / "config.json").is_file():
            how = f"python -m qwen_lab.tiny {where}" if key == "tiny" else f"python scripts/train_tiny.py --out {where}"
            raise CheckpointError(f"{where}: the {key} snapshot that ships with qwen_lab is missing; rebuild it with "
                                  f"`{how}`")
        return where
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
        if info.dtype not in FLOAT_CODES:
            raise CheckpointError(f"{info.file}: tensor '{info.name}' has dtype {info.dtype}, expected a floating "
                                  f"point dtype ({', '.join(FLOAT_CODES)}); quantized checkpoints are not supported")

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
            full = full_name(name, prefix)
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


# ------------------------------------------------------------------ command line


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m qwen_lab.snapshot",
                                description="Validate a snapshot against its config and list its tensors.")
    p.add_argument("source", help="a snapshot directory, a preset name or a hub id")
    args = p.parse_args(argv)
    try:
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
    except (QwenLabError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
