"""Probe: a decode token's projections between two mixers (out-projection, gate/up, down, the next in-projection)
in one launch with grid barriers (`chain.gemv_chain`), against the four GEMV launches the model makes today.

    python benchmarks/probe_gemv_chain.py [--no-model]           (an NVIDIA GPU)

1. Qwen3.5-0.8B's decode shapes, one chain per layer (24 in one CUDA Graph: 1 GB of weights, past L2), three
   ways alternated: the model's four operators, the chain's phases launched one by one, the chain in one launch.
   The outputs must agree (bf16 level) and no program may have given up at a barrier.
2. The chain's configurations (programs per SM, warps, rows per step of each phase), each timed the same way.
3. The whole model's decode step with model.DECODE_CHAIN off and on (the best configuration of 2).
"""

import torch
from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__)
    if args is None:
        return 0
    from qwen_lab import model as model_module
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import activations, chain, gemm, graph_time_us

    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    H, I, eps = cfg.hidden_size, cfg.intermediate_size, cfg.rms_norm_eps
    Hv, Dv = cfg.linear_num_value_heads, cfg.linear_value_head_dim
    n_in = cfg.linear_conv_dim + cfg.linear_value_dim + 2 * Hv
    L = cfg.num_hidden_layers

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=dev) * scale).to(bf)

    layers = [dict(out=rnd(H, Hv * Dv, scale=0.02), post=rnd(H, scale=0.1), gu=rnd(2 * I, H, scale=0.03),
                   down=rnd(H, I, scale=0.02), nxt_norm=rnd(H, scale=0.1), nxt=rnd(n_in, H, scale=0.03))
              for _ in range(L)]
    o = rnd(1, Hv, Dv)
    z = rnd(1, 2 * Hv * Dv)[:, Hv * Dv:].unflatten(1, (Hv, Dv))   # a view, as in the in-projection's output
    gnorm = rnd(Dv, scale=0.1) + 1
    x = rnd(1, H)
    outs = {}

    def ops(i):
        w = layers[i]
        y = gemm.gated_rms_norm_linear(o, z, gnorm, eps, w["out"])
        gu, x1 = gemm.add_rms_norm_linear(y, x, w["post"], eps, w["gu"])
        m = activations.swiglu_down(gu, w["down"])
        outs["ops", i] = gemm.add_rms_norm_linear(m, x1, w["nxt_norm"], eps, w["nxt"])

    def chained(apart):
        def call(i):
            w = layers[i]
            outs["apart" if apart else "chain", i] = chain.gemv_chain(
                o, z, gnorm, w["out"], x, w["post"], w["gu"], w["down"], eps, w["nxt_norm"], w["nxt"],
                phases_apart=apart)
        return call

    ways = {"ops": ops, "apart": chained(True), "chain": chained(False)}
    best = {}
    for name in ("ops", "apart", "chain") * 2:
        us = graph_time_us([lambda i=i: ways[name](i) for i in range(L)], warmup=True, replays=20)
        best[name] = min(best.get(name, 1e9), us)
        print(f"{name:>6}: {us:.2f} us per layer ({L} in a graph)", flush=True)
    torch.cuda.synchronize()
    ok = True
    for name in ("apart", "chain"):
        for i in (0, L - 1):
            for a, b, what in zip(outs[name, i], outs["ops", i], ("next projection", "residual")):
                err = float((a.float() - b.float()).norm() / b.float().norm())
                ok &= err < 2e-2
                print(f"{name} layer {i} {what}: relative difference to the operators {err:.2e}")
    try:
        chain.check(dev)
        print("no program gave up at a barrier")
    except Exception as e:  # noqa: BLE001 (reported, then the probe fails)
        print(f"FAILED: {e}")
        ok = False
    print(f"chain saves {best['ops'] - best['chain']:.2f} us per layer against the operators, "
          f"{best['apart'] - best['chain']:.2f} against its own phases launched apart", flush=True)

    default = dict(chain.GPU_CONFIG)
    sweep = [(2, 8, (4, 8, 2, 8), True), (2, 8, (4, 8, 2, 8), False), (2, 8, (2, 8, 2, 8), True),
             (4, 8, (2, 4, 1, 4), True), (3, 4, (2, 8, 2, 8), True), (2, 4, (4, 8, 2, 8), True),
             (1, 8, (8, 16, 4, 16), True), (2, 8, (4, 16, 2, 16), True)]
    timed = []
    for persist, warps, bn, poll_load in sweep:
        chain.GPU_CONFIG.update(PERSIST=persist, num_warps=warps, BN=bn, POLL_LOAD=poll_load)
        chain._grids.clear()
        label = f"config PERSIST={persist} warps={warps} BN={bn} POLL_LOAD={poll_load}"
        try:
            us = {name: graph_time_us([lambda i=i: ways[name](i) for i in range(L)], warmup=True, replays=20)
                  for name in ("apart", "chain")}
            chain.check(dev)
        except Exception as e:  # noqa: BLE001
            print(f"{label}: {type(e).__name__}: {str(e)[:200]}")
            continue
        G = next(iter(chain._grids.values()))
        timed.append((us["chain"], persist, warps, bn, poll_load))
        print(f"{label}: grid {G}, phases apart {us['apart']:.2f}, chain {us['chain']:.2f} us per layer", flush=True)
    if timed:
        us, persist, warps, bn, poll_load = min(timed)
        print(f"best: PERSIST={persist} warps={warps} BN={bn} POLL_LOAD={poll_load} at {us:.2f} us per layer "
              f"(the operators: {best['ops']:.2f})")
        chain.GPU_CONFIG.update(PERSIST=persist, num_warps=warps, BN=bn, POLL_LOAD=poll_load)
    else:
        chain.GPU_CONFIG.update(default)
    chain._grids.clear()
    if timed and min(timed)[0] >= best["ops"]:
        print("the chain is slower than the operators in every configuration: the model is not timed")
        return 0 if ok else 1
    if args.no_model or not ok:
        return 0 if ok else 1
    model_ab(lambda on: setattr(model_module, "DECODE_CHAIN", on), "decode chain", 2048, metric="decode")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
