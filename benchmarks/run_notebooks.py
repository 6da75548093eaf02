"""Execute notebooks without Jupyter: each code cell in order, in one namespace, like a kernel would.

For machines that have the course's runtime but not nbval/nbclient (the GPU image): a cell tagged
`raises-exception` may raise (its exception's type and first line are printed, and the run goes on); any other
cell that raises fails the notebook. IPython magics (`%...`, `!...`) are skipped. Prints one line per notebook and
exits 1 if any failed.

    python benchmarks/run_notebooks.py solutions/*.ipynb notebooks/*.ipynb
"""

import json
import linecache
import os
import sys
import time
import traceback


def run_cell(src: str, name: str, namespace: dict) -> None:
    """Execute one code cell's source in `namespace` as a Jupyter kernel would: IPython magics and shell lines
    (`%...`, `!...`) skipped, the text registered under `name` in linecache, where Triton reads a kernel's source
    (inspect.getsource)."""
    src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    exec(compile(src, name, "exec"), namespace)


def run(path: str) -> tuple[bool, str]:
    nb = json.load(open(path))
    ns = {"__name__": "__main__"}
    os.environ.setdefault("MPLBACKEND", "Agg")
    cwd = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path)))
    try:
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] != "code":
                continue
            tags = cell.get("metadata", {}).get("tags", [])
            t0 = time.time()
            try:
                run_cell("".join(cell["source"]), f"<{os.path.basename(path)} cell {i}>", ns)
            except Exception as e:
                if "raises-exception" in tags:
                    # said, not hidden: in a learner's notebook an unfinished exercise must show up as its own
                    # NotImplementedError, not as a compiler's error about the stub
                    first = str(e).splitlines()[0] if str(e) else ""
                    print(f"  {os.path.basename(path)} cell {i} raised, as tagged: {type(e).__name__}: {first}",
                          file=sys.stderr, flush=True)
                    continue
                return False, f"cell {i} raised {type(e).__name__}: {e}\n{traceback.format_exc(limit=-3)}"
            finally:
                # each cell's time on stderr as it ends: a run stopped by a time limit still says how far it got
                # and which cells took the time (a cold start compiles and tunes every kernel)
                print(f"  {os.path.basename(path)} cell {i}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        return True, ""
    finally:
        os.chdir(cwd)
        try:
            import matplotlib.pyplot as plt
            plt.close("all")
        except ImportError:
            pass


if __name__ == "__main__":
    failed = 0
    for path in sys.argv[1:]:
        t0 = time.time()
        ok, why = run(path)
        print(f"{'ok  ' if ok else 'FAIL'} {path} ({time.time() - t0:.1f} s) {why}", flush=True)
        failed += not ok
    sys.exit(1 if failed else 0)
