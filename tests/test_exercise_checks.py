"""The notebooks' exercise checks catch the mistakes they are written for.

nbval runs each solution notebook, so it proves that a check passes a right answer. These tests prove the other
half: each runs a solution notebook's code cells in order, as a Jupyter kernel would, with one mistake written
into an exercise's solution, and expects the exercise's check cell to fail with `checks.CheckFailed` naming what
is wrong (the case, or the property, the mistake breaks). A check that stopped looking at strides, at eps or at
the order of a sum would pass these mistakes and fail here.
"""

import json
import os
import re

import pytest

import torch

from qwen_lab import runtime
from qwen_lab.course import checks, exercises
from qwen_lab.course.checks.runner import _unfinished

SOLUTIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "solutions")


def run_with_mistake(run_cell, notebook: str, exercise: str, wrong: str, right: str, before_check=None) -> None:
    """Run `notebook`'s code cells (each through `run_cell`, benchmarks/run_notebooks.py's) up to the first check
    cell after the exercise titled `exercise`, with `right` replaced by `wrong` in that exercise's cell. Returns
    when every cell ran; raises what a cell raised. `before_check(namespace)`, if given, runs just before the check
    cell (to change what the check finds there)."""
    path = os.path.join(SOLUTIONS, notebook)
    nb = json.load(open(path))
    index, check = exercises.exercise_and_check(path, exercise)
    source = "".join(nb["cells"][index]["source"])
    assert source.count(right) == 1, f"{notebook}, cell {index}: {right!r} is not in the solution once"
    namespace = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"][:check + 1]):
        if cell["cell_type"] != "code":
            continue
        code = "".join(cell["source"])
        if i == index:
            code = code.replace(right, wrong)
        if i == check and before_check is not None:
            before_check(namespace)
        run_cell(code, f"<{notebook} cell {i}>", namespace)


# The notebooks run the real shapes on a GPU and the tiny model elsewhere: their cases differ there, and so, for a
# few mistakes, does the case that fails first or the explanation that fits it.
ON_GPU = torch.cuda.is_available() and not runtime.interpreter_active()

MISTAKES = [
    # (notebook, exercise, the right line, the mistake, what the failure must say: one text, or {"cpu": .., "gpu": ..})
    ("01_triton_basics_embedding.ipynb", "Exercise 01.1",   # the store without its mask: past the end of out
     "tl.store(out_ptr + offs, x + y, mask=mask)", "tl.store(out_ptr + offs, x + y)", "outside 'out'"),
    ("01_triton_basics_embedding.ipynb", "Exercise 01.2",
     "ids.to(tl.int64)[:, None] * stride_w", "ids.to(tl.int64)[:, None] * H", "case 4"),   # the strided table
    ("02_rmsnorm.ipynb", "Exercise 02.1",
     "y = (x * inv_rms[:, None]) * (1.0 + w)[None, :]", "y = (x * inv_rms[:, None]) * w[None, :]", "rms_norm"),
    ("02_rmsnorm.ipynb", "Exercise 02.1",
     "tl.sum(x * x, axis=1) / D + eps", "tl.sum(x * x, axis=1) / D", "case 3"),   # the tiny rows, where eps matters
    ("02_rmsnorm.ipynb", "Exercise 02.2",   # the residual read with x's row stride: the strided case
     "r = tl.load(r_ptr + rows[:, None] * sr", "r = tl.load(r_ptr + rows[:, None] * sx", "add_rms_norm (case 3"),
    ("02_rmsnorm.ipynb", "Exercise 02.2",   # the residual stream stored with out's row stride: the strided case
     "tl.store(rout_ptr + rows[:, None] * sro", "tl.store(rout_ptr + rows[:, None] * so", "add_rms_norm (case 3"),
    ("02_rmsnorm.ipynb", "Exercise 02.2",   # eps dropped: the tiny case, where eps is as large as the mean square
     "tl.math.rsqrt(tl.sum(s * s, axis=1) / D + eps)", "tl.math.rsqrt(tl.sum(s * s, axis=1) / D)",
     "add_rms_norm (case 4"),
    ("02_rmsnorm.ipynb", "Exercise 02.2",   # eps added after the rsqrt: the tiny case again
     "tl.math.rsqrt(tl.sum(s * s, axis=1) / D + eps)", "(tl.math.rsqrt(tl.sum(s * s, axis=1) / D) + eps)",
     "add_rms_norm (case 4"),
    ("02_rmsnorm.ipynb", "Exercise 02.3",   # the gated norm's weight is plain w, not 1 + w
     "* w[None, :]) * (z * tl.sigmoid(z))", "* (1.0 + w)[None, :]) * (z * tl.sigmoid(z))", "gated_rms_norm"),
    ("02_rmsnorm.ipynb", "Exercise 02.3",   # eps dropped: the tiny x of the last case
     "tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)", "tl.math.rsqrt(tl.sum(x * x, axis=1) / D)",
     "gated_rms_norm (case 3"),
    ("02_rmsnorm.ipynb", "Exercise 02.3",   # eps added after the rsqrt: the tiny x again
     "tl.math.rsqrt(tl.sum(x * x, axis=1) / D + eps)", "(tl.math.rsqrt(tl.sum(x * x, axis=1) / D) + eps)",
     "gated_rms_norm (case 3"),
    ("03_gemm.ipynb", "Exercise 03.1",   # the last K step reads past the row: the guard's NaN comes in
     "mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)", "mask=offs_m[:, None] < M, other=0.0)", "NaN"),
    ("04_split_k.ipynb", "Exercise 04.1",
     "tl.atomic_add(acc_ptr + m * N + offs_n, total, mask=offs_n < N)",
     "tl.store(acc_ptr + m * N + offs_n, total, mask=offs_n < N)", "split-K linear"),
    ("03_gemm.ipynb", "Exercise 03.1",   # W's rows taken as K apart: the strided weight of the last case
     "b = tl.load(w_ptr + offs_n[None, :] * stride_wn + k[:, None],",
     "b = tl.load(w_ptr + offs_n[None, :] * K + k[:, None],", {"cpu": "case 4", "gpu": "case 3"}),
    ("04_split_k.ipynb", "Exercise 04.1",
     "k_ok = (k < K) & (k < k_lo + K_PER_SPLIT)", "k_ok = k < K", "split-K linear"),   # a slice read past its end
    ("04_split_k.ipynb", "Exercise 04.1",   # W's rows taken as K apart: the strided case
     "wv = tl.load(w_ptr + offs_n[:, None] * stride_wn + k[None, :],",
     "wv = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],", "case 4"),
    ("04_split_k.ipynb", "Exercise 04.2",
     "    for s in range(S):         # a fixed order", "    for s in range(S - 1, -1, -1):  # reversed", "bit for bit"),
    ("05_swiglu_mlp.ipynb", "Exercise 05.1",
     "y = gate * tl.sigmoid(gate) * up", "y = up * tl.sigmoid(up) * gate", "silu_mul"),   # gate and up swapped
    ("05_swiglu_mlp.ipynb", "Exercise 05.1",   # out's rows taken as I apart: the cases with padded rows
     "tl.store(out_ptr + row * stride_om + cols,", "tl.store(out_ptr + row * I + cols,",
     {"cpu": "silu_mul (case 1", "gpu": "silu_mul (case 2"}),
    ("06_rope.ipynb", "Exercise 06.1",
     "sin = tl.where(is_first, -tl.sin(phi),", "sin = tl.where(is_first, tl.sin(phi),", "rope"),   # rotated backwards
    ("07_gated_attention.ipynb", "Exercise 07.1",
     "s = tl.dot(q, tl.trans(k)) * scale ", "s = tl.dot(q, tl.trans(k)) ", "missing or extra scale factor"),
    ("07_gated_attention.ipynb", "Exercise 07.1",   # k's heads taken as D apart: the case where k is a wider view
     "kv_head * stride_kh", "kv_head * D", "scores (case 3"),
    ("07_gated_attention.ipynb", "Exercise 07.2",
     'm = tl.where(m == float("-inf"), 0.0, m)', "m = m", "NaN"),   # a fully masked row: -inf - (-inf)
    ("07_gated_attention.ipynb", "Exercise 07.3",
     "(h // G) * stride_vh", "(h % G) * stride_vh", "weighted sum"),   # GQA: the wrong KV head
    ("07_gated_attention.ipynb", "Exercise 07.3",   # G hard-coded as 2: the G = 3 case (first, so on a GPU too)
     "(h // G) * stride_vh", "(h // 2) * stride_vh", "weighted sum (case 0"),
    ("07_gated_attention.ipynb", "Exercise 07.3",   # v's heads taken as D apart: the case where v is a wider view
     "(h // G) * stride_vh", "(h // G) * D", "weighted sum (case 3"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.1",   # a short input drops the old state's columns
     "new = tl.where((r >= 0)[None, :], xv.to(state_ptr.dtype.element_ty), sv)",
     "new = xv.to(state_ptr.dtype.element_ty)", "in-place 'state'"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.2",
     "x = a + tl.load(dt_bias_ptr", "x = a - tl.load(dt_bias_ptr", "deltanet_gates"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.2",   # b read with a's row stride: the case where they differ
     "b = tl.load(b_ptr + t * stride_bt", "b = tl.load(b_ptr + t * stride_at", "deltanet_gates (case 4"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.3",
     "S = S * tl.exp(g)  ", "S = S  ", "in-place 'state'"),   # the state never forgets
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.3",   # k's l2 norm without eps: the all-zero k row is NaN
     "k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)", "k = k * tl.rsqrt(tl.sum(k * k, 0))", "delta_rule_recurrent (case 3"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.3",   # beta read with g's row stride: g a wider view
     "beta = tl.load(beta_ptr + t * stride_bt + h)", "beta = tl.load(beta_ptr + t * stride_gt + h)",
     "delta_rule_recurrent (case 4"),
    ("09_gated_deltanet_chunked.ipynb", "Exercise 09.1",
     "row = (r == i).to(tl.float32) - tl.sum(", "row = (r == i).to(tl.float32) + tl.sum(", "tril_inverse"),
    ("09_gated_deltanet_chunked.ipynb", "Exercise 09.2",
     "o = tl.dot(qg, S) + tl.dot(aqk, u_new)", "o = tl.dot(qg, S) + tl.dot(aqk, u)", "delta_rule_chunked"),
    ("09_gated_deltanet_chunked.ipynb", "Exercise 09.3",   # each new chunk's A multiplied on the right
     "M, B = A_c @ M, A_c @ B + b_c", "M, B = M @ A_c, A_c @ B + b_c", "opposite order"),
    ("09_gated_deltanet_chunked.ipynb", "Exercise 09.3",   # B from the entering state instead of zero
     "    B = torch.zeros_like(b[0])\n", "    B = S0.clone()\n", "from a zero state"),
    ("09_gated_deltanet_chunked.ipynb", "Exercise 09.3",   # the segments applied last to first
     "    for M, B in maps:\n", "    for M, B in maps[::-1]:\n", "reverse order"),
    ("10_whole_forward.ipynb", "Exercise 10.1",
     'o = ops["sigmoid_gate"](o, gate)', 'o = o', "attention_block"),   # the output gate forgotten
    ("11_decode_and_sampling.ipynb", "Exercise 11.1",
     "keep &= n_greater < top_k", "keep &= n_greater <= top_k", "outside the kept set"),   # top-k keeps k + 1
    ("11_decode_and_sampling.ipynb", "Exercise 11.1",   # the count of tokens <= p_i one short: too few kept
     "n_at_most = torch.searchsorted(asc, p, right=True)", "n_at_most = torch.searchsorted(asc, p, right=False)",
     # (tiny-english's 4096 tokens, like the real 248320: fewer kept than the reference)
     "either your filter keeps fewer"),
    ("11_decode_and_sampling.ipynb", "Exercise 11.1",   # the draw's search on the left: u = 0 gives a filtered token 0
     "idx = torch.searchsorted(cdf, (uniform.float() * cdf[-1]).reshape(1), right=True)[0]",
     "idx = torch.searchsorted(cdf, (uniform.float() * cdf[-1]).reshape(1), right=False)[0]",
     "sample_on_device (case 51"),
    ("12_cuda_graph.ipynb", "Exercise 12.1",   # every replay would draw with the same uniform
     "    s.counter.add_(1)\n", "\n", "s.counter ends at 1 after"),
    ("12_cuda_graph.ipynb", "Exercise 12.1",   # a Python index synchronises: named with its line, before any capture
     "    torch.index_select(s.uniforms, 0, s.counter, out=s.uniform)",
     "    s.uniform.copy_(s.uniforms[int(s.counter)].reshape(1))", "HostSyncError: host synchronisation in code "
     "that must be capturable: int(tensor)\n  at <12_cuda_graph.ipynb cell 18>:6 in decode_step()"),
    ("13_generation_and_benchmark.ipynb", "Exercise 13.1",   # the states read but not written back
     "(n_weights * bytes_per_weight + 2 * state)", "(n_weights * bytes_per_weight + state)", "bytes too few"),
    ("13_generation_and_benchmark.ipynb", "Exercise 13.1",   # each state Dv x Dv: the config with Dk != Dv
     "config.linear_key_head_dim \\", "config.linear_value_head_dim \\", "decode_floor_ms (case 5"),
    ("13_generation_and_benchmark.ipynb", "Exercise 13.2:",   # the LM head counted for every prompt token
     "flops = 2 * per_token * T + 2 * c.hidden_size * c.vocab_size",
     "flops = 2 * per_token * T + 2 * c.hidden_size * c.vocab_size * T", "the LM head counted per token"),
    ("13_generation_and_benchmark.ipynb", "Exercise 13.2:",   # the delta rule's Dk x Dk: the config with Dk != Dv
     "c.linear_key_head_dim * c.linear_value_head_dim * T", "c.linear_key_head_dim * c.linear_key_head_dim * T",
     "prefill_flops (case 4"),
    # (added after the ids above were cited in docs/experiments.md: new mistakes go at the end, so those stay put)
    ("03_gemm.ipynb", "Exercise 03.1",   # the program ids' axes swapped: only a grid that is not square shows it
     "    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)\n    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
     "    offs_m = pid_n * BLOCK_M + tl.arange(0, BLOCK_M)\n    offs_n = pid_m * BLOCK_N + tl.arange(0, BLOCK_N)",
     {"cpu": "matmul (case 3", "gpu": "matmul (case 0"}),
    ("04_split_k.ipynb", "Exercise 04.1",   # one lane past the row: it adds the 0.0 of its masked load, past acc's end
     "tl.atomic_add(acc_ptr + m * N + offs_n, total, mask=offs_n < N)",
     "tl.atomic_add(acc_ptr + m * N + offs_n, total, mask=offs_n <= N)", "outside a buffer your function allocated"),
    ("05_swiglu_mlp.ipynb", "Exercise 05.1",   # the store masked by the program id: one value for the whole block
     "    mask = cols < I\n", "    mask = pid < I\n",
     "the mask `mask` (= `pid < I`) of its tl.store holds one value for the whole block"),
    ("05_swiglu_mlp.ipynb", "Exercise 05.1",   # the grid's axes swapped: rows past the last one (case 0 has one row)
     "    row = tl.program_id(0)\n    pid = tl.program_id(1)\n",
     "    row = tl.program_id(1)\n    pid = tl.program_id(0)\n",
     "takes `row = tl.program_id(1)`, `pid = tl.program_id(0)`"),
    ("07_gated_attention.ipynb", "Exercise 07.2",   # 0/0 in the rows that see no key: not a missing eps
     "    p = e / tl.where(total > 0, total, 1.0) ", "    p = e / total ",
     "whose expected values are all 0: a row with nothing to normalise"),
    ("07_gated_attention.ipynb", "Exercise 07.2",   # no max subtracted: exp overflows in the case with large scores
     "    e = tl.exp(s - m) ", "    e = tl.exp(s) ", "the row's sum overflowed to inf"),
    ("12_cuda_graph.ipynb", "Exercise 12.1",   # the counter runs past the uniforms: caught before the step reads there
     "    s.counter.add_(1)\n", "    s.counter.add_(2)\n", "s.counter ran past the end of s.uniforms"),
    ("13_generation_and_benchmark.ipynb", "Exercise 13.2:",   # the T/2 keys rounded down: wrong for odd T only
     "T * T / 2", "T * (T // 2)", "That is integer rounding"),
    ("11_decode_and_sampling.ipynb", "Exercise 11.1",   # the top-p boundary kept: the exact tie of the last case
     "keep &= mass_greater < top_p", "keep &= mass_greater <= top_p", "it sits on the top-p boundary"),
    ("12_cuda_graph.ipynb", "Exercise 12.1",   # the draws counted in Python: right eagerly, frozen in a replay
     "    torch.index_select(s.uniforms, 0, s.counter, out=s.uniform)",
     "    s.drawn = getattr(s, 'drawn', 1)\n    s.uniform.copy_(s.uniforms[s.drawn:s.drawn + 1])\n"
     "    s.drawn += 1", "decode_step changed s.drawn, a Python int (not there before the step, "),
    ("12_cuda_graph.ipynb", "Exercise 12.1",   # the position for the counter: past the uniforms' end on a GPU's replay
     "    torch.index_select(s.uniforms, 0, s.counter, out=s.uniform)",
     "    torch.index_select(s.uniforms, 0, s.position, out=s.uniform)",
     "that is s.position (the tokens so far, the prompt's included); the index is s.counter"),
    # 14.1: the check reads h, the counter after the launch, the error and y, then waits on a counter that never
    # reaches T1 (a wait with no bound is stopped by the interpreter's watch on a CPU, refused from its source on a GPU)
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # no bound on the wait
     "while (seen < T1) & (polls < spin_limit):", "while seen < T1:",
     {"cpu": "the wait has no bound", "gpu": "is a wait with no bound"}),
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # the wait gives up without saying which item
     "                    tl.store(error_ptr, item + 1)           # gave up: say which item waited\n", "",
     "the error still holds 0"),
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # the item itself, not item + 1 (0 would mean no error)
     "tl.store(error_ptr, item + 1)", "tl.store(error_ptr, item)", "it should name the item that gave up"),
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # the tiles of h never publish
     '                tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")   # ... then published\n', "",
     "the counter reads 0 after the launch, expected"),
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # the tiles of y bump the counter too
     "                    _tile(w2_ptr, h_ptr, y_ptr, (item - T1) * BLOCK_N, N2, N1, BLOCK_N, BLOCK_K)\n",
     "                    _tile(w2_ptr, h_ptr, y_ptr, (item - T1) * BLOCK_N, N2, N1, BLOCK_N, BLOCK_K)\n"
     '                    tl.atomic_add(counter_ptr, 1, sem="release", scope="gpu")\n', "the tiles of y bump it too"),
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # y's tiles over K columns instead of N1
     "(item - T1) * BLOCK_N, N2, N1, BLOCK_N, BLOCK_K)", "(item - T1) * BLOCK_N, N2, K, BLOCK_N, BLOCK_K)",
     "the second GEMV is wrong"),
    ("14_one_kernel_per_token.ipynb", "Exercise 14.1",   # a program goes on after its wait gave up
     "                    ok = 0\n", "", "the program went on after item"),
]


@pytest.mark.parametrize("notebook, exercise, right, wrong, says", MISTAKES,
                         ids=[f"{m[1].split()[-1]}-{j}" for j, m in enumerate(MISTAKES)])
def test_the_check_fails_the_mistake(notebook, exercise, right, wrong, says, monkeypatch, benchmark_module):
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    run_cell = benchmark_module("run_notebooks").run_cell
    with pytest.raises(checks.CheckFailed) as failed:
        run_with_mistake(run_cell, notebook, exercise, wrong, right)
    if isinstance(says, dict):
        says = says["gpu" if ON_GPU else "cpu"]
    assert says in str(failed.value), str(failed.value)


def test_the_right_solution_passes_its_check(monkeypatch, benchmark_module):
    """The control: the same runner with no mistake reaches the end of Exercise 04.2's check."""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    right = "    for s in range(S):         # a fixed order"
    run_with_mistake(benchmark_module("run_notebooks").run_cell, "04_split_k.ipynb", "Exercise 04.2", right, right)


def test_a_missing_barrier_in_the_conv_state_update_is_noted(monkeypatch, benchmark_module, capsys):
    """08.1's kernel shifts the conv state in place: without tl.debug_barrier() one thread may overwrite a column that
    another has not read yet. The interpreter runs a program as one thread, so the results stay right there and the
    check passes; its note names the store. (On a GPU the race may also make the check fail: then the failure
    carries the same note.)"""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    barrier = ("    tl.debug_barrier()                     # every thread has read its old columns before any is "
               "overwritten\n")
    try:
        run_with_mistake(benchmark_module("run_notebooks").run_cell, "08_gated_deltanet_recurrent.ipynb",
                         "Exercise 08.1", "", barrier)
        said = capsys.readouterr().out
    except checks.CheckFailed as failed:
        said = str(failed)
    assert "conv1d_kernel (line" in said and "stores through `state_ptr`" in said, said
    assert "no tl.debug_barrier() between them" in said, said


def test_an_unmasked_read_whose_lanes_are_never_stored_is_noted(monkeypatch, benchmark_module, capsys):
    """01.2's gather with its table load unmasked: the columns past H read past each row (between the rows of the
    strided table, past the end of the last), but the store's mask drops them, so the outputs are right and the check
    passes. Under the interpreter the note names the load's line; on a GPU (no watch there) it passes silently, the
    read staying within the check's guard margins."""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    run_with_mistake(benchmark_module("run_notebooks").run_cell, "01_triton_basics_embedding.ipynb",
                     "Exercise 01.2", "    vals = tl.load(src)\n", "    vals = tl.load(src, mask=mask)\n")
    said = capsys.readouterr().out
    assert "PASS embedding" in said, said
    noted = re.search(r"embedding_exercise_kernel \(line \d+ of its file\) read \d+ element\(s\) outside 'weight'",
                      said) is not None
    assert noted == runtime.interpreter_active(), said


@pytest.mark.parametrize("wrong, says", [
    (None, None),
    ("    torch.index_select(s.uniforms, 0, s.position, out=s.uniform)",
     "that is s.position (the tokens so far, the prompt's included); the index is s.counter"),
], ids=["right", "position for counter"])
def test_the_12_1_check_takes_its_gpu_path_with_the_capture_emulated(wrong, says, monkeypatch, benchmark_module,
                                                                        capsys):
    """Chapter 12's check on a GPU runs two eager steps (from a position apart from the counter), captures the step and
    replays it. Here `on_gpu` is set and graph.capture runs the step eagerly in its place (its warm-up, then each
    replay), so the GPU path's own logic runs on any machine: the right step passes it, and a draw with s.position
    is named in the eager steps, before any replay."""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    run_cell = benchmark_module("run_notebooks").run_cell
    replays = []

    def capture(fn, warmup: int = 2, pool=None):
        for _ in range(warmup):
            fn()

        class Replayed:
            def replay(self):
                replays.append(1)
                fn()
        return Replayed(), None

    def as_on_a_gpu(namespace):
        namespace["on_gpu"] = True
        monkeypatch.setattr(namespace["graph"], "capture", capture)

    right = "    torch.index_select(s.uniforms, 0, s.counter, out=s.uniform)"
    if wrong is not None:
        with pytest.raises(checks.CheckFailed) as failed:
            run_with_mistake(run_cell, "12_cuda_graph.ipynb", "Exercise 12.1", wrong, right, as_on_a_gpu)
        assert says in str(failed.value), str(failed.value)
        assert not replays   # named in the eager steps, before the capture
        return
    run_with_mistake(run_cell, "12_cuda_graph.ipynb", "Exercise 12.1", right, right, as_on_a_gpu)
    assert "PASS decode_step" in capsys.readouterr().out
    assert len(replays) == 2 * 15   # two cases of 16 tokens: 15 replays each


def run_12_check_one_token_off(run_cell) -> None:
    """Chapter 12's solution cells up to Exercise 12.1's check, as a Jupyter kernel runs them; then the check's last
    part again with eager generation's last token changed whenever the deterministic mode is off (as if the atomics
    had swapped a near-tie): the check must report the differing token, compare again in the deterministic mode, and
    pass."""
    from qwen_lab.course import exercises

    notebook = os.path.join(SOLUTIONS, "12_cuda_graph.ipynb")
    nb = json.load(open(notebook))
    _, check = exercises.exercise_and_check(notebook, "Exercise 12.1")
    namespace = {"__name__": "__main__"}
    for i, cell in enumerate(nb["cells"][:check + 1]):
        if cell["cell_type"] == "code":
            run_cell("".join(cell["source"]), f"<12_cuda_graph.ipynb cell {i}>", namespace)
    source = "".join(nb["cells"][check]["source"])
    retry = source[source.index("try:\n    check_decode_step()"):]
    eager = namespace["tokens_from_generate"]

    def one_token_off(**case):
        tokens = eager(**case)
        if os.environ.get("QWEN_LAB_DETERMINISTIC") != "1":
            tokens = tokens.clone()
            tokens[-1] += 1
        return tokens

    namespace["tokens_from_generate"] = one_token_off
    run_cell(retry, "<12_cuda_graph.ipynb check, one token off in the atomic round>", namespace)


def test_the_check_retries_a_token_of_the_atomic_round_only(monkeypatch, benchmark_module):
    """Chapter 12's check compares the graph-replayed step with eager generation under the default atomic split-K.
    On a GPU, a token off in that round must send it to a retry in the deterministic mode, which passes. Under the
    interpreter (never a retry) the same plumbing must reach the comparison and fail on exactly that token, which
    shows the run found the check, kept the notebook's namespace and changed what the check compares."""
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(SOLUTIONS)
    run_cell = benchmark_module("run_notebooks").run_cell
    if ON_GPU:
        run_12_check_one_token_off(run_cell)   # the one-token-off round failed, the deterministic one passed
    else:
        with pytest.raises(checks.CheckFailed) as failed:
            run_12_check_one_token_off(run_cell)
        assert "decode_step (case 0" in str(failed.value) and "1 of 3 values differ; first at (2,)" in str(failed.value)
    assert os.environ.get("QWEN_LAB_DETERMINISTIC") is None


NOTEBOOKS = os.path.join(os.path.dirname(SOLUTIONS), "notebooks")
LEARNER_NOTEBOOKS = sorted(name for name in os.listdir(NOTEBOOKS) if name.endswith(".ipynb"))


@pytest.mark.parametrize("notebook", LEARNER_NOTEBOOKS)
def test_each_exercise_of_a_learners_notebook_is_checked_by_its_own_stub(notebook, monkeypatch, benchmark_module):
    """nbval lets a cell tagged raises-exception raise; it does not require it to. Here every code exercise of a
    learner's notebook, run as a kernel would, must reach a check cell that raises its own stub's
    NotImplementedError ("Exercise NN.M: ..."), and no check may raise anything else: a stub that never runs, a
    solution left in the notebook, or a check that passes an unfinished exercise would each fail this."""
    monkeypatch.chdir(NOTEBOOKS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    run_cell = benchmark_module("run_notebooks").run_cell
    nb = json.load(open(os.path.join(NOTEBOOKS, notebook)))
    namespace, raised = {"__name__": "__main__"}, {}
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "code":
            continue
        try:
            run_cell("".join(cell["source"]), f"<{notebook} cell {i}>", namespace)
        except Exception as e:  # noqa: BLE001 (every exception is looked at below)
            tags = cell.get("metadata", {}).get("tags", [])
            assert "raises-exception" in tags, f"{notebook}, cell {i} (not a check cell) raised {e!r}"
            unfinished = _unfinished(e)
            assert unfinished is not None, f"{notebook}, cell {i}: a check raised {type(e).__name__}: {e}, " \
                                           "not an exercise stub's NotImplementedError"
            raised[i] = str(unfinished)
    code_exercises = [title for title, i in exercises.list_exercises(os.path.join(NOTEBOOKS, notebook))
                      if nb["cells"][i]["cell_type"] == "code"]
    for title in code_exercises:
        number = title.split(":")[0].strip()   # "Exercise 04.1"
        assert any(message.startswith(number + ":") for message in raised.values()), (
            f"{notebook}: no check cell raised {number}'s stub (raised: {sorted(set(raised.values()))})")


# ---------------------------------------------------------------- the cause first (issue 49)

# (notebook, exercise, the right line, the mistake, the sentence the failure must begin with, after the case)
PITFALLS = [
    ("02_rmsnorm.ipynb", "Exercise 02.1",   # the `+1` pitfall the notebook's section 2 is about
     "y = (x * inv_rms[:, None]) * (1.0 + w)[None, :]", "y = (x * inv_rms[:, None]) * w[None, :]",
     "the result is x / rms(x) * w, the usual RMSNorm: Qwen3.5's norm multiplies by (1 + w)"),
    ("02_rmsnorm.ipynb", "Exercise 02.1",   # the mean over the tile's width: the ragged case D = 100
     "tl.sum(x * x, axis=1) / D + eps", "tl.sum(x * x, axis=1) / BLOCK_D + eps",
     "the mean square is divided by BLOCK_D, the tile's width: divide by D"),
    ("02_rmsnorm.ipynb", "Exercise 02.3",   # the gated norm given 02.1's (1 + w)
     "* w[None, :]) * (z * tl.sigmoid(z))", "* (1.0 + w)[None, :]) * (z * tl.sigmoid(z))",
     "the result is multiplied by (1 + w): the gated norm takes plain w"),
    ("06_rope.ipynb", "Exercise 06.1",
     "sin = tl.where(is_first, -tl.sin(phi),", "sin = tl.where(is_first, tl.sin(phi),",
     "the first half adds x_partner * sin: it subtracts it"),
    ("06_rope.ipynb", "Exercise 06.1",   # both signs swapped: the rotation by -position
     "sin = tl.where(is_first, -tl.sin(phi), tl.where(is_rot, tl.sin(phi), 0.0))",
     "sin = tl.where(is_first, tl.sin(phi), tl.where(is_rot, -tl.sin(phi), 0.0))", "the rotation runs backwards"),
    ("01_triton_basics_embedding.ipynb", "Exercise 01.2",   # the table's rows read H apart: the strided table
     "ids.to(tl.int64)[:, None] * stride_w", "ids.to(tl.int64)[:, None] * H", "the table's rows are read H apart"),
    ("05_swiglu_mlp.ipynb", "Exercise 05.1",
     "y = gate * tl.sigmoid(gate) * up", "y = up * tl.sigmoid(up) * gate", "gate and up are swapped"),
    ("07_gated_attention.ipynb", "Exercise 07.1",
     "s = tl.dot(q, tl.trans(k)) * scale ", "s = tl.dot(q, tl.trans(k)) ", "the scale is missing"),
    ("07_gated_attention.ipynb", "Exercise 07.2",   # every key visible: no causal mask
     "visible = (j <= pos) & (j < L)", "visible = j < L", "no key is masked: query t sees key j only when"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.2",
     "x = a + tl.load(dt_bias_ptr", "x = a - tl.load(dt_bias_ptr", "dt_bias is subtracted: softplus takes a + dt_bias"),
    ("08_gated_deltanet_recurrent.ipynb", "Exercise 08.3",
     "S = S * tl.exp(g)  ", "S = S  ", "the state never forgets: multiply S by exp(g)"),
]


@pytest.mark.parametrize("notebook, exercise, right, wrong, first", PITFALLS,
                         ids=[f"{m[1].split()[-1]}-{j}" for j, m in enumerate(PITFALLS)])
def test_a_known_pitfall_is_named_first(notebook, exercise, right, wrong, first, monkeypatch, benchmark_module):
    """A mistake the notebook warns about, planted in a copy of the solution: the failure names it and its fix in
    its first sentence (right after the case), or right after the reads outside a tensor that the mistake made
    (under the interpreter, the one finding more specific), and before the counts of what differs."""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    with pytest.raises(checks.CheckFailed) as failed:
        run_with_mistake(benchmark_module("run_notebooks").run_cell, notebook, exercise, wrong, right)
    said = str(failed.value)
    case = re.match(r"[^\n]*?\(case \d+: [^\n]*?\)(, [^\n]*?)?: ", said)   # (no colon in a case's shapes)
    assert case is not None, said
    notes = said.split("\n  hint: ")[0][case.end():].split("\n  also: ")
    while notes and re.match(r"\w+ \(line \d+ of its file\) read \d+ element\(s\) outside ", notes[0]):
        notes.pop(0)
    assert len(notes) >= 2 and notes[0].startswith(first), said   # the comparison's own finding still follows


def test_a_missing_load_mask_names_the_read_first_and_only_a_norms_causes(monkeypatch, benchmark_module):
    """02.1 with its load unmasked: the read outside x comes first, with its line; the NaN it brought in follows,
    explained with a norm's causes only (no softmax row, no exp), and no note is cut short."""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    with pytest.raises(checks.CheckFailed) as failed:
        run_with_mistake(benchmark_module("run_notebooks").run_cell, "02_rmsnorm.ipynb", "Exercise 02.1",
                         "x = tl.load(x_rows[:, None] + cols[None, :])",
                         "x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0)")
    said = str(failed.value)
    head, *notes = said.split("\n  also: ")
    if runtime.interpreter_active():   # (the read watch runs under the interpreter)
        assert re.search(r"\): rms_norm_exercise_kernel \(line \d+ of its file\) read \d+ element\(s\) outside 'x'",
                         head), said
        assert any("elements are NaN" in note for note in notes), said
    assert "a missing eps" in said, said
    for softmax_only in ("exp(", "softmax", "max was not subtracted", "every key is masked"):
        assert softmax_only not in said.split("\n  hint:")[0], said
    assert "more such notes" not in said, said


UPCASTS = [   # (exercise, the right line, its check's name, the variable whose square overflows)
    ("Exercise 02.1", "x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)", "rms_norm",
     "x"),
    ("Exercise 02.2", "    s = s.to(tl.float32)\n", "add_rms_norm", "s"),   # the rounded sum left in float16
    ("Exercise 02.3", "x = tl.load(x_rows[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)",
     "gated_rms_norm", "x"),
]


@pytest.mark.parametrize("exercise, right, name, squared", UPCASTS, ids=[u[0].split()[-1] for u in UPCASTS])
def test_a_missing_fp32_upcast_is_caught_by_the_float16_case(exercise, right, name, squared, monkeypatch,
                                                             benchmark_module):
    """A norm without its `.to(tl.float32)`: right in float32, so the notebook's cases pass; the check's float16 case
    (x up to about 1000: the square overflows float16, as on a GPU) fails, and the failure names the missing upcast
    first."""
    monkeypatch.chdir(SOLUTIONS)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    wrong = right.removesuffix(".to(tl.float32)") if right.endswith(")") else ""
    with pytest.raises(checks.CheckFailed) as failed:
        run_with_mistake(benchmark_module("run_notebooks").run_cell, "02_rmsnorm.ipynb", exercise, wrong, right)
    said = str(failed.value)
    case = re.escape(name) + r" \(case \d+: x=\(\d+, \d+\) float16, [^\n]*\)(, output 0)?: "
    overflow = f"this is what float16 arithmetic gives: {squared} \\* {squared} overflows float16"
    assert re.match(case + overflow, said), said
    assert "the fp32 upcast is missing" in said.split("\n")[0], said


def test_the_float16_pitfalls_take_a_bf16_weight_as_on_a_gpu():
    """On a GPU the notebooks' weights are bf16, which NumPy lacks: each norm's missing-upcast pitfall still
    computes what the kernel gives (every row of x up to about 1000 overflows float16 and comes out 0)."""
    from qwen_lab.course.checks import pitfalls

    g = torch.Generator().manual_seed(0)
    x = checks.randn(5, 64, g=g, dtype=torch.float16, scale=300.0)
    w = checks.randn(64, g=g, dtype=torch.bfloat16, scale=0.1)
    normed = pitfalls._no_upcast_norm(x, w, 1e-6)
    summed, s = pitfalls._no_upcast_add_norm(x, torch.zeros_like(x), w, 1e-6)
    gated = pitfalls._no_upcast_gated(x, x, w, 1e-6)
    for y in (normed, summed, gated):
        assert y.dtype == torch.float16 and y.shape == x.shape and (y == 0).all(), y
    assert torch.equal(s, x)


_IPYTHON_CELLS = """
import json, sys
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
nb = json.load(open(sys.argv[1]))
for i in map(int, sys.argv[2:]):
    print(f"<<cell {i}>>", flush=True)
    shell.run_cell("".join(nb["cells"][i]["source"]))
    sys.stdout.flush()
"""


def test_an_unsolved_exercise_ends_in_one_short_message(tmp_path):
    """The learner's notebook 02, unsolved, run cell by cell in IPython as Jupyter runs it: Exercise 02.1's check
    cell, and the cell that calls the learner's norm itself within checks.learner_code(), each show one short
    message naming the exercise, the kernel still to write and what to do; no traceback of the interpreter."""
    import subprocess
    import sys

    path = os.path.join(NOTEBOOKS, "02_rmsnorm.ipynb")
    nb = json.load(open(path))
    _, check = exercises.exercise_and_check(path, "Exercise 02.1")
    direct = next(i for i in range(check + 1, len(nb["cells"]))
                  if "checks.learner_code()" in "".join(nb["cells"][i]["source"]))
    cells = [i for i in range(check + 1) if nb["cells"][i]["cell_type"] == "code"] + [direct]
    script = tmp_path / "run_cells.py"
    script.write_text(_IPYTHON_CELLS)
    root = os.path.dirname(SOLUTIONS)
    done = subprocess.run([sys.executable, str(script), path, *map(str, cells)], capture_output=True, text=True,
                          cwd=NOTEBOOKS, timeout=600, env={**os.environ, "MPLBACKEND": "Agg", "PYTHONPATH": root})
    said = {int(part.split(">>", 1)[0]): part.split(">>", 1)[1] for part in done.stdout.split("<<cell ")[1:]}
    message = ("NotImplementedError: Exercise 02.1: zero-centred RMSNorm: `rms_norm_exercise_kernel` still raises "
               "NotImplementedError (the exercise's stub): fill in the exercise's cell above, run it, then run this "
               "cell again")
    for i in (check, direct):
        lines = said.get(i, "").strip().splitlines()
        assert lines and lines[-1] == message, done.stdout[-3000:] + done.stderr[-3000:]
        assert len(lines) <= 3 and "Traceback" not in said[i], said[i]   # (cell 14 prints two lines of its own first)


@pytest.mark.parametrize("wrong", [None, "while seen < T1:", "while (seen < T1) | (polls < spin_limit):"],
                         ids=["right", "no bound", "or instead of and"])
def test_the_14_1_check_reads_the_bound_of_the_wait_from_the_source(wrong, tmp_path, monkeypatch):
    """On a GPU nothing stops a kernel that spins for ever, so before Exercise 14.1's check launches a wait that can
    never be met it reads the kernel's source: every `while` must end at spin_limit. The solution's kernel passes
    that reading; a wait with no bound, or one whose bound is joined with `|`, is named by its line. (Under the
    interpreter the launch itself is watched instead: the MISTAKES above.)"""
    import importlib
    import sys

    from notebook_source import solution_cells
    from qwen_lab.course.checks.counters import unbounded_loops

    (cell,) = [c for c in solution_cells("14_one_kernel_per_token.ipynb").values() if c.startswith("# Exercise 14.1:")]
    right = "while (seen < T1) & (polls < spin_limit):"
    assert cell.count(right) == 1
    module = tmp_path / "learners_14_1.py"
    module.write_text("import triton\nimport triton.language as tl\nfrom qwen_lab.kernels.persistent.teach import "
                      "_tile\n\n" + cell.replace(right, wrong or right) + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("learners_14_1", None)
    kernel = importlib.import_module("learners_14_1").two_gemvs_kernel
    assert unbounded_loops(kernel) == ([] if wrong is None else [wrong])
