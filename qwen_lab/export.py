"""Writing snapshots: config.json in either layout, the weights (one file or shards with an index), the tokenizer.

`save_snapshot` writes what `transformers` reads (`from_pretrained`) and what `qwen_lab.snapshot` reads back: the
tests build every kind of snapshot with it, the tiny builder (`qwen_lab.tiny`) the committed one. Its state dict
holds Hugging Face names; `qwen_lab.weights.random_state_dict` draws one, `to_hf_state_dict` unfuses loaded weights.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from torch import Tensor

from .config import Qwen35Config
from .safetensors_file import write_safetensors
from .snapshot import INDEX_FILE, SINGLE_FILE, layout_prefix


def write_json(path: Path, obj) -> None:
    """Sorted keys, UTF-8, "\n" line ends on every OS: the same object gives the same bytes."""
    path.write_bytes((json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def _tiny_vision_config(text_hidden: int) -> dict:
    """A small vision tower config: the multimodal layout needs one, the loader ignores it."""
    return {"model_type": "qwen3_5_vision", "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
            "in_channels": 3, "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2,
            "out_hidden_size": text_hidden, "num_position_embeddings": 16, "hidden_act": "gelu_pytorch_tanh"}


def hf_config_dict(config: Qwen35Config, layout: str = "causal") -> dict:
    """config.json for `config`: flat (causal LM) or the multimodal form with the text part under text_config."""
    layout_prefix(layout)
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
    layout_prefix(layout)  # before anything is written
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", hf_config_dict(config, layout))
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
        write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})
    if tokenizer_dir is not None:
        for fname in TOKENIZER_FILES:
            src = Path(tokenizer_dir) / fname
            if src.is_file():
                shutil.copyfile(src, directory / fname)
    return directory
