"""The persistent decode step (qwen_lab.kernels.persistent, issue 50 stage 1) against the graph decode of the fast plan.

    python benchmarks/bench_persistent.py [--model qwen3.5-0.8b] [--prefill-len 2048] [--decode-steps 128]
        [--rounds 4] [--variants 4:16x256,8:16x1024:n:a:p64k:d128] [--json FILE]

One process, one model (random weights, bf16): a prompt prefilled by the plan, then decode steps replayed from CUDA
Graphs both ways, as `python -m qwen_lab.bench` times its triton + cuda-graph row (the plan's step at a fixed
position, no sampling; the persistent step includes its greedy token and starts each timed run at the same
position). Rounds alternate the order (plan first, then persistent first, ...); each round's number is the median of
5 runs of `decode_steps` replays. A variant is the persistent kernel's num_warps and GEMV block (BLOCK_N x BLOCK_K),
then the stages it turns on (the others stay as in stage 1, whatever PersistentDecode's defaults): `n` the norms
fused into the GEMV tiles, `a` each GEMV item's next weight block loaded into registers before the current one is
summed, `cN` the GEMV loop pipelined by Triton through shared memory in N stages instead, `l` (with `cN`) the
GEMV input computed in that loop's first pass, after the first blocks' copies are issued, `e` (with `cN`) the
GEMV item's wait there too (its first weight blocks stream while its producers finish), `i` each program's next
item's fields read while the current item runs, `k` (with `pBYTES`) the L2 prefetch of the DeltaNet column items'
states and the attention splits' keys and values too, `w` every wait polled by acquire loads of all the program's
threads (no acquire read left once the counter is met), `f` no ATTN_PREP items
(each attention split prepares its queries, one holds the new key and value), `pBYTES` (k for 1024) the
L2 prefetch before each wait, `dN` N state columns per iteration of a DeltaNet item (default 32), `vN` each
DeltaNet head's columns split over N items (the conv in the in-projection's tiles, the gated norm in out_proj's),
`rNxK` blocks of N x K for the tiles that add into the residual stream (out_proj, o_proj, down), `sN` N programs
per SM (default 1; they must all be resident at once, so the registers of N programs must fit an SM).
Before timing, one step from the same prefilled state both ways: the relative error of the logits and the two
tokens (a timing of wrong results means nothing). Prints a table and writes JSON with the floors of the same run.
"""

import argparse
import json
import statistics
import sys
import time

import torch


def parse_variants(text: str) -> list[tuple[str, dict]]:
    """'4:16x256:n:p64k,...' -> [(name, options)]: PersistentDecode's, and programs_per_sm (see decode_options)."""
    out = []
    for part in text.split(","):
        warps, block, *stages = part.split(":")
        n, k = block.lower().split("x")
        options = {"num_warps": int(warps), "gemv_block": (int(n), int(k))}
        for st in stages:
            if st == "n":
                options["fuse_norms"] = True
            elif st == "a":   # the next weight block loaded ahead
                options["gemv_ahead"] = 1
            elif st == "l":   # the GEMV input computed in the pipelined loop's first pass
                options["gemv_late"] = 1
            elif st == "e":   # the GEMV item's wait in the pipelined loop's first pass, after its first copies
                options["gemv_early"] = 1
            elif st == "k":   # the L2 prefetch also of the DeltaNet column items' states, the splits' keys and values
                options["prefetch_states"] = 1
            elif st == "w":   # every wait polled by acquire loads of all the program's threads
                options["acquire_poll"] = 1
            elif st == "i":   # each program's next item's fields read while the current one runs
                options["fields_ahead"] = 1
            elif st == "f":   # the attention prep folded into the splits
                options["fold_prep"] = True
            elif st.startswith("c") and st[1:].isdigit():   # the GEMV loop pipelined through shared memory
                options["gemv_stages"] = int(st[1:])
            elif st.startswith("d") and st[1:].isdigit():   # DeltaNet state columns per iteration
                options["deltanet_block"] = int(st[1:])
            elif st.startswith("v") and st[1:].isdigit():   # DeltaNet items per head, by value columns
                options["deltanet_split"] = int(st[1:])
            elif st.startswith("r") and "x" in st and st[1:].replace("x", "", 1).isdigit():   # the adding tiles' block
                an, ak = st[1:].split("x")
                options["add_block"] = (int(an), int(ak))
            elif st.startswith("s") and st[1:].isdigit():   # programs per SM (all must be resident at once)
                options["programs_per_sm"] = int(st[1:])
            elif st.startswith("p"):
                options["prefetch"] = int(st[1:-1]) * 1024 if st.endswith("k") else int(st[1:])
            else:
                raise SystemExit(f"--variants: stage {st!r} of {part!r}: expected n (fused norms), a (the next "
                                 f"GEMV block loaded ahead), l (the GEMV input in the loop's first pass), e (the GEMV "
                                 f"wait there too), f (the attention prep in the splits), i (the next item's fields "
                                 f"read ahead), k (the prefetch of states, keys and values too), w (acquire polls), "
                                 f"cN (N pipeline stages), pBYTES (L2 prefetch), dN (DeltaNet columns per "
                                 f"iteration), vN (DeltaNet items per head), rNxK (the block of the tiles that add "
                                 f"into x) or sN (N programs per SM)")
        out.append((f"persistent w{warps} {n}x{k}" + "".join(f" {st}" for st in stages), options))
    return out


# a variant names every option it turns on: the rest are stage 1's (not PersistentDecode's defaults, which change as
# measurements come in), so a variant's name means the same kernel in every run
STAGE_1 = {"fuse_norms": False, "prefetch": 0, "gemv_ahead": 0, "deltanet_block": 32, "gemv_stages": 0,
           "deltanet_split": 1, "add_block": 0, "gemv_late": 0, "fold_prep": False, "gemv_early": 0, "fields_ahead": 0,
           "prefetch_states": 0, "acquire_poll": 0}


DEFAULTS = "8:16x1024:n:c3:p64k:v8:r8x2048"   # PersistentDecode's GPU_DEFAULTS as a variant
DEFAULT_VARIANTS = [DEFAULTS, DEFAULTS + ":w", DEFAULTS + ":f", DEFAULTS + ":w:f"]


def decode_options(options: dict, programs: int | None = None) -> dict:
    """A variant's options as PersistentDecode takes them: stage 1's under the variant's own, and programs_per_sm
    times the GPU's SM count as `programs` (else `programs`, None for one per SM)."""
    options = dict(options)
    per_sm = options.pop("programs_per_sm", None)
    if per_sm is not None:
        programs = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    return {**STAGE_1, **options, "programs": programs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen3.5-0.8b")
    p.add_argument("--prefill-len", type=int, default=2048)
    p.add_argument("--decode-steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=4)
    # (default: PersistentDecode's GPU defaults, then with the two forms measured faster, acquire polls and the
    # folded prep, alone and together)
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help="num_warps:BLOCK_NxBLOCK_K[:n][:a|:cN[:l][:e]][:pBYTES[:k]][:dN][:vN][:rNxK][:sN][:i][:w][:f], "
                        "comma-separated")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("skipped: the benchmark times CUDA Graphs on an NVIDIA GPU")
        return 0

    from qwen_lab import bench
    from qwen_lab.course import checks
    from qwen_lab.graph import capture
    from qwen_lab.kernels.persistent import KIND_NAMES, PersistentDecode
    from qwen_lab.model import load_model
    from qwen_lab.plan import fast_plan

    dev = torch.device("cuda")
    model = load_model(args.model, device="cuda", dtype=torch.bfloat16)
    plan = fast_plan(model)
    T, n = args.prefill_len, args.decode_steps
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(0)).to(dev)
    positions = torch.arange(T, device=dev)

    costs = bench.model_costs(model.config, model.weights, T)
    floors = bench.measure_floors(dev, torch.bfloat16)
    floors["decode_ms"] = costs["decode_bytes"] / (floors["copy_GBps"] * 1e9) * 1e3
    floors["decode_bytes"] = costs["decode_bytes"]

    def stamp(msg):
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    with torch.inference_mode():
        # ---- the plan's graph decode, as bench.py captures it
        stamp("plan: warm-up and capture")
        plan_cache = model.new_cache(T + n + 8)
        token = ids[-1:].clone()
        pos = torch.tensor([T], device=dev)
        plan.step(ids, positions, plan_cache)
        plan.step(token, pos, plan_cache)
        plan_cache.reset()
        first = plan.step(ids, positions, plan_cache)[-1]
        g_plan, plan_logits = capture(lambda: plan.step(token, pos, plan_cache), warmup=2)
        greedy = int(first.float().argmax())

        # ---- the persistent step: captured before its prefill (the warm-up writes the cache), then prefilled
        variants, failed = [], {}
        for name, options in parse_variants(args.variants):
            stamp(f"{name}: schedule, compile, capture")
            try:
                cache = model.new_cache(T + n + 8)
                step = PersistentDecode(model, cache, **decode_options(options))
                t0 = time.perf_counter()
                step.step()   # the first launch compiles
                torch.cuda.synchronize()
                compile_s = time.perf_counter() - t0
                graph, _ = capture(lambda step=step: step.step(), warmup=1)
            except Exception as e:   # (one variant out of resources, say: the others are still timed)
                failed[name] = f"{type(e).__name__}: {e}"
                stamp(f"{name}: failed: {failed[name]}")
                continue
            cache.reset()
            step.reset()
            plan.step(ids, positions, cache)
            variants.append((name, step, graph, compile_s))

        # ---- one step from the same state both ways (the plan's cache has run its warm-up steps: re-prefill it)
        plan_cache.reset()
        plan.step(ids, positions, plan_cache)
        token.fill_(greedy)
        g_plan.replay()
        checks_out = {}
        for name, step, graph, _ in variants:
            step.prime(greedy, T)
            graph.replay()
            torch.cuda.synchronize()
            step.check()
            checks_out[name] = {"relative_error": checks.relative_error(step.logits[0].float(), plan_logits.float()),
                                "token": int(step.token), "plan_token": int(plan_logits.float().argmax())}
            stamp(f"{name}: one step vs the plan: {checks_out[name]}")

        # ---- timing, rounds in alternating order
        def run_plan():
            for _ in range(n):
                g_plan.replay()

        def timer(step, graph):
            def run():
                for _ in range(n):
                    graph.replay()
            return run, lambda: step.prime(greedy, T)

        rows = {"triton+cuda-graph": []}
        rows.update({name: [] for name, *_ in variants})
        for r in range(args.rounds):
            order = [("triton+cuda-graph", run_plan, None)] + [(name, *timer(step, graph)) for name, step, graph, _
                                                               in variants]
            if r % 2:
                order = order[::-1]
            for name, fn, setup in order:
                rows[name].append(bench.time_ms(fn, dev, warmup=1, reps=5, setup=setup) / n)
            stamp(f"round {r}: " + ", ".join(f"{k} {v[-1]:.4f} ms" for k, v in rows.items()))
        for _, step, _, _ in variants:
            step.check()

    info = {name: {"programs": step.schedule.programs, "items": len(step.schedule.item_list),
                   "counters": len(step.schedule.counter_totals), "num_warps": step.num_warps,
                   "gemv_block": list(step.gemv_block), "splits": step.schedule.buffers["ws"].shape[0],
                   "prefetch": step.prefetch,
                   "compile_s": round(compile_s, 1),
                   "items_by_kind": {k: sum(1 for it in step.schedule.item_list if KIND_NAMES[it.kind] == k)
                                     for k in KIND_NAMES}}
            for name, step, _, compile_s in variants}
    result = {**bench.run_info(dev), "config": model.config.name, "prefill_len": T, "decode_steps": n,
              "rounds": args.rounds, "floors": floors, "checks": checks_out, "variants": info, "failed": failed,
              "rows": []}
    print(f"{'row':32s} {'decode ms/token (median of rounds)':>36s} {'share of floor':>15s}  rounds")
    for name, times in rows.items():
        ms = statistics.median(times)
        result["rows"].append({"name": name, "decode_ms": ms, "decode_ms_rounds": times,
                               "decode_floor_share": floors["decode_ms"] / ms, "tokens_per_s": 1e3 / ms})
        print(f"{name:32s} {ms:36.4f} {floors['decode_ms'] / ms:15.1%}  " + " ".join(f"{t:.4f}" for t in times))
    print(f"floor {floors['decode_ms']:.4f} ms ({floors['copy_GBps']} GB/s copy)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
