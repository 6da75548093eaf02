"""Probe: the DeltaNet's gated output norm beside the chunk scan, against the norm kernel after it.

    python benchmarks/probe_norm_beside_scan.py [--tokens 2048] [--layers 18]   (an NVIDIA GPU; one line per case)

At 2048 tokens the chunk scan runs 64 programs (16 heads x 4 blocks of value columns) for ~47 us per DeltaNet layer,
so most of the H200's 132 SMs wait; then `gated_rms_norm` (~7.7 us) and the out-projection GEMM run. In
`deltanet.deltanet_chunked_gated_norm` the scan counts each group of SCAN_GROUP chunks it has stored, and a fixed
grid of norm programs normalises a group as soon as its count is full: only the last group's rows (a quarter at
2048 tokens) are left when the scan ends, and the out-projection is launched beside them.

Each way runs `--layers` DeltaNet layers' prep, scan, norm and out-projection (each layer its own inputs and
weights, so they come from memory as in the model) in one CUDA Graph, alternated twice; the normed outputs are
compared bit for bit. Then (unless --no-model) the model's prefill with `qwen_lab.model.NORM_BESIDE_SCAN` off and on,
alternated (`probe_ab.model_ab`).
"""

import sys

import torch

from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--layers", dict(type=int, default=18)))
    if args is None:
        return 0
    from qwen_lab.config import QWEN35_0_8B as cfg
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

    # compile and tune each way, and compare their outputs for the first layer (the same state before each)
    outs = []
    for way in (after, beside):
        layers[0]["state"].zero_()
        outs.append(tuple(t.clone() for t in way(layers[0])))
    same = torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    times = {}
    for _ in range(2):
        for way in (after, beside):
            calls = [lambda way=way, d=d: way(d) for d in layers]
            times.setdefault(way.__name__, []).append(graph_time_us(calls))
    a, b = min(times["after"]), min(times["beside"])
    print(f"T={T}, {args.layers} DeltaNet layers (prep, scan, gated norm, out-projection), us per layer: norm after "
          f"{a:.2f}, beside {b:.2f} ({a - b:+.2f}; runs {', '.join(f'{t:.2f}' for t in times['after'])} / "
          f"{', '.join(f'{t:.2f}' for t in times['beside'])}); outputs bitwise equal: {same}", flush=True)
    if not args.no_model:  # the model's prefill with qwen_lab.model.NORM_BESIDE_SCAN off and on, alternated
        from qwen_lab import model as model_module

        model_ab(lambda on: setattr(model_module, "NORM_BESIDE_SCAN", on), "NORM_BESIDE_SCAN", T)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
