"""Every GPU configuration of the kernels compiles for sm_90 (H100/H200) and fits its shared memory, checked on any
machine: Triton compiles ahead of time for a target it does not have (tests/sm90_compile.py does the compiling,
in a child process with the interpreter off)."""

import json
import os
import subprocess
import sys

import pytest
import torch

# The compile runs on the CPU and needs no GPU; on a GPU machine the GPU tests compile and run every configuration
# for real, and this minutes-long compile (once per test worker) would only slow them down.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine compiles the configs for real; "
                                "this offline sm_90 check belongs to the CPU run")

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "sm90_compile.py")
SHARED_LIMIT = 232448  # 227 KB of shared memory per program on sm_90
T4_SHARED_LIMIT = 65536  # 64 KB on a T4 (sm_75)


def _run(*args) -> list[dict]:
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def results():
    return _run()


def test_every_gpu_config_compiles_for_sm90(results):
    failed = [f"{r['label']}: {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    kinds = {r["label"].split(" ")[0] for r in results}
    assert {"matmul", "gemv", "flash_attention", "flash_decode_split", "chunk_prep", "chunk_scan", "conv_decode_step",
            "conv1d_prefill", "sample_max", "sample_round", "sample_draw", "notebook"} <= kinds, kinds
    # the GEMM epilogues that split a residual add + RMSNorm between two prompt GEMMs, with the TMA candidates
    assert any("RES_NORM" in r["label"] for r in results) and any("ROW_SCALE" in r["label"] for r in results)


def test_a_t4_has_attention_tiles_that_fit(results):
    """On a T4 (sm_75, 64 KB of shared memory per program; Colab's free GPU) every small prefill tile the autotuner
    is offered there fits, and so does at least one decode tile: the others (96-192 KB there) fail to launch and
    the autotuner passes over them."""
    t4 = [r for r in results if " sm_75 " in r["label"]]
    failed = [f"{r['label']}: {r['error']}" for r in t4 if not r["ok"]]
    assert not failed, "\n".join(failed)
    prefill = [r for r in t4 if r["label"].startswith("flash_attention")]
    decode = [r for r in t4 if r["label"].startswith("flash_decode_split") and r["shared"] <= T4_SHARED_LIMIT]
    assert prefill, "no small prefill tile was compiled for sm_75"
    over = [f"{r['label']}: {r['shared']} bytes" for r in prefill if r["shared"] > T4_SHARED_LIMIT]
    assert not over, "over a T4's 64 KB per program:\n" + "\n".join(over)
    assert decode, "no decode tile fits a T4's 64 KB per program"


def test_the_large_prefill_tiles_need_what_a_t4_lacks(results):
    """Below attention.LARGE_TILE_SHARED_MEMORY per program the autotuner is offered the small prefill tiles alone:
    that loses nothing only if every other prefill tile needs at least that much (compiled for sm_75 the large ones
    took 9-56 s each, only to fail to launch on a T4)."""
    from qwen_lab.kernels import attention

    large = [r for r in results if r["label"].startswith("flash_attention ") and " sm_75 " not in r["label"]]
    assert large, "no large prefill tile was compiled"
    under = [f"{r['label']}: {r['shared']} bytes" for r in large if r["shared"] < attention.LARGE_TILE_SHARED_MEMORY]
    assert not under, "prefill tiles a GPU with less than LARGE_TILE_SHARED_MEMORY could run:\n" + "\n".join(under)


def test_every_gpu_config_fits_the_shared_memory_of_sm90(results):
    over = [f"{r['label']}: {r['shared']} bytes" for r in results if r["ok"] and r["shared"] > SHARED_LIMIT]
    assert not over, "over the 227 KB an sm_90 program may use:\n" + "\n".join(over)


def test_the_atomic_split_k_clears_its_sums_only_after_every_thread_read_them(results):
    """The last program of a split-K block reads the fp32 sums and clears them for the next call. With several rows
    (the tl.dot path) the compiler lays the load and the clearing store out differently over the threads, so a
    barrier must separate them: without it, a prompt of 4 tokens prefilled through the split-K GEMVs came out
    with logits 1.1 (relative) away from the right ones on the H200."""
    checked = [r for r in results if r["ok"] and "barrier_before_clear" in r]
    assert any(r["label"].startswith("gemv M=16 atomic") for r in checked), "no M=16 atomic case was compiled"
    racy = [r["label"] for r in checked if not r["barrier_before_clear"]]
    assert not racy, "sums cleared with no barrier after they are read:\n" + "\n".join(racy)


def test_the_tma_kernels_take_their_descriptors_from_the_host(results):
    """The TMA configurations of the prefill GEMM and of flash attention load through tensor descriptors made by the
    launcher. Made by the kernel (`tl.make_tensor_descriptor`), each program wrote and fenced its own in global memory
    before its first load: 2-3.5 us per GEMM call on the H200 (docs/experiments.md, 2026-12-01), as much as cuBLAS's
    lead on the narrow shapes."""
    tma = [r for r in results if r["ok"] and "tma_loads" in r]
    matmuls = [r for r in tma if r["label"].startswith("matmul")]
    assert len(matmuls) >= 8, f"only {len(matmuls)} TMA matmul cases compiled"
    assert any(r["label"].startswith("flash_attention") for r in tma), "no TMA flash-attention case compiled"
    assert all(r["tma_loads"] for r in tma), [r["label"] for r in tma if not r["tma_loads"]]
    made = [r["label"] for r in tma if r["device_made_descriptors"]]
    assert not made, "TMA descriptors built on the device:\n" + "\n".join(made)


def test_a_persistent_prep_program_leaves_room_for_a_scan_program(results):
    """PREP_PERSISTENT leaves one SM slot per scan program beside a prep program: in shared memory, a persistent
    prep program (4 warps, the config it runs) and the scan's largest config must fit one SM together (228 KB, less
    1 KB the GPU reserves per program)."""
    prep = [r for r in results
            if r["ok"] and r["label"].startswith("chunk_prep PERSIST") and "num_warps: 4," in r["label"]]
    scans = [r for r in results if r["ok"] and r["label"].startswith("chunk_scan ")]
    assert prep and scans, "no persistent prep or no scan was compiled"
    per_sm = 228 * 1024
    worst = max(p["shared"] for p in prep) + max(s["shared"] for s in scans) + 2 * 1024
    assert worst <= per_sm, f"a prep and a scan program need {worst} bytes of shared memory, an SM has {per_sm}"


def test_the_check_sees_a_pipeline_too_deep_for_the_sm():
    """The exercise 09.2 scan with three pipeline stages (the default) needs more shared memory than an SM has: on
    the H200 it failed with "out of resource: shared memory"; its launcher asks for one stage."""
    (deep,) = _run("--notebook-09-stages", "3")
    assert deep["ok"] and deep["shared"] > SHARED_LIMIT, deep


def test_decode_prefetch_comes_before_the_pdl_wait(results):
    # a prefetch after the wait would warm L2 with nothing left to overlap; none at all, a dropped asm
    cases = [r for r in results if r["label"].startswith("flash_decode_split PREP PREFETCH")]
    assert cases, "no prefetching decode case compiled"
    for r in cases:
        assert r["ok"] and r["prefetches"] > 0 and r["prefetches_before_wait"], r

