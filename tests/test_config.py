"""Qwen35Config: both config.json forms, the presets' exact numbers, and every config it must reject."""

import json
import math

import pytest

from qwen_lab.config import FULL, LINEAR, PRESETS, QWEN35_0_8B, TINY, Qwen35Config, get_preset
from qwen_lab.errors import ConfigError, UnsupportedModelError
from qwen_lab.weights import TINY_DIR, expected_tensors, hf_config_dict


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
    assert set(PRESETS) == {"tiny", "qwen3.5-0.8b"}
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


def test_missing_field_is_named():
    d = flat()
    del d["hidden_size"]
    with pytest.raises(ConfigError, match="missing field 'hidden_size'"):
        Qwen35Config.from_dict(d)


def test_missing_field_in_text_config_is_named():
    d = hf_config_dict(TINY, "multimodal")
    del d["text_config"]["linear_num_key_heads"]
    with pytest.raises(ConfigError, match="missing field 'linear_num_key_heads' in text_config"):
        Qwen35Config.from_dict(d)


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
