"""The whole model against transformers' Qwen3_5ForCausalLM, on random tiny configs.

Each config is saved by transformers as a real snapshot and read back through qwen_lab's loader, so these tests
cover the loader's fusion and the forward graph together. Norm weights are random (transformers initialises them
to 0 and 1, which would hide a missing `1 + w`).
"""

import pytest
import torch

from hf_models import hf_logits, make_hf_model, save_hf_snapshot
from qwen_lab import GenerationError, runtime
from qwen_lab.course import checks
from qwen_lab.config import FULL, LINEAR, TINY
from qwen_lab.generation import generate
from qwen_lab.model import OPERATORS, Qwen35Model, load_model
import qwen_lab.model as qwen_lab_model
from qwen_lab.plan import fast_plan
from qwen_lab.weights import random_weights

CONFIGS = {
    # the tiny preset itself: tied head, Hv = 2 Hk
    "tiny": TINY,
    # untied head, Hv == Hk, key and value head dims differ, widths that are not powers of two
    "untied_equal_heads": TINY.replace(tie_word_embeddings=False, hidden_size=48, intermediate_size=100,
                                       linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=12,
                                       linear_value_head_dim=20, name="untied_equal_heads"),
    # Hv = 3 Hk, a non-default layer pattern (attention first), head_dim 24 with rotary 12, 2 query heads per KV head
    "three_to_one": TINY.replace(num_hidden_layers=5, layer_types=(FULL, LINEAR, LINEAR, FULL, LINEAR),
                                 linear_num_key_heads=1, linear_num_value_heads=3, linear_value_head_dim=8,
                                 head_dim=24, partial_rotary_factor=0.5, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=300, pad_token_id=None, eos_token_ids=(),
                                 name="three_to_one"),
}


@pytest.fixture(scope="module", params=[(name, backend) for name in sorted(CONFIGS) for backend in ("torch", "triton")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def pair(request, tmp_path_factory):
    """(transformers model, qwen_lab model) with the same random weights, on the torch or the triton backend.

    On a CPU the triton backend runs every kernel through the Triton interpreter, in float32.
    """
    name, backend = request.param
    cfg = CONFIGS[name]
    hf = make_hf_model(cfg, seed=1)
    path = tmp_path_factory.mktemp(name)
    save_hf_snapshot(hf, path)
    device = "cpu" if backend == "torch" else None
    ours = load_model(str(path), device=device, dtype=torch.float32, backend=backend)
    if ours.device.type != "cpu":
        hf = hf.to(ours.device)
    assert tuple(ours.ops) == OPERATORS
    if backend == "triton":   # every operator runs its kernel
        assert all(fn.__module__.startswith("qwen_lab.kernels.") for fn in ours.ops.values()), ours.ops
    return hf, ours


@pytest.mark.parametrize("T", [1, 5, 64, 65, 130])
def test_prefill_logits_match_transformers(pair, T, gen):
    hf, ours = pair
    ids = torch.randint(0, ours.config.vocab_size, (T,), generator=gen).to(ours.device)
    got = ours.forward(ids)
    want = hf_logits(hf, ids)
    assert got.shape == (T, ours.config.vocab_size) and got.dtype == torch.float32
    assert checks.relative_error(got, want) <= 1e-4
    # the fast route, every row
    with torch.inference_mode():
        fast = fast_plan(ours).step(ids, torch.arange(T, device=ours.device), ours.new_cache(T), all_logits=True)
    assert checks.relative_error(fast.float(), want) <= 1e-4


def test_decode_steps_equal_a_longer_prefill(pair, gen):
    hf, ours = pair
    ids = torch.randint(0, ours.config.vocab_size, (70,), generator=gen).to(ours.device)
    want = hf_logits(hf, ids)
    for runner in (ours, fast_plan(ours)):   # the plain route and the fast one
        cache = runner.new_cache(80)
        with torch.inference_mode():
            got = [runner.step(ids[:66], torch.arange(66, device=ours.device), cache)[-1]]
            for t in range(66, 70):
                got.append(runner.step(ids[t:t + 1], torch.tensor([t], device=ours.device), cache)[-1])
        for j, logits in enumerate(got):
            assert checks.relative_error(logits.float(), want[65 + j]) <= 1e-4, f"{runner}: decode step {j}"


def test_greedy_generation_matches_transformers_token_for_token(pair, gen):
    hf, ours = pair
    prompt = torch.randint(0, ours.config.vocab_size, (9,), generator=gen).to(ours.device)
    with torch.no_grad():
        want = hf.generate(prompt[None], max_new_tokens=12, do_sample=False, eos_token_id=None,
                           pad_token_id=0)[0, 9:]
    got = generate(ours, prompt, max_new_tokens=12, eos_token_ids=(), cuda_graph=False)
    assert got.tolist() == want.cpu().tolist()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_trained_tiny_english_matches_transformers(backend, gen):
    """The shipped trained snapshot, read by transformers' own loader and by qwen_lab's: the same logits, and greedy
    generation token for token (trained weights give a confident argmax, not random ties)."""
    from transformers import Qwen3_5ForCausalLM

    from qwen_lab.snapshot import TINY_ENGLISH_DIR

    hf = Qwen3_5ForCausalLM.from_pretrained(TINY_ENGLISH_DIR, dtype=torch.float32, attn_implementation="eager").eval()
    ours = load_model("tiny-english", device="cpu" if backend == "torch" else None, dtype=torch.float32,
                      backend=backend)
    hf = hf.to(ours.device)
    ids = torch.tensor(qwen_lab_tokenizer().encode("It is a truth universally acknowledged, that"),
                       device=ours.device)
    assert checks.relative_error(ours.forward(ids), hf_logits(hf, ids)) <= 1e-4
    with torch.no_grad():
        want = hf.generate(ids[None], max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)[0]
    got = generate(ours, ids, max_new_tokens=6, eos_token_ids=(), cuda_graph=False)
    assert got.tolist() == want[len(ids):].cpu().tolist()


def qwen_lab_tokenizer():
    from qwen_lab import load_tokenizer

    return load_tokenizer("tiny-english")


def test_sharded_multimodal_snapshot_matches(tmp_path, gen):
    cfg = CONFIGS["untied_equal_heads"]
    hf = make_hf_model(cfg, seed=3, multimodal=True)
    save_hf_snapshot(hf, tmp_path, max_shard_size="60KB")
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1, "the snapshot should be sharded"
    ours = load_model(str(tmp_path), device="cpu", dtype=torch.float32, backend="torch")
    ids = torch.randint(0, cfg.vocab_size, (33,), generator=gen)
    assert checks.relative_error(ours.forward(ids), hf_logits(hf, ids)) <= 1e-4


def test_forward_accepts_batch_of_one_and_lists():
    model = load_model("tiny", device="cpu", dtype=torch.float32, backend="torch")
    a = model.forward(torch.tensor([[1, 2, 3]]))
    b = model.forward([1, 2, 3])
    assert torch.equal(a, b)
    # unsigned ids (torch has no min/max for uint16-64: the range check failed with NotImplementedError)
    for dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        assert torch.equal(model.forward(torch.tensor([1, 2, 3], dtype=dtype)), b), dtype
    with pytest.raises(GenerationError, match="token id 600 is outside"):
        model.forward(torch.tensor([1, 600], dtype=torch.uint32))


def test_forward_refuses_more_positions_than_the_model_has():
    """As generate() does: positions past max_position_embeddings were never trained."""
    model = load_model("tiny", device="cpu", dtype=torch.float32, backend="torch")
    limit = model.config.max_position_embeddings
    with pytest.raises(GenerationError, match=f"{limit + 1} tokens exceed the model's max_position_embeddings"):
        model.forward(torch.zeros(limit + 1, dtype=torch.long))


def test_weights_of_another_dtype_are_refused_with_the_fix():
    """Weights drawn in bf16 under a float32 model used to fail deep in the attention (a bf16 q against a float32
    cache); the model now says so when it is built, naming both dtypes and how to draw matching weights."""
    from qwen_lab import ConfigError

    weights = random_weights(TINY, device="cpu", dtype=torch.bfloat16, seed=0, progress=False)
    with pytest.raises(ConfigError, match=r"weights: the embedding is bfloat16 on cpu, but the model runs in float32 "
                                          r"on cpu: .*random_weights\(config, device=\.\.\., dtype=\.\.\.\)"):
        Qwen35Model(TINY, weights, device="cpu", dtype=torch.float32, backend="torch")
    Qwen35Model(TINY, weights, device="cpu", dtype=torch.bfloat16, backend="torch")   # matching: accepted


def test_divergence_report_names_the_broken_operator():
    from qwen_lab import reference
    from qwen_lab.model import divergence_report

    good = load_model("tiny", device="cpu", dtype=torch.float32, backend="torch")
    bad = Qwen35Model(good.config, good.weights, device="cpu", dtype=torch.float32, backend="torch")
    # the classic mistake: RMSNorm with plain w instead of (1 + w), used for every norm including q/k
    bad.ops["rms_norm"] = lambda x, w, eps: reference.rms_norm(x, w - 1.0, eps)
    report = divergence_report(bad, good, [5, 6, 7, 8])
    assert "layer 0" in report and "input_norm" in report
    assert divergence_report(good, good, [5, 6, 7, 8]).startswith("no divergence")


@pytest.mark.parametrize("name", ["tiny", "three_to_one"])   # the last layer gated attention; Gated DeltaNet
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_step_runs_the_last_layer_past_its_mixer_for_the_last_row(name, backend, gen):
    """Only the last position's logits leave a step of the fast route: the last layer's token mixing sees every row
    (the cache and the states take them all), everything after it the last row alone; all_logits keeps every row
    everywhere."""
    cfg = CONFIGS[name]
    device = "cpu" if backend == "torch" else runtime.choose(None, torch.float32).device
    model = Qwen35Model(cfg, random_weights(cfg, device=device, dtype=torch.float32, seed=2), device=device,
                        dtype=torch.float32, backend=backend)
    plan = fast_plan(model)
    T = 20
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen).to(model.device)
    last = cfg.num_hidden_layers - 1

    def rows_seen(all_logits):
        seen = []   # (call, rows of its output) for the last layer's calls, in order

        def observe(layer, name, out):
            first = out[0] if isinstance(out, tuple) else out
            if layer == last and isinstance(first, torch.Tensor):
                seen.append((name, first.shape[0]))

        cache = model.new_cache(T + 4)
        plan.observe = observe
        try:
            with torch.inference_mode():
                logits = plan.step(ids, torch.arange(T, device=model.device), cache, all_logits=all_logits)
        finally:
            plan.observe = None
        return seen, logits, cache

    seen, logits, cache = rows_seen(False)
    full, full_logits, full_cache = rows_seen(True)
    # the last call that mixes positions: the delta rule, or the q/k preparation that fills the cache
    mixing = {"deltanet_chunked", "delta_rule_chunked", "qk_norm_rope_cache", "rope"}
    cut = max(j for j, (op, _) in enumerate(seen) if op in mixing) + 1
    if backend == "triton" and cfg.layer_types[last] == FULL:
        # the library's route (a prompt of GEMM rows): k and v projected for every row, q and its gate for the last
        # row alone, which is the one query that attends
        assert seen[:cut] == [("add_rms_norm", T), ("linear", T), ("linear", 1), ("qk_norm_rope_cache", 1)], seen
    else:
        assert [rows for _, rows in seen[:cut]] == [T] * cut, seen
    assert seen[cut:] and [rows for _, rows in seen[cut:]] == [1] * (len(seen) - cut), seen
    assert {rows for _, rows in full} == {T}, full   # (a prompt's MLP: the GEMM route there, the GEMV route here)
    assert logits.shape == (1, cfg.vocab_size) and full_logits.shape == (T, cfg.vocab_size)
    # (fp32 both ways; the GEMV and the decode attention sum in another order than the GEMM and flash attention)
    assert checks.relative_error(logits[0].float(), full_logits[-1].float()) <= 1e-4
    # the caches and states that the last layer leaves are those of the full step
    for a, b in zip(cache.tensors(), full_cache.tensors()):
        assert torch.equal(a, b)
    # and the plain route, which computes every row and keeps the last, gives the same logits
    plain = model.step(ids, torch.arange(T, device=model.device), model.new_cache(T))
    assert checks.relative_error(logits.float(), plain.float()) <= 1e-4


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_mixer_put_in_place_may_return_every_row(backend, gen):
    """A learner's block in place of a mixer (chapter 10) keeps the mixer's signature and may compute every row of
    the last layer: the fast route cuts its output to the last row, and the logits are those of the model's own
    mixer. The block gets the whole projection, every row's q included (the library's own block takes the last row's
    q alone on a prompt of GEMM rows)."""
    cfg = CONFIGS["tiny"]
    device = "cpu" if backend == "torch" else runtime.choose(None, torch.float32).device
    weights = random_weights(cfg, device=device, dtype=torch.float32, seed=2)
    model, every_row = (Qwen35Model(cfg, weights, device=device, dtype=torch.float32, backend=backend)
                        for _ in range(2))
    T = 20                                   # past the GEMV rows
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen).to(model.device)
    positions = torch.arange(T, device=model.device)
    want = fast_plan(model).step(ids, positions, model.new_cache(T))
    widths = []

    def block(i, layer, proj, positions, cache):
        out = Qwen35Model.gated_attention(every_row, i, layer, proj, positions, cache)
        widths.append((tuple(proj.shape), out.shape[0]))
        return out
    model.gated_attention = block
    for runner in (fast_plan(model), model):
        widths.clear()
        got = runner.step(ids, positions, model.new_cache(T))
        assert widths == [((T, cfg.attn_q_dim + 2 * cfg.attn_kv_dim), T)], widths
        assert got.shape == want.shape == (1, cfg.vocab_size)
        assert checks.relative_error(got.float(), want.float()) <= 1e-5


def test_split_norms_route_equals_the_norm_kernels(gen, monkeypatch, switch):
    """Split norms: a prompt's residual add + RMSNorm split between the GEMMs around it (no add_rms_norm kernel
    left at prefill), the same logits; decode keeps its fused GEMV route, launch for launch."""
    from qwen_lab.kernels import count_launches

    model = load_model("tiny", backend="triton")
    plan = fast_plan(model)
    T = 20
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=gen).to(model.device)
    runs = {}
    for on in (False, True):
        switch(split_norms=on)
        cache = model.new_cache(T + 1)
        with torch.inference_mode(), count_launches() as prefill:
            logits = plan.step(ids, torch.arange(T, device=model.device), cache, all_logits=True)
        with torch.inference_mode(), count_launches() as decode:
            plan.step(ids[:1], torch.tensor([T], device=model.device), cache)
        runs[on] = logits.float(), dict(prefill), dict(decode)
    (off, prefill_off, decode_off), (on, prefill_on, decode_on) = runs[False], runs[True]
    # bf16 on a GPU: h = s (1 + w) is rounded where the norm kernel rounds the normed row
    assert checks.relative_error(on, off) <= (1e-5 if model.dtype == torch.float32 else 3e-2)
    assert prefill_off["add_rms_norm_kernel"] == 2 * model.config.num_hidden_layers, prefill_off
    assert prefill_on.get("add_rms_norm_kernel", 0) == 0 and prefill_on["rms_norm_kernel"] == 1, prefill_on
    assert prefill_on["matmul_kernel"] == prefill_off["matmul_kernel"], (prefill_on, prefill_off)
    assert decode_on == decode_off
    # unset (None), the environment variable decides, read at each step
    switch(split_norms=None)
    monkeypatch.setenv("QWEN_LAB_SPLIT_NORMS", "1")
    assert plan._splits_norms(T) and not plan._splits_norms(1)
    monkeypatch.setenv("QWEN_LAB_SPLIT_NORMS", "0")
    assert not plan._splits_norms(T)


def test_fused_paths_launch_what_they_should(gen):
    """With the library's kernels, a prompt runs SwiGLU in the gate/up GEMM's epilogue (no silu_mul kernel) and the
    DeltaNet gates in the chunk prep (no gates kernel); each attention layer prepares q/k and fills the cache in one
    kernel for a prompt, and inside the attention's split kernel for a decode token."""
    from qwen_lab.kernels import count_launches

    model = load_model("tiny", backend="triton")
    plan = fast_plan(model)
    cfg = model.config
    T = 20                                             # past the GEMV rows: the tiled GEMM path
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen).to(model.device)
    cache = model.new_cache(T + 1)
    with count_launches() as prefill:
        plan.step(ids, torch.arange(T, device=model.device), cache)
    with count_launches() as decode:
        plan.step(ids[:1], torch.tensor([T], device=model.device), cache)
    L, A = cfg.num_hidden_layers, cfg.num_full_layers
    assert prefill["silu_mul_kernel"] == 0 and prefill["kv_cache_write_kernel"] == 0, dict(prefill)
    assert prefill["deltanet_gates_kernel"] == 0, dict(prefill)  # the gates are computed in the chunk prep
    assert prefill["qk_norm_rope_cache_kernel"] == A, dict(prefill)
    assert decode["qk_norm_rope_cache_kernel"] == 0, dict(decode)  # folded into the decode attention's split kernel
    # per layer: the in-projection, the gate/up GEMM with SwiGLU and the down GEMM; per DeltaNet layer the
    # out-projection (its gated norm is a kernel apart at prefill); per attention layer the o-projection. The last
    # layer's projections after its mixer see the last row alone: GEMVs, not GEMMs (its attention too: the decode
    # kernels for its one query)
    assert prefill["matmul_kernel"] == 4 * L - 3, dict(prefill)
    assert prefill["flash_attention_kernel"] == A - 1 and prefill["flash_decode_split_kernel"] == 1, dict(prefill)
    assert decode["flash_decode_split_kernel"] == A and decode["kv_cache_write_kernel"] == 0, dict(decode)
    # and the fused prompt path still equals the PyTorch operators
    oracle = Qwen35Model(cfg, model.weights, device=model.device, dtype=model.dtype, backend="torch")
    bound = 1e-4 if model.dtype == torch.float32 else 3e-2   # bf16 on a GPU: two orders of rounding
    with torch.inference_mode():
        fast = plan.step(ids, torch.arange(T, device=model.device), model.new_cache(T), all_logits=True).float()
    assert checks.relative_error(fast, oracle.forward(ids)) <= bound


def test_a_learners_entry_turns_its_fusions_off_and_is_called_where_the_plain_model_calls_it(gen):
    """Observing the fast route changes no launch; an entry of the table that is not the library's kernel turns off
    every fusion over it (the plan says so once, naming it), is called as often as the plain model calls it, and the
    fusions come back when the kernel is put back."""
    from qwen_lab.kernels import count_launches

    model = load_model("tiny", backend="triton")
    plan = fast_plan(model)
    cfg = model.config
    T = 20
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen).to(model.device)

    def launches(observe: bool):
        cache = model.new_cache(T + 1)
        counts = []
        plan.observe = (lambda layer, name, out: None) if observe else None
        for step_ids, pos in ((ids, torch.arange(T)), (ids[:1], torch.tensor([T]))):
            with count_launches() as c:
                plan.step(step_ids, pos.to(model.device), cache)
            counts.append(dict(c))
        plan.observe = None
        return counts

    assert launches(True) == launches(False)

    def decode_calls():
        called = []
        plan.observe = lambda layer, name, out: called.append(name)
        cache = model.new_cache(9)
        with torch.inference_mode():
            plan.step(ids[:8], torch.arange(8, device=model.device), cache)
            called.clear()
            plan.step(ids[:1], torch.tensor([8], device=model.device), cache)
        plan.observe = None
        return called

    assert "deltanet_conv_decode_step" in decode_calls() and "causal_conv1d" not in decode_calls()
    stock_conv = model.ops["causal_conv1d"]
    mine = []
    model.ops["causal_conv1d"] = lambda *a, **k: mine.append(1) or stock_conv(*a, **k)   # a learner's own entry
    with pytest.warns(UserWarning, match=r"model.ops\['causal_conv1d'\] is not the library's kernel"):
        called = decode_calls()
    assert "causal_conv1d" in called and "deltanet_conv_decode_step" not in called, called
    assert len(mine) == 2 * cfg.num_linear_layers   # the prefill's and the decode step's, per DeltaNet layer
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # said once
        decode_calls()
    model.ops["causal_conv1d"] = stock_conv
    assert "deltanet_conv_decode_step" in decode_calls()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_step_refuses_more_tokens_than_the_cache_holds(backend):
    # the kernels would leave the rows past the cache unwritten and return wrong logits without a word; the shape is
    # known on the host, so the step says so before any kernel runs
    model = load_model("tiny", device="cpu" if backend == "torch" else None, dtype=torch.float32, backend=backend)
    ids = torch.arange(8, device=model.device)
    for runner in (model, fast_plan(model)):
        with pytest.raises(GenerationError, match=r"ids: 8 tokens, but the cache holds max_len=4"):
            runner.step(ids, torch.arange(8, device=model.device), model.new_cache(4))
        with pytest.raises(GenerationError, match=r"positions: shape \(7,\), expected \(8,\)"):
            runner.step(ids, torch.arange(7, device=model.device), model.new_cache(8))
        logits = runner.step(ids, torch.arange(8, device=model.device), model.new_cache(8))
        assert logits.shape == (1, model.config.vocab_size)


def test_every_launcher_takes_the_references_arguments_in_its_order():
    """A kernel's launcher can stand in for the reference function of the same name with the same call: the
    reference's parameters come first, in its order, and the launcher's extras (out=, workspaces) after them. A
    launcher that put `out` before the reference's `gate` took a positional gate for its output buffer. (The fused
    kernels of the fast route too: each has a reference of its name.)"""
    import inspect

    from qwen_lab import reference
    from qwen_lab.model import triton_ops
    from qwen_lab.plan import _fused_kernels

    for name, fn in {**triton_ops(), **_fused_kernels()}.items():
        want = list(inspect.signature(getattr(reference, name)).parameters)
        params = inspect.signature(fn).parameters.values()
        positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        assert positional[:len(want)] == want, f"{name}: launcher {positional}, reference {want}"


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_the_forward_calls_every_entry_of_the_table_and_refuses_an_unknown_one(backend, gen):
    """A learner's kernel put in the table changes the model: the forward (a short prompt, a long one and a decode
    step) calls every entry but `sample`, which generation calls; a name the forward does not have is refused."""
    from qwen_lab import ConfigError

    device, dtype = ("cpu", torch.float32) if backend == "torch" else (None, None)   # triton: the runtime's own
    model = Qwen35Model(TINY, random_weights(TINY, device=device, dtype=dtype, seed=0), device=device, dtype=dtype,
                        backend=backend)
    called = {name for T in (3, 40) for _, name in qwen_lab_model.record_operators(model, T)}
    called |= {name for _, name in qwen_lab_model.record_operators(model, 3, decode=True)}
    assert called == set(OPERATORS) - {"sample"}, set(OPERATORS) ^ called
    assert all(model.ops[n] is fn for n, fn in (qwen_lab_model.torch_ops() if backend == "torch"
                                                 else qwen_lab_model.triton_ops()).items())   # restored
    with pytest.raises(ConfigError, match=r"model.ops\['rmsnorm'\]: the forward calls no operator of that name"):
        model.ops["rmsnorm"] = model.ops["rms_norm"]
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.ops["rms_norm"] = model.ops["rms_norm"]   # an entry the forward calls: no warning
