"""benchmarks/gpu_session.sh, the one command of a GPU call: the Triton cache it saves at the end of one call is what
the next call restores, so that a fresh machine does not compile every kernel again."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _session(cwd, out, cache_dir, **env):
    """The script with no target that runs anything (only its setup and its end), in a copy of the repository's
    layout at cwd."""
    # (SAVE_TRITON_CACHE from the caller's environment, a GPU call's `SAVE_TRITON_CACHE=1 ... tests`, is left out:
    # each call here says for itself whether it saves)
    inherited = {k: v for k, v in os.environ.items() if k != "SAVE_TRITON_CACHE"}
    env = {**inherited, "OUT": str(out), "TRITON_CACHE_DIR": str(cache_dir), **env}
    done = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu_session.sh"), "nothing"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.stdout + done.stderr


@pytest.mark.skipif(not (shutil.which("tar") and shutil.which("xz")), reason="needs tar and xz")
def test_the_triton_cache_saved_by_one_call_is_restored_by_the_next(tmp_path):
    cache = tmp_path / "tcache"
    files = {"k1/add_kernel.cubin": b"\x7fELF" + bytes(range(256)) * 40, "k1/add_kernel.json": b'{"name": "add"}',
             "k1/__grp__add_kernel.json": b'{"child_paths": {}}', "k1/add_kernel.ptx": b".version 8.7",
             "k1/add_kernel.ttgir": b"#blocked = ...", "k1/add_kernel.llir": b"define void",
             "k2/matmul.autotune.json": b'{"configs_timings": []}',
             "k3/__triton_launcher.cpython-312-x86_64-linux-gnu.so": b"\x7fELF launcher",
             "qwen_lab-tunings/nvidia-h200-0123.json": b'{"entries": {}}'}
    for name, data in files.items():
        (cache / name).parent.mkdir(parents=True, exist_ok=True)
        (cache / name).write_bytes(data)
    first = tmp_path / "first"
    log = _session(tmp_path, first, cache, SAVE_TRITON_CACHE="1")
    archive = first / "triton-cache.tar.xz"
    assert archive.is_file() and "Triton cache saved" in log, log

    # the next call: a new machine (an empty cache directory), the archive carried in .tcache/
    (tmp_path / ".tcache").mkdir()
    shutil.copy(archive, tmp_path / ".tcache" / "triton-cache.tar.xz")
    restored = tmp_path / "restored"
    log = _session(tmp_path, tmp_path / "second", restored)
    assert "Triton cache restored: 1 compiled kernels" in log, log
    kept = {str(p.relative_to(restored)) for p in restored.rglob("*") if p.is_file()}
    assert kept == {name for name in files if not name.endswith((".ttgir", ".llir"))}, kept
    for name in kept:
        assert (restored / name).read_bytes() == files[name], name
    assert not (tmp_path / "second" / "triton-cache.tar.xz").exists(), "saved without SAVE_TRITON_CACHE=1"


@pytest.mark.skipif(not (shutil.which("tar") and shutil.which("xz")), reason="needs tar and xz")
def test_the_tuning_picks_travel_without_the_archive(tmp_path):
    """The picks of qwen_lab.tunings come back on their own, so that they are carried even when the archive is too
    large to come back: saved to $OUT/qwen_lab-tunings/, restored from .tcache/qwen_lab-tunings/."""
    cache = tmp_path / "tcache"
    (cache / "qwen_lab-tunings").mkdir(parents=True)
    picks = b'{"entries": {"k": {"choice": 1}}}'
    (cache / "qwen_lab-tunings" / "nvidia-h200-0123.json").write_bytes(picks)
    first = tmp_path / "first"
    log = _session(tmp_path, first, cache, SAVE_TRITON_CACHE="1")
    assert (first / "qwen_lab-tunings" / "nvidia-h200-0123.json").read_bytes() == picks, log
    assert "tuning picks saved: 1 file(s)" in log, log

    (tmp_path / ".tcache").mkdir()
    shutil.copytree(first / "qwen_lab-tunings", tmp_path / ".tcache" / "qwen_lab-tunings")   # no archive carried
    restored = tmp_path / "restored"
    log = _session(tmp_path, tmp_path / "second", restored)
    assert (restored / "qwen_lab-tunings" / "nvidia-h200-0123.json").read_bytes() == picks, log
    assert "tuning picks restored: 1 file(s)" in log, log
