"""The prefill in bucket-sized pieces (qwen_lab.graph.prefill_pieces, PrefillGraphs), and generate() with graphs.

On a CPU (Triton interpreter, tiny model, float32): the greedy split into buckets, and the fact the design rests
on: `model.step` over the pieces, one after another into one cache, gives the logits and the cache contents
(KV rows, conv state, recurrent state) of one step over the whole prompt. On a GPU (bf16): the captured graphs
replay exactly the eager pieces, the pieces stay within bf16 noise of one eager prefill, generate() with graphs
picks the tokens eager generation picks, and a prompt longer than the cache is refused.
"""

import os
import types

import pytest
import torch

import qwen_lab
from qwen_lab.course import checks
from qwen_lab.errors import GenerationError
from qwen_lab.graph import PREFILL_BUCKETS, GraphCaptureError, PrefillGraphs, buckets_used, prefill_pieces
from qwen_lab.plan import fast_plan


# ---------------------------------------------------------------- the split


@pytest.mark.parametrize("T, pieces", [
    (1, [1]),
    (3, [1, 1, 1]),
    (4, [4]),
    (77, [64, 4, 4, 4, 1]),
    (2048, [2048]),
    (2049, [2048, 1]),
    (3000, [2048, 256, 256, 256, 64, 64, 16, 16, 16, 4, 4]),
    (5000, [2048, 2048, 256, 256, 256, 64, 64, 4, 4]),
])
def test_prefill_pieces_split_greedily_largest_first(T, pieces):
    assert prefill_pieces(T) == pieces
    assert sum(prefill_pieces(T)) == T


def test_prefill_pieces_with_other_buckets():
    assert PREFILL_BUCKETS == (2048, 1024, 256, 64, 16, 4, 1)
    assert prefill_pieces(70, (16, 4, 1)) == [16, 16, 16, 16, 4, 1, 1]
    assert prefill_pieces(70, (1, 16, 4)) == [16, 16, 16, 16, 4, 1, 1]   # any order; largest used first
    assert prefill_pieces(7, (1,)) == [1] * 7
    for T in range(1, 300):
        p = prefill_pieces(T)
        assert sum(p) == T and p == sorted(p, reverse=True)


def test_the_buckets_a_prompt_uses_split_it_as_every_bucket_does():
    """The benchmark captures only buckets_used(prefill_len): the pieces must be those of the full set."""
    assert buckets_used(2048) == (2048, 1)
    assert buckets_used(77) == (64, 4, 1)
    assert buckets_used(16, 77, 300) == (256, 64, 16, 4, 1)
    assert buckets_used(3000) == (2048, 256, 64, 16, 4, 1)
    assert buckets_used(70, buckets=(16, 4, 1)) == (16, 4, 1)
    for T in list(range(1, 600)) + [1023, 1024, 1025, 2047, 2048, 2049, 4100]:
        assert prefill_pieces(T, buckets_used(T)) == prefill_pieces(T), T
    with pytest.raises(GenerationError, match="T="):
        buckets_used(0)


@pytest.mark.parametrize("T", [0, -3, 2.0, True, None, "5"])
def test_prefill_pieces_rejects_bad_lengths(T):
    with pytest.raises(GenerationError, match="T="):
        prefill_pieces(T)


@pytest.mark.parametrize("buckets, fragment", [
    ((16, 4), "bucket 1"),
    ((), "non-empty"),
    ((16, 0, 1), "positive"),
    ((16, -4, 1), "positive"),
    ((16, 4.0, 1), "positive"),
    (7, "sequence"),
])
def test_prefill_pieces_rejects_bad_buckets(buckets, fragment):
    with pytest.raises(GenerationError, match=f"buckets=.*{fragment}"):
        prefill_pieces(10, buckets)


def test_prefill_graphs_need_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: see the gpu tests")
    model = qwen_lab.load_model("tiny", device="cpu", dtype=torch.float32, backend="torch")
    with pytest.raises(GraphCaptureError, match="NVIDIA GPU"):
        PrefillGraphs(model, model.new_cache(8))


# ---------------------------------------------------------------- pieces = one prefill


def step_in_pieces(model, ids, cache, buckets, start=0, logits_out=None):
    """model.step over the bucket pieces of ids, one after another into `cache`: the logits [1, V] of the last.
    With logits_out, every piece writes its logits there, as the captured steps do. (The fast route, as the graphs
    run it.)"""
    model = fast_plan(model)
    offset = 0
    with torch.inference_mode():
        for s in prefill_pieces(ids.numel(), buckets):
            positions = torch.arange(start + offset, start + offset + s, device=model.device)
            logits = model.step(ids[offset:offset + s], positions, cache, logits_out=logits_out)
            assert logits_out is None or logits.data_ptr() == logits_out.data_ptr()
            offset += s
    return logits


def cache_contents(cache, T):
    """(name, tensor) of everything a prefill of T tokens wrote: KV rows 0..T-1, conv and recurrent states."""
    out = []
    for i in range(cache.config.num_hidden_layers):
        for name in ("key", "value"):
            t = getattr(cache, name)[i]
            if t is not None:
                out.append((f"{name}[{i}] rows 0..{T - 1}", t[:T]))
        for name in ("conv_state", "recurrent_state"):
            t = getattr(cache, name)[i]
            if t is not None:
                out.append((f"{name}[{i}]", t))
    return out


def cache_errors(a, b, T):
    """{name: relative error of a's contents against b's}."""
    return {name: checks.relative_error(x.float(), y.float())
            for (name, x), (_, y) in zip(cache_contents(a, T), cache_contents(b, T))}


@pytest.fixture(scope="module")
def tiny():
    return fast_plan(qwen_lab.load_model("tiny"))  # the triton backend (the interpreter on a CPU), its fast route


@pytest.mark.parametrize("T", [1, 5, 17, 70])
def test_steps_over_the_pieces_equal_one_prefill(tiny, T):
    """No padding and no mask: the pieces at increasing positions carry the conv and delta-rule states and read
    the earlier keys from the KV cache, so they compute what one step over the whole prompt computes."""
    ids = torch.randint(0, tiny.config.vocab_size, (T,), generator=torch.Generator().manual_seed(T)).to(tiny.device)
    whole_cache, piece_cache = tiny.new_cache(T + 3), tiny.new_cache(T + 3)
    with torch.inference_mode():
        whole = tiny.step(ids, torch.arange(T, device=tiny.device), whole_cache)
    static_logits = torch.full((1, tiny.config.vocab_size), float("nan"), dtype=tiny.dtype, device=tiny.device)
    pieces = step_in_pieces(tiny, ids, piece_cache, (16, 4, 1), logits_out=static_logits)
    rtol = 1e-5 if tiny.dtype == torch.float32 else 2e-2
    err = checks.relative_error(pieces.float(), whole.float())
    assert torch.isfinite(pieces).all() and err < rtol, f"T={T}: last logits differ, relative error {err:.3g}"
    errors = cache_errors(piece_cache, whole_cache, T)
    assert len(errors) == 2 * tiny.config.num_full_layers + 2 * tiny.config.num_linear_layers
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v < rtol}
    assert not bad, f"T={T}: cache contents differ from one prefill: {bad}"


def test_generate_eager_is_one_prefill_then_decode_steps():
    """cuda_graph=False keeps the eager loop: one step of the fast route over the prompt, then one step per token."""
    model = fast_plan(qwen_lab.load_model("tiny", device="cpu", dtype=torch.float32, backend="torch"))
    prompt = torch.randint(0, model.config.vocab_size, (9,), generator=torch.Generator().manual_seed(4))
    got = qwen_lab.generate(model, prompt, max_new_tokens=6, cuda_graph=False, eos_token_ids=())
    cache = model.new_cache(16)
    want = []
    with torch.inference_mode():
        logits = model.step(prompt, torch.arange(9), cache)[-1]
        for n in range(6):
            want.append(int(logits.argmax()))
            logits = model.step(torch.tensor(want[-1:]), torch.tensor([9 + n]), cache)[-1]
    assert got.tolist() == want


def _count_workspaces(monkeypatch):
    """Record every sampling_workspace() call (the sampler's scratch) from here on."""
    from qwen_lab.kernels import sampling

    calls, real = [], sampling.sampling_workspace
    monkeypatch.setattr(sampling, "sampling_workspace", lambda *args: calls.append(args) or real(*args))
    return calls


def test_generate_allocates_the_sampling_scratch_once(tiny, monkeypatch):
    """One workspace serves every draw of a generation (graph.sampler); a sampler that takes neither `out` nor
    `workspace` (a learner's) is still called, and with the same uniforms draws the same tokens."""
    from qwen_lab.kernels import sampling

    prompt = torch.randint(0, tiny.config.vocab_size, (6,), generator=torch.Generator().manual_seed(6))
    kwargs = dict(max_new_tokens=5, temperature=0.9, top_k=7, top_p=0.9, seed=3, cuda_graph=False, eos_token_ids=())
    calls = _count_workspaces(monkeypatch)
    got = qwen_lab.generate(tiny, prompt, **kwargs)
    assert len(calls) == 1, f"{len(calls)} sampling workspaces for 5 draws; expected one per generation"
    monkeypatch.setitem(tiny.ops, "sample", lambda logits, t, k, p, u: sampling.sample(logits, t, k, p, u))
    plain = qwen_lab.generate(tiny, prompt, **kwargs)
    assert len(calls) == 1 + 5, "the plain sampler should allocate its own scratch at each of the 5 draws"
    assert got.tolist() == plain.tolist()


def test_the_benchmark_captures_only_the_buckets_its_prompt_uses(tiny, monkeypatch):
    """The graph row's prefill: each bucket's warm-up compiles and tunes its own length (minutes on a fresh GPU for
    the whole set), and the benchmark replays only the pieces of its prompt. (Stand-ins for the capture, which needs
    a GPU; the row's untimed warm-up runs the tiny model for real.)"""
    from qwen_lab import bench, graph

    made = []

    class Recorded:
        def __init__(self, model, cache, buckets=graph.PREFILL_BUCKETS, max_len=None, **kwargs):
            made.append(tuple(buckets))
            self.buckets = tuple(buckets)

        def pieces(self, T):
            return graph.prefill_pieces(T, self.buckets)

        def run(self, ids, start=0):
            return None

    replays = types.SimpleNamespace(replay=lambda: None)
    monkeypatch.setattr(graph, "PrefillGraphs", Recorded)
    monkeypatch.setattr(graph, "capture", lambda fn, **kwargs: (replays, None))
    row = bench.bench_qwen_lab(tiny, prefill_len=77, decode_steps=1, graph=True, gen=torch.Generator().manual_seed(0))
    assert made == [(64, 4, 1)], f"captured buckets {made}; a 77-token prompt is replayed as 64 + 4 + 4 + 4 + 1"
    assert row["host_launches_prefill"] == 3 * 5   # per piece: the ids, the positions, the replay


def test_decode_graph_keeps_the_sampling_scratch_alive(tiny, monkeypatch):
    """A captured graph keeps the addresses it was captured with, not the tensors: the sampler's workspace, allocated
    before the capture, must live as long as the DecodeGraph, or the next allocations take its memory and every
    replay writes over them. (The capture itself needs a GPU; here a stand-in runs the step once instead.)"""
    import gc
    import weakref

    from qwen_lab import graph
    from qwen_lab.kernels import sampling

    made, real = [], sampling.sampling_workspace

    def tracked(*args):
        ws = real(*args)
        made.append(weakref.ref(ws))
        return ws

    monkeypatch.setattr(sampling, "sampling_workspace", tracked)
    monkeypatch.setattr(graph, "capture", lambda fn, **kwargs: (None, fn()))
    decode = graph.DecodeGraph(tiny, tiny.new_cache(8), 0.8, 5, 0.9, torch.rand(4, device=tiny.device))
    gc.collect()
    assert len(made) == 1 and made[0]() is not None, "the DecodeGraph let its sampling workspace be freed"
    assert 0 <= int(decode.token) < tiny.config.vocab_size


# ---------------------------------------------------------------- GPU

# The tests of the 0.8B model share its module-scoped fixtures (the model, its captured buckets, transformers' copy)
# only on the worker that builds them: spread over several pytest-xdist workers, each built its own, and under
# twelve workers tuning at once a bucket capture passed the per-test limit. `--dist loadgroup` (gpu_session.sh)
# keeps this group on one worker.
ON_ONE_WORKER = pytest.mark.xdist_group("qwen3.5-0.8b graphs")


@pytest.fixture(scope="module")
def deterministic():
    """Split-K GEMVs reduce in a fixed order, so the same launches give the same bits (graph and eager)."""
    old = os.environ.get("QWEN_LAB_DETERMINISTIC")
    os.environ["QWEN_LAB_DETERMINISTIC"] = "1"
    yield
    if old is None:
        os.environ.pop("QWEN_LAB_DETERMINISTIC", None)
    else:
        os.environ["QWEN_LAB_DETERMINISTIC"] = old


@pytest.fixture(scope="module")
def big(deterministic):
    return fast_plan(qwen_lab.load_model("qwen3.5-0.8b", dtype=torch.bfloat16))


@pytest.fixture(scope="module")
def big_float32(big):
    """transformers' model holding the same weights in float32: the yardstick of bf16 rounding."""
    from qwen_lab import bench

    return bench.transformers_model(big.config, big.weights, big.device, torch.float32)


@pytest.fixture(scope="module")
def big_graphs(big):
    cache = big.new_cache(2048 + 8)
    return PrefillGraphs(big, cache), cache


@pytest.mark.gpu
@ON_ONE_WORKER
def test_prefill_graphs_capture_the_buckets_that_fit(big, big_graphs):
    graphs, cache = big_graphs
    assert graphs.buckets == PREFILL_BUCKETS and set(graphs.graphs) == set(PREFILL_BUCKETS)
    small = PrefillGraphs(big, big.new_cache(300))
    assert small.buckets == (256, 64, 16, 4, 1)
    assert small.pieces(300) == [256, 16, 16, 4, 4, 4]
    assert PrefillGraphs(big, big.new_cache(300), max_len=20).buckets == (16, 4, 1)


@pytest.mark.gpu
@ON_ONE_WORKER
@pytest.mark.parametrize("T", [1, 77, 300, 2048])
def test_prefill_graphs_match_the_eager_prefill(big, big_graphs, big_float32, T):
    graphs, cache = big_graphs
    dev = big.device
    ids = torch.randint(0, big.config.vocab_size, (T,), generator=torch.Generator().manual_seed(T)).to(dev)
    cache.reset()
    with torch.inference_mode():
        got = graphs.run(ids).clone()
    torch.cuda.synchronize()
    assert got.shape == (1, big.config.vocab_size) and torch.isfinite(got).all()

    # (1) the graphs replay exactly the eager steps over the same pieces: same kernels, same shapes
    pieces_cache = big.new_cache(cache.max_len)
    pieces = step_in_pieces(big, ids, pieces_cache, graphs.buckets)
    err = checks.relative_error(got.float(), pieces.float())
    assert err < 1e-2, f"T={T}: graph replay against the eager pieces: relative error {err:.3g}"
    errors = cache_errors(cache, pieces_cache, T)
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v < 1e-2}
    assert not bad, f"T={T}: the graphs' cache differs from the eager pieces' cache: {bad}"

    # (2) the pieces against one eager prefill of the whole prompt: different shapes round differently in bf16,
    # so the bar is the bf16 rounding level, measured here as the eager prefill's own error against float32
    whole_cache = big.new_cache(cache.max_len)
    with torch.inference_mode():
        whole = big.step(ids, torch.arange(T, device=dev), whole_cache)
    err_whole = checks.relative_error(got.float(), whole.float())
    with torch.inference_mode():
        exact = big_float32(input_ids=ids[None], logits_to_keep=1).logits[0, -1:].float()
    noise = checks.relative_error(whole.float(), exact)
    print(f"T={T}: graphs vs eager pieces {err:.2e}, vs one eager prefill {err_whole:.2e}; eager bf16 vs "
          f"float32 {noise:.2e}; pieces {graphs.pieces(T)}")
    assert err_whole < max(1e-2, 1.5 * noise), f"T={T}: pieces vs one prefill {err_whole:.3g}, bf16 noise {noise:.3g}"
    assert checks.relative_error(got.float(), exact) < 1.5 * noise + 1e-2
    errors = cache_errors(cache, whole_cache, T)
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v < max(2e-2, 1.5 * noise)}
    assert not bad, f"T={T}: the graphs' cache differs from one prefill's beyond bf16 noise {noise:.3g}: {bad}"


@pytest.mark.gpu
@ON_ONE_WORKER
@pytest.mark.parametrize("T", [77, 300])
def test_prefill_graphs_with_the_default_atomic_split_k(big, big_float32, T, monkeypatch):
    """The same comparison with the default reduction of the split-K GEMVs (atomic adds), which the pieces of 4 and
    16 tokens use. A race in that reduction (the sums cleared before every thread had read them) once put these
    logits 1.1 (T = 77) and 1.4 (T = 300) away from one eager prefill, eager pieces and graphs alike, while the
    deterministic runs above agreed. The comparisons say which side is off: the first graph run against the eager
    pieces, the twelfth run against the first (whether repeats drift), the eager pieces against one eager
    prefill, and the graphs against float32."""
    monkeypatch.setenv("QWEN_LAB_DETERMINISTIC", "0")
    dev = big.device
    cache = big.new_cache(2048)
    graphs = PrefillGraphs(big, cache)
    ids = torch.randint(0, big.config.vocab_size, (T,), generator=torch.Generator().manual_seed(T)).to(dev)
    with torch.inference_mode():
        runs = []
        for _ in range(12):   # the notebook timed 10 runs of each before comparing: does a repeat drift?
            cache.reset()
            runs.append(graphs.run(ids).clone().float())
        got = runs[-1]
        pieces = step_in_pieces(big, ids, big.new_cache(2048), graphs.buckets).float()
        whole = big.step(ids, torch.arange(T, device=dev), big.new_cache(2048)).float()
        exact = big_float32(input_ids=ids[None], logits_to_keep=1).logits[0, -1:].float()
    noise = checks.relative_error(whole, exact)
    errors = {"first graph run vs eager pieces": checks.relative_error(runs[0], pieces),
              "twelfth graph run vs the first": checks.relative_error(got, runs[0]),
              "eager pieces vs one eager prefill": checks.relative_error(pieces, whole),
              "graphs vs float32": checks.relative_error(got, exact)}
    bad = {k: f"{v:.3g}" for k, v in errors.items() if not v < max(2e-2, 1.5 * noise + 1e-2)}
    assert not bad, f"T={T} (pieces {graphs.pieces(T)}, bf16 noise {noise:.3g}): {bad}"


def assert_same_greedy_tokens(model, prompt, graph, eager, top: int = 5):
    """graph == eager, or they part where bf16 rounding of two computation orders can flip the choice: both tokens
    are among the `top` most likely of the eager logits over the common prefix. (On random weights the logits are
    nearly flat, so a flip is common; a wrong kernel would pick an unlikely token.)"""
    if graph == eager:
        return
    n = next(i for i, (a, b) in enumerate(zip(graph, eager)) if a != b)
    ids = torch.cat([prompt.to(model.device), torch.tensor(eager[:n], dtype=torch.long, device=model.device)])
    logits = model.forward(ids)[-1]
    best = logits.topk(top).indices.tolist()
    assert graph[n] in best and eager[n] in best, (
        f"the graph run picked {graph[n]} at step {n}, eager {eager[n]}: not both among the {top} most likely "
        f"tokens {best}\ngraph {graph}\neager {eager}")


@pytest.mark.gpu
@ON_ONE_WORKER
@pytest.mark.parametrize("source, T", [("tiny", 37), ("tiny", 5), ("qwen3.5-0.8b", 77)])
def test_generate_with_graphs_picks_the_eager_tokens(deterministic, big, source, T):
    model = big if source != "tiny" else qwen_lab.load_model("tiny", device="cuda")
    prompt = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(T))
    eager = qwen_lab.generate(model, prompt, max_new_tokens=16, cuda_graph=False, eos_token_ids=()).tolist()
    graph = qwen_lab.generate(model, prompt, max_new_tokens=16, cuda_graph=True, eos_token_ids=()).tolist()
    default = qwen_lab.generate(model, prompt, max_new_tokens=16, eos_token_ids=()).tolist()
    assert len(graph) == len(eager) == 16
    assert default == graph  # graphs are the default on a GPU, and a second run replays the same bits
    assert_same_greedy_tokens(model, prompt, graph, eager)


@pytest.mark.gpu
def test_prefill_graphs_refuse_a_prompt_longer_than_the_cache():
    model = qwen_lab.load_model("tiny", device="cuda")
    graphs = PrefillGraphs(model, model.new_cache(8))
    assert graphs.buckets == (4, 1)
    ids = torch.randint(0, model.config.vocab_size, (9,), device="cuda")
    with pytest.raises(GenerationError, match="max_len=8"):
        graphs.run(ids)
    with pytest.raises(GenerationError, match="max_len=8"):
        graphs.run(ids[:5], start=4)
    with pytest.raises(GenerationError, match="ids"):
        graphs.run(ids.cpu())
    assert torch.isfinite(graphs.run(ids[:8])).all()
    with pytest.raises(GenerationError, match="max_len=8"):
        qwen_lab.generate(model, ids, max_new_tokens=2, max_len=8, cuda_graph=True)


@pytest.mark.gpu
def test_decode_graph_samples_with_one_workspace_and_draws_the_eager_tokens(deterministic, monkeypatch):
    """The captured step's sampler gets its scratch before the capture (no allocation or memset replayed per token)
    and, with top-k and top-p, draws what the eager loop draws from the same uniforms."""
    model = qwen_lab.load_model("tiny", device="cuda")
    prompt = torch.randint(0, model.config.vocab_size, (11,), generator=torch.Generator().manual_seed(11))
    kwargs = dict(max_new_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=5, eos_token_ids=())
    eager = qwen_lab.generate(model, prompt, cuda_graph=False, **kwargs).tolist()
    calls = _count_workspaces(monkeypatch)
    graph = qwen_lab.generate(model, prompt, cuda_graph=True, **kwargs).tolist()
    # one, made before the capture: the eager draw of the prompt's last logits uses the captured step's scratch too
    assert len(calls) == 1, f"{len(calls)} sampling workspaces for a graphed generation; expected 1"
    assert graph == eager
