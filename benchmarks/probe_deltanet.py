"""Which (head dims, length) cases of the chunked and recurrent delta rule run correctly on this GPU.

Each case runs in its own process, so a kernel that faults cannot hide the result of the others.
    python benchmarks/probe_deltanet.py            -> one line per case: ok (rel err) / WRONG / FAULT
"""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

CASE = r"""
import sys, json, torch, qwen_lab
from qwen_lab import reference as R
from qwen_lab.course import checks
from qwen_lab.kernels import deltanet as K
form, T, Hk, Hv, Dk, Dv = sys.argv[1], *map(int, sys.argv[2:7])
g = torch.Generator().manual_seed(T * 7 + Dk)
q = torch.randn(T, Hk, Dk, generator=g).cuda().bfloat16(); k = torch.randn(T, Hk, Dk, generator=g).cuda().bfloat16()
v = torch.randn(T, Hv, Dv, generator=g).cuda().bfloat16()
gg = (-torch.rand(T, Hv, generator=g)).cuda(); beta = torch.rand(T, Hv, generator=g).cuda()
s0 = torch.randn(Hv, Dk, Dv, generator=g).cuda() * 0.1
s1, s2 = s0.clone(), s0.clone()
fn = K.delta_rule_chunked if form == "chunked" else K.delta_rule_recurrent
o = fn(q, k, v, gg, beta, s1); torch.cuda.synchronize()
r = R.delta_rule_recurrent(q.float(), k.float(), v.float(), gg, beta, s2)
print(json.dumps({"out": checks.relative_error(o.float(), r), "state": checks.relative_error(s1, s2)}))
"""


def run(case):
    form, T, Hk, Hv, Dk, Dv = case
    p = subprocess.run([sys.executable, "-c", CASE, form, *map(str, (T, Hk, Hv, Dk, Dv))], capture_output=True,
                       text=True, timeout=240)
    if p.returncode:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return case, "FAULT" if "illegal" in p.stderr or "misaligned" in p.stderr else f"ERROR {last[:120]}"
    r = json.loads(p.stdout.strip().splitlines()[-1])
    verdict = "ok" if max(r.values()) < 3e-2 else "WRONG"
    return case, f"{verdict} out {r['out']:.2e} state {r['state']:.2e}"


if __name__ == "__main__":
    cases = [(form, T, Hk, Hv, D, Dv) for form in ("chunked", "recurrent")
             for T in (1, 2, 64, 65, 130) for (Hk, Hv, D, Dv) in ((2, 4, 16, 16), (2, 2, 16, 32), (2, 4, 32, 32),
                                                                  (2, 2, 64, 64), (16, 16, 128, 128))]
    with ThreadPoolExecutor(8) as pool:
        for case, verdict in pool.map(run, cases):
            print(f"{case[0]:9s} T={case[1]:4d} Hk={case[2]:2d} Hv={case[3]:2d} Dk={case[4]:3d} Dv={case[5]:3d}: {verdict}",
                  flush=True)
