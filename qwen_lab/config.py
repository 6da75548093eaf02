"""The model's configuration: every size the kernels and the model use comes from here.

`Qwen35Config.from_dict` reads either form of a Qwen3.5 dense `config.json`:
- flat, as saved by `Qwen3_5ForCausalLM` (`model_type: "qwen3_5_text"`);
- multimodal, as in the released snapshots (`model_type: "qwen3_5"` with a `text_config`;
  the `vision_config` is ignored).
Presets: `tiny` (random weights, small enough for the Triton interpreter on a CPU: the tests' model),
`tiny-english` (the CPU default: the same architecture a little larger, trained on English prose by
scripts/train_tiny.py) and `qwen3.5-0.8b` (the exact shapes of Qwen/Qwen3.5-0.8B, used with random weights). The
first two ship as snapshots in qwen_lab/data/.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError, UnsupportedModelError

LINEAR = "linear_attention"
FULL = "full_attention"
SUPPORTED_MODEL_TYPES = ("qwen3_5", "qwen3_5_text")

# transformers' Qwen3_5TextConfig defaults (transformers 5.17, configuration_qwen3_5.py): a key absent from
# config.json takes these there, so it takes them here too, and both read a config.json the same way
HF_DEFAULTS = {
    "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "head_dim": 256, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "tie_word_embeddings": False,
    "partial_rotary_factor": 0.25, "full_attention_interval": 4, "rope_theta": 10000.0,
}
_SIZE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "head_dim",
                "num_attention_heads", "num_key_value_heads", "linear_num_key_heads", "linear_num_value_heads",
                "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "max_position_embeddings")


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
        for f in _SIZE_FIELDS:
            if getattr(self, f) <= 0:
                problems.append(f"{f}={getattr(self, f)}; expected a positive integer")
        # (written so that NaN fails too: every comparison with NaN is false)
        if not (0 < self.rms_norm_eps < math.inf):
            problems.append(f"rms_norm_eps={self.rms_norm_eps}; expected a finite number > 0")
        if not (0 < self.rope_theta < math.inf):
            problems.append(f"rope_theta={self.rope_theta}; expected a finite number > 0")
        if not (0 < self.partial_rotary_factor <= 1):
            problems.append(f"partial_rotary_factor={self.partial_rotary_factor}; expected a number in (0, 1]")
        # the end-of-sequence ids are compared with sampled tokens: one outside the vocabulary would never stop a
        # generation. (bos and pad are only carried along, as transformers carries them: a pad_token_id of -1
        # loads there, so it loads here.)
        bad = [i for i in self.eos_token_ids if not 0 <= i < self.vocab_size]
        if bad:
            problems.append(f"eos_token_ids holds {bad[0]}; expected token ids in [0, vocab_size={self.vocab_size})")
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

        inner = " in text_config" if text is not raw else ""

        def bad(key, value, expected, where=inner):
            return ConfigError(f"{name}: field '{key}'={_show(value)}{where}; expected {expected}")

        def size(key):
            # a JSON integer: transformers' strict config refuses 48.9, "48" and true, so must we (int() would
            # quietly turn them into 48, 48 and 1); absent takes transformers' default, an explicit null is refused
            value = text.get(key, HF_DEFAULTS[key])
            if not _is_int(value):
                raise bad(key, value, "a positive integer")
            return value

        def number(key, value, where=inner):
            if not _is_number(value):
                raise bad(key, value, "a number", where)
            return float(value)

        def token_ids(key):
            # transformers writes "eos_token_id": null into a saved text_config while the top level holds the id:
            # a null inside falls back to the top level rather than hiding it
            value, where = text.get(key), inner
            if value is None and text is not raw:
                value, where = raw.get(key), ""
            if value is None:
                return ()
            ids = value if isinstance(value, list) and key == "eos_token_id" else [value]
            if not all(_is_int(i) for i in ids):
                raise bad(key, value, "a token id (an integer)" + (", a list of them" if key == "eos_token_id" else "")
                          + " or null", where)
            return tuple(ids)

        # what the model computes that qwen_lab does not make configurable: SiLU in the MLP and the conv, no biases
        act = text.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"{name}: hidden_act={act!r} is not supported (Qwen3.5's MLP and conv use "
                                        "'silu')")
        if text.get("attention_bias", False):
            raise UnsupportedModelError(f"{name}: attention_bias=true is not supported (Qwen3.5's attention "
                                        "projections have no bias)")

        # (transformers: a legacy rope_scaling given beside rope_parameters wins)
        rope_key = "rope_scaling" if text.get("rope_scaling") else "rope_parameters"
        rope = text.get(rope_key) or {}
        if not isinstance(rope, dict):
            raise ConfigError(f"{name}: 'rope_scaling' / 'rope_parameters' must be an object")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "mrope"):
            raise UnsupportedModelError(f"{name}: rope_type={rope_type!r} is not supported "
                                        "(expected 'default' or 'mrope')")
        rope_fields = {}
        for key in ("rope_theta", "partial_rotary_factor"):
            # inside the rope object first, then the legacy top-level key, then transformers' default
            where = f" in {rope_key}{inner}" if key in rope else inner
            value = rope[key] if key in rope else text.get(key, HF_DEFAULTS[key])
            rope_fields[key] = number(key, value, where)

        num_layers = size("num_hidden_layers")
        layer_types = text.get("layer_types")
        if layer_types is None:  # absent or null: transformers derives them from the interval
            interval = text.get("full_attention_interval", HF_DEFAULTS["full_attention_interval"])
            if not _is_int(interval) or interval < 1:
                raise bad("full_attention_interval", interval,
                          "a positive integer (every interval-th layer is full attention)")
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(num_layers)]
        elif not isinstance(layer_types, list) or not all(isinstance(t, str) for t in layer_types):
            raise bad("layer_types", layer_types, f"a list of '{LINEAR}' / '{FULL}' strings, one per layer")

        # transformers ties the head from the config of the class it builds: the top level of a multimodal
        # config (Qwen3_5ForConditionalGeneration), the flat config otherwise; absent means untied.
        tie = raw.get("tie_word_embeddings", HF_DEFAULTS["tie_word_embeddings"])
        if not isinstance(tie, bool):
            raise bad("tie_word_embeddings", tie, "true or false", where="")

        bos, pad = token_ids("bos_token_id"), token_ids("pad_token_id")
        return cls(
            vocab_size=size("vocab_size"),
            hidden_size=size("hidden_size"),
            intermediate_size=size("intermediate_size"),
            num_hidden_layers=num_layers,
            layer_types=tuple(layer_types),
            num_attention_heads=size("num_attention_heads"),
            num_key_value_heads=size("num_key_value_heads"),
            head_dim=size("head_dim"),  # transformers' default for Qwen3.5 is 256, not hidden / heads
            rope_theta=rope_fields["rope_theta"],
            partial_rotary_factor=rope_fields["partial_rotary_factor"],
            linear_num_key_heads=size("linear_num_key_heads"),
            linear_num_value_heads=size("linear_num_value_heads"),
            linear_key_head_dim=size("linear_key_head_dim"),
            linear_value_head_dim=size("linear_value_head_dim"),
            linear_conv_kernel_dim=size("linear_conv_kernel_dim"),
            rms_norm_eps=number("rms_norm_eps", text.get("rms_norm_eps", HF_DEFAULTS["rms_norm_eps"])),
            max_position_embeddings=size("max_position_embeddings"),
            tie_word_embeddings=tie,
            eos_token_ids=token_ids("eos_token_id"),
            bos_token_id=bos[0] if bos else None,
            pad_token_id=pad[0] if pad else None,
            name=name,
        )

    @classmethod
    def from_file(cls, path) -> "Qwen35Config":
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no such file; a Qwen3.5 snapshot needs a config.json")
        config = cls.from_dict(_read_json(path), name=str(path))
        # A released snapshot's config.json names <|endoftext|> alone; generation_config.json adds the chat's
        # <|im_end|>, and transformers' generate stops at its ids. So do qwen_lab's, theirs first.
        gen = path.parent / "generation_config.json"
        if gen.is_file():
            gen_raw = _read_json(gen, "not a valid generation config")
            if not isinstance(gen_raw, dict):
                raise ConfigError(f"{gen}: not a valid generation config (expected a JSON object, got "
                                  f"{type(gen_raw).__name__})")
            value = gen_raw.get("eos_token_id")
            ids = value if isinstance(value, list) else [] if value is None else [value]
            wrong = [i for i in ids if not _is_int(i) or not 0 <= i < config.vocab_size]
            if wrong:
                raise ConfigError(f"{gen}: not a valid generation config (eos_token_id={_show(value)}; expected "
                                  f"token ids, integers in [0, vocab_size={config.vocab_size}))")
            merged = tuple(dict.fromkeys(tuple(ids) + config.eos_token_ids))
            config = config.replace(eos_token_ids=merged)
        return config


def _read_json(path: Path, invalid: str = "not valid JSON"):
    """The JSON value in `path`; ConfigError naming the file when it cannot be read or parsed."""
    try:
        return json.loads(path.read_text())
    except OSError as e:  # permissions, an I/O error: say which file, not a bare traceback
        raise ConfigError(f"{path}: could not read the file ({e.strerror or e})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: {invalid} ({e})") from None


def _is_int(value) -> bool:
    """A JSON integer (json.loads gives int); a bool is not one, though Python's bool subclasses int."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _show(value) -> str:
    """A config value as the reader of config.json wrote it (null, true), strings and numbers as Python shows them."""
    return json.dumps(value) if value is None or isinstance(value, bool) else repr(value)


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

# The trained CPU default (qwen_lab/data/tiny_english, written by scripts/train_tiny.py): both layer kinds in the
# real 3:1 pattern, a 4096-token BPE; 3.3 M parameters, 6.6 MB in bf16. Sized for the Triton interpreter, where a
# decode step costs per program launched more than per multiply: 32-wide DeltaNet heads take one program per head
# in the decode step (64-wide ones took two), 512 MLP rows one GEMV program per call; a token takes about 1.5 times
# the tiny model's time.
TINY_ENGLISH = Qwen35Config(
    vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4, layer_types=_pattern(4),
    num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=1e7, partial_rotary_factor=0.25,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=4096, tie_word_embeddings=True,
    eos_token_ids=(4095, 4093), pad_token_id=4093, name="tiny-english",  # <|im_end|>, <|endoftext|>
)

QWEN35_0_8B = Qwen35Config(
    vocab_size=248320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
    layer_types=_pattern(24), num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    rope_theta=1e7, partial_rotary_factor=0.25, linear_num_key_heads=16, linear_num_value_heads=16,
    linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
    max_position_embeddings=262144, tie_word_embeddings=True, name="qwen3.5-0.8b",
)

PRESETS = {"tiny": TINY, "tiny-english": TINY_ENGLISH, "qwen3.5-0.8b": QWEN35_0_8B}


def get_preset(name: str) -> Qwen35Config:
    try:
        return PRESETS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; expected one of {sorted(PRESETS)}") from None
