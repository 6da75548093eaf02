"""The loader: the committed tiny snapshot, both key layouts, shards, tied/untied, mixed dtypes, random weights,
and every bad input it must reject with a message naming the file and the tensor."""

import json
import math
import struct
import warnings
from pathlib import Path

import pytest
import torch

from hf_models import hf_logits, make_hf_model, random_tiny_config, save_hf_snapshot
from qwen_lab.config import FULL, LINEAR, PRESETS, QWEN35_0_8B, TINY, Qwen35Config
from qwen_lab.errors import CheckpointError, ConfigError, QwenLabError, UnsupportedModelError
from qwen_lab import snapshot, tiny
from qwen_lab.export import save_snapshot
from qwen_lab.safetensors_file import read_safetensors_header
from qwen_lab.snapshot import INDEX_FILE, TINY_DIR, expected_tensors, resolve_source
from qwen_lab.tiny import build_tiny_checkpoint
from qwen_lab.weights import load_weights, random_state_dict, random_weights

UNTIED = TINY.replace(tie_word_embeddings=False)


# ---------------------------------------------------------------- helpers


def load(source, **kw):
    kw.setdefault("progress", False)
    return load_weights(source, device="cpu", **kw)


TINY_EOS = json.loads((TINY_DIR / "generation_config.json").read_text())["eos_token_id"]


def write(tmp_path, config=TINY, state=None, layout="causal", shard=None, name="snap"):
    """A snapshot of `config` with the given (default: random_state_dict) HF-named tensors."""
    state = random_state_dict(config, seed=0, layout=layout) if state is None else state
    return save_snapshot(tmp_path / name, config, state, layout=layout, max_shard_bytes=shard, tokenizer_dir=TINY_DIR)


def unprefixed(state: dict, prefix: str) -> dict:
    return {(k if k == "lm_head.weight" else k[len(prefix):]): v for k, v in state.items()
            if k == "lm_head.weight" or k.startswith(prefix)}


def assert_fused(config: Qwen35Config, w, ref: dict, dtype=torch.float32):
    """Every field of ModelWeights equals the unfused reference tensors (unprefixed names), block of rows by block."""

    def same(t, expected, what, want_dtype=dtype, contiguous=True):
        assert t.dtype == want_dtype, f"{what}: dtype {t.dtype}, expected {want_dtype}"
        assert t.is_contiguous() == contiguous, f"{what}: contiguous is {t.is_contiguous()}, expected {contiguous}"
        assert tuple(t.shape) == tuple(expected.shape), f"{what}: shape {tuple(t.shape)} vs {tuple(expected.shape)}"
        assert torch.equal(t.cpu(), expected.to(want_dtype)), f"{what}: values differ"

    def rows(t, names, what):
        start = 0
        for n in names:
            r = ref[n]
            same(t[start:start + r.shape[0]], r, f"{what} rows {start}..{start + r.shape[0]} ({n})")
            start += r.shape[0]
        assert start == t.shape[0], f"{what}: {t.shape[0]} rows, the parts add up to {start}"

    same(w.embed, ref["embed_tokens.weight"], "embed")
    same(w.final_norm, ref["norm.weight"], "final_norm", torch.float32)
    if config.tie_word_embeddings:
        assert w.lm_head is w.embed
    else:
        assert w.lm_head is not w.embed
        same(w.lm_head, ref["lm_head.weight"], "lm_head")
    assert len(w.layers) == config.num_hidden_layers
    for i, (layer, kind) in enumerate(zip(w.layers, config.layer_types)):
        p = f"layers.{i}."
        assert layer.kind == kind
        same(layer.input_norm, ref[p + "input_layernorm.weight"], f"{p}input_norm", torch.float32)
        same(layer.post_norm, ref[p + "post_attention_layernorm.weight"], f"{p}post_norm", torch.float32)
        rows(layer.gate_up, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], f"{p}gate_up")
        same(layer.down, ref[p + "mlp.down_proj.weight"], f"{p}down")
        if kind == LINEAR:
            a = p + "linear_attn."
            assert layer.in_proj.shape == (config.linear_in_proj_dim, config.hidden_size)
            rows(layer.in_proj, [a + n + ".weight" for n in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")],
                 f"{p}in_proj")
            # stored tap by tap ([W, C]: each tap's channels contiguous); the kernels take its [C, W] view
            same(layer.conv, ref[a + "conv1d.weight"][:, 0, :], f"{p}conv", contiguous=False)
            assert layer.conv.stride() == (1, config.linear_conv_dim), f"{p}conv strides {layer.conv.stride()}"
            same(layer.A_log, ref[a + "A_log"], f"{p}A_log", torch.float32)
            same(layer.dt_bias, ref[a + "dt_bias"], f"{p}dt_bias", torch.float32)
            same(layer.norm, ref[a + "norm.weight"], f"{p}norm", torch.float32)
            same(layer.out_proj, ref[a + "out_proj.weight"], f"{p}out_proj")
            assert layer.qkv_proj is None and layer.q_norm is None and layer.o_proj is None
        else:
            a = p + "self_attn."
            assert layer.qkv_proj.shape == (config.attn_in_proj_dim, config.hidden_size)
            rows(layer.qkv_proj, [a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"], f"{p}qkv_proj")
            same(layer.q_norm, ref[a + "q_norm.weight"], f"{p}q_norm", torch.float32)
            same(layer.k_norm, ref[a + "k_norm.weight"], f"{p}k_norm", torch.float32)
            same(layer.o_proj, ref[a + "o_proj.weight"], f"{p}o_proj")
            assert layer.in_proj is None and layer.A_log is None and layer.conv is None


def expected_nbytes(config, matrix_bytes):
    total = 0
    for name, shape in expected_tensors(config).items():
        total += math.prod(shape) * (4 if len(shape) == 1 else matrix_bytes)
    return total


def raises(tmp_source, exc=CheckpointError, *needles):
    with pytest.raises(exc) as e:
        load(tmp_source)
    msg = str(e.value)
    for needle in needles:
        assert str(needle) in msg, f"{needle!r} not in the message: {msg}"
    return msg


# ---------------------------------------------------------------- the committed tiny snapshot


def test_tiny_loads_and_fuses_random_state_dict():
    config, w = load("tiny")
    assert config.name == "tiny"
    assert config.replace(eos_token_ids=TINY.eos_token_ids, pad_token_id=TINY.pad_token_id) == TINY
    assert_fused(config, w, unprefixed(random_state_dict(TINY, seed=0), "model."))


def test_tiny_in_bf16_keeps_1d_parameters_in_fp32():
    config, w = load("tiny", dtype=torch.bfloat16)
    assert_fused(config, w, unprefixed(random_state_dict(TINY, seed=0), "model."), dtype=torch.bfloat16)
    assert w.nbytes() == expected_nbytes(TINY, 2)


def test_tiny_is_a_real_snapshot_with_mixed_dtypes():
    header = read_safetensors_header(TINY_DIR / "model.safetensors")
    assert set(header) == {"model." + k for k in expected_tensors(TINY)}
    for name, info in header.items():
        fp32 = name.endswith(("linear_attn.A_log", "linear_attn.norm.weight"))
        assert info.dtype == ("F32" if fp32 else "BF16"), name
    size = sum(f.stat().st_size for f in TINY_DIR.iterdir())
    assert size < 700_000
    assert {f.name for f in TINY_DIR.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json",
                                                    "tokenizer_config.json", "generation_config.json"}


def test_build_tiny_checkpoint_is_byte_identical_to_the_committed_files(tmp_path):
    build_tiny_checkpoint(tmp_path / "a")
    built = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert built == sorted(p.name for p in TINY_DIR.iterdir())
    for name in built:
        assert (tmp_path / "a" / name).read_bytes() == (TINY_DIR / name).read_bytes(), (
            f"{name} differs from qwen_lab/data/tiny/{name}: rebuild with `python -m qwen_lab.tiny "
            "qwen_lab/data/tiny` and commit it")


def test_build_tiny_command_line(tmp_path, capsys):
    assert tiny.main([str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "model.safetensors").read_bytes() == (TINY_DIR / "model.safetensors").read_bytes()
    assert snapshot.main([str(tmp_path / "t")]) == 0
    assert "OK" in capsys.readouterr().out


def test_check_command_reports_a_bad_snapshot(tmp_path, capsys):
    snap = write(tmp_path, TINY.replace(hidden_size=96), random_state_dict(TINY))
    assert snapshot.main([str(snap)]) == 2
    assert "hidden_size=96" in capsys.readouterr().err


# ---------------------------------------------------------------- snapshots written by transformers


def test_sharded_multimodal_snapshot_saved_by_transformers(tmp_path):
    model = make_hf_model(TINY, seed=1, multimodal=True)
    snap = save_hf_snapshot(model, tmp_path / "mm", max_shard_size="100KB")
    assert (snap / INDEX_FILE).is_file() and len(list(snap.glob("model-*.safetensors"))) >= 3
    assert any(k.startswith("model.visual.") for k in json.loads((snap / INDEX_FILE).read_text())["weight_map"])
    config, w = load(snap)
    assert config.replace(name="tiny") == TINY.replace(name="tiny")
    assert_fused(config, w, unprefixed(model.state_dict(), "model.language_model."))


def test_causal_untied_snapshot_saved_by_transformers(tmp_path):
    config = random_tiny_config(seed=3, tie_word_embeddings=False)
    model = make_hf_model(config, seed=2)
    snap = save_hf_snapshot(model, tmp_path / "causal")
    assert "lm_head.weight" in read_safetensors_header(snap / "model.safetensors")
    loaded, w = load(snap)
    assert loaded.replace(name=config.name) == config
    assert_fused(config, w, unprefixed(model.state_dict(), "model."))


def test_causal_tied_snapshot_saved_by_transformers(tmp_path):
    config = random_tiny_config(seed=1, tie_word_embeddings=True)
    model = make_hf_model(config, seed=0)
    loaded, w = load(save_hf_snapshot(model, tmp_path / "tied", max_shard_size="50KB"))
    assert w.lm_head is w.embed
    assert_fused(config, w, unprefixed(model.state_dict(), "model."))


@pytest.mark.parametrize("layout", ["causal", "multimodal"])
def test_snapshot_written_here_loads_in_transformers(tmp_path, layout):
    """save_snapshot writes what transformers reads: the same names, shapes and values, in either layout."""
    transformers = pytest.importorskip("transformers")
    state = random_state_dict(UNTIED, seed=4, layout=layout, dtype=torch.float32)
    snap = write(tmp_path, UNTIED, state, layout=layout, shard=100_000 if layout == "multimodal" else None)
    cls = transformers.Qwen3_5ForCausalLM if layout == "causal" else transformers.Qwen3_5ForConditionalGeneration
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # the multimodal snapshot has no vision weights: that is expected
    try:
        model = cls.from_pretrained(snap, dtype=torch.float32)
    finally:
        transformers.logging.set_verbosity(verbosity)
    assert model.config.tie_word_embeddings is False
    hf_state = model.state_dict()
    for name, t in state.items():
        assert torch.equal(hf_state[name], t), name


# ---------------------------------------------------------------- layouts, shards, tying, dtypes


@pytest.mark.parametrize("layout", ["causal", "multimodal"])
def test_layouts_single_file_and_sharded(tmp_path, layout):
    config = random_tiny_config(seed=5)
    state = random_state_dict(config, seed=7, layout=layout)
    ref = unprefixed(state, "model." if layout == "causal" else "model.language_model.")
    for shard in (None, 30_000):
        loaded, w = load(write(tmp_path, config, state, layout=layout, shard=shard, name=f"s{shard}"))
        # (the end-of-sequence ids also come from the tiny tokenizer's generation_config.json, written beside)
        assert loaded.replace(name=config.name, eos_token_ids=config.eos_token_ids) == config
        assert loaded.eos_token_ids == tuple(dict.fromkeys(list(TINY_EOS) + list(config.eos_token_ids)))
        assert_fused(config, w, ref)


def test_vision_and_mtp_tensors_are_ignored(tmp_path):
    state = random_state_dict(TINY, layout="multimodal")
    state["model.visual.blocks.0.attn.qkv.weight"] = torch.ones(96, 32, dtype=torch.bfloat16)
    state["mtp.fc.weight"] = torch.ones(64, 128, dtype=torch.bfloat16)
    state["mtp.layers.0.mlp.up_proj.weight"] = torch.ones(160, 64, dtype=torch.bfloat16)
    _, w = load(write(tmp_path, TINY, state, layout="multimodal", shard=100_000))
    assert_fused(TINY, w, unprefixed(random_state_dict(TINY), "model."))


def test_model_mtp_prefix_is_ignored_in_the_causal_layout(tmp_path):
    state = random_state_dict(TINY)
    state["model.mtp.layers.0.mlp.up_proj.weight"] = torch.ones(160, 64, dtype=torch.bfloat16)
    _, w = load(write(tmp_path, TINY, state))
    assert w.lm_head is w.embed


def test_untied_head_is_its_own_tensor(tmp_path):
    state = random_state_dict(UNTIED, seed=3)
    config, w = load(write(tmp_path, UNTIED, state))
    assert not config.tie_word_embeddings and w.lm_head is not w.embed
    assert torch.equal(w.lm_head, state["lm_head.weight"].float())
    assert w.nbytes() == expected_nbytes(UNTIED, 4)


def test_tied_config_with_a_different_stored_head_uses_it_untied_as_transformers_does(tmp_path):
    state = random_state_dict(TINY)
    state["lm_head.weight"] = torch.zeros(512, 64, dtype=torch.bfloat16)
    with pytest.warns(UserWarning, match="stores an lm_head.weight that differs from the embedding") as record:
        config, w = load(write(tmp_path, TINY, state))
    assert len(record) == 1
    assert w.lm_head is not w.embed and w.lm_head.abs().sum() == 0 and w.embed.abs().sum() > 0
    # the config says what the weights are, so that what is built from it (to_hf_state_dict) keeps the head
    assert not config.tie_word_embeddings
    assert w.nbytes() == expected_nbytes(UNTIED, 4)


def test_tied_config_with_an_equal_stored_head_ties_it(tmp_path):
    state = random_state_dict(TINY)
    state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config, w = load(write(tmp_path, TINY, state))
    assert config.tie_word_embeddings and w.lm_head is w.embed
    assert w.nbytes() == expected_nbytes(TINY, 4)  # the tied head counted once


def test_tied_config_with_a_stored_head_of_the_wrong_shape(tmp_path):
    state = random_state_dict(TINY)
    state["lm_head.weight"] = torch.zeros(7, 3, dtype=torch.bfloat16)
    snap = write(tmp_path, TINY, state)
    raises(snap, CheckpointError, snap / "model.safetensors", "tensor 'lm_head.weight' has shape (7, 3), expected "
           "(512, 64)", "vocab_size=512")


def test_tied_checkpoint_storing_only_the_head_uses_it_as_the_embedding(tmp_path):
    # transformers' tie_weights swaps source and target when only lm_head.weight is stored
    state = random_state_dict(TINY)
    state["lm_head.weight"] = state.pop("model.embed_tokens.weight")
    config, w = load(write(tmp_path, TINY, state))
    assert config.tie_word_embeddings and w.lm_head is w.embed
    assert_fused(TINY, w, unprefixed(random_state_dict(TINY), "model."))


@pytest.mark.parametrize("multimodal", [False, True], ids=["causal", "multimodal"])
def test_tied_config_with_a_different_stored_head_gives_transformers_logits(tmp_path, multimodal):
    transformers = pytest.importorskip("transformers")
    from qwen_lab import load_model
    from qwen_lab.course import checks

    hf = make_hf_model(UNTIED, seed=2, multimodal=multimodal)
    snap = save_hf_snapshot(hf, tmp_path / "snap")
    config = json.loads((snap / "config.json").read_text())
    config["tie_word_embeddings"] = True  # the key transformers reads in either layout
    (snap / "config.json").write_text(json.dumps(config))
    cls = transformers.Qwen3_5ForConditionalGeneration if multimodal else transformers.Qwen3_5ForCausalLM
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its own "we will NOT tie them" warning
    try:
        theirs = cls.from_pretrained(snap, dtype=torch.float32, attn_implementation="eager").eval()
    finally:
        transformers.logging.set_verbosity(verbosity)
    ids = torch.tensor([3, 17, 250, 5, 99, 1, 42, 300, 7])
    want = hf_logits(theirs, ids)
    with pytest.warns(UserWarning, match="untied LM head"):
        ours = load_model(str(snap), device="cpu", dtype=torch.float32, backend="torch")
    assert checks.relative_error(ours.forward(ids), want) <= 1e-4
    ours.weights.lm_head = ours.weights.embed  # what the loader did before: far from transformers' logits
    assert checks.relative_error(ours.forward(ids), want) > 0.5


def test_mixed_dtypes_convert_per_the_rule(tmp_path):
    """fp32 A_log / gated norm beside bf16 matrices, and an fp16 tensor: matrices -> model dtype, 1-D -> fp32."""
    state = random_state_dict(TINY, dtype=torch.bfloat16)
    state["model.layers.1.mlp.down_proj.weight"] = state["model.layers.1.mlp.down_proj.weight"].half()
    state["model.layers.0.linear_attn.dt_bias"] = state["model.layers.0.linear_attn.dt_bias"].float()
    snap = write(tmp_path, TINY, state)
    header = read_safetensors_header(snap / "model.safetensors")
    assert header["model.layers.0.linear_attn.A_log"].dtype == "F32"
    assert header["model.layers.0.linear_attn.in_proj_qkv.weight"].dtype == "BF16"
    assert header["model.layers.1.mlp.down_proj.weight"].dtype == "F16"
    for dtype in (torch.float32, torch.bfloat16):
        _, w = load(snap, dtype=dtype)
        assert_fused(TINY, w, unprefixed(state, "model."), dtype=dtype)


def test_progress_false_prints_nothing(tmp_path, capfd):
    load("tiny", progress=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    load("tiny", progress=True)
    out, err = capfd.readouterr()
    assert out == ""  # the progress bar goes to stderr


def test_default_device_and_dtype_come_from_the_runtime(rt):
    _, w = load_weights("tiny", progress=False)
    assert w.embed.device.type == rt.device.type and w.embed.dtype == rt.dtype
    assert w.final_norm.dtype == torch.float32


def test_drawing_a_preset_shows_its_progress_and_progress_false_silences_it(capfd, monkeypatch):
    """The 0.8B preset's random weights take 10-13 s on a CPU: a bar says what is happening (tqdm's delay keeps a
    quick draw silent; here the delay is removed so the tiny config's draw shows)."""
    import tqdm

    original = tqdm.tqdm
    monkeypatch.setattr(tqdm, "tqdm", lambda *a, **k: original(*a, **{**k, "delay": 0}))
    random_weights(TINY, device="cpu", dtype=torch.float32)
    assert "drawing tiny" in capfd.readouterr().err
    random_weights(TINY, device="cpu", dtype=torch.float32, progress=False)
    assert capfd.readouterr().err == ""
    # load_weights hands its own progress= on to a preset's draw
    import qwen_lab.weights as qw
    seen = []
    monkeypatch.setattr(qw, "random_weights", lambda *a, **k: seen.append(k.get("progress")))
    qw.load_weights("qwen3.5-0.8b", device="cpu", dtype=torch.float32, progress=False)
    assert seen == [False]


# ---------------------------------------------------------------- random weights


def test_random_weights_on_cpu_are_random_state_dict_fused():
    config = random_tiny_config(seed=2)
    w = random_weights(config, device="cpu", dtype=torch.float32, seed=11)
    assert_fused(config, w, unprefixed(random_state_dict(config, seed=11, dtype=torch.float32), "model."))


def test_random_weights_are_deterministic_and_depend_on_the_seed():
    a = random_weights(TINY, device="cpu", dtype=torch.float32, seed=0)
    b = random_weights(TINY, device="cpu", dtype=torch.float32, seed=0)
    c = random_weights(TINY, device="cpu", dtype=torch.float32, seed=1)
    for (name, x), (_, y), (_, z) in zip(a.tensors(), b.tensors(), c.tensors()):
        assert torch.equal(x, y), name
        assert not torch.equal(x, z), name


def test_random_weights_have_realistic_nontrivial_values():
    config = random_tiny_config(seed=0, hidden_size=64, linear_num_key_heads=4, linear_num_value_heads=16)
    w = random_weights(config, device="cpu", dtype=torch.float32, seed=0)
    assert abs(w.embed.std().item() - 0.02) < 0.002
    norms = torch.cat([w.final_norm] + [t for layer in w.layers for t in (layer.input_norm, layer.post_norm)])
    assert abs(norms.mean().item()) < 0.03 and 0.07 < norms.std().item() < 0.13  # (1 + w): w ~ N(0, 0.1)
    lin = [layer for layer in w.layers if layer.kind == LINEAR]
    gated = torch.cat([layer.norm for layer in lin])
    assert abs(gated.mean().item() - 1) < 0.05 and gated.std().item() > 0.05   # plain w ~ 1 + N(0, 0.1)
    A = torch.cat([layer.A_log for layer in lin]).exp()
    assert A.min() >= 1 and A.max() <= 16 and A.std() > 1
    dt = torch.cat([layer.dt_bias for layer in lin])
    assert dt.min() >= 0.5 and dt.max() <= 1.5
    conv = torch.cat([layer.conv.flatten() for layer in lin])
    assert 0.15 < conv.std().item() < 0.25


def test_random_preset_without_files(monkeypatch):
    config = random_tiny_config(seed=4)
    monkeypatch.setitem(PRESETS, "mini-random", config)
    loaded, w = load("mini-random", seed=3)
    assert loaded is config
    ref = random_weights(config, device="cpu", dtype=torch.float32, seed=3)
    for (name, x), (_, y) in zip(w.tensors(), ref.tensors()):
        assert torch.equal(x, y), name


def test_expected_tensors_names_and_shapes():
    shapes = expected_tensors(TINY)
    assert shapes["embed_tokens.weight"] == (512, 64)
    assert shapes["layers.0.linear_attn.in_proj_qkv.weight"] == (128, 64)
    assert shapes["layers.0.linear_attn.conv1d.weight"] == (128, 1, 4)
    assert shapes["layers.0.linear_attn.A_log"] == (4,)
    assert shapes["layers.3.self_attn.q_proj.weight"] == (256, 64)
    assert shapes["layers.3.self_attn.o_proj.weight"] == (64, 128)
    assert shapes["norm.weight"] == (64,) and "lm_head.weight" not in shapes
    assert expected_tensors(UNTIED)["lm_head.weight"] == (512, 64)
    assert not any(k.startswith("layers.3.linear_attn") for k in shapes)
    assert len(shapes) == 1 + 3 * 14 + 11 + 1


# ---------------------------------------------------------------- sources


def test_source_as_path_and_as_string(tmp_path):
    snap = write(tmp_path)
    for source in (snap, str(snap)):
        config, w = load(source)
        assert config.hidden_size == 64


@pytest.mark.parametrize("folder", ["Qwen3.5-0.8B", "tiny"])
def test_local_snapshot_named_like_a_preset_wins_over_it(tmp_path, monkeypatch, folder):
    # what `hf download Qwen/Qwen3.5-0.8B --local-dir Qwen3.5-0.8B` makes: its real weights, not the random preset
    snap = write(tmp_path, UNTIED, name=folder)
    monkeypatch.chdir(tmp_path)
    assert resolve_source(folder) == Path(folder)
    config, w = load(folder)
    assert config.name == str(Path(folder) / "config.json") and not config.tie_word_embeddings
    assert torch.equal(w.lm_head, random_state_dict(UNTIED)["lm_head.weight"].float())
    assert resolve_source(str(snap)) == snap


@pytest.mark.parametrize("folder, preset", [("tiny", TINY_DIR), ("Qwen3.5-0.8B", QWEN35_0_8B),
                                            ("qwen3.5-0.8b", QWEN35_0_8B)])
def test_folder_without_config_json_does_not_hide_the_preset(tmp_path, monkeypatch, folder, preset):
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "notes.txt").write_text("not a snapshot")
    monkeypatch.chdir(tmp_path)
    assert resolve_source(folder) == preset
    assert resolve_source(folder.upper()) == preset  # preset names stay case-insensitive


def test_hub_id_downloads_configs_weights_and_tokenizer(tmp_path, monkeypatch):
    hub = pytest.importorskip("huggingface_hub")
    snap = write(tmp_path)
    calls = []

    def fake_download(repo_id, allow_patterns=None, **kw):
        calls.append((repo_id, allow_patterns))
        return str(snap)

    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    config, _ = load("SomeOrg/Tiny-Qwen3.5")
    assert config.name == "SomeOrg/Tiny-Qwen3.5"
    (repo, patterns), = calls
    assert repo == "SomeOrg/Tiny-Qwen3.5"
    assert {"*.json", "*.safetensors"} <= set(patterns) and "*.bin" not in patterns


def test_hub_unreachable(monkeypatch):
    hub = pytest.importorskip("huggingface_hub")

    def offline(*a, **kw):
        raise OSError("Cannot reach https://huggingface.co: network is unreachable")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    msg = raises("Qwen/Qwen3.5-0.8B", CheckpointError, "Qwen/Qwen3.5-0.8B", "could not fetch", "local",
                 "network is unreachable")
    assert "--local-dir" in msg


# ---------------------------------------------------------------- bad inputs: each one its own clear error


def test_missing_directory(tmp_path):
    raises(tmp_path / "nowhere", CheckpointError, tmp_path / "nowhere", "no such directory")


def test_missing_directory_given_as_a_string(tmp_path):
    raises(str(tmp_path / "nowhere" / "deeper"), CheckpointError, "nowhere", "no such directory")


@pytest.mark.parametrize("source", ["", "  "])
def test_an_empty_source_is_refused_not_read_as_the_current_directory(source):
    with pytest.raises(CheckpointError, match=f"source={source!r} is empty; expected a snapshot directory"):
        resolve_source(source)


def test_source_is_a_file(tmp_path):
    snap = write(tmp_path)
    raises(snap / "model.safetensors", CheckpointError, "model.safetensors", "is a file")


def test_no_config_json(tmp_path):
    snap = write(tmp_path)
    (snap / "config.json").unlink()
    raises(snap, CheckpointError, snap, "no config.json")


def test_unsupported_model_type(tmp_path):
    snap = write(tmp_path)
    d = json.loads((snap / "config.json").read_text())
    d["model_type"] = "qwen3_moe"
    (snap / "config.json").write_text(json.dumps(d))
    raises(snap, UnsupportedModelError, snap / "config.json", "model_type='qwen3_moe'")


def test_config_json_not_json(tmp_path):
    snap = write(tmp_path)
    (snap / "config.json").write_text("{not json")
    raises(snap, ConfigError, snap / "config.json", "not valid JSON")


def test_no_weight_files(tmp_path):
    snap = write(tmp_path)
    (snap / "model.safetensors").unlink()
    raises(snap, CheckpointError, snap, "no model.safetensors")


def test_truncated_safetensors(tmp_path):
    snap = write(tmp_path)
    path = snap / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[:-1000])
    header = read_safetensors_header(TINY_DIR / "model.safetensors")
    data_size = len(data) - 8 - struct.unpack("<Q", data[:8])[0]
    first_cut = min((info for info in header.values() if info.offsets[1] > data_size - 1000),
                    key=lambda info: info.offsets[0])
    raises(snap, CheckpointError, path, f"tensor '{first_cut.name}' ends at byte", "truncated")


def test_safetensors_truncated_inside_its_header(tmp_path):
    snap = write(tmp_path)
    path = snap / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    raises(snap, CheckpointError, path, "truncated")


def test_empty_safetensors_file(tmp_path):
    snap = write(tmp_path)
    (snap / "model.safetensors").write_bytes(b"")
    raises(snap, CheckpointError, snap / "model.safetensors", "too short")


def test_corrupt_header(tmp_path):
    snap = write(tmp_path)
    path = snap / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:24] = b"\x00\xffGARBAGE GARBAGE"
    path.write_bytes(bytes(data))
    raises(snap, CheckpointError, path, "corrupt safetensors header")


def test_header_offsets_disagree_with_shape(tmp_path):
    snap = write(tmp_path)
    path = snap / "model.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    name = "model.norm.weight"
    header[name]["shape"] = [32]  # half the bytes its offsets span
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (n - len(text))
    path.write_bytes(data[:8] + text + data[8 + n:])
    raises(snap, CheckpointError, path, f"tensor '{name}'", "needs 64", "corrupt")


def rewrite_header(path, edit):
    """Rewrite a safetensors file through edit(header, data) -> data, which may also change the header in place."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = edit(header, raw[8 + n:])
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


def _shift_all(header, data):
    for name, info in header.items():
        if name != "__metadata__":
            info["data_offsets"] = [o + 16 for o in info["data_offsets"]]
    return bytes(16) + data


def _share_bytes(header, data):
    header["model.norm.weight"]["data_offsets"] = header["model.layers.0.input_layernorm.weight"]["data_offsets"]
    return data


def _set(name, key, value):
    def edit(header, data):
        header[name][key] = value
        return data
    return edit


def _metadata(value):
    def edit(header, data):
        header["__metadata__"] = value
        return data
    return edit


_NORM = "model.norm.weight"  # bf16 [64]


# each file is also one the safetensors library refuses to open: checked first, with a message that names the tensor
@pytest.mark.parametrize("edit, fragments", [
    (_shift_all, ["but the data starts at 0 (a gap of 16 bytes)"]),
    (_share_bytes, [f"tensor '{_NORM}' has data_offsets", "but the previous tensor "
                    "'model.layers.0.input_layernorm.weight' ends at", "(128 bytes overlap)"]),
    (lambda header, data: data + bytes(64), ["64 bytes follow the last tensor's data"]),
    (_set(_NORM, "shape", [64.0]), [f"tensor '{_NORM}': corrupt header entry", "[non-negative integers]"]),
    (_set(_NORM, "shape", [True, 64]), [f"tensor '{_NORM}': corrupt header entry"]),
    (_set(_NORM, "shape", [-64]), [f"tensor '{_NORM}': corrupt header entry"]),
    (_set(_NORM, "data_offsets", [0.0, 128]), [f"tensor '{_NORM}': corrupt header entry"]),
    (_metadata({"format": 5}), ["'__metadata__' is {'format': 5}; expected an object of string values"]),
    (_metadata(["pt"]), ["'__metadata__' is ['pt']"]),
], ids=["gap", "overlap", "trailing-bytes", "float-shape", "bool-shape", "negative-shape", "float-offset",
        "metadata-int", "metadata-list"])
def test_header_breaking_the_safetensors_rules(tmp_path, capsys, edit, fragments):
    from safetensors import safe_open

    snap = write(tmp_path)
    path = snap / "model.safetensors"
    rewrite_header(path, edit)
    with pytest.raises(Exception):
        with safe_open(str(path), framework="pt") as f:
            [f.get_tensor(k) for k in f.keys()]
    raises(snap, CheckpointError, path, *fragments)
    assert snapshot.main([str(snap)]) == 2
    assert f"error: {path}" in capsys.readouterr().err


def test_header_that_the_safetensors_rules_allow(tmp_path):
    """Tensors with no elements (sharing an offset, or at the very end), entries in another order than their bytes,
    a null __metadata__: the safetensors library opens such files, so they must pass."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = tmp_path / "edge.safetensors"
    save_file({"empty": torch.zeros(0, 4), "also_empty": torch.zeros(2, 0, dtype=torch.float16),
               "a": torch.ones(3), "b": torch.ones(2, dtype=torch.bfloat16)}, str(path))

    def reverse(header, data):
        entries = list(header.items())[::-1]
        header.clear()
        header.update(entries)
        header["__metadata__"] = None
        header["tail"] = {"dtype": "F32", "shape": [0], "data_offsets": [len(data), len(data)]}
        return data

    rewrite_header(path, reverse)
    info = read_safetensors_header(path)
    assert {k: v.shape for k, v in info.items()} == {"empty": (0, 4), "also_empty": (2, 0), "a": (3,), "b": (2,),
                                                     "tail": (0,)}
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == set(info)


def test_a_refusal_the_header_does_not_explain_still_names_the_file(tmp_path, monkeypatch):
    """Where the header shows no broken rule, the library's own words come back, naming the file."""
    from qwen_lab import safetensors_file

    snap = write(tmp_path)
    path = snap / "model.safetensors"
    rewrite_header(path, lambda header, data: data + bytes(8))  # the library refuses the trailing bytes
    monkeypatch.setattr(safetensors_file, "_explain_refusal", lambda *args: None)
    raises(snap, CheckpointError, f"{path}: the safetensors library refuses the file (", "download it again")


def test_writing_where_no_directory_is_names_the_file(tmp_path):
    from qwen_lab.safetensors_file import write_safetensors

    path = tmp_path / "missing" / "model.safetensors"
    with pytest.raises(CheckpointError, match="could not write the safetensors file") as e:
        write_safetensors(path, {"a": torch.ones(2)})
    assert str(e.value).startswith(f"{path}: ")


def test_missing_tensor(tmp_path):
    state = random_state_dict(TINY)
    del state["model.layers.1.mlp.up_proj.weight"]
    snap = write(tmp_path, TINY, state)
    raises(snap, CheckpointError, snap / "model.safetensors", ": no tensor 'model.layers.1.mlp.up_proj.weight'",
           "expected shape (160, 64)",
           "intermediate_size=160")


def test_missing_tensor_in_a_sharded_snapshot(tmp_path):
    state = random_state_dict(TINY, layout="multimodal")
    del state["model.language_model.layers.2.linear_attn.A_log"]
    snap = write(tmp_path, TINY, state, layout="multimodal", shard=100_000)
    raises(snap, CheckpointError, f"{snap / INDEX_FILE}: does not list tensor "
           "'model.language_model.layers.2.linear_attn.A_log'",
           "expected shape (4,)", "linear_num_value_heads=4")


def test_wrong_shape_names_the_shard_and_the_config_field(tmp_path):
    state = random_state_dict(TINY)
    name = "model.layers.3.mlp.down_proj.weight"
    state[name] = torch.zeros(64, 100, dtype=torch.bfloat16)
    snap = write(tmp_path, TINY, state, shard=100_000)
    shard = json.loads((snap / INDEX_FILE).read_text())["weight_map"][name]
    assert shard.startswith("model-0000")
    raises(snap, CheckpointError, snap / shard, f"tensor '{name}' has shape (64, 100), expected (64, 160) from "
           "config.json (hidden_size=64, intermediate_size=160)")


def test_config_has_fewer_layers_than_the_weights(tmp_path):
    three = TINY.replace(num_hidden_layers=3, layer_types=TINY.layer_types[:3])
    snap = write(tmp_path, three, random_state_dict(TINY))
    raises(snap, CheckpointError, "model.safetensors", "'model.layers.3.", "num_hidden_layers=3",
           "disagrees with the weights")


def test_config_has_more_layers_than_the_weights(tmp_path):
    five = TINY.replace(num_hidden_layers=5, layer_types=TINY.layer_types + (LINEAR,))
    snap = write(tmp_path, five, random_state_dict(TINY))
    raises(snap, CheckpointError, "'model.layers.4.", "no tensor of layer 4", "num_hidden_layers=5")


def test_config_hidden_size_differs_from_the_weights(tmp_path):
    snap = write(tmp_path, TINY.replace(hidden_size=96), random_state_dict(TINY))
    raises(snap, CheckpointError, snap / "model.safetensors", "'model.embed_tokens.weight' has shape (512, 64)",
           "expected (512, 96)", "hidden_size=96")


def test_config_layer_types_differ_from_the_weights(tmp_path):
    swapped = TINY.replace(layer_types=(LINEAR, LINEAR, FULL, FULL))
    snap = write(tmp_path, swapped, random_state_dict(TINY))
    raises(snap, CheckpointError, "'model.layers.2.self_attn.", "layer_types[2]='full_attention'")


def test_unexpected_tensor_in_the_text_model(tmp_path):
    state = random_state_dict(TINY)
    state["model.layers.0.linear_attn.extra.weight"] = torch.zeros(4, 64, dtype=torch.bfloat16)
    snap = write(tmp_path, TINY, state)
    raises(snap, CheckpointError, snap / "model.safetensors", "'model.layers.0.linear_attn.extra.weight'",
           "not part of the Qwen3.5 text model")


def test_stray_multimodal_tensor_in_a_causal_snapshot_is_named(tmp_path):
    # the layout follows the embedding: one stray key no longer turns the snapshot into the other layout
    state = random_state_dict(TINY)
    state["model.language_model.norm.weight"] = torch.zeros(64, dtype=torch.bfloat16)
    snap = write(tmp_path, TINY, state)
    msg = raises(snap, CheckpointError, snap / "model.safetensors", "'model.language_model.norm.weight'",
                 "not part of the Qwen3.5 text model")
    assert "missing" not in msg


@pytest.mark.parametrize("stray, shape", [("model.layers.0.mlp.up_proj.weight", (160, 64)),
                                          ("model.norm.weight", (64,))])
def test_stray_causal_tensor_in_a_multimodal_snapshot_is_named(tmp_path, stray, shape):
    state = random_state_dict(TINY, layout="multimodal")
    state[stray] = torch.zeros(shape, dtype=torch.bfloat16)
    snap = write(tmp_path, TINY, state, layout="multimodal")
    raises(snap, CheckpointError, snap / "model.safetensors", f"tensor '{stray}' is not part of the Qwen3.5 text "
           "model, whose tensors are named 'model.language_model.*' in this snapshot")


@pytest.mark.parametrize("layout", ["causal", "multimodal"])
@pytest.mark.parametrize("extra, shape", [("lm_head.bias", (512,)), ("score.weight", (2, 64))])
def test_top_level_tensor_beside_the_text_model_is_named(tmp_path, layout, extra, shape):
    state = random_state_dict(UNTIED, layout=layout)
    state[extra] = torch.zeros(shape, dtype=torch.bfloat16)
    snap = write(tmp_path, UNTIED, state, layout=layout)
    raises(snap, CheckpointError, snap / "model.safetensors", f"tensor '{extra}' is not part of the Qwen3.5 text "
           "model", "model.visual.*, mtp.*, model.mtp.*")


def test_embedding_in_both_layouts_is_refused(tmp_path):
    state = random_state_dict(TINY)
    state["model.language_model.embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
    snap = write(tmp_path, TINY, state)
    raises(snap, CheckpointError, "'model.embed_tokens.weight'", "'model.language_model.embed_tokens.weight'",
           "not both")


def test_layout_without_an_embedding_follows_the_final_norm(tmp_path):
    state = random_state_dict(TINY, layout="multimodal")
    del state["model.language_model.embed_tokens.weight"]
    snap = write(tmp_path, TINY, state, layout="multimodal")
    raises(snap, CheckpointError, "no tensor 'model.language_model.embed_tokens.weight'", "expected shape (512, 64)")


def test_integer_tensor_is_rejected(tmp_path):
    state = random_state_dict(TINY)
    state["model.norm.weight"] = torch.zeros(64, dtype=torch.int32)
    snap = write(tmp_path, TINY, state)
    raises(snap, CheckpointError, "'model.norm.weight'", "dtype I32")


def test_missing_shard(tmp_path):
    snap = write(tmp_path, TINY, shard=100_000)
    shards = sorted(snap.glob("model-*.safetensors"))
    assert len(shards) >= 3
    shards[1].unlink()
    raises(snap, CheckpointError, shards[1], "missing shard", INDEX_FILE)


def test_index_disagrees_with_the_shards(tmp_path):
    snap = write(tmp_path, TINY, shard=100_000)
    index = json.loads((snap / INDEX_FILE).read_text())
    name = "model.layers.0.input_layernorm.weight"
    other = next(s for s in sorted(set(index["weight_map"].values())) if s != index["weight_map"][name])
    index["weight_map"][name] = other
    (snap / INDEX_FILE).write_text(json.dumps(index))
    raises(snap, CheckpointError, other, f"'{name}'", "does not hold it")


def test_index_not_json(tmp_path):
    snap = write(tmp_path, TINY, shard=100_000)
    (snap / INDEX_FILE).write_text("{")
    raises(snap, CheckpointError, INDEX_FILE, "weight_map")


@pytest.mark.parametrize("which", ["config", "index", "shard", "generation_config"])
def test_unreadable_file_is_named_and_the_check_command_reports_it(tmp_path, monkeypatch, capsys, which):
    import builtins

    snap = write(tmp_path, TINY, shard=100_000)
    target = {"config": snap / "config.json", "index": snap / INDEX_FILE, "generation_config":
              snap / "generation_config.json", "shard": sorted(snap.glob("model-*.safetensors"))[1]}[which]
    real_open, read_text = builtins.open, Path.read_text

    # (as root, chmod 000 stops no read: the read itself is made to fail)
    def deny(file):
        if isinstance(file, (str, Path)) and Path(file) == target:
            raise PermissionError(13, "Permission denied", str(file))

    monkeypatch.setattr(builtins, "open", lambda file, *a, **k: deny(file) or real_open(file, *a, **k))
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: deny(self) or read_text(self, *a, **k))
    exc = ConfigError if "config" in which else CheckpointError
    raises(snap, exc, f"{target}: could not read the file (Permission denied)")
    assert snapshot.main([str(snap)]) == 2
    assert f"error: {target}: could not read the file (Permission denied)" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["seq2seq", "Causal", None])
def test_unknown_layout_is_rejected_naming_the_argument(tmp_path, layout):
    from qwen_lab.export import hf_config_dict
    from qwen_lab.weights import to_hf_state_dict

    expected = r"layout=.*; expected one of \['causal', 'multimodal'\]"
    calls = {"random_state_dict": lambda: random_state_dict(TINY, layout=layout),
             "hf_config_dict": lambda: hf_config_dict(TINY, layout),
             "to_hf_state_dict": lambda: to_hf_state_dict(TINY, None, layout),
             "save_snapshot": lambda: save_snapshot(tmp_path / "snap", TINY, {}, layout=layout)}
    for name, call in calls.items():
        with pytest.raises(CheckpointError, match=expected) as e:
            call()
        assert isinstance(e.value, QwenLabError) and isinstance(e.value, ValueError), name
    assert not (tmp_path / "snap").exists(), "save_snapshot checks the layout before it writes anything"


def test_untied_without_lm_head(tmp_path):
    state = random_state_dict(UNTIED)
    del state["lm_head.weight"]
    snap = write(tmp_path, UNTIED, state)
    raises(snap, CheckpointError, snap, "'lm_head.weight'", "tie_word_embeddings false")


# ---------------------------------------------------------------- GPU (real shapes, bf16)


@pytest.mark.gpu
def test_gpu_random_qwen35_0_8b_preset():
    import time

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    config, w = load_weights("qwen3.5-0.8b", progress=False)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    assert config is QWEN35_0_8B and w.lm_head is w.embed
    assert elapsed < 60, f"random 0.8B weights took {elapsed:.1f} s on the GPU"
    assert w.embed.shape == (248320, 1024) and w.embed.dtype == torch.bfloat16 and w.embed.is_cuda
    lin, full = w.layers[0], w.layers[3]
    assert lin.in_proj.shape == (QWEN35_0_8B.linear_in_proj_dim, 1024) and lin.conv.shape == (6144, 4)
    assert full.qkv_proj.shape == (5120, 1024) and full.o_proj.shape == (1024, 2048)
    for name, t in w.tensors():
        # the conv filter is stored tap by tap ([W, C]) and held as its [C, W] view
        stored = t.t() if name.endswith(".conv") else t
        assert t.is_cuda and stored.is_contiguous(), f"{name}: strides {t.stride()}"
        assert t.dtype == (torch.float32 if t.dim() == 1 else torch.bfloat16), name
    assert w.nbytes() == expected_nbytes(QWEN35_0_8B, 2)
    assert 1.50e9 < w.nbytes() < 1.51e9
    again = random_weights(QWEN35_0_8B, seed=0)
    assert torch.equal(again.layers[5].in_proj, w.layers[5].in_proj)
    assert torch.equal(again.embed, w.embed)


@pytest.mark.gpu
def test_gpu_tiny_and_sharded_snapshot_load_to_the_device(tmp_path):
    config, w = load_weights("tiny", progress=False)
    assert w.embed.is_cuda and w.embed.dtype in (torch.bfloat16, torch.float16)
    assert_fused(config, w, unprefixed(random_state_dict(TINY), "model."), dtype=w.embed.dtype)
    model = make_hf_model(TINY, seed=1, multimodal=True)
    snap = save_hf_snapshot(model, tmp_path / "mm", max_shard_size="100KB")
    config, w = load_weights(snap, progress=False)
    assert_fused(config, w, unprefixed(model.state_dict(), "model.language_model."), dtype=w.embed.dtype)


def test_to_hf_state_dict_inverts_the_fusion():
    from qwen_lab.config import TINY
    from qwen_lab.weights import load_weights, random_state_dict, to_hf_state_dict

    config, weights = load_weights("tiny", device="cpu", dtype=torch.float32, progress=False)
    back = to_hf_state_dict(config, weights)
    original = random_state_dict(TINY, seed=0)
    assert set(back) == set(original)
    for name, t in original.items():
        assert back[name].shape == t.shape, name
        assert torch.equal(back[name].float(), t.float()), name


def test_save_snapshot_writes_tensors_that_share_memory(tmp_path):
    """to_hf_state_dict hands back views of the fused matrices, and a state dict may hold one tensor under two names;
    the safetensors library refuses to write memory shared so, save_snapshot writes each as its own copy."""
    from qwen_lab.weights import to_hf_state_dict

    config, weights = load("tiny")
    state = to_hf_state_dict(config, weights)
    state["lm_head.weight"] = state["model.embed_tokens.weight"]  # stored beside the tied embedding, equal to it
    snap = save_snapshot(tmp_path / "again", config, state, tokenizer_dir=TINY_DIR)
    assert read_safetensors_header(snap / "model.safetensors")["lm_head.weight"].shape == (512, 64)
    again_config, again = load(snap)
    assert again_config.replace(name="tiny") == config and again.tied
    for (name, a), (_, b) in zip(weights.tensors(), again.tensors()):
        assert torch.equal(a, b), name


# ---------------------------------------------------------------- the loader's modules import without a cycle

LOADING_MODULES = ("safetensors_file", "snapshot", "export", "weights", "tiny", "tokenizer")


def _package_imports(module: str) -> set[str]:
    """The qwen_lab modules that qwen_lab/<module>.py imports anywhere (at the top or inside a function), read from
    its source."""
    import ast

    import qwen_lab

    root = Path(qwen_lab.__file__).parent
    found = set()
    for node in ast.walk(ast.parse((root / f"{module}.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "qwen_lab":
            found |= {node.module.split(".")[1]} if "." in node.module else {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("qwen_lab.")}
    return {m for m in found if (root / f"{m}.py").is_file() or (root / m / "__init__.py").is_file()}


def test_loading_modules_have_no_import_cycle_in_their_source():
    graph, todo = {}, list(LOADING_MODULES)
    while todo:
        m = todo.pop()
        if m not in graph and Path(__file__).parent.parent.joinpath("qwen_lab", f"{m}.py").is_file():
            graph[m] = _package_imports(m)
            todo += graph[m]

    def reach(m, path=()):
        assert m not in path, f"import cycle: {' -> '.join(path + (m,))}"
        out = {m}
        for n in graph.get(m, ()):
            out |= reach(n, path + (m,))
        return out

    for m in LOADING_MODULES:
        reach(m)
    # the tokenizer reads snapshots; the tiny builder writes its files and imports it, never the other way round
    assert not reach("tokenizer") & {"weights", "tiny", "export"}, graph["tokenizer"]
    assert not reach("snapshot") & {"weights", "tiny", "tokenizer", "export"}, graph["snapshot"]
    assert {"weights", "export", "snapshot"} <= reach("tiny")


def test_loading_modules_import_in_any_order_in_a_fresh_interpreter():
    """Each module imported first into a fresh interpreter, then the others forwards and backwards (a cycle fails
    only through the module by which it is entered, so this stands for every order); importing the tokenizer
    loads neither the weights nor the tiny builder."""
    import subprocess
    import sys

    script = f"""
import importlib, sys
import qwen_lab
import qwen_lab.tokenizer
assert "qwen_lab.weights" not in sys.modules and "qwen_lab.tiny" not in sys.modules, sorted(sys.modules)
names = {LOADING_MODULES!r}
orders = 0
for first in names:
    rest = [n for n in names if n != first]
    for order in ([first] + rest, [first] + rest[::-1]):
        for n in names:  # forget the loading modules, so that each order imports them afresh
            sys.modules.pop("qwen_lab." + n, None)
            qwen_lab.__dict__.pop(n, None)
        for n in order:
            importlib.import_module("qwen_lab." + n)
        orders += 1
print(orders, "orders")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(2 * len(LOADING_MODULES)), "orders"]
