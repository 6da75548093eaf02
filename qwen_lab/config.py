"""The model's configuration: every size the kernels and the model use comes from here.

`Qwen35Config.from_dict` reads either form of a Qwen3.5 dense `config.json`:
- flat, as saved by `Qwen3_5ForCausalLM` (`model_type: "qwen3_5_text"`);
- multimodal, as in the released snapshots (`model_type: "qwen3_5"` with a `text_config`;
  the `vision_config` is ignored).
Two presets need no file: `tiny` (the embedded default, small enough for the Triton interpreter
on a CPU) and `qwen3.5-0.8b` (the exact shapes of Qwen/Qwen3.5-0.8B, used with random weights).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, UnsupportedModelError

LINEAR = "linear_attention"
FULL = "full_attention"
SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")


@dataclass(frozen=True)
class Qwen35Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    layer_types: tuple[str, ...]
    # gated (full) attention
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float
    partial_rotary_factor: float
    # Gated DeltaNet (linear attention)
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    # the rest
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    name: str = "custom"

    def __post_init__(self):
        problems = []
        if len(self.layer_types) != self.num_hidden_layers:
            problems.append(f"layer_types has {len(self.layer_types)} entries, expected num_hidden_layers="
                            f"{self.num_hidden_layers}")
        bad = sorted(set(self.layer_types) - {LINEAR, FULL})
        if bad:
            problems.append(f"layer_types holds {bad}; expected only '{LINEAR}' and '{FULL}'")
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim",
                  "num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads",
                  "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim"):
            if getattr(self, f) <= 0:
                problems.append(f"{f}={getattr(self, f)}; expected a positive integer")
        if problems:  # before the ratios below, which divide by these sizes
            raise ConfigError(f"config '{self.name}': " + "; ".join(problems))
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                            f"num_key_value_heads={self.num_key_value_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            problems.append(f"linear_num_value_heads={self.linear_num_value_heads} is not a multiple of "
                            f"linear_num_key_heads={self.linear_num_key_heads}")
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.head_dim:
            problems.append(f"head_dim={self.head_dim} x partial_rotary_factor={self.partial_rotary_factor} "
                            f"gives rotary_dim={self.rotary_dim}; expected an even number in (0, head_dim]")
        if problems:
            raise ConfigError(f"config '{self.name}': " + "; ".join(problems))

    # ---- sizes derived from the config (the kernels and the loader use these names) ----
    @property
    def rotary_dim(self) -> int:
        """Dims of each attention head that RoPE rotates (the first ones); the rest pass through."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the causal conv: q, k and v side by side."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def linear_in_proj_dim(self) -> int:
        """Rows of the fused DeltaNet in-projection: [q k v | z | b | a]."""
        return self.linear_conv_dim + self.linear_value_dim + 2 * self.linear_num_value_heads

    @property
    def attn_q_dim(self) -> int:
        """Rows of q_proj: per head, head_dim query rows then head_dim gate rows."""
        return 2 * self.num_attention_heads * self.head_dim

    @property
    def attn_kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def attn_in_proj_dim(self) -> int:
        """Rows of the fused attention in-projection: [q/gate interleaved | k | v]."""
        return self.attn_q_dim + 2 * self.attn_kv_dim

    @property
    def num_linear_layers(self) -> int:
        return sum(t == LINEAR for t in self.layer_types)

    @property
    def num_full_layers(self) -> int:
        return sum(t == FULL for t in self.layer_types)

    def replace(self, **changes) -> "Qwen35Config":
        return dataclasses.replace(self, **changes)

    def to_hf_dict(self) -> dict:
        """A flat `Qwen3_5ForCausalLM`-style config.json dict for these shapes."""
        d = {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "layer_types": list(self.layer_types),
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta,
                                "partial_rotary_factor": self.partial_rotary_factor,
                                "mrope_section": _default_mrope_section(self.rotary_dim),
                                "mrope_interleaved": True},
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "torch_dtype": "bfloat16",
        }
        if self.eos_token_ids:
            d["eos_token_id"] = self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids)
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.pad_token_id is not None:
            d["pad_token_id"] = self.pad_token_id
        return d

    # ---- reading ----
    @classmethod
    def from_dict(cls, raw: dict, name: str = "config.json") -> "Qwen35Config":
        if not isinstance(raw, dict):
            raise ConfigError(f"{name}: expected a JSON object, got {type(raw).__name__}")
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{name}: model_type={model_type!r} is not supported; qwen_lab serves dense Qwen3.5 "
                f"({' or '.join(SUPPORTED_MODEL_TYPES)}). Mixture-of-experts and other families are not covered.")
        text = raw
        if model_type == "qwen3_5":
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise ConfigError(f"{name}: model_type 'qwen3_5' needs a 'text_config' object")
        if text.get("num_experts") or text.get("num_local_experts"):
            raise UnsupportedModelError(f"{name}: a mixture-of-experts config (num_experts) is not supported")

        def need(key, default=None, cast=int):
            value = text.get(key, default)
            if value is None:
                raise ConfigError(f"{name}: missing field '{key}'" + (" in text_config" if text is not raw else ""))
            try:
                return cast(value)
            except (TypeError, ValueError):
                raise ConfigError(f"{name}: field '{key}'={value!r} is not a valid {cast.__name__}") from None

        # what the model computes that qwen_lab does not make configurable: SiLU in the MLP and the conv, no biases
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"{name}: hidden_act={act!r} is not supported (Qwen3.5's MLP and conv use "
                                        "'silu')")
        if text.get("attention_bias", False):
            raise UnsupportedModelError(f"{name}: attention_bias=true is not supported (Qwen3.5's attention "
                                        "projections have no bias)")

        # (transformers: a legacy rope_scaling given beside rope_parameters wins)
        rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"{name}: 'rope_scaling' / 'rope_parameters' must be an object")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise UnsupportedModelError(f"{name}: rope_type={rope_type!r} is not supported "
                                        "(expected 'default' or 'mrope')")
        rope_theta = float(rope.get("rope_theta", text.get("rope_theta", 10000.0)))
        partial = float(rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25)))

        num_layers = need("num_hidden_layers")
        layer_types = text.get("layer_types")
        if layer_types is None:
            interval = int(text.get("full_attention_interval", 4))
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
        heads = need("num_attention_heads")
        hidden = need("hidden_size")

        eos_ids = eos_token_ids(text.get("eos_token_id", raw.get("eos_token_id")))
        # transformers ties the head from the config of the class it builds: the top level of a multimodal
        # config (Qwen3_5ForConditionalGeneration), the flat config otherwise; absent means untied.
        tie = raw.get("tie_word_embeddings", False)

        return cls(
            vocab_size=need("vocab_size"),
            hidden_size=hidden,
            intermediate_size=need("intermediate_size"),
            num_hidden_layers=num_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=heads,
            num_key_value_heads=need("num_key_value_heads"),
            head_dim=need("head_dim", 256),  # transformers' default for Qwen3.5, not hidden / heads
            rope_theta=rope_theta,
            partial_rotary_factor=partial,
            linear_num_key_heads=need("linear_num_key_heads"),
            linear_num_value_heads=need("linear_num_value_heads"),
            linear_key_head_dim=need("linear_key_head_dim"),
            linear_value_head_dim=need("linear_value_head_dim"),
            linear_conv_kernel_dim=need("linear_conv_kernel_dim", 4),
            rms_norm_eps=need("rms_norm_eps", 1e-6, float),
            max_position_embeddings=need("max_position_embeddings", 32768),
            tie_word_embeddings=bool(tie),
            eos_token_ids=eos_ids,
            bos_token_id=text.get("bos_token_id", raw.get("bos_token_id")),
            pad_token_id=text.get("pad_token_id", raw.get("pad_token_id")),
            name=name,
        )

    @classmethod
    def from_file(cls, path) -> "Qwen35Config":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no such file; a Qwen3.5 snapshot needs a config.json")
        try:
            raw = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        config = cls.from_dict(raw, name=str(path))
        # A released snapshot's config.json names <|endoftext|> alone; generation_config.json adds the chat's
        # <|im_end|>, and transformers' generate stops at its ids. So do qwen_lab's, theirs first.
        gen = path.parent / "generation_config.json"
        if gen.is_file():
            try:
                eos = eos_token_ids(json.loads(gen.read_text()).get("eos_token_id"))
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, TypeError, ValueError) as e:
                raise ConfigError(f"{gen}: not a valid generation config ({e})") from None
            merged = tuple(dict.fromkeys(eos + config.eos_token_ids))
            config = config.replace(eos_token_ids=merged)
        return config


def eos_token_ids(value) -> tuple[int, ...]:
    """A config's eos_token_id (an id, a list of ids, or None) as a tuple of ids."""
    if value is None:
        return ()
    return tuple(int(e) for e in (value if isinstance(value, (list, tuple)) else [value]) if e is not None)


def _default_mrope_section(rotary_dim: int) -> list[int]:
    """Split rotary_dim/2 frequencies into (t, h, w) sections the way Qwen3.5 does ([11, 11, 10] for 64).

    With text alone all three position streams are equal, so the sections change nothing; transformers
    still wants them in the config it reads.
    """
    half = rotary_dim // 2
    t = h = round(half * 11 / 32)
    return [t, h, half - t - h]


# ---- presets ----
def _pattern(n_layers: int, interval: int = 4) -> tuple[str, ...]:
    return tuple(FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers))


TINY = Qwen35Config(
    vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=4, layer_types=_pattern(4),
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1e7, partial_rotary_factor=0.25,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=True,
    eos_token_ids=(511, 509), pad_token_id=509, name="tiny",  # <|im_end|>, <|endoftext|> of the tiny tokenizer
)

QWEN35_0_8B = Qwen35Config(
    vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
    layer_types=_pattern(24), num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    rope_theta=1e7, partial_rotary_factor=0.25, linear_num_key_heads=16, linear_num_value_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    max_position_embeddings=262144, tie_word_embeddings=True, name="qwen3.5-0.8b",
)

PRESETS = {"tiny": TINY, "qwen3.5-0.8b": QWEN35_0_8B}


def get_preset(name: str) -> Qwen35Config:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}") from None
