"""Qwen35Config: both config.json forms, the presets' exact numbers, and every config it must reject."""

import json
import math
from pathlib import Path

import pytest

from qwen_lab.config import FULL, LINEAR, PRESETS, QWEN35_0_8B, TINY, Qwen35Config, get_preset
from qwen_lab.errors import ConfigError, UnsupportedModelError
from qwen_lab.export import hf_config_dict
from qwen_lab.snapshot import TINY_DIR, expected_tensors


def flat(config=TINY, **changes):
    d = config.to_hf_dict()
    d.update(changes)
    return d


def same_shapes(a: Qwen35Config, b: Qwen35Config) -> bool:
    return a.replace(name="x") == b.replace(name="x")


# ---------------------------------------------------------------- the two forms


@pytest.mark.parametrize("preset", [TINY, QWEN35_0_8B], ids=["tiny", "0.8b"])
def test_flat_form_round_trips(preset):
    assert same_shapes(Qwen35Config.from_dict(preset.to_hf_dict()), preset)


@pytest.mark.parametrize("preset", [TINY, QWEN35_0_8B], ids=["tiny", "0.8b"])
def test_multimodal_form_reads_text_config(preset):
    d = hf_config_dict(preset, "multimodal")
    assert d["model_type"] == "qwen3_5" and "vision_config" in d and "vocab_size" not in d
    assert same_shapes(Qwen35Config.from_dict(d), preset)


def test_multimodal_config_written_by_transformers(tmp_path):
    """The config.json that transformers writes for Qwen3_5ForConditionalGeneration reads back to the same shapes."""
    transformers = pytest.importorskip("transformers")
    text = {k: v for k, v in TINY.to_hf_dict().items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf = transformers.Qwen3_5Config(text_config=text, vision_config={"depth": 1, "hidden_size": 32, "num_heads": 2,
                                                                     "out_hidden_size": 64},
                                    tie_word_embeddings=True)
    hf.save_pretrained(tmp_path)
    cfg = Qwen35Config.from_file(tmp_path)
    assert same_shapes(cfg, TINY)
    assert cfg.name.endswith("config.json")


def test_legacy_rope_theta_at_top_level():
    d = flat()
    del d["rope_parameters"]
    d.update(rope_theta=5e6, partial_rotary_factor=0.5)
    cfg = Qwen35Config.from_dict(d)
    assert cfg.rope_theta == 5e6 and cfg.partial_rotary_factor == 0.5 and cfg.rotary_dim == TINY.head_dim // 2


def test_missing_layer_types_follow_the_interval_pattern():
    d = flat(num_hidden_layers=8)
    del d["layer_types"]
    assert Qwen35Config.from_dict(d).layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 2
    d["full_attention_interval"] = 2
    assert Qwen35Config.from_dict(d).layer_types == (LINEAR, FULL) * 4


def test_eos_ids_int_or_list():
    assert Qwen35Config.from_dict(flat(eos_token_id=7)).eos_token_ids == (7,)
    assert Qwen35Config.from_dict(flat(eos_token_id=[511, 509])).eos_token_ids == (511, 509)


def test_generation_config_adds_its_end_of_sequence_ids_first(tmp_path):
    # as a released snapshot: config.json names <|endoftext|> alone, generation_config.json adds <|im_end|>;
    # transformers' generate stops at both, so must qwen_lab's (the chat's turns end with <|im_end|>)
    (tmp_path / "config.json").write_text(json.dumps(flat(eos_token_id=509)))
    assert Qwen35Config.from_file(tmp_path).eos_token_ids == (509,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [511, 509], "do_sample": True}))
    assert Qwen35Config.from_file(tmp_path).eos_token_ids == (511, 509)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 511}))
    assert Qwen35Config.from_file(tmp_path).eos_token_ids == (511, 509)
    (tmp_path / "generation_config.json").write_text("[1, 2")
    with pytest.raises(ConfigError, match="generation_config.json: not a valid generation config"):
        Qwen35Config.from_file(tmp_path)


def test_missing_head_dim_takes_transformers_default():
    # Qwen3.5's head_dim is not hidden_size / num_attention_heads (1024 / 8 = 128 against 256 for the 0.8B)
    d = QWEN35_0_8B.to_hf_dict()
    del d["head_dim"]
    assert Qwen35Config.from_dict(d).head_dim == 256


def test_legacy_rope_scaling_beside_rope_parameters_wins_as_in_transformers():
    d = flat(rope_scaling={"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5})
    cfg = Qwen35Config.from_dict(d)
    assert cfg.rope_theta == 5e5 and cfg.partial_rotary_factor == 0.5


@pytest.mark.parametrize("field, value, fragment", [
    ("hidden_act", "gelu", "hidden_act='gelu' is not supported"),
    ("attention_bias", True, "attention_bias=true is not supported"),
])
def test_math_qwen_lab_does_not_implement_is_refused(field, value, fragment):
    # loaded silently, a GELU config would give logits off by 1e-2; a biased one failed naming the bias tensor
    with pytest.raises(UnsupportedModelError, match=fragment):
        Qwen35Config.from_dict(flat(**{field: value}))
    assert Qwen35Config.from_dict(flat(hidden_act="silu", attention_bias=False)).head_dim == TINY.head_dim


def test_from_file_reads_a_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(flat()))
    assert same_shapes(Qwen35Config.from_file(tmp_path), TINY)


# ---------------------------------------------------------------- presets


def test_qwen35_0_8b_preset_matches_the_model_card():
    c = QWEN35_0_8B
    assert (c.hidden_size, c.num_hidden_layers, c.intermediate_size, c.vocab_size) == (1024, 24, 3584, 248320)
    assert c.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 6
    assert c.tie_word_embeddings
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (8, 2, 256)
    assert c.rotary_dim == 64 and c.partial_rotary_factor == 0.25 and c.rope_theta == 1e7
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (16, 16)
    assert (c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim) == (128, 128, 4)
    assert c.rms_norm_eps == 1e-6
    # derived sizes the kernels use
    assert c.linear_conv_dim == 2 * 16 * 128 + 16 * 128 == 6144
    assert c.linear_in_proj_dim == 6144 + 2048 + 32
    assert c.attn_q_dim == 4096 and c.attn_kv_dim == 512 and c.attn_in_proj_dim == 5120
    assert (c.num_linear_layers, c.num_full_layers) == (18, 6)


def test_qwen35_0_8b_parameter_count():
    shapes = expected_tensors(QWEN35_0_8B)
    assert sum(math.prod(s) for s in shapes.values()) == 752_393_024
    assert math.prod(shapes["embed_tokens.weight"]) == 254_279_680
    assert "lm_head.weight" not in shapes  # tied


def test_tiny_preset_and_its_committed_config():
    assert get_preset("tiny") is TINY and get_preset("Qwen3.5-0.8B") is QWEN35_0_8B
    assert set(PRESETS) == {"tiny", "tiny-english", "qwen3.5-0.8b"}
    committed = Qwen35Config.from_file(TINY_DIR / "config.json")
    # the committed snapshot adds the tiny tokenizer's special-token ids; every shape is TINY's
    assert same_shapes(committed.replace(eos_token_ids=TINY.eos_token_ids, pad_token_id=TINY.pad_token_id,
                                         bos_token_id=TINY.bos_token_id), TINY)
    assert committed.eos_token_ids == (511, 509) and committed.pad_token_id == 509
    assert TINY.vocab_size == 512 and TINY.layer_types == (LINEAR, LINEAR, LINEAR, FULL)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'qwen9'"):
        get_preset("qwen9")


# ---------------------------------------------------------------- what it must reject


def test_unsupported_model_type():
    with pytest.raises(UnsupportedModelError, match="model_type='llama'"):
        Qwen35Config.from_dict(flat(model_type="llama"), name="/snap/config.json")


def test_missing_model_type():
    d = flat()
    del d["model_type"]
    with pytest.raises(UnsupportedModelError, match="model_type=None"):
        Qwen35Config.from_dict(d)


def test_mixture_of_experts_is_rejected():
    with pytest.raises(UnsupportedModelError, match="mixture-of-experts"):
        Qwen35Config.from_dict(flat(num_experts=64))


def test_null_field_is_named():
    # absent takes transformers' default (below); an explicit null is refused, as transformers' strict config does
    d = flat(hidden_size=None)
    with pytest.raises(ConfigError, match="field 'hidden_size'=null; expected a positive integer"):
        Qwen35Config.from_dict(d)


def test_null_field_in_text_config_is_named():
    d = hf_config_dict(TINY, "multimodal")
    d["text_config"]["linear_num_key_heads"] = None
    with pytest.raises(ConfigError, match="field 'linear_num_key_heads'=null in text_config"):
        Qwen35Config.from_dict(d)


# transformers 5.17's Qwen3_5TextConfig defaults, spelled out so that a change on either side shows here
HF_TEXT_DEFAULTS = dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=32768, rms_norm_eps=1e-6,
                        head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128,
                        linear_num_key_heads=16, linear_num_value_heads=32, tie_word_embeddings=False,
                        partial_rotary_factor=0.25, rope_theta=10000.0)


@pytest.mark.parametrize("form", ["flat", "multimodal"])
def test_absent_fields_take_transformers_defaults(form):
    raw = {"model_type": "qwen3_5_text"} if form == "flat" else {"model_type": "qwen3_5", "text_config": {}}
    cfg = Qwen35Config.from_dict(raw)
    for field, value in HF_TEXT_DEFAULTS.items():
        assert getattr(cfg, field) == value, field
    assert cfg.layer_types == (LINEAR, LINEAR, LINEAR, FULL) * 8  # full_attention_interval 4
    assert cfg.eos_token_ids == () and cfg.bos_token_id is None and cfg.pad_token_id is None


def test_absent_fields_read_as_transformers_reads_them():
    """Each key dropped in turn from a full config.json: qwen_lab and transformers read the same config."""
    transformers = pytest.importorskip("transformers")
    full = {k: v for k, v in QWEN35_0_8B.to_hf_dict().items() if k not in ("architectures", "torch_dtype")}
    for key in [k for k in full if k in HF_TEXT_DEFAULTS or k in ("layer_types", "rope_parameters")]:
        # (without num_hidden_layers the 24 layer_types would disagree with the default 32: drop both)
        d = {k: v for k, v in full.items() if k != key and not (key == "num_hidden_layers" and k == "layer_types")}
        ours = Qwen35Config.from_dict(d)
        hf = transformers.Qwen3_5TextConfig(**{k: v for k, v in d.items() if k != "model_type"})
        for field in HF_TEXT_DEFAULTS:
            theirs = (hf.rope_parameters[field] if field in ("rope_theta", "partial_rotary_factor")
                      else getattr(hf, field))
            assert getattr(ours, field) == theirs, f"without '{key}': {field} {getattr(ours, field)} vs {theirs}"
        assert list(ours.layer_types) == hf.layer_types, f"without '{key}'"


def test_multimodal_without_text_config():
    with pytest.raises(ConfigError, match="text_config"):
        Qwen35Config.from_dict({"model_type": "qwen3_5", "vision_config": {}})


def test_bad_layer_types():
    with pytest.raises(ConfigError, match="sliding_attention"):
        Qwen35Config.from_dict(flat(layer_types=[LINEAR, LINEAR, "sliding_attention", FULL]))


def test_layer_types_of_the_wrong_length():
    with pytest.raises(ConfigError, match="layer_types has 3 entries, expected num_hidden_layers=4"):
        Qwen35Config.from_dict(flat(layer_types=[LINEAR, LINEAR, FULL]))


def test_attention_heads_not_a_multiple_of_kv_heads():
    with pytest.raises(ConfigError, match="num_attention_heads=3 is not a multiple of num_key_value_heads=2"):
        Qwen35Config.from_dict(flat(num_attention_heads=3))


@pytest.mark.parametrize("field", ["num_attention_heads", "num_key_value_heads", "linear_num_key_heads",
                                   "linear_num_value_heads"])
def test_zero_heads_are_named_not_divided_by(field):
    with pytest.raises(ConfigError, match=f"{field}=0; expected a positive integer"):
        Qwen35Config.from_dict(flat(**{field: 0}))


def test_value_heads_not_a_multiple_of_key_heads():
    with pytest.raises(ConfigError, match="linear_num_value_heads=3 is not a multiple of linear_num_key_heads=2"):
        Qwen35Config.from_dict(flat(linear_num_value_heads=3))


def test_field_of_the_wrong_type():
    with pytest.raises(ConfigError, match="'hidden_size'='big'"):
        Qwen35Config.from_dict(flat(hidden_size="big"))


def test_invalid_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "qwen3_5_text", "hidden_size": 64,')
    with pytest.raises(ConfigError, match="not valid JSON") as e:
        Qwen35Config.from_file(path)
    assert str(path) in str(e.value)


def test_json_that_is_not_an_object(tmp_path):
    (tmp_path / "config.json").write_text("[1, 2, 3]")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        Qwen35Config.from_file(tmp_path)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="no such file") as e:
        Qwen35Config.from_file(tmp_path)
    assert str(tmp_path / "config.json") in str(e.value)


def test_multimodal_config_ties_the_head_from_the_top_level_like_transformers():
    from qwen_lab.config import TINY, Qwen35Config

    text = {k: v for k, v in TINY.to_hf_dict().items() if k not in ("architectures",)}
    text["tie_word_embeddings"] = False
    raw = {"model_type": "qwen3_5", "text_config": text, "tie_word_embeddings": True}
    assert Qwen35Config.from_dict(raw).tie_word_embeddings is True
    text["tie_word_embeddings"] = True
    del raw["tie_word_embeddings"]
    assert Qwen35Config.from_dict(raw).tie_word_embeddings is False


def write_config(tmp_path, d, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return path


def without_layer_types(**changes):
    d = flat(**changes)
    del d["layer_types"]
    return d


def with_rope(**changes):
    d = flat()
    d["rope_parameters"] = dict(d["rope_parameters"], **changes)
    return d


# each malformed field is one ConfigError naming the file and the field, never a bare TypeError / ValueError /
# ZeroDivisionError from inside the parser
@pytest.mark.parametrize("d, fragment", [
    (with_rope(rope_theta=None), "field 'rope_theta'=null in rope_parameters; expected a number"),
    (with_rope(rope_theta="abc"), "field 'rope_theta'='abc' in rope_parameters; expected a number"),
    (with_rope(partial_rotary_factor=None), "field 'partial_rotary_factor'=null in rope_parameters"),
    (without_layer_types(full_attention_interval=0), "field 'full_attention_interval'=0; expected a positive integer"),
    (without_layer_types(full_attention_interval="four"), "field 'full_attention_interval'='four'"),
    (without_layer_types(full_attention_interval=None), "field 'full_attention_interval'=null"),
    (flat(layer_types=[{"a": 1}, LINEAR, LINEAR, FULL]), "field 'layer_types'=[{'a': 1}, "),
    (flat(layer_types=LINEAR), "field 'layer_types'='linear_attention'; expected a list"),
    (flat(eos_token_id="abc"), "field 'eos_token_id'='abc'; expected a token id"),
    (flat(eos_token_id=[1, "x"]), "field 'eos_token_id'=[1, 'x']; expected a token id"),
    (flat(bos_token_id="abc"), "field 'bos_token_id'='abc'; expected a token id"),
], ids=["theta-null", "theta-str", "partial-null", "interval-0", "interval-str", "interval-null", "layer-types-dict",
        "layer-types-str", "eos-str", "eos-list-str", "bos-str"])
def test_malformed_field_is_named_with_the_file(tmp_path, d, fragment):
    path = write_config(tmp_path, d)
    with pytest.raises(ConfigError) as e:
        Qwen35Config.from_file(path)
    assert str(e.value).startswith(f"{path}: "), str(e.value)
    assert fragment in str(e.value)


# values int() / bool() / float() used to accept silently; transformers' strict config refuses them too
@pytest.mark.parametrize("changes, fragment", [
    (dict(hidden_size=48.9), "field 'hidden_size'=48.9; expected a positive integer"),
    (dict(hidden_size=64.0), "field 'hidden_size'=64.0; expected a positive integer"),
    (dict(hidden_size=True), "field 'hidden_size'=true; expected a positive integer"),
    (dict(hidden_size="64"), "field 'hidden_size'='64'; expected a positive integer"),
    (dict(num_hidden_layers=4.5), "field 'num_hidden_layers'=4.5"),
    (dict(head_dim=-32), "head_dim=-32; expected a positive integer"),
    (dict(max_position_embeddings=0), "max_position_embeddings=0; expected a positive integer"),
    (dict(tie_word_embeddings="false"), "field 'tie_word_embeddings'='false'; expected true or false"),
    (dict(tie_word_embeddings=None), "field 'tie_word_embeddings'=null; expected true or false"),
    (dict(tie_word_embeddings=1), "field 'tie_word_embeddings'=1; expected true or false"),
    (dict(rms_norm_eps=-1), "rms_norm_eps=-1.0; expected a finite number > 0"),
    (dict(rms_norm_eps=0.0), "rms_norm_eps=0.0; expected a finite number > 0"),
    (dict(rms_norm_eps=float("nan")), "rms_norm_eps=nan; expected a finite number > 0"),
    (dict(rms_norm_eps="1e-6"), "field 'rms_norm_eps'='1e-6'; expected a number"),
    (dict(rope_parameters={"rope_theta": float("inf")}), "rope_theta=inf; expected a finite number > 0"),
    (dict(rope_parameters={"rope_theta": 0}), "rope_theta=0.0; expected a finite number > 0"),
    (dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 1.5}),
     "partial_rotary_factor=1.5; expected a number in (0, 1]"),
    (dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0}), "partial_rotary_factor=0.0"),
    (dict(eos_token_id=True), "field 'eos_token_id'=true; expected a token id"),
    (dict(eos_token_id=[511, 512]), "eos_token_ids holds 512; expected token ids in [0, vocab_size=512)"),
    (dict(pad_token_id=[1]), "field 'pad_token_id'=[1]; expected a token id (an integer) or null"),
], ids=lambda v: json.dumps(v) if isinstance(v, dict) else None)
def test_bad_value_is_refused_naming_the_field(tmp_path, changes, fragment):
    path = write_config(tmp_path, flat(**changes))
    with pytest.raises(ConfigError) as e:
        Qwen35Config.from_file(path)
    assert str(path) in str(e.value) and fragment in str(e.value), str(e.value)


def test_values_transformers_accepts_are_read():
    # a JSON integer where a float is expected, partial_rotary_factor 1 (all of the head rotates), no eos at all
    cfg = Qwen35Config.from_dict(flat(rope_parameters={"rope_theta": 10000, "partial_rotary_factor": 1},
                                      eos_token_id=[], pad_token_id=None, rms_norm_eps=1e-5))
    assert cfg.rope_theta == 10000.0 and cfg.rotary_dim == TINY.head_dim
    assert cfg.eos_token_ids == () and cfg.pad_token_id is None and cfg.rms_norm_eps == 1e-5
    # bos and pad are carried, never compared with a token: transformers loads a pad of -1 (and one past the
    # vocabulary), and so does qwen_lab
    carried = Qwen35Config.from_dict(flat(pad_token_id=-1, bos_token_id=99999))
    assert carried.pad_token_id == -1 and carried.bos_token_id == 99999
    d = without_layer_types()
    d["layer_types"] = None  # transformers derives them from the interval, as when absent
    assert Qwen35Config.from_dict(d).layer_types == TINY.layer_types


def test_generation_config_with_bad_eos_ids_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(flat()))
    for value in ("abc", [511, 9999], True):
        write_config(tmp_path, {"eos_token_id": value}, "generation_config.json")
        with pytest.raises(ConfigError, match=r"generation_config.json: not a valid generation config \(eos_token_id="):
            Qwen35Config.from_file(tmp_path)


@pytest.mark.parametrize("key, expected", [("eos_token_id", (7,)), ("bos_token_id", 7), ("pad_token_id", 7)])
def test_null_in_text_config_falls_back_to_the_top_level(key, expected):
    # transformers writes "eos_token_id": null into the text_config it saves while the top level holds the id
    d = hf_config_dict(TINY, "multimodal")
    d["text_config"][key] = None
    d[key] = 7
    cfg = Qwen35Config.from_dict(d)
    assert (cfg.eos_token_ids if key == "eos_token_id" else getattr(cfg, key)) == expected
    d["text_config"][key] = 9  # a value inside still wins
    cfg = Qwen35Config.from_dict(d)
    assert (cfg.eos_token_ids if key == "eos_token_id" else getattr(cfg, key)) == ((9,) if key == "eos_token_id" else 9)


@pytest.mark.parametrize("name", ["config.json", "generation_config.json"])
def test_unreadable_file_is_named(tmp_path, monkeypatch, name):
    (tmp_path / "config.json").write_text(json.dumps(flat()))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 511}))
    target, read_text = tmp_path / name, Path.read_text

    def denied(self, *args, **kwargs):
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    with pytest.raises(ConfigError, match=f"{target}: could not read the file \\(Permission denied\\)"):
        Qwen35Config.from_file(tmp_path)
