"""Probe: does the DeltaNet scan that waits on the prep's counters finish, in which launch form?

    python benchmarks/probe_scan_wait.py            (an NVIDIA GPU; each case in its own process, with a time limit)

Cases: deltanet_chunked at Qwen3.5-0.8B's shapes, eager and in a CUDA Graph, with PDL on and off, at several
prompt lengths and with each scan configuration forced; then the random-weight model's prefill, eager and through
PrefillGraphs. Each prints `done` with the counters left non-zero; a case past its limit (35 s, the model's
90 s) prints TIMEOUT.
"""

import os
import subprocess
import sys

CASE = r'''
import sys, torch
from qwen_lab.config import QWEN35_0_8B as cfg
from qwen_lab.kernels import deltanet
kind, T, cfg_i = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dev, bf = "cuda", torch.bfloat16
g = torch.Generator().manual_seed(0)
if kind.startswith("model"):
    from qwen_lab.model import load_model
    from qwen_lab.graph import PrefillGraphs
    m = load_model("qwen3.5-0.8b", device=dev, dtype=bf)
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=g).to(dev)
    cache = m.new_cache(T + 8)
    with torch.inference_mode():
        a = m.step(ids, torch.arange(T, device=dev), cache).float()
        torch.cuda.synchronize(); print("eager prefill done", flush=True)
        if kind == "model_graphs":
            cache.reset()
            pg = PrefillGraphs(m, cache)
            torch.cuda.synchronize(); print("captured", pg.buckets, flush=True)
            cache.reset()
            b = pg.run(ids).float()
            torch.cuda.synchronize()
            print("graph prefill rel err vs eager", ((b[-1] - a[-1]).norm() / a[-1].norm()).item())
else:
    sys.path.insert(0, "benchmarks")
    from bench_deltanet import layer_inputs  # a DeltaNet layer's inputs at 0.8B's shapes, as the model passes them
    d = layer_inputs(T, torch.Generator(device=dev).manual_seed(0))
    D, s0 = cfg.linear_key_head_dim, d["state"]
    def call(state):
        return deltanet.deltanet_chunked(d["q"], d["k"], d["v"], d["a"], d["b"], d["A_log"], d["dt_bias"], state)
    import contextlib
    ctx = contextlib.nullcontext()
    if cfg_i >= 0:
        c = deltanet.autotune_configs("chunk_scan_kernel", Dv=D)[cfg_i]
        print("forced", c, flush=True)
        ctx = deltanet.force_config("chunk_scan_kernel", c)
    with ctx:
        st = s0.clone(); o = call(st); torch.cuda.synchronize(); print("first call done", flush=True)
        for _ in range(3):
            st = s0.clone(); o2 = call(st)
        torch.cuda.synchronize(); print("eager repeat equal:", torch.equal(o, o2), flush=True)
        if kind == "graph":
            st = s0.clone()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                o3 = call(st)
            for _ in range(3):
                st.copy_(s0); gr.replay()
            torch.cuda.synchronize(); print("graph equal:", torch.equal(o, o3), flush=True)
counters = deltanet._TICKETS.get(torch.device("cuda", torch.cuda.current_device()))
left = [] if counters is None else counters.nonzero().flatten().tolist()
print("done; counters left non-zero:", left[:20])
'''


def main() -> int:
    import torch
    if not torch.cuda.is_available():
        print("skipped: needs an NVIDIA GPU")
        return 0
    cases = [("eager", 2048, -1, "1"), ("eager", 2048, -1, "0"), ("eager", 77, -1, "1"), ("eager", 4, -1, "1"),
             ("graph", 2048, -1, "1")]
    cases += [("eager", 2048, i, "1") for i in range(6)]
    cases += [("model", 300, -1, "1"), ("model_graphs", 300, -1, "1")]
    bad = 0
    for kind, T, ci, pdl in cases:
        env = dict(os.environ, QWEN_LAB_PDL=pdl)
        try:
            r = subprocess.run([sys.executable, "-c", CASE, kind, str(T), str(ci)], env=env, capture_output=True,
                               text=True, timeout=90 if kind.startswith("model") else 35)
            out = (r.stdout + r.stderr[-600:]).strip().replace("\n", " | ")
            status = "ok" if r.returncode == 0 else f"rc {r.returncode}"
        except subprocess.TimeoutExpired as e:
            out = ((e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")).replace("\n", " | ")
            status = "TIMEOUT"
        bad += status != "ok"
        print(f"{kind:13s} T={T:5d} scan config {ci:2d} PDL={pdl}: {status}: {out[-900:]}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
