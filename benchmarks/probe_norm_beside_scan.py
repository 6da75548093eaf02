"""Probe: the DeltaNet's gated output norm (and its out-projection) beside the chunk scan, against both after it.

    python benchmarks/probe_norm_beside_scan.py [--tokens 2048] [--layers 18]   (an NVIDIA GPU; one line per case)

At 2048 tokens the chunk scan runs 64 programs (16 heads x 4 blocks of value columns) for ~47 us per DeltaNet layer,
so most of the H200's 132 SMs wait; then `gated_rms_norm` (~7.7 us) and the out-projection GEMM run. In
`deltanet.deltanet_chunked_gated_norm` the scan counts each group of SCAN_GROUP chunks it has stored, and a fixed
grid of norm programs normalises a group as soon as its count is full: only the last group's rows (a quarter at
2048 tokens) are left when the scan ends, and the out-projection is launched beside them.
`deltanet.deltanet_chunked_gated_norm_linear` goes one step further: the programs beside the scan compute output
tiles of the out-projection, each step of their K loop one value head normed in registers, so that only the last
group's tiles follow the scan (no norm kernel, no GEMM launch).

Each way runs `--layers` DeltaNet layers' prep, scan, norm and out-projection (each layer its own inputs and
weights, so they come from memory as in the model) in one CUDA Graph, alternated twice, and compares the projection
with the norm kernel's route (bitwise for the norm beside the scan, the relative error for the fused tiles, whose
products sum in another order). The fused tiles are timed with each (BLOCK_M, BLOCK_N, warps, stages) of `--tiles`
(32 x 128 with 1 stage fits beside a scan program of 3 stages; 32 x 64 halves the registers).
Then (unless --no-model) the model's prefill with `qwen_lab.model.NORM_BESIDE_SCAN`, then
`NORM_LINEAR_BESIDE_SCAN`, off and on, alternated (`probe_ab.model_ab`).
"""

import sys

import torch

from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--layers", dict(type=int, default=18)),
                      ("--tiles", dict(default="32x128x4x2,32x128x4x1,32x64x4x2")))
    if args is None:
        return 0
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab import checks
    from qwen_lab.kernels import deltanet, gemm, graph_time_us, norms

    T = args.tokens
    Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    Dk, Dv, H = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.hidden_size
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0, dtype=torch.bfloat16):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(dtype)

    layers = []
    for _ in range(args.layers):
        qkv = randn(T, 2 * Hk * Dk + Hv * Dv)   # as the conv leaves it: q, k, v side by side
        proj = randn(T, Hv * Dv + 2 * Hv, scale=2.0)   # z, then b and a
        layers.append(dict(
            q=qkv[:, :Hk * Dk].unflatten(1, (Hk, Dk)), k=qkv[:, Hk * Dk:2 * Hk * Dk].unflatten(1, (Hk, Dk)),
            v=qkv[:, 2 * Hk * Dk:].unflatten(1, (Hv, Dv)), z=proj[:, :Hv * Dv].unflatten(1, (Hv, Dv)),
            b=proj[:, Hv * Dv:Hv * Dv + Hv], a=proj[:, Hv * Dv + Hv:],
            A_log=torch.rand(Hv, device="cuda", generator=gen).add(1).log(), dt_bias=randn(Hv, dtype=torch.float32),
            state=torch.zeros(Hv, Dk, Dv, device="cuda"), norm=1 + randn(Dv, scale=0.1, dtype=torch.float32),
            out_proj=randn(H, Hv * Dv, scale=(Hv * Dv) ** -0.5)))
    ws = deltanet.chunk_workspace(T, Hv, Dk, Dv, torch.bfloat16, "cuda")
    eps = cfg.rms_norm_eps

    def gates(d):
        return {n: d[n] for n in ("q", "k", "v", "a", "b", "A_log", "dt_bias", "state")}

    def after(d):    # the model's route today: the scan, then the norm kernel, then the out-projection
        o = deltanet.deltanet_chunked(**gates(d), workspace=ws)
        normed = norms.gated_rms_norm(o, d["z"], d["norm"], eps)
        return normed, gemm.matmul(normed.reshape(T, -1), d["out_proj"])

    def beside(d):   # the norm beside the scan
        normed = deltanet.deltanet_chunked_gated_norm(**gates(d), z=d["z"], norm_weight=d["norm"], eps=eps,
                                                      workspace=ws)
        return normed, gemm.matmul(normed.reshape(T, -1), d["out_proj"])

    def fused(d):    # the norm and the out-projection beside the scan
        return None, deltanet.deltanet_chunked_gated_norm_linear(**gates(d), z=d["z"], norm_weight=d["norm"],
                                                                 eps=eps, weight=d["out_proj"], workspace=ws)

    def first_layer(way):   # the first layer's outputs from the same state
        layers[0]["state"].zero_()
        return tuple(None if t is None else t.clone() for t in way(layers[0]))

    def timed(ways, label):
        times = {}
        for _ in range(2):
            for name, way in ways:
                calls = [lambda way=way, d=d: way(d) for d in layers]
                times.setdefault(name, []).append(graph_time_us(calls))
        print(f"{label}: " + "; ".join(f"{name} {min(t):.2f} (runs {', '.join(f'{x:.2f}' for x in t)})"
                                         for name, t in times.items()), flush=True)
        return {name: min(t) for name, t in times.items()}

    want = first_layer(after)   # (compiles and tunes each way before its timing)
    got = first_layer(beside)
    same = torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    print(f"T={T}, {args.layers} DeltaNet layers (prep, scan, gated norm, out-projection), us per layer; the norm "
          f"beside the scan bitwise equal to the norm after it: {same}", flush=True)
    timed([("norm after", after), ("norm beside", beside)], "norm kernel after the scan / beside it")
    ok = same
    for tile in args.tiles.split(","):
        deltanet.NORM_LINEAR_BESIDE_SCAN_CONFIG = tuple(int(n) for n in tile.split("x"))
        err = checks.relative_error(first_layer(fused)[1].float(), want[1].float())
        ok = ok and err < 1e-2
        timed([("norm after", after), (f"norm + projection beside {tile}", fused)],
              f"fused tiles {tile} (relative error {err:.2e} against the norm kernel's route)")
    if not args.no_model:  # the model's prefill with each switch off and on, alternated
        from qwen_lab import model as model_module

        model = model_module.load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)   # (loaded once)
        for flag in ("NORM_BESIDE_SCAN", "NORM_LINEAR_BESIDE_SCAN"):
            model_ab(lambda on, flag=flag: setattr(model_module, flag, on), flag, T, model=model)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
