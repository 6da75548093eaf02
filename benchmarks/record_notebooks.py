"""Record the GPU results that the notebooks show on a CPU (qwen_lab.course.recorded), in one run on a GPU.

Each solution notebook runs through benchmarks/run_notebooks.py (every code cell in order, in a namespace of its own,
as a kernel would; all in this process, so the kernels one notebook compiled and tuned serve the next) with
QWEN_LAB_RECORD set: every measuring cell's `recorded.keep(...)` writes its record (NAME.json, NAME.png) into OUT.
Then the records come into the course with one copy:

    python benchmarks/record_notebooks.py --out $OUT/records            # on a GPU, about 5-8 minutes warm
    cp $OUT/records/* qwen_lab/course/records/                          # then commit them

    --only 03 07       only these notebooks (the others' records are left as they are)
    --skip-slow        notebook 13's benchmark without its transformers row (transformers hidden from the
                       notebook), the slowest cell of the course: 13.bench then has no transformers row, and
                       13.compare (which needs it) is not written
    --bench-json FILE  13.bench and 13.compare from a `python -m qwen_lab.bench --json` result, written after the
                       notebooks (replacing notebook 13's) and labelled with that result's GPU, date and versions;
                       with `--only` and no notebook named, this needs no GPU
    --timeout S        seconds per notebook (default 240); --budget S: no notebook starts past S seconds (450)
                       (a notebook stopped by its timeout keeps the records its earlier cells wrote)

Prints one line per notebook (what its cells print goes to record_logs/NAME.txt beside OUT, or --logs DIR), then
which records the notebooks run keep and which of them this run did not write.
"""

import argparse
import json
import os
import re
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))      # run_notebooks.py, beside this file
KEEP = re.compile(r"""recorded\.keep\(\s*["']([^"']+)["']""")


def kept_names(path: Path) -> list[str]:
    """The records a notebook's code cells keep."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return [m for c in cells if c["cell_type"] == "code" for m in KEEP.findall("".join(c["source"]))]


def _shown(path: Path) -> str:
    """A path as the repository names it where it lies inside, else as given."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def bench_records(bench_json: Path, out: Path) -> list[str]:
    """13.bench and 13.compare from a saved benchmark result, labelled with where that result was measured."""
    from qwen_lab import bench
    from qwen_lab.course import recorded

    result = json.loads(bench_json.read_text(encoding="utf-8"))
    versions = result.get("versions") or {}
    measured = {"gpu": result["gpu"], "date": str(result["date"])[:10],
                "torch": versions.get("torch") or result.get("torch"),
                "triton": versions.get("triton") or result.get("triton"), "commit": result.get("commit"),
                "source": f"from {_shown(bench_json)}"}
    command = result.get("command") or (f"python -m qwen_lab.bench --model {result['config']} --prefill-len "
                                        f"{result['prefill_len']}" + (f" --decode-steps {result['decode_steps']}"
                                                                       if result.get("decode_steps") else ""))
    floors = result["floors"]
    columns = ("name", "prefill_ms", "decode_ms", "tokens_per_s", "prefill_floor_share", "decode_floor_share")
    # the note's first sentence says how the run was made; the rest is about the JSON's own fields
    notes = [result["note"].split(". ")[0].rstrip(".") + "."] if result.get("note") else []
    if floors.get("prefill_ms") and floors.get("decode_ms"):
        notes.append(f"floors: prefill {floors['prefill_ms']:.3g} ms, decode {floors['decode_ms']:.3g} ms")
    recorded.keep("13.bench", table=[{k: r.get(k) for k in columns} for r in result["rows"]],
                  figure=bench.plot(result), notes=notes, command=command, folder=out, measured=measured)
    rows = {r["name"]: r for r in result["rows"] if r["name"] in ("transformers-eager", "triton", "triton+cuda-graph")}
    if floors.get("prefill_ms") and floors.get("decode_ms"):
        rows["floor"] = floors
    recorded.keep("13.compare", table={name: {"prefill ms": r["prefill_ms"], "decode ms": r["decode_ms"]}
                                       for name, r in rows.items()}, notes=notes[:1] if result.get("note") else (),
                  command=command, folder=out, measured=measured)
    return ["13.bench", "13.compare"]


class _Late(BaseException):
    """A notebook ran past its time (not an Exception: run_notebooks.run goes on past a cell's Exception)."""


def _on_alarm(signum, frame):
    raise _Late()


def run_one(path: Path, timeout: float, hide_transformers: bool, log: Path) -> tuple[bool, str]:
    """One notebook through run_notebooks.run (its own namespace, this process: the kernels compiled and tuned
    by one notebook serve the next, as in gpu_session.sh's notebooks target), stopped after `timeout` seconds.
    What its cells print, and each cell's time, go to `log`."""
    import contextlib

    import run_notebooks

    hidden = sys.modules.get("transformers", False)
    if hide_transformers:           # bench.run then leaves its transformers row out, and says so
        sys.modules["transformers"] = None
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with open(log, "w", encoding="utf-8") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            return run_notebooks.run(str(path))
    except _Late:
        return False, f"past the timeout of {timeout:.0f} s (the records it kept before that are written)"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        if hide_transformers:
            if hidden is False:
                del sys.modules["transformers"]
            else:
                sys.modules["transformers"] = hidden


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "records"))
    ap.add_argument("--only", nargs="*", default=None, help="notebook numbers, e.g. 03 07")
    ap.add_argument("--skip-slow", action="store_true")
    ap.add_argument("--bench-json", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--budget", type=float, default=450)
    ap.add_argument("--logs", default=None, help="what the notebooks print (default: record_logs beside OUT)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    logs = Path(args.logs).resolve() if args.logs else out.parent / "record_logs"
    logs.mkdir(parents=True, exist_ok=True)
    notebooks = sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb"))
    if args.only is not None:
        notebooks = [p for p in notebooks if p.name[:2] in args.only]
    os.environ[recorded_env()] = str(out)          # every recorded.keep of the notebooks writes here
    os.environ.setdefault("MPLBACKEND", "Agg")
    start, failed, expected = time.time(), [], []
    for path in notebooks:
        names = kept_names(path)
        expected += names
        if not names:
            continue
        left = args.budget - (time.time() - start)
        if left <= 0:
            print(f"NOT RUN {path.name}: past the budget of {args.budget:.0f} s (run it again with --only "
                  f"{path.name[:2]})", flush=True)
            failed.append(path.name)
            continue
        slow = args.skip_slow and path.name.startswith("13")
        t0 = time.time()
        ok, why = run_one(path, min(args.timeout, left + 60), slow, logs / f"{path.stem}.txt")
        print(f"{'ok  ' if ok else 'FAIL'} {path.name} ({time.time() - t0:.0f} s)"
              + (" without transformers" if slow else "") + (f": {why}" if why else ""), flush=True)
        if not ok:
            failed.append(path.name)
    if args.bench_json is not None:         # after the notebooks: these replace notebook 13's own
        bench_records(args.bench_json, out)
    written = {p.stem for p in out.glob("*.json")}
    missing = [n for n in expected if n not in written]
    print(f"\n{len(written)} records in {out}; the notebooks run keep {len(expected)}"
          + (f"; not written: {', '.join(missing)}" if missing else ""))
    print(f"into the course: cp {out}/* {ROOT / 'qwen_lab' / 'course' / 'records'}/")
    return 1 if failed else 0


def recorded_env() -> str:
    from qwen_lab.course import recorded
    return recorded.ENV


if __name__ == "__main__":
    sys.exit(main())
