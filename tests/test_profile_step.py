"""qwen_lab.profile_step's accounting of kernel times, on made-up profiler events (no GPU needed)."""

import importlib

import pytest


@pytest.fixture(scope="module")
def profile_step():
    return importlib.import_module("qwen_lab.profile_step")


def test_exclusive_times_add_up_to_the_busy_time_when_kernels_overlap(profile_step):
    # b starts under PDL while a is finishing; c follows a gap; d lies wholly inside c's span
    events = [(10.0, 20.0, "a"), (15.0, 24.0, "b"), (30.0, 41.0, "c"), (32.0, 35.0, "d")]
    timed = profile_step.exclusive(events)
    assert [name for name, _, _ in timed] == ["a", "b", "c", "d"]
    assert [span for _, span, _ in timed] == [10.0, 9.0, 11.0, 3.0]
    assert [excl for _, _, excl in timed] == [10.0, 4.0, 11.0, 0.0]
    busy = profile_step.covered([(s, e) for s, e, _ in events])
    assert busy == 25.0 and sum(excl for _, _, excl in timed) == busy


def test_exclusive_times_sort_the_events_by_start(profile_step):
    timed = profile_step.exclusive([(5.0, 9.0, "second"), (0.0, 6.0, "first")])
    assert timed == [("first", 6.0, 6.0), ("second", 4.0, 3.0)]


def test_tuned_picks_lists_each_autotuned_kernels_choice(profile_step, monkeypatch):
    """On a GPU the autotuners fill `cache` (key -> config); under the interpreter they are never timed, so two made-up
    choices stand in for them."""
    from types import SimpleNamespace

    from qwen_lab.kernels import attention, deltanet, gemm

    monkeypatch.setattr(gemm, "matmul_kernel", SimpleNamespace(cache={(2048, 7168, 1024, True): "BLOCK_M: 128, JOIN"}))
    monkeypatch.setitem(attention._tuned, "prefill", SimpleNamespace(cache={(4, 256, True): "BLOCK_M: 64"}))
    monkeypatch.setattr(deltanet.tuning, "_PICKS", {"chunk_scan_kernel": {("cuda:0", 16, 32, 200): "BV: 32"},
                                             "conv_decode_step_kernel": {("cuda:0", 16, 128, 4): "BV: 16"}})
    lines = profile_step.tuned_picks()
    assert "  matmul_kernel [2048, 7168, 1024, True]: BLOCK_M: 128, JOIN" in lines
    assert "  flash_attention_kernel [4, 256, True]: BLOCK_M: 64" in lines
    assert "  chunk_scan_kernel, timed beside the prep [cuda:0, 16, 32, 200]: BV: 32" in lines
    assert "  conv_decode_step_kernel, timed in a graph [cuda:0, 16, 128, 4]: BV: 16" in lines


def test_cli_rejects_bad_counts_in_one_line(profile_step, capsys):
    for argv, fragment in ((["--reps", "0"], "--reps 0: expected at least 1"),
                           (["--prefill-len", "-3"], "--prefill-len -3: expected at least 1")):
        with pytest.raises(SystemExit) as exit_info:
            profile_step.main(argv)
        assert exit_info.value.code == 2 and fragment in capsys.readouterr().err
