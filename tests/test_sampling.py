"""The device sampler against qwen_lab.reference.sample: greedy, temperature, top-k, top-p."""

import math

import pytest
import torch

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.sampling import KEY_BITS, LOG2E, sample, sampling_workspace

ONE_MINUS = 1.0 - 2.0 ** -24          # the largest float32 below 1


def _u(value, device):
    return torch.tensor(value, dtype=torch.float32, device=device)


def _assert_same_draw(got, want, logits, temperature, top_k, top_p, u, what=""):
    """The kernel's draw equals the reference's. Two exceptions, both the neighbour across one edge of the
    kept CDF (within 1e-5 of the mass): u = 1 - 2^-24, where the reference's float32 running sum has stopped
    growing at the tail and the kernel's float64 one has not; and on a GPU, where the reference's running
    sum is a float32 scan in another order. On the CPU every other draw must be equal."""
    if int(got) == int(want):
        return
    loose = logits.device.type != "cpu" or float(u) == ONE_MINUS
    assert loose and _near_edge(got, want, logits, temperature, top_k, top_p, u), \
        (f"{what} T={temperature} top_k={top_k} top_p={top_p} u={float(u)}: kernel drew {int(got)}, "
         f"reference {int(want)}")


def _kept_probs(logits, temperature, top_k, top_p):
    """The kept set's renormalised probabilities by the order-free rules, in float64 on the CPU.

    Returns (q, keep, mass_greater): q [V] (0 outside the kept set), keep [V] bool, and for every token
    the probability mass of the tokens strictly more likely than it."""
    p = torch.softmax(logits.double().cpu() / temperature, 0)
    asc = torch.sort(p).values
    at_most = torch.searchsorted(asc, p, right=True)         # tokens with probability <= p_i
    csum = torch.cumsum(asc, 0)
    n_greater = p.numel() - at_most
    mass_greater = csum[-1] - csum[at_most - 1]
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k > 0:
        keep &= n_greater < top_k
    if top_p < 1:
        keep &= mass_greater < top_p
    q = torch.where(keep, p, torch.zeros(()))
    return q / q.sum(), keep, mass_greater


# ---------------------------------------------------------------- greedy

@pytest.mark.parametrize("V", [1, 2, 37, 1000, 2500])
def test_greedy_is_argmax(rt, gen, V):
    logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
    with count_launches() as launches:
        got = sample(logits, 0.0, 0, 1.0, None)
    assert sum(launches.values()) == 1                       # greedy is one kernel
    assert got.shape == () and got.dtype == torch.int64 and got.device == logits.device
    checks.compare("greedy", got, reference.sample(logits, 0.0, 0, 1.0, None))


def test_greedy_ties_take_the_lowest_index(rt, gen):
    V = 2500                                                 # several programs under the interpreter
    logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device)
    for planted in ([2400, 1500, 7], [1023, 1024], [2499, 1800], [0, 5]):
        x = logits.clone()
        x[planted] = 9.0
        got = sample(x, 0.0, 0, 1.0, None)
        assert int(got) == min(planted), (planted, int(got))
        checks.compare("greedy ties", got, reference.sample(x, 0.0, 0, 1.0, None))
    flat = torch.zeros(V, device=rt.device, dtype=rt.dtype)     # everything tied: index 0
    assert int(sample(flat, 0.0, 0, 1.0, None)) == 0


def test_greedy_on_a_strided_row(rt, gen):
    table = checks.randn(300, 3, g=gen, dtype=rt.dtype, device=rt.device)
    col = table[:, 1]                                        # stride 3
    checks.compare("greedy (strided)", sample(col, 0.0, 0, 1.0, None), reference.sample(col, 0.0, 0, 1.0, None))


# ---------------------------------------------------------------- exact agreement with the reference

# (V, logit scale, temperature, top_k, top_p): random logits, several temperatures and filters
CASES = [
    (1, 1.0, 1.0, 0, 1.0), (2, 2.0, 0.7, 0, 1.0), (5, 1.0, 1.0, 1, 1.0), (64, 3.0, 0.5, 1, 0.5),
    (100, 1.0, 1.0, 0, 1.0), (100, 2.0, 1.0, 10, 1.0), (100, 2.0, 1.0, 0, 0.9), (100, 2.0, 0.8, 10, 0.9),
    (300, 3.0, 1.3, 0, 1e-6), (300, 1.0, 2.5, 50, 0.95), (300, 0.5, 0.3, 299, 0.99), (300, 1.0, 1.0, 500, 1.0),
    (1000, 2.0, 0.7, 20, 0.8), (1000, 1.0, 1.0, 0, 0.5), (2500, 2.0, 1.0, 40, 1.0), (2500, 1.0, 1.0, 0, 0.7),
    (2500, 2.0, 1.5, 0, 1.0),
]


@pytest.mark.parametrize("V,scale,temperature,top_k,top_p", CASES)
def test_matches_reference_exactly(rt, gen, V, scale, temperature, top_k, top_p):
    for trial in range(3):
        logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device, scale=scale)
        u_value = [float(torch.rand((), generator=gen)), 0.0, ONE_MINUS][trial]
        u = _u(u_value, rt.device)
        got = sample(logits, temperature, top_k, top_p, u)
        want = reference.sample(logits, temperature, top_k, top_p, u)
        _assert_same_draw(got, want, logits, temperature, top_k, top_p, u, what=f"V={V}")


def test_ties_in_logits_stay_together(rt, gen):
    """Integer logits: many exact ties; top-k and top-p keep or drop a tied group as a whole."""
    V = 400
    for trial, (top_k, top_p) in enumerate([(3, 1.0), (1, 1.0), (0, 0.3), (7, 0.6), (0, 0.999)]):
        logits = torch.randint(-4, 4, (V,), generator=gen).to(device=rt.device, dtype=rt.dtype)
        for u_value in (float(torch.rand((), generator=gen)), 0.0, ONE_MINUS, 0.5):
            u = _u(u_value, rt.device)
            got = sample(logits, 1.0, top_k, top_p, u)
            _assert_same_draw(got, reference.sample(logits, 1.0, top_k, top_p, u), logits, 1.0, top_k, top_p, u,
                              what="integer logits")
    # every token tied: the draw is a uniform pick in index order
    flat = torch.zeros(10, device=rt.device, dtype=rt.dtype)
    for top_k, top_p in ((1, 1.0), (3, 0.2), (0, 1.0)):
        assert int(sample(flat, 1.0, top_k, top_p, _u(0.55, rt.device))) == 5


def test_top_k_one_and_tiny_top_p_are_greedy(rt, gen):
    logits = checks.randn(700, g=gen, dtype=rt.dtype, device=rt.device, scale=2.0)
    best = int(torch.argmax(logits))
    logits[best] += 1.0                                      # a unique maximum, even in bf16
    for u_value in (0.0, 0.3, ONE_MINUS):
        assert int(sample(logits, 0.9, 1, 1.0, _u(u_value, rt.device))) == best
        assert int(sample(logits, 1.7, 0, 1e-7, _u(u_value, rt.device))) == best
    assert int(sample(logits, 1.0, 0, 1e-300, _u(0.9, rt.device))) == best     # below float32's range


def test_uniform_edges_pick_first_and_last_kept(rt, gen):
    logits = checks.randn(500, g=gen, dtype=rt.dtype, device=rt.device)
    _, keep, _ = _kept_probs(logits, 1.0, 30, 1.0)
    kept_idx = keep.nonzero().flatten()
    assert int(sample(logits, 1.0, 30, 1.0, _u(0.0, rt.device))) == int(kept_idx[0])
    assert int(sample(logits, 1.0, 30, 1.0, _u(ONE_MINUS, rt.device))) == int(kept_idx[-1])


def test_draws_are_kept_tokens_and_follow_the_kept_probabilities(rt, gen):
    """A chi-square test of the draws' frequencies against the kept set's probabilities."""
    logits = torch.tensor([1.0, 2.5, 0.3, 2.0, -1.0, 2.2, 1.8, 0.0, 2.4, -3.0], device=rt.device, dtype=rt.dtype)
    temperature, top_k, top_p = 1.2, 6, 0.85
    q, keep, _ = _kept_probs(logits, temperature, top_k, top_p)
    assert 3 <= int(keep.sum()) <= 6
    n = 200
    ws = sampling_workspace(logits.numel(), rt.device)
    out = torch.empty((), dtype=torch.int64, device=rt.device)
    counts = torch.zeros(logits.numel(), dtype=torch.float64)
    for _ in range(n):
        u = torch.rand((), generator=gen).to(rt.device)
        counts[int(sample(logits, temperature, top_k, top_p, u, out=out, workspace=ws))] += 1
    assert counts[~keep].sum() == 0, f"drew tokens outside the kept set: {counts}"
    expected = n * q[keep]
    chi2 = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = int(keep.sum()) - 1
    z = 3.09                                                 # one-sided p = 1e-3 (Wilson-Hilferty)
    limit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert chi2 < limit, f"chi-square {chi2:.1f} >= {limit:.1f} (df={df}): counts {counts[keep]}, expected {expected}"


def test_gpu_configuration_runs_right_under_the_interpreter(rt, gen, monkeypatch):
    """The GPU's constexpr configuration (1024-token blocks in 128-token chunks, 6 rounds of 5 bits, chunks
    without live tokens skipped after round 0) is not what the interpreter runs by default: check it here too."""
    from qwen_lab.kernels import sampling
    from qwen_lab.kernels.sampling import radix_select
    monkeypatch.setattr(radix_select, "_config", lambda V: sampling._GPU)
    V = 4500
    logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device, scale=2.0)
    logits[[7, 2100, V - 1]] = 9.0                            # a tie spread over three blocks
    for temperature, top_k, top_p, u_value in [(0.0, 0, 1.0, 0.0), (0.8, 20, 0.9, 0.6), (1.0, 0, 0.7, 0.3)]:
        u = _u(u_value, rt.device)
        _assert_same_draw(sample(logits, temperature, top_k, top_p, u),
                          reference.sample(logits, temperature, top_k, top_p, u), logits, temperature, top_k, top_p, u)


@pytest.mark.parametrize("option", [dict(block=2048), dict(chunk=64), dict(skip_dead=False)],
                         ids=["block=2048", "chunk=64", "no-skip"])
def test_launch_configurations_give_the_same_search(rt, gen, monkeypatch, option):
    """The launch configurations benchmarks/probe_sampling.py times against the GPU's (kernels.sampling._Config):
    other tokens per program, per step of a program's loop, no test of each chunk for tokens in play after round 0.
    Every round must end in the same state: the threshold, the tokens above it, the flag, and the token drawn."""
    import dataclasses

    from qwen_lab.kernels import sampling
    from qwen_lab.kernels.sampling import radix_select
    V = 4500                                                  # 5 blocks of 1024, 3 of 2048
    logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device, scale=2.0)
    logits[[7, 2100, V - 1]] = 9.0                            # a tie, one of it in the last block
    u = _u(0.6, rt.device)
    for temperature, top_k, top_p in [(0.8, 20, 0.9), (1.0, 0, 0.7), (1.0, 3, 1.0), (2.0, 0, 0.99)]:
        results = []
        for config in (sampling._GPU, dataclasses.replace(sampling._GPU, **option)):
            monkeypatch.setattr(radix_select, "_config", lambda V, config=config: config)
            ws = sampling_workspace(V, rt.device)
            token = int(sample(logits, temperature, top_k, top_p, u, workspace=ws))
            results.append((token, ws.state_i.tolist()))
        assert results[0] == results[1], (f"T={temperature} top_k={top_k} top_p={top_p}: (token, [tau, tokens "
                                           f"above, done]) {results[0]} by default, {results[1]} with {option}")


def test_search_stops_once_the_boundary_bin_is_kept(rt, gen):
    """The radix select ends as soon as every token of the boundary bin is kept: tau is then that bin's lowest
    key, the remaining rounds return at once, and the draw is the reference's. Where the bin keeps splitting
    (tied tokens past top_k), every round runs and tau is the exact key."""
    V = 1000
    ws = sampling_workspace(V, rt.device)
    nbits, key_bits = ws.config.nbits, KEY_BITS
    x = checks.randn(V, g=gen, device="cpu")
    x[[11, 500, 987]] = torch.tensor([20.0, 19.5, 19.0])     # three tokens far above the rest
    logits = x.to(device=rt.device, dtype=rt.dtype)
    u = _u(0.37, rt.device)
    # top-k 3 keeps exactly those three; the bin of the third one's key (the top nbits bits) holds no other
    # token, so round 0 already decides
    _assert_same_draw(sample(logits, 1.0, 3, 1.0, u, workspace=ws), reference.sample(logits, 1.0, 3, 1.0, u),
                      logits, 1.0, 3, 1.0, u)
    e3 = torch.exp2((torch.tensor(19.0) - 20.0) * LOG2E).float()
    shift = key_bits - nbits
    third = int(e3.view(torch.int32))
    assert int(ws.state_i[2]) == 1, "the search did not stop after a round whose boundary bin was all kept"
    assert int(ws.state_i[0]) == (third >> shift) << shift, \
        f"tau {int(ws.state_i[0]):#x}: expected the lowest key of round 0's bin, {(third >> shift) << shift:#x}"
    # top-p 0.5 keeps the first alone; the second shares its bin in round 0, so it takes one round more
    _assert_same_draw(sample(logits, 1.0, 0, 0.5, u, workspace=ws), reference.sample(logits, 1.0, 0, 0.5, u),
                      logits, 1.0, 0, 0.5, u)
    assert int(ws.state_i[2]) == 1
    # every logit tied and top_k 5: the bin never splits and is never kept whole before the last round
    tied = torch.zeros(V, device=rt.device, dtype=rt.dtype)
    _assert_same_draw(sample(tied, 1.0, 5, 1.0, u, workspace=ws), reference.sample(tied, 1.0, 5, 1.0, u),
                      tied, 1.0, 5, 1.0, u)
    assert int(ws.state_i[2]) == 0 and int(ws.state_i[0]) == 0x3F800000        # the exact key of e = 1.0
    assert int(ws.counter.sum()) == 0


# ---------------------------------------------------------------- buffers, launches, errors

def test_out_buffer_workspace_reuse_and_launch_counts(rt, gen):
    V = 1500
    logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device, scale=2.0)
    ws = sampling_workspace(V, rt.device)
    out = checks.poison_(torch.empty((), dtype=torch.int64, device=rt.device))
    u = _u(0.37, rt.device)
    with count_launches() as launches:
        got = sample(logits, 0.8, 0, 1.0, u, out=out, workspace=ws)
    assert got.data_ptr() == out.data_ptr() and sum(launches.values()) == 2          # max, draw
    _assert_same_draw(out, reference.sample(logits, 0.8, 0, 1.0, u), logits, 0.8, 0, 1.0, u)
    with count_launches() as launches:
        first = int(sample(logits, 0.8, 25, 0.9, u, out=out, workspace=ws))
    assert launches["sample_max_kernel"] == 1 and launches["sample_draw_kernel"] == 1
    assert launches["sample_round_kernel"] >= 3
    _assert_same_draw(out, reference.sample(logits, 0.8, 25, 0.9, u), logits, 0.8, 25, 0.9, u)
    assert int(sample(logits, 0.8, 25, 0.9, u, out=out, workspace=ws)) == first        # reusable, deterministic
    assert int(ws.counter.sum()) == 0                        # every kernel leaves its counter at 0


def test_check_kernel_accepts_it(rt):
    def case(g):
        return dict(logits=checks.randn(200, g=g, dtype=rt.dtype, device=rt.device, scale=2.0),
                    temperature=0.9, top_k=12, top_p=0.8, uniform=torch.rand((), generator=g).to(rt.device),
                    out=torch.empty((), dtype=torch.int64, device=rt.device))
    checks.check_kernel("sample", sample, reference.sample, cases=[case], quiet=True)


def test_bad_arguments_are_named(rt):
    x = torch.zeros(10, device=rt.device, dtype=rt.dtype)
    u = _u(0.5, rt.device)
    for kwargs, word in [(dict(temperature=-1.0), "temperature"), (dict(temperature=float("nan")), "temperature"),
                         (dict(temperature=1e-40), "temperature"),
                         (dict(top_k=-2), "top_k"), (dict(top_k=2.5), "top_k"), (dict(top_p=0.0), "top_p"),
                         (dict(top_p=1.5), "top_p"), (dict(uniform=0.5), "uniform"),
                         (dict(uniform=torch.zeros(2, device=rt.device)), "uniform")]:
        args = dict(logits=x, temperature=1.0, top_k=0, top_p=1.0, uniform=u) | kwargs
        with pytest.raises(KernelError, match=word):
            sample(**args)
    with pytest.raises(KernelError, match="logits"):
        sample(x[None], 1.0, 0, 1.0, u)
    with pytest.raises(KernelError, match="out"):
        sample(x, 1.0, 0, 1.0, u, out=torch.empty((), dtype=torch.int32, device=rt.device))
    with pytest.raises(KernelError, match="workspace"):
        sample(x, 1.0, 0, 1.0, u, workspace=sampling_workspace(11, rt.device))


# ---------------------------------------------------------------- GPU: V = 248320

def _near_edge(got, want, logits, temperature, top_k, top_p, u, tol=1e-5):
    """True when two different draws are the two sides of one edge of the kept CDF, within tol of the
    kept mass: what fp32 (reference) and fp64 (kernel) sums may legitimately disagree on."""
    q, _, _ = _kept_probs(logits, temperature, top_k, top_p)
    lo, hi = sorted((int(got), int(want)))
    cdf = torch.cumsum(q, 0)
    between = float(cdf[hi - 1] - cdf[lo]) if hi > lo + 1 else 0.0
    return between <= tol and abs(float(cdf[lo]) - float(u)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_greedy_full_vocab(gen, dtype):
    V = QWEN35_0_8B.vocab_size
    for trial in range(20):
        logits = checks.randn(V, g=gen, dtype=dtype, device="cuda", scale=3.0)
        if trial % 2:
            hot = torch.randint(0, V, (3,), generator=gen)
            logits[hot.cuda()] = 30.0                         # a three-way tie far apart
        got = sample(logits, 0.0, 0, 1.0, None)
        assert int(got) == int(torch.argmax(logits.float()))


@pytest.mark.gpu
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 20, 0.8), (1.0, 1, 1.0), (1.0, 0, 1e-6), (0.6, 0, 1.0),
                                                     (1.0, 50, 1.0), (0.8, 0, 0.95), (1.0, 100000, 0.999)])
def test_gpu_matches_reference_full_vocab(gen, temperature, top_k, top_p):
    """Peaked logits: the same token as the reference. Nearly flat ones (248320 probabilities of ~4e-6):
    fp32 (reference) and fp64 (kernel) running sums may pick the neighbour across one edge of the CDF, so
    there the draws must agree within 1e-4 of the probability mass."""
    V = QWEN35_0_8B.vocab_size
    ws = sampling_workspace(V, "cuda")
    exact_peaked = 0
    for trial in range(16):
        scale = (6.0, 3.0, 1.0, 0.3)[trial % 4]              # peaked to nearly flat distributions
        logits = checks.randn(V, g=gen, dtype=torch.bfloat16, device="cuda", scale=scale)
        u = torch.rand((), generator=gen).cuda() if trial % 5 else _u((0.0, ONE_MINUS)[trial % 2], "cuda")
        got = sample(logits, temperature, top_k, top_p, u, workspace=ws)
        want = reference.sample(logits, temperature, top_k, top_p, u)
        if int(got) == int(want):
            exact_peaked += scale >= 3.0
            continue
        tol = 1e-5 if scale >= 3.0 else 1e-4
        assert _near_edge(got, want, logits, temperature, top_k, top_p, u, tol=tol), \
            f"trial {trial} (scale {scale}): kernel drew {int(got)}, reference {int(want)}, not neighbours across an edge"
    assert exact_peaked >= 6, f"only {exact_peaked} of 8 draws on peaked logits equal the reference"


@pytest.mark.gpu
def test_gpu_deterministic_and_graph_capturable(gen):
    V = QWEN35_0_8B.vocab_size
    logits = checks.randn(V, g=gen, dtype=torch.bfloat16, device="cuda", scale=2.0)
    ws = sampling_workspace(V, "cuda")
    out = torch.empty((), dtype=torch.int64, device="cuda")
    u = _u(0.25, "cuda")
    eager = [int(sample(logits, 0.8, 40, 0.9, u, out=out, workspace=ws)) for _ in range(50)]
    assert len(set(eager)) == 1                              # fixed-order fp64 sums: same draw every run
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        sample(logits, 0.8, 40, 0.9, u, out=out, workspace=ws)          # warm-up off the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sample(logits, 0.8, 40, 0.9, u, out=out, workspace=ws)
    for value in (0.0, 0.25, 0.5, 0.9, ONE_MINUS):
        u.fill_(value)
        graph.replay()
        assert int(out) == int(sample(logits, 0.8, 40, 0.9, u.clone(), workspace=ws)), value


@pytest.mark.gpu
def test_gpu_frequencies_full_vocab(gen):
    """20000 draws over the full vocabulary against the kept probabilities (chi-square on the top tokens)."""
    V = QWEN35_0_8B.vocab_size
    logits = checks.randn(V, g=gen, dtype=torch.float32, device="cuda", scale=1.0)
    logits[:8] = torch.tensor([9.0, 8.5, 8.0, 7.5, 7.0, 6.5, 6.0, 5.5], device="cuda")
    temperature, top_k, top_p = 1.0, 0, 0.9
    q, keep, mass_greater = _kept_probs(logits, temperature, top_k, top_p)
    n = 20000
    ws = sampling_workspace(V, "cuda")
    draws = torch.empty(n, dtype=torch.int64, device="cuda")
    us = torch.rand(n, generator=gen).cuda()
    for i in range(n):
        sample(logits, temperature, top_k, top_p, us[i], out=draws[i], workspace=ws)
    counts = torch.bincount(draws.cpu(), minlength=V).double()
    outside = (counts > 0) & ~keep                           # at most a boundary token, by rounding
    assert bool((mass_greater[outside] < top_p + 1e-6).all()), "drew tokens far outside the kept set"
    # the 8 planted tokens, then everything else kept as one bin
    obs = torch.cat([counts[:8], counts[8:].sum()[None]])
    exp = n * torch.cat([q[:8], q[8:].sum()[None]])
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 26.1, f"chi-square {chi2:.1f} (df 8, p=1e-3 limit 26.1): {obs.tolist()} vs {exp.tolist()}"


# ---------------------------------------------------------------- the teaching sampler (notebook 11)


def test_teaching_file_is_the_notebooks_solution():
    """sampling/teach.py holds notebook 11's exercise solution character for character."""
    from notebook_source import assert_teaches

    assert_teaches("11_decode_and_sampling.ipynb", "qwen_lab/kernels/sampling/teach.py")


@pytest.mark.parametrize("V", [1, 37, 1000])
@pytest.mark.parametrize("temperature,top_k,top_p", [(0.0, 0, 1.0), (0.8, 0, 1.0), (0.8, 20, 1.0), (1.0, 0, 0.7),
                                                     (0.7, 5, 0.9)])
def test_teaching_sampler_matches_reference(rt, gen, V, temperature, top_k, top_p):
    from qwen_lab.kernels.sampling import teach

    logits = checks.randn(V, g=gen, dtype=rt.dtype, device=rt.device, scale=3.0)
    if V > 10:
        logits[[3, V // 2, V - 1]] = float(logits.max()) + 1.0    # a tie at the top, spread out
    for u_value in (0.0, 0.37, 0.9, ONE_MINUS):
        u = _u(u_value, rt.device)
        _assert_same_draw(teach.sample_on_device(logits, temperature, top_k, top_p, u),
                          reference.sample(logits, temperature, top_k, top_p, u), logits, temperature, top_k, top_p,
                          u, what=f"teaching sampler, V={V}")
