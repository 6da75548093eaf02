"""Helpers for tests that compare with transformers: tiny Qwen3.5 models with known weights, and their snapshots.

    model = make_hf_model(cfg, seed=0)                     # Qwen3_5ForCausalLM, weights = random_state_dict(cfg, 0)
    model = make_hf_model(cfg, multimodal=True)            # Qwen3_5ForConditionalGeneration, tiny vision tower
    save_hf_snapshot(model, tmp_path / "snap", max_shard_size="100KB")
    cfg = random_tiny_config(seed=3, tie_word_embeddings=False)

The weights come from `qwen_lab.weights.random_state_dict`, so the norm weights are not the trivial zeros/ones
of a fresh transformers model and a missing `1 +` in a norm shows up.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import torch

from qwen_lab.config import FULL, LINEAR, Qwen35Config
from qwen_lab.export import _tiny_vision_config
from qwen_lab.snapshot import TINY_DIR
from qwen_lab.weights import random_state_dict

_NOT_HF_FIELDS = ("architectures", "model_type", "torch_dtype")


def hf_text_config(config: Qwen35Config):
    """transformers' Qwen3_5TextConfig for these shapes (from `config.to_hf_dict()`)."""
    from transformers import Qwen3_5TextConfig

    d = {k: v for k, v in config.to_hf_dict().items() if k not in _NOT_HF_FIELDS}
    return Qwen3_5TextConfig(**d)


def make_hf_model(config: Qwen35Config, seed: int = 0, multimodal: bool = False, dtype=torch.float32):
    """A transformers Qwen3.5 (eager attention, eval mode) whose text weights are random_state_dict(config, seed).

    multimodal=False: `Qwen3_5ForCausalLM` (keys `model.*`); True: `Qwen3_5ForConditionalGeneration` with a tiny
    vision tower (keys `model.language_model.*`, `model.visual.*`). The text weights load strictly.
    """
    from transformers import Qwen3_5Config, Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

    text = hf_text_config(config)
    if multimodal:
        hf_config = Qwen3_5Config(text_config=text.to_dict(), vision_config=_tiny_vision_config(config.hidden_size),
                                  tie_word_embeddings=config.tie_word_embeddings)
        cls, layout = Qwen3_5ForConditionalGeneration, "multimodal"
    else:
        hf_config, cls, layout = text, Qwen3_5ForCausalLM, "causal"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the vision tower keeps transformers' own (now seeded) initialisation
        model = cls._from_config(hf_config, attn_implementation="eager", dtype=dtype)
    state = random_state_dict(config, seed=seed, layout=layout, dtype=dtype)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state[f"{'model.language_model.' if multimodal else 'model.'}embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("model.visual.")]
    if missing or unexpected:
        raise AssertionError(f"random_state_dict does not match {cls.__name__}: missing {missing}, "
                             f"unexpected {unexpected}")
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    return model.eval()


def save_hf_snapshot(model, directory, max_shard_size=None) -> Path:
    """`model.save_pretrained(directory)` (safetensors, sharded when max_shard_size is given) + the tiny tokenizer."""
    directory = Path(directory)
    kwargs = {} if max_shard_size is None else {"max_shard_size": max_shard_size}
    model.save_pretrained(directory, **kwargs)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TINY_DIR / name, directory / name)
    return directory


def random_tiny_config(seed: int = 0, **overrides) -> Qwen35Config:
    """A small Qwen3.5 config with sizes drawn from `seed` (any field can be forced with a keyword).

    Valid by construction: heads divide evenly, the rotary part of a head is even. vocab_size stays 512 (the tiny
    tokenizer's). Forcing num_hidden_layers without layer_types repeats the 3 x linear + 1 x full pattern.
    """
    rng = random.Random(seed)
    hk = rng.choice([1, 2])
    n_layers = overrides.get("num_hidden_layers", rng.choice([4, 5]))
    hq, hkv = rng.choice([(4, 2), (2, 1), (4, 1), (2, 2)])
    fields = dict(
        vocab_size=512,
        hidden_size=rng.choice([32, 48, 64]),
        intermediate_size=rng.choice([64, 96, 160]),
        num_hidden_layers=n_layers,
        layer_types=tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(n_layers)),
        num_attention_heads=hq,
        num_key_value_heads=hkv,
        head_dim=rng.choice([16, 32]),
        rope_theta=rng.choice([1e4, 1e7]),
        partial_rotary_factor=rng.choice([0.25, 0.5]),
        linear_num_key_heads=hk,
        linear_num_value_heads=hk * rng.choice([1, 2]),
        linear_key_head_dim=rng.choice([8, 16]),
        linear_value_head_dim=rng.choice([8, 16]),
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=1024,
        tie_word_embeddings=rng.random() < 0.5,
        name=f"random-tiny-{seed}",
    )
    fields.update(overrides)
    return Qwen35Config(**fields)


# ---------------------------------------------------------------- the GPU parity bar

def hf_logits(hf, ids) -> torch.Tensor:
    """transformers' logits [T, V] in float32 for one prompt of token ids [T] (on the model's device)."""
    with torch.inference_mode():
        return hf(input_ids=ids[None]).logits[0].float()


def assert_as_accurate_as_transformers(ours, theirs, want, what: str) -> float:
    """Our low-precision logits against transformers' (the same weights, the same dtype), both measured against
    transformers in float32: ours may be no less accurate than theirs, x1.25 + 2e-3 (rounding in another order).
    Returns our relative error."""
    from qwen_lab.course import checks

    ours_err, theirs_err = checks.relative_error(ours.float(), want), checks.relative_error(theirs, want)
    assert ours_err <= 1.25 * theirs_err + 2e-3, f"{what}: relative error ours {ours_err:.4f}, theirs {theirs_err:.4f}"
    return ours_err


def decode_after_prefill(model, ids, prefill: int) -> list:
    """The logits of the last of `prefill` prompt tokens, then of each later token of `ids` decoded one at a time
    (one cache, on the model's device), on the fast route (qwen_lab.plan), as generation runs them: the rows
    compared with a full forward's rows prefill - 1, prefill, ..."""
    from qwen_lab.plan import fast_plan

    model = fast_plan(model)
    cache = model.new_cache(len(ids) + 10)
    dev = model.device
    with torch.inference_mode():
        got = [model.step(ids[:prefill], torch.arange(prefill, device=dev), cache)[-1]]
        for t in range(prefill, len(ids)):
            got.append(model.step(ids[t:t + 1], torch.tensor([t], device=dev), cache)[-1])
    return got
