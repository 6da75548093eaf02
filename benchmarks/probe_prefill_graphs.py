"""Where the bucketed prefill graphs part from the eager prefill, under each setting of the kernel switches.

For a prompt split into several pieces, each setting (its own process) compares piece by piece: the graph replay of
a piece against the same piece run eagerly (same split, a second cache), and reports whether the split-K
workspaces are back to zeros after each piece, as every GEMV launch must leave them.
    python benchmarks/probe_prefill_graphs.py [T ...]     -> one block of lines per setting
"""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CASE = r"""
import sys, json, torch, qwen_lab
from qwen_lab import checks
from qwen_lab.graph import PrefillGraphs, prefill_pieces
from qwen_lab.kernels import gemm
T = int(sys.argv[1])
model = qwen_lab.load_model("qwen3.5-0.8b", dtype=torch.bfloat16)
dev = model.device
ids = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(T)).to(dev)

def dirty():
    return {k[0]: int((buf != 0).sum()) for k, buf in gemm._workspaces.items() if k[0] in ("sums", "counts")}

report = {"pieces": [], "repeats": []}
with torch.inference_mode():
    whole = model.step(ids, torch.arange(T, device=dev), model.new_cache(2048)).float()
    cache = model.new_cache(2048)
    graphs = PrefillGraphs(model, cache)
    report["after capture"] = dirty()
    eager_cache = model.new_cache(2048)
    offset = 0
    for s in graphs.pieces(T):
        pos = torch.arange(offset, offset + s, device=dev)
        e = model.step(ids[offset:offset + s], pos, eager_cache).float()
        e_dirty = dirty()
        graphs.ids[:s].copy_(ids[offset:offset + s]); graphs.positions[:s].copy_(pos)
        graphs.graphs[s].replay(); torch.cuda.synchronize()
        g = graphs.logits.float()
        n = offset + s
        kv = [checks.relative_error(a[:n].float(), b[:n].float()) for a, b in
              zip(cache.key + cache.value, eager_cache.key + eager_cache.value) if a is not None]
        st = [checks.relative_error(a.float(), b.float()) for a, b in
              zip(cache.conv_state + cache.recurrent_state, eager_cache.conv_state + eager_cache.recurrent_state)
              if a is not None]
        report["pieces"].append({"s": s, "graph vs eager": checks.relative_error(g, e), "eager dirty": e_dirty,
                                 "graph dirty": dirty(), "kv max": max(kv), "state max": max(st)})
        offset += s
    report["pieces vs whole"] = checks.relative_error(e, whole)
    for r in range(12):
        cache.reset()
        out = graphs.run(ids).float()
        report["repeats"].append((checks.relative_error(out, whole), dirty()))
    report["plans"] = [(k[1], k[2], k[3], k[0], v[0], str(v[1])) for k, v in gemm._plans.items() if k[1] > 1]
print(json.dumps(report))
"""

SETTINGS = {"default": {}, "PDL=0": {"QWEN_LAB_PDL": "0"}, "TUNE=0": {"QWEN_LAB_TUNE": "0"},
            "DETERMINISTIC=1": {"QWEN_LAB_DETERMINISTIC": "1"}, "PERSIST=0": {"QWEN_LAB_GEMV_PERSIST": "0"}}


def run(job):
    name, T = job
    env = {**os.environ, "QWEN_LAB_DETERMINISTIC": "0", **SETTINGS[name]}
    p = subprocess.run([sys.executable, "-c", CASE, str(T)], capture_output=True, text=True, timeout=400, env=env)
    if p.returncode:
        return job, "ERROR " + "\n".join(p.stderr.strip().splitlines()[-6:])
    r = json.loads(p.stdout.strip().splitlines()[-1])
    lines = [f"  after capture dirty {r['after capture']}; eager pieces vs whole {r['pieces vs whole']:.3g}"]
    for pc in r["pieces"]:
        lines.append(f"  piece {pc['s']:4d}: graph vs eager {pc['graph vs eager']:.3g}  kv {pc['kv max']:.3g} states {pc['state max']:.3g}  "
                     f"dirty eager {pc['eager dirty']} graph {pc['graph dirty']}")
    lines.append("  repeats vs whole: " + " ".join(f"{e:.3g}{'' if not any(d.values()) else '*'}"
                                                  for e, d in r["repeats"]))
    lines.append(f"  plans M>1: {r['plans']}")
    return job, "\n".join(lines)


if __name__ == "__main__":
    lengths = [int(a) for a in sys.argv[1:]] or [77]
    jobs = [(name, T) for T in lengths for name in SETTINGS]
    with ThreadPoolExecutor(len(jobs)) as pool:
        for (name, T), text in pool.map(run, jobs):
            print(f"T={T} {name}:\n{text}", flush=True)
