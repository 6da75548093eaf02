"""The causal depthwise conv1d + SiLU kernel (qwen_lab.kernels.conv1d) against qwen_lab.reference.

CPU: the Triton interpreter in float32 on small channel counts; GPU: bf16 on Qwen3.5-0.8B's conv
(6144 channels, width 4) reading a strided slice of the fused in-projection output.
"""

import pytest
import torch

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.conv1d import STEP_MAX_TOKENS, causal_conv1d
from qwen_lab.kernels.conv1d import tuning as conv_tuning

from notebook_source import assert_teaches


def _inputs(T, C, W, g, dtype, device, row_pad=7, state_dtype=None):
    """x as a strided view (a slice of a wider projection output), weight, and a non-zero carried state."""
    proj = checks.randn(T, C + row_pad, g=g, dtype=dtype, device=device)
    x = proj[:, 3:3 + C]
    weight = checks.randn(C, W, g=g, dtype=dtype, device=device, scale=0.5)
    state = checks.randn(C, W - 1, g=g, dtype=state_dtype or dtype, device=device)
    return x, weight, state


@pytest.mark.parametrize("T, C, W", [
    (1, 100, 4),     # decode: one token, the single-step kernel
    (3, 130, 4),     # fewer tokens than the state holds: part of the old state stays in it
    (STEP_MAX_TOKENS, 64, 4),
    (5, 40, 4),      # the segmented prefill kernel, which also writes the new state
    (63, 72, 4),
    (200, 130, 4),   # several token segments and a ragged channel block
    (9, 24, 2),      # other filter widths
    (17, 33, 3),
])
def test_causal_conv1d_matches_reference(T, C, W, rt, gen):
    x, weight, state = _inputs(T, C, W, gen, rt.dtype, rt.device)
    ref_state = state.clone()
    ref = reference.causal_conv1d(x, weight, ref_state)
    out = checks.poison_(torch.empty(T, C, dtype=rt.dtype, device=rt.device))
    with count_launches() as launches:
        y = causal_conv1d(x, weight, state, out=out)
    assert y is out
    assert sum(launches.values()) == 1, f"{dict(launches)}: one launch writes y and the state at every length"
    checks.compare("y", y, ref)
    checks.compare("state", state, ref_state)


@pytest.mark.parametrize("T", [1, 3, 9, 70])
def test_weight_stored_tap_by_tap(T, rt, gen):
    """The model stores the weight [W, C] and passes its [C, W] view (strides (1, C)): both kernels read it."""
    C, W = 40, 4
    x, weight, state = _inputs(T, C, W, gen, rt.dtype, rt.device)
    by_tap = weight.t().contiguous().t()
    assert by_tap.stride() == (1, C)
    ref_state = state.clone()
    ref = reference.causal_conv1d(x, weight, ref_state)
    y = causal_conv1d(x, by_tap, state)
    checks.compare(f"y, T={T}, weight stored [W, C]", y, ref)
    checks.compare(f"state, T={T}, weight stored [W, C]", state, ref_state)


def _two_segments_of_9_tokens(rt, gen) -> dict:
    """A 9-token prompt through causal_conv1d, checked against the reference: the kernels it launched."""
    x, weight, state = _inputs(9, 40, 4, gen, rt.dtype, rt.device)
    ref_state = state.clone()
    ref = reference.causal_conv1d(x, weight, ref_state)
    with count_launches() as launches:
        y = causal_conv1d(x, weight, state)
    checks.compare("y", y, ref)
    checks.compare("state", state, ref_state)
    return dict(launches)


def test_segment_shorter_than_the_state_shifts_it_in_a_second_launch(rt, gen, switch):
    """With a first segment of fewer than W-1 tokens a second segment would read the old state too, so the
    segmented kernel leaves the state alone and the step kernel shifts it afterwards."""
    import triton
    switch.force("conv1d_prefill_kernel", triton.Config({"BLOCK_T": 2, "BLOCK_C": 32}, num_warps=1))
    assert _two_segments_of_9_tokens(rt, gen) == {"conv1d_prefill_kernel": 1, "conv1d_step_kernel": 1}


def test_causal_conv1d_check_kernel(rt):
    """The notebook-style check (poisoned output, launch proof, in-place state compared)."""
    def case(T, C):
        return lambda g: dict(zip(("x", "weight", "state"), _inputs(T, C, 4, g, rt.dtype, rt.device)),
                              out=torch.empty(T, C, dtype=rt.dtype, device=rt.device))
    checks.check_kernel("causal_conv1d", causal_conv1d, reference.causal_conv1d, [case(1, 48), case(70, 48)],
                        seed=3, inplace=("state",), quiet=True)


def test_state_carried_across_calls_equals_one_long_call(rt, gen):
    """A prompt fed in pieces (prefill chunks, then decode steps) gives the outputs and state of one call."""
    T, C, W = 90, 56, 4
    x, weight, state0 = _inputs(T, C, W, gen, rt.dtype, rt.device)
    long_state = state0.clone()
    y_long = causal_conv1d(x, weight, long_state)
    state = state0.clone()
    pieces, start = [], 0
    for n in (2, 1, 40, 1, 1, 3, 30, 1, 11):
        pieces.append(causal_conv1d(x[start:start + n], weight, state))
        start += n
    assert start == T
    checks.compare("outputs of the pieces", torch.cat(pieces), y_long)
    checks.compare("final state", state, long_state)


def test_first_call_of_a_sequence_is_zero_padded(rt, gen):
    """With a zero state the conv sees zeros before the first token, like a padded nn.Conv1d."""
    T, C, W = 12, 20, 4
    x, weight, _ = _inputs(T, C, W, gen, rt.dtype, rt.device)
    state = torch.zeros(C, W - 1, dtype=rt.dtype, device=rt.device)
    y = causal_conv1d(x, weight, state)
    conv = torch.nn.functional.conv1d(x.t().float()[None], weight.float()[:, None, :], padding=W - 1, groups=C)
    expected = torch.nn.functional.silu(conv[0, :, :T]).t().to(rt.dtype)
    checks.compare("y", y, expected)
    checks.compare("state", state, x[-(W - 1):].t().contiguous())


def test_matches_transformers_update(rt, gen):
    """Same as transformers' causal_conv1d_update (its PyTorch path) given our [C, W-1] state layout."""
    tf = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    T, C, W = 6, 48, 4
    x, weight, state = _inputs(T, C, W, gen, torch.float32, "cpu")
    hf_state = state.clone()[None]
    expected = tf.causal_conv1d_update(x.t()[None].contiguous(), hf_state, weight, None, "silu")[0].t()
    y = causal_conv1d(x.to(rt.device), weight.to(rt.device), state.to(rt.device))
    checks.compare("y", y.cpu().float(), expected.contiguous())


def test_rejects_bad_arguments(rt, gen):
    x, weight, state = _inputs(5, 16, 4, gen, rt.dtype, rt.device)
    with pytest.raises(KernelError, match="state"):
        causal_conv1d(x, weight, state[:, :2])
    with pytest.raises(KernelError, match="weight"):
        causal_conv1d(x, weight[:8], state)
    with pytest.raises(KernelError, match="x: the last dim must be contiguous"):
        causal_conv1d(torch.empty(16, 5, dtype=rt.dtype, device=rt.device).t(), weight, state)
    with pytest.raises(KernelError, match="out"):
        causal_conv1d(x, weight, state, out=torch.empty(5, 16, dtype=torch.float64, device=rt.device))
    with pytest.raises(KernelError, match="x"):
        causal_conv1d(x[0], weight, state)


def test_a_config_forced_through_the_switches_reaches_the_launcher_for_the_block_only(rt, gen):
    """A config forced with qwen_lab.switches reaches the launcher (a segment of 2 tokens: two launches, as above),
    and only inside its `with` block."""
    import triton

    from qwen_lab.switches import switches

    config = triton.Config({"BLOCK_T": 2, "BLOCK_C": 32}, num_warps=1)
    with switches.force_config("conv1d_prefill_kernel", config):
        assert switches.forced("conv1d_prefill_kernel") is config
        assert _two_segments_of_9_tokens(rt, gen) == {"conv1d_prefill_kernel": 1, "conv1d_step_kernel": 1}
    assert switches.forced("conv1d_prefill_kernel") is None
    # the interpreter's own segment again: the state written by the one launch
    assert _two_segments_of_9_tokens(rt, gen) == {"conv1d_prefill_kernel": 1}


# ---------------------------------------------------------------- the teaching kernel (notebook 08)


def test_teaching_kernel_is_notebook_08s_solution():
    """conv1d/teach.py holds Exercise 08.1's solution as the notebook has it: the two must not drift apart."""
    assert_teaches("08_gated_deltanet_recurrent.ipynb", "qwen_lab/kernels/conv1d/teach.py", exercises=["08.1"])


@pytest.mark.parametrize("T, C, W", [(1, 70, 4), (3, 37, 4), (9, 100, 4), (6, 70, 3), (5, 33, 2)])
def test_teaching_kernel_matches_reference(T, C, W, rt, gen):
    """The notebook's kernel as library code: ragged channel counts, fewer tokens than the state holds, strided x."""
    from qwen_lab.kernels.conv1d import teach

    x, weight, state = _inputs(T, C, W, gen, rt.dtype, rt.device)
    ref_state = state.clone()
    ref = reference.causal_conv1d(x, weight, ref_state)
    y = teach.my_causal_conv1d(x, weight, state)
    checks.compare(f"teach y (T={T}, C={C}, W={W})", y, ref)
    checks.compare(f"teach state (T={T}, C={C}, W={W})", state, ref_state)


# ---------------------------------------------------------------- guard regions: nothing outside the tensors
#
# The interpreter reads and writes CPU memory through raw pointers: an access past the end of a tensor lands
# in a neighbouring allocation and goes unnoticed, where the GPU faults. So every tensor here is a strided view
# in the middle of a bigger buffer holding NaN around inputs (read, it reaches the output) and a sentinel
# around outputs; nothing outside the views may change. The GPU's block sizes (8 x 256 segments, 128-channel
# steps) run through the interpreter too.

from qwen_lab.course.checks import GUARD_NAN as NAN, GUARD_SENTINEL as SENTINEL, GuardedTensor as _Guard  # noqa: E402


_SIZES = [("interpreter", T) for T in (1, 2, 3, 4, 5, 63, 64, 65, 130)] + \
    [("gpu", T) for T in (1, 2, 3, 4, 5, 63, 64, 65, 130)] + \
    [(f"prefill-config-{i}", T) for i in range(len(conv_tuning.PREFILL_CONFIGS)) for T in (5, 65, 130)]


@pytest.mark.parametrize("sizes, T", _SIZES)
def test_conv1d_stays_inside_its_tensors(T, sizes, rt, gen, monkeypatch, switch):
    if sizes == "gpu":  # the block sizes a GPU launch uses, here as well
        real = conv_tuning.block_sizes
        monkeypatch.setattr(conv_tuning, "block_sizes", lambda C, interpreter: real(C, False))
    elif sizes.startswith("prefill-config"):  # each segment the GPU autotuner may pick for the prefill kernel
        config = conv_tuning.PREFILL_CONFIGS[int(sizes.rsplit("-", 1)[1])]
        switch.force("conv1d_prefill_kernel", config)
    for C, W in [(40, 4), (300, 4), (33, 2), (17, 3)]:
        x, weight, state = _inputs(T, C, W, gen, rt.dtype, rt.device)
        ref_state = state.clone()
        ref = reference.causal_conv1d(x, weight, ref_state)
        gx, gw, gs = _Guard(x, NAN), _Guard(weight, NAN), _Guard(state, NAN)
        go = _Guard(torch.full((T, C), NAN, dtype=rt.dtype, device=rt.device), SENTINEL)
        causal_conv1d(gx.view, gw.view, gs.view, out=go.view)
        for name, g in (("x", gx), ("weight", gw), ("state", gs), ("out", go)):
            assert g.touched() == 0, f"T={T}, C={C}, W={W}: elements around '{name}' changed: a store went outside it"
        hint = "NaN here means a kernel read outside its inputs (the memory around them holds NaN)"
        checks.compare(f"y (T={T}, C={C}, W={W}, {sizes} blocks)", go.view, ref, hint=hint)
        checks.compare(f"state (T={T}, C={C}, W={W}, {sizes} blocks)", gs.view, ref_state, hint=hint)


@pytest.mark.parametrize("T0", [1, 3, 64])
def test_decode_after_prefill_equals_a_longer_call(T0, rt, gen):
    """A prefill of T0 tokens then single-token decode steps == one call over all of them."""
    steps, C, W = 4, 56, 4
    x, weight, state0 = _inputs(T0 + steps, C, W, gen, rt.dtype, rt.device)
    long_state = state0.clone()
    y_long = causal_conv1d(x, weight, long_state)
    state = state0.clone()
    ys = [causal_conv1d(x[:T0], weight, state)] + [causal_conv1d(x[t:t + 1], weight, state)
                                                   for t in range(T0, T0 + steps)]
    checks.compare(f"outputs (prefill {T0}, then decode)", torch.cat(ys), y_long)
    checks.compare(f"state (prefill {T0}, then decode)", state, long_state)


# ---------------------------------------------------------------- GPU: real shapes, bf16


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 3, 2048])
def test_gpu_real_shapes(T, rt, gen):
    cfg = QWEN35_0_8B
    C, W = cfg.linear_conv_dim, cfg.linear_conv_kernel_dim
    proj = checks.randn(T, cfg.linear_in_proj_dim, g=gen, dtype=rt.dtype, device=rt.device)
    x = proj[:, :C]                      # the q|k|v slice of the fused in-projection
    weight = checks.randn(C, W, g=gen, dtype=rt.dtype, device=rt.device, scale=0.5)
    state = checks.randn(C, W - 1, g=gen, dtype=rt.dtype, device=rt.device)
    ref_state = state.clone()
    ref = reference.causal_conv1d(x, weight, ref_state)
    y = causal_conv1d(x, weight, state)
    checks.compare("y", y, ref)
    checks.compare("state", state, ref_state)


@pytest.mark.gpu
def test_gpu_autotuning_restores_the_state_between_timed_runs(rt, gen, monkeypatch):
    """The prefill kernel replaces the state; the autotuner runs it many times on the first call of a shape, so it
    must put the state back after each timed run (restore_value), or the call's own run reads a replaced one."""
    monkeypatch.delitem(conv_tuning._tuned, "prefill", raising=False)   # a fresh autotuner: this call tunes
    C, W, T = QWEN35_0_8B.linear_conv_dim, QWEN35_0_8B.linear_conv_kernel_dim, 700
    x = checks.randn(T, C, g=gen, dtype=rt.dtype, device=rt.device)
    weight = checks.randn(C, W, g=gen, dtype=rt.dtype, device=rt.device, scale=0.5)
    state = checks.randn(C, W - 1, g=gen, dtype=rt.dtype, device=rt.device)
    ref_state = state.clone()
    ref = reference.causal_conv1d(x, weight, ref_state)
    y = causal_conv1d(x, weight, state)
    checks.compare("y (first rows read the old state)", y, ref)
    checks.compare("state", state, ref_state)


@pytest.mark.gpu
def test_gpu_decode_step_captures_in_a_cuda_graph(rt, gen):
    C, W = QWEN35_0_8B.linear_conv_dim, QWEN35_0_8B.linear_conv_kernel_dim
    x = checks.randn(1, C, g=gen, dtype=rt.dtype, device=rt.device)
    weight = checks.randn(C, W, g=gen, dtype=rt.dtype, device=rt.device)
    state = checks.randn(C, W - 1, g=gen, dtype=rt.dtype, device=rt.device)
    out = torch.empty(1, C, dtype=rt.dtype, device=rt.device)
    start = state.clone()
    causal_conv1d(x, weight, state, out=out)  # warm-up: compile outside the capture
    state.copy_(start)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        causal_conv1d(x, weight, state, out=out)
    state.copy_(start)
    graph.replay()
    ref_state = start.clone()
    checks.compare("y", out, reference.causal_conv1d(x, weight, ref_state))
    checks.compare("state", state, ref_state)
