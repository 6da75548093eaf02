"""What each kernel's first-call timing picked on this kind of GPU, kept on disk for the next process.

On a GPU the first call of each kernel shape times its candidate configurations and keeps the fastest:
Triton's autotuner for the prefill GEMM, the flash attention, the conv and the DeltaNet kernels; the launchers'
own timing inside a CUDA Graph for the decode GEMV plans (`kernels.gemm.tuning`) and for two DeltaNet kernels
(`kernels.deltanet._pick_in_place`). That is seconds per shape and minutes per notebook on a fresh machine.
Triton keeps the compiled kernels on disk, but not what was picked, so without this module every new process
(each notebook, each restart of its kernel, each run of the command line) times everything again.

Each pick is recorded here with what every candidate measured, in one JSON file per GPU model and software:

    <Triton's cache directory>/qwen_lab-tunings/<gpu name>-<hash>.json

(the cache directory is TRITON_CACHE_DIR, by default ~/.triton/cache). The hash covers the GPU's name and compute
capability, the versions of Triton and PyTorch, Triton's settings that change compiled code, the QWEN_LAB_*
switches as set (unset and set to their default count as different), and the source of the kernel modules and of
this file (an edit of any kernel, launcher or timer starts a new file). An entry is found by the kernel's name and
hash (Triton's `cache_key`) and by the call's tuning key, and is used only if the call offers the same candidates
as the call that timed them; otherwise the call times them as before and records the new pick.

`QWEN_LAB_TUNING_CACHE=0` turns this off: nothing is read or written. The tests set it, so that each times what it
tests and so that test workers sharing one GPU leave no picks timed under contention for later processes.
`python -m qwen_lab.tunings` lists the files and how many picks each holds; `--clear` (or `clear()`) deletes them,
to time everything again (after a run that shared the GPU with other work, say).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import os
import re
import tempfile
import threading
from pathlib import Path

from .switches import switches as _switches

ENV = "QWEN_LAB_TUNING_CACHE"
FOLDER = "qwen_lab-tunings"
# Switches that choose the model or where the course comes from, or this file itself: they change no kernel.
_NOT_KERNEL_SWITCHES = {"QWEN_LAB_MODEL", "QWEN_LAB_SOURCE", ENV}

_lock = threading.Lock()
_loaded: dict = {}   # file path -> its entries, as read by this process (and grown by its records)


def enabled() -> bool:
    """Whether picks are read from and written to disk: the `tuning_cache` switch (QWEN_LAB_TUNING_CACHE unset, or 1,
    true, yes or on; qwen_lab.switches)."""
    return _switches.tuning_cache


def cache_dir() -> Path:
    """The folder of the tuning files: `qwen_lab-tunings` in Triton's cache directory."""
    try:
        from triton import knobs

        base = knobs.cache.dir
    except (ImportError, AttributeError):
        base = os.environ.get("TRITON_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".triton", "cache")
    return Path(base) / FOLDER


def _device_identity(device) -> tuple[str, str]:
    """(the GPU's name, its compute capability) of `device`, or ("cpu", "") for anything but a CUDA device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return device.type, ""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"sm_{major}{minor}"


def path(device) -> Path:
    """The tuning file of `device` under the present software and switches."""
    import torch
    import triton

    name, capability = _device_identity(device)
    switches = sorted((k, v) for k, v in os.environ.items()
                      if k.startswith("QWEN_LAB_") and k not in _NOT_KERNEL_SWITCHES)
    # switches set in code (qwen_lab.switches.set) as well: a pick timed under them is theirs alone
    in_code = sorted((k, repr(v)) for k, v in _switches.set_in_code().items() if k != "tuning_cache")
    identity = json.dumps([name, capability, triton.__version__, torch.__version__, switches, _triton_settings(),
                           _code_digest()] + ([in_code] if in_code else []))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower() or "device"
    return cache_dir() / f"{slug}-{digest}.json"


def _triton_settings() -> list:
    """The Triton settings (environment variables) that its own caches treat as changing compiled code."""
    try:
        from triton._C.libtriton import get_cache_invalidating_env_vars  # where Triton 3.6's autotuner takes it from

        return sorted(get_cache_invalidating_env_vars().items())
    except (ImportError, AttributeError):
        return []


@functools.lru_cache(maxsize=None)
def _code_digest() -> str:
    """A digest of the kernel modules' source (every file of the family folders under kernels/) and of this file's:
    any edit of a kernel, of a launcher that times its candidates (the GEMV plans' grids, the scan timed beside its
    prep) or of the timers, starts a new file."""
    folder = Path(__file__).parent
    kernels = folder / "kernels"
    digest = hashlib.sha256()
    for file in sorted(kernels.rglob("*.py")) + [Path(__file__)]:
        name = file.relative_to(kernels).as_posix() if file.is_relative_to(kernels) else file.name
        digest.update(name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def kernel_id(*kernels) -> str:
    """The name and source hash of the kernels a pick is for (JITFunctions, or Autotuners around one): an edit of
    any of them, or of a function they call, makes a new id."""
    parts = []
    for kernel in kernels:
        fn = kernel
        while not hasattr(fn, "cache_key") and hasattr(fn, "fn"):
            fn = fn.fn
        if hasattr(fn, "cache_key"):
            digest = fn.cache_key
        else:  # the interpreter's kernels have no cache_key: the function's own source (nothing is timed there)
            digest = hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
        parts.append(f"{fn.__name__}:{digest}")
    return "+".join(parts)


def _plain(value):
    """A candidate (a triton.Config, a tuple of them and numbers, a number) as JSON-ready data."""
    if hasattr(value, "all_kwargs"):
        return {"config": {k: v if _jsonable(v) else repr(v) for k, v in sorted(value.all_kwargs().items())}}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _jsonable(value) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _key_text(key) -> str:
    """A tuning key as text: torch devices by their kind only (the file is already per GPU model), dtypes by name."""
    import torch

    def part(v):
        if isinstance(v, torch.device):
            return v.type
        if isinstance(v, (tuple, list)):
            return [part(x) for x in v]
        return v if _jsonable(v) else str(v)

    return json.dumps(part(key))


def _read(file: Path):
    """The entries of `file` as {entry name: entry}: {} for a missing file or one whose content is not a tuning file
    (it is replaced by the next record); None for a file that exists but cannot be read (permissions), which this
    process then neither uses nor overwrites."""
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        return {}
    except OSError:
        return None
    except ValueError:
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        return {}
    return {name: entry for name, entry in entries.items() if isinstance(entry, dict)}


def _entries(file: Path):
    """The entries of `file`, read once per process (see _read; None: unreadable)."""
    if file not in _loaded:
        _loaded[file] = _read(file)
    return _loaded[file]


def _texts(candidates):
    """{a candidate's JSON text: the candidate}, or None if two candidates have the same text or one carries a
    pre-hook (which no text describes): such a set is always timed, as Triton's own disk cache does."""
    if any(getattr(c, "pre_hook", None) for c in _configs_in(candidates)):
        return None
    texts = {json.dumps(_plain(c), sort_keys=True): c for c in candidates}
    return texts if len(texts) == len(candidates) else None


def _configs_in(candidates):
    for c in candidates:
        yield from (x for x in c if hasattr(x, "all_kwargs")) if isinstance(c, tuple) else (c,)


def _offer(texts) -> str:
    """A digest of a set of candidates (their JSON texts): a pick stands only against the offer it was made from."""
    return hashlib.sha256("\n".join(sorted(texts)).encode()).hexdigest()[:16]


def lookup(device, kernel: str, key, candidates):
    """The recorded pick for `kernel` (a `kernel_id`) and this tuning key among `candidates`, with what each candidate
    measured when it was picked: (choice, {candidate: time}) as the caller's own candidate objects. None when there
    is no such record, when the record was timed over another set of candidates (one added, removed or pruned
    differently: the new set must be timed), or when the store is off."""
    if not enabled():
        return None
    with _lock:
        entries = _entries(path(device))
    by_text = _texts(candidates)
    entry = (entries or {}).get(f"{kernel} {_key_text(key)}")
    if by_text is None or entry is None or entry.get("offer") != _offer(by_text):
        return None
    choice = by_text.get(json.dumps(entry.get("choice"), sort_keys=True))
    if choice is None:
        return None
    times = {}
    for pair in entry.get("times") if isinstance(entry.get("times"), list) else []:
        if isinstance(pair, list) and len(pair) == 2:
            candidate = by_text.get(json.dumps(pair[0], sort_keys=True))
            if candidate is not None:
                times[candidate] = pair[1]
    return choice, times


def record(device, kernel: str, key, candidates, choice, times: dict | None = None) -> None:
    """Record `choice` as the pick for `kernel` and this tuning key among `candidates` (what was timed), with what
    each candidate measured. Under a lock shared by the processes of this machine, the file is read again, the
    entry added and the file replaced in one rename: processes recording at once lose no entry of each other's."""
    by_text = _texts(candidates)
    if not enabled() or by_text is None:
        return
    file = path(device)
    entry = {"choice": _plain(choice), "offer": _offer(by_text),
             "times": [[_plain(c), t] for c, t in (times or {}).items() if _jsonable(t) or isinstance(t, list)]}
    with _lock:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(file):
                entries = _read(file)  # as it is now: another process may have recorded since this one read it
                if entries is None:
                    return  # a file this process cannot read is not overwritten; the pick still serves this process
                entries[f"{kernel} {_key_text(key)}"] = entry
                _loaded[file] = entries
                fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=file.name, suffix=".tmp")
                try:
                    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes it private; the file follows the umask
                    with os.fdopen(fd, "w") as out:
                        json.dump({"entries": entries}, out, indent=0)
                    os.replace(tmp, file)
                except BaseException:
                    os.unlink(tmp)
                    raise
        except OSError:
            pass  # a read-only cache folder: the pick still serves this process


def pick(device, kernel: str, key, candidates, time_them):
    """The pick for `kernel` and this tuning key among `candidates`, with what each candidate measured: the
    recorded one if an earlier process timed the same candidates (see `lookup`), else `time_them()` -> (choice,
    {candidate: time}), recorded for the next process (a choice of None, nothing timed, is not recorded).
    Returns (choice, times, timed): whether this call did the timing."""
    found = lookup(device, kernel, key, candidates)
    if found is not None:
        return (*found, False)
    choice, times = time_them()
    if choice is not None:
        record(device, kernel, key, candidates, choice, times)
    return choice, times, True


@contextlib.contextmanager
def _file_lock(file: Path):
    """An exclusive lock on `file`'s companion `.lock` between processes (where the OS offers flock)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): records made at the same moment may lose one another
        yield
        return
    with open(file.with_name(file.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _read_umask() -> int:
    """The process's umask, read once at import: reading it means setting it, which another thread creating a file at
    that moment would see."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def clear() -> int:
    """Delete every tuning file (every GPU and version); returns how many were deleted. The next first call of each
    kernel shape, in any process, times its candidates again. (This process keeps what it has already picked.)"""
    removed = 0
    with _lock:
        _loaded.clear()
        for lock in cache_dir().glob("*.json.lock"):
            try:
                lock.unlink()
            except OSError:
                pass
        for file in cache_dir().glob("*.json"):
            try:
                file.unlink()
                removed += 1
            except OSError:
                pass
    return removed


# ---------------------------------------------------------------- Triton's autotuner


def _triton_disk_cache_asked() -> bool:
    """Whether Triton's own switch for keeping autotuning results on disk (TRITON_CACHE_AUTOTUNING) is on now."""
    try:
        from triton import knobs

        return bool(knobs.autotuning.cache)
    except (ImportError, AttributeError):
        return False


def _autotuner_check(tuner, tuning_key, configs, bench_fn) -> bool:
    """In place of `Autotuner.check_disk_cache`, which Triton calls with the call's tuning key and candidates when a
    key is first met and which returns whether the timing was skipped: the recorded pick if there is one, else
    the timing (`bench_fn`, which sets tuner.cache[key] and tuner.configs_timings), then its record. With the store
    off, Triton's own disk cache where its switch (TRITON_CACHE_AUTOTUNING) asks for it, else the timing."""
    import torch

    if not enabled():
        if getattr(tuner, "_triton_cache_results", False) or _triton_disk_cache_asked():
            return type(tuner).check_disk_cache(tuner, tuning_key, configs, bench_fn)
        bench_fn()
        return False

    def bench():
        bench_fn()
        return tuner.cache[tuning_key], getattr(tuner, "configs_timings", None)
    device = torch.device("cuda", torch.cuda.current_device())
    tuner.cache[tuning_key], tuner.configs_timings, timed = pick(device, kernel_id(tuner), tuning_key, configs, bench)
    return not timed


def stored(tuner):
    """`tuner` (a triton.autotune object) reading and recording its picks here, on a GPU. Under the interpreter
    (where the launchers pass a fixed config and nothing is timed) and with a Triton that lacks the hook, as is."""
    from .runtime import interpreter_active

    if interpreter_active() or not hasattr(tuner, "check_disk_cache") or not hasattr(tuner, "cache_results"):
        return tuner
    tuner._triton_cache_results = tuner.cache_results
    tuner.cache_results = True  # so that run() asks check_disk_cache for every new key
    tuner.check_disk_cache = lambda key, configs, bench_fn: _autotuner_check(tuner, key, configs, bench_fn)
    return tuner


def main(argv=None) -> int:
    """`python -m qwen_lab.tunings [--clear]`: where the tuning files are and how many picks each holds; --clear
    deletes them."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m qwen_lab.tunings",
                                     description="The kernel tunings kept on disk: list them, or delete them.")
    parser.add_argument("--clear", action="store_true", help="delete every tuning file, so that the next first "
                        "call of each kernel shape times its candidates again")
    args = parser.parse_args(argv)
    if args.clear:
        print(f"deleted {clear()} tuning file(s) in {cache_dir()}")
        return 0
    files = sorted(cache_dir().glob("*.json"))
    state = "on" if enabled() else f"off ({ENV}={os.environ.get(ENV)!r})"
    print(f"tunings on disk: {state}; folder {cache_dir()}")
    for file in files:
        entries = _read(file)
        print(f"  {file.name}: " + ("unreadable" if entries is None else f"{len(entries)} pick(s)"))
    if not files:
        print("  no file yet: a GPU process records the picks of its first calls here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
