"""Probe: a residual add + RMSNorm split between two prompt GEMMs, against the norm kernel between them.

    python benchmarks/probe_norm_split.py [--tokens 2048]        (an NVIDIA GPU; prints one line per case)

A prompt runs 48 `add_rms_norm` kernels (4.2 us each at 2048 tokens): each sits between a branch's output
projection and the next projection, reads the branch output and the residual stream, and writes the new stream
and the normed rows. The norm inside the next GEMM's product measured slower (21-31 us per GEMM: x went through
the registers on its way to the tensor cores; docs/perf-log.md, 2026-12-01). The split here leaves both products
as they are:

- the output projection's epilogue (`gemm.linear_add_rms_norm`) adds its tile to the residual stream, stores
  h = s (1 + w) and each row's sum of squares over its tile (a slot per column tile);
- the next GEMM (`gemm.rms_scaled_linear`) multiplies its fp32 sums by each row's 1 / rms, computed from the
  slots, before SwiGLU or the store. x goes from TMA to the tensor cores untouched.

No norm kernel and no branch output in memory: ~8 of the pair's ~20 MB of traffic and one launch boundary less.
Each case times `--pairs` pairs (each its own weights, so they come from memory as the model's layers do) in a CUDA
Graph, both ways alternated twice, and compares the outputs: s bitwise, the second product within bf16 rounding
(h rounds s (1 + w) where the reference rounds the normed row). Then (unless --no-model) the model's prefill with
`qwen_lab.model.SPLIT_NORMS` off and on, alternated (`probe_ab.model_ab`).
"""

import sys

import torch

from probe_ab import model_ab, probe_args


def main() -> int:
    args = probe_args(__doc__, ("--pairs", dict(type=int, default=8)))
    if args is None:
        return 0
    from qwen_lab import checks
    from qwen_lab.config import QWEN35_0_8B as cfg
    from qwen_lab.kernels import activations, gemm, graph_time_us, norms

    T, H, eps = args.tokens, cfg.hidden_size, cfg.rms_norm_eps
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).bfloat16()

    # (label, the branch's width K, the next projection's outputs N, SwiGLU)
    cases = [("out-projection -> gate/up + SwiGLU", cfg.linear_value_dim, cfg.intermediate_size, True),
             ("down -> DeltaNet in-projection", cfg.intermediate_size, cfg.linear_in_proj_dim, False),
             ("down -> attention q/k/v", cfg.intermediate_size, cfg.attn_in_proj_dim, False)]
    print(f"T={T} H={H}; us per pair ({args.pairs} pairs in a graph, each with its own weights)")
    for label, K, N, swiglu in cases:
        x, residual = randn(T, K), randn(T, H)
        pairs = [(randn(H, K, scale=K ** -0.5), (torch.randn(H, device="cuda", generator=gen) * 0.3).float(),
                  randn(2 * N if swiglu else N, H, scale=H ** -0.5)) for _ in range(args.pairs)]
        s_buf = torch.empty_like(residual)

        def norm_kernel(w1, nw, w2):   # the model today: GEMM, add_rms_norm, GEMM
            h, s = norms.add_rms_norm(gemm.matmul(x, w1), residual, nw, eps, residual_out=s_buf)
            return s, activations.linear_silu_mul(h, w2) if swiglu else gemm.matmul(h, w2)

        def split(w1, nw, w2):         # the norm split between the two GEMMs' epilogues
            s, h, ss = gemm.linear_add_rms_norm(x, w1, residual, nw, eps, residual_out=s_buf)
            return s, gemm.rms_scaled_linear(h, ss, eps, w2, swiglu=swiglu)

        # compile and tune each way, and keep its outputs for the first pair (s_buf is shared: cloned at once)
        (s0, y0), (s1, y1) = [tuple(t.clone() for t in way(*pairs[0])) for way in (norm_kernel, split)]
        same_s = torch.equal(s0, s1)
        err = checks.relative_error(y1.float(), y0.float())
        times = {}
        for _ in range(2):
            for way in (norm_kernel, split):
                calls = [lambda way=way, p=p: way(*p) for p in pairs]
                times.setdefault(way.__name__, []).append(graph_time_us(calls))
        a, b = min(times["norm_kernel"]), min(times["split"])
        print(f"{label:36s} norm kernel {a:7.2f}  split {b:7.2f}  ({a - b:+.2f} us a pair; "
              f"runs {', '.join(f'{t:.2f}' for t in times['norm_kernel'])} / "
              f"{', '.join(f'{t:.2f}' for t in times['split'])})  s bitwise {same_s}, second output "
              f"relative error {err:.2e}", flush=True)
    if not args.no_model:  # the model's prefill with qwen_lab.model.SPLIT_NORMS off and on, alternated
        from qwen_lab import model as model_module

        model = model_module.load_model("qwen3.5-0.8b", device="cuda", dtype=torch.bfloat16)
        model_ab(lambda on: setattr(model_module, "SPLIT_NORMS", on), "SPLIT_NORMS", T, model=model)
        # and the logits both ways (a 512-token prompt), each against transformers in float32 (bf16 routes differ
        # from each other by about what each differs from the truth: 5.8e-2 on against off, docs/perf-log.md,
        # 2026-12-02)
        from qwen_lab import bench

        ids = torch.randint(0, cfg.vocab_size, (512,), generator=torch.Generator().manual_seed(1)).cuda()
        hf32 = bench.transformers_model(model.config, model.weights, "cuda", torch.float32)
        with torch.inference_mode():
            truth = hf32(input_ids=ids[None]).logits[0].float()
        del hf32
        for on in (False, True):
            model_module.SPLIT_NORMS = on
            logits = model(ids)
            same_top = (logits.argmax(-1) == truth.argmax(-1)).float().mean().item()
            print(f"logits, SPLIT_NORMS={on}, against transformers float32: relative error "
                  f"{checks.relative_error(logits, truth):.2e}, same argmax at {100 * same_top:.1f}% of 512 "
                  f"positions", flush=True)
        model_module.SPLIT_NORMS = None
    return 0


if __name__ == "__main__":
    sys.exit(main())
