"""The benchmark table: PyTorch eager (transformers) against the course's Triton kernels, without and with
CUDA Graph replay.

    python -m qwen_lab.bench --model qwen3.5-0.8b --prefill-len 2048 --decode-steps 128 --json out.json --plot out.png

Rows: `transformers-eager` (when transformers is installed: the same weights in Hugging Face's model),
`triton` (every kernel launched from Python), `triton+cuda-graph` (prefill and decode steps replayed from
graphs). Columns: prefill ms (T tokens, logits of the last position), decode ms/token (one token after that
prefill), tokens/s, share of the hardware floor, kernel launches per forward.

Floors are measured in the same run: the copy bandwidth (a large device-to-device copy) bounds decode, which
must read every weight once per token; the bf16 matmul rate bounds prefill.
On a CPU the benchmark still runs (tiny shapes, interpreter) so the code path is tested; its times mean nothing
and the graph row is skipped with a note.

    python -m qwen_lab.bench ab --switch QWEN_LAB_PDL=0,1 [--rounds N] [--json out.json]

times the fast route's prefill and decode with a switch set one way and the other, alternated in one process
(qwen_lab.bench_ab). The kernels one by one: benchmarks/bench_<family>.py, on the harness of benchmarks/harness.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from . import runtime
from .kernels import count_launches


# ---------------------------------------------------------------- timing helpers


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, warmup: int = 2, reps: int = 10, setup=None) -> float:
    """Median wall time of fn() in ms: CUDA events on a GPU, perf_counter on a CPU. setup() runs untimed first."""
    for _ in range(warmup):
        if setup:
            setup()
        fn()
    _sync(device)
    times = []
    for _ in range(reps):
        if setup:
            setup()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_GBps(device) -> float:
    """Copy bandwidth of a GPU in GB/s (bytes read + written by a large device-to-device copy)."""
    n = 512 * 2**20  # 512 MiB per buffer (1 GiB read and written): far beyond L2
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, warmup=3, reps=20)
    return 2 * n / (ms * 1e-3) / 1e9


def measure_floors(device, dtype) -> dict:
    """Copy bandwidth (GB/s, bytes read + written) and dense matmul rate (TFLOP/s) of this device."""
    if device.type != "cuda":
        return {"copy_GBps": None, "matmul_TFLOPs": None}
    copy = copy_GBps(device)
    a = torch.randn(8192, 8192, device=device, dtype=dtype)
    b = torch.randn(8192, 8192, device=device, dtype=dtype)
    ms = time_ms(lambda: a @ b, device, warmup=3, reps=20)
    flops = 2 * 8192**3 / (ms * 1e-3) / 1e12
    return {"copy_GBps": round(copy, 1), "matmul_TFLOPs": round(flops, 1)}


def model_costs(config, weights, prefill_len: int) -> dict:
    """Bytes a decode step must read and FLOPs a prefill must do (logits for the last position only)."""
    c = config
    weight_bytes = weights.nbytes()
    per_token_matmul = 0
    for kind in c.layer_types:
        if kind == "linear_attention":
            per_token_matmul += c.hidden_size * (c.linear_in_proj_dim + c.linear_value_dim)
        else:
            per_token_matmul += c.hidden_size * (c.attn_in_proj_dim + c.num_attention_heads * c.head_dim)
        per_token_matmul += c.hidden_size * 3 * c.intermediate_size
    flops = 2 * per_token_matmul * prefill_len + 2 * c.hidden_size * c.vocab_size
    # causal attention: QK^T and PV over on average T/2 keys, per full-attention layer
    flops += c.num_full_layers * 2 * 2 * c.num_attention_heads * c.head_dim * prefill_len * prefill_len / 2
    # the delta rule: roughly 4 Dk*Dv products per token and head (state read, update, output, chunk terms)
    state = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim   # values per layer
    flops += c.num_linear_layers * 4 * 2 * state * prefill_len
    state_bytes = c.num_linear_layers * 2 * 4 * state
    return {"weight_bytes": weight_bytes, "decode_bytes": weight_bytes + state_bytes, "prefill_flops": flops}


def run_info(device) -> dict:
    """What a benchmark's JSON says about where it ran: the GPU (or the CPU and its interpreter), the versions of
    PyTorch and Triton, the git commit of this checkout (None outside a git checkout; "+dirty" when files differ
    from it), every switch's value (qwen_lab.switches) and the date and time in UTC."""
    import triton

    from .switches import switches

    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (Triton interpreter)"
    return {"gpu": gpu, "torch": torch.__version__, "triton": triton.__version__, "commit": git_commit(),
            "switches": switches.describe(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def git_commit() -> str | None:
    """The commit of the checkout holding this package, with "+dirty" when tracked files changed; None when it is
    not in a git checkout (a copied tree) or git is missing."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


# ---------------------------------------------------------------- rows


def bench_qwen_lab(model, prefill_len: int, decode_steps: int, graph: bool, gen: torch.Generator,
                   status=lambda phase: None, persistent: bool = False) -> dict:
    """One row of the table: the model's fast route (qwen_lab.plan), launched from Python or replayed from CUDA
    Graphs; persistent: its decode step as the one persistent launch (qwen_lab.kernels.persistent), replayed from a
    graph, the greedy token included."""
    from .plan import fast_plan

    model = fast_plan(model)
    dev = model.device
    ids = torch.randint(0, model.config.vocab_size, (prefill_len,), generator=gen).to(dev)
    positions = torch.arange(prefill_len, device=dev)
    cache = model.new_cache(prefill_len + decode_steps + 1)
    token = ids[-1:].clone()
    pos = torch.tensor([prefill_len], device=dev)

    with torch.inference_mode():
        status("warm-up: compiling and autotuning")
        model.step(ids, positions, cache)  # warm-up: compiling and autotuning launch kernels of their own
        model.step(token, pos, cache)
        cache.reset()
        with count_launches() as c:
            model.step(ids, positions, cache)
        prefill_launches = sum(c.values())
        with count_launches() as c:
            model.step(token, pos, cache)
        decode_launches = sum(c.values())

        if not graph:
            # on a CPU (the interpreter: nothing to compile, each step takes seconds) the two untimed runs above
            # are warm-up enough, and one timed run of each is what the table can honestly say
            cpu = dev.type != "cuda"
            status("timing the prefill")
            prefill_ms = time_ms(lambda: model.step(ids, positions, cache), dev, setup=cache.reset,
                                 reps=1 if cpu else 5, warmup=0 if cpu else 1)
            cache.reset()
            model.step(ids, positions, cache)

            def decode():
                for _ in range(decode_steps):
                    model.step(token, pos, cache)
            status("timing the decode steps")
            decode_ms = time_ms(decode, dev, warmup=0 if cpu else 1, reps=1 if cpu else 3) / decode_steps
            host_launches = (prefill_launches, decode_launches)
        else:
            from .graph import PrefillGraphs, buckets_used, capture

            # the prefill replayed in bucket-sized pieces (for 2048 tokens, one replay), as a server holding its
            # graphs across prompts would run it; the states are reset, untimed, before each run. Only the buckets
            # this prompt is split into are captured: the others would only compile and tune their own lengths.
            status("capturing the prefill graphs")
            prefill = PrefillGraphs(model, cache, buckets=buckets_used(prefill_len))
            status("timing the prefill")
            prefill_ms = time_ms(lambda: prefill.run(ids), dev, reps=10, setup=cache.reset)
            cache.reset()
            prefill.run(ids)
            setup = None
            if persistent:   # its position advances every step: each timed run starts again at the prompt's end
                from .kernels.persistent import PersistentDecode

                step = PersistentDecode(model.model, cache)
                status("compiling the persistent step")
                g_decode, _ = capture(lambda: step.step(check=False), warmup=1)
                step.reset()
                cache.reset()
                prefill.run(ids)
                with count_launches() as c:
                    step.prime(token, prefill_len)
                    step.step()
                decode_launches = sum(c.values())

                def setup():
                    step.prime(token, prefill_len)
            else:
                g_decode, _ = capture(lambda: model.step(token, pos, cache), warmup=2)

            def decode():
                for _ in range(decode_steps):
                    g_decode.replay()
            status("timing the decode steps")
            decode_ms = time_ms(decode, dev, warmup=1, reps=5, setup=setup) / decode_steps
            if persistent:
                step.check()
            # per prefill piece: the ids copy, the positions, the replay
            host_launches = (3 * len(prefill.pieces(prefill_len)), 1)
    return {"prefill_ms": prefill_ms, "decode_ms": decode_ms, "kernels_prefill": prefill_launches,
            "kernels_decode": decode_launches, "host_launches_prefill": host_launches[0],
            "host_launches_decode": host_launches[1]}


def transformers_model(config, weights, device, dtype):
    """transformers' Qwen3_5ForCausalLM (eager attention) holding exactly `weights`, in `dtype` on `device`."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from .weights import to_hf_state_dict

    cfg = {k: v for k, v in config.to_hf_dict().items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf_config = Qwen3_5TextConfig(**cfg)
    hf_config._attn_implementation = "eager"
    with torch.device("meta"):
        hf = Qwen3_5ForCausalLM(hf_config)
    state = {k: v.to(device=device, dtype=dtype) for k, v in to_hf_state_dict(config, weights).items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict(state, strict=True, assign=True)
    # buffers (the rotary inverse frequencies) were made on the meta device: build them for real
    hf.model.rotary_emb = type(hf.model.rotary_emb)(config=hf_config).to(device)
    return hf.eval()


@contextlib.contextmanager
def _transformers_quiet():
    """transformers at ERROR level for the block: without flash-linear-attention it warns once per fallback
    function that it runs its PyTorch reference, which the row's note already says."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def bench_transformers(model, prefill_len: int, decode_steps: int, gen: torch.Generator) -> dict | None:
    """transformers' Qwen3_5ForCausalLM (eager attention) with the same weights, or None if not installed."""
    try:
        from transformers.cache_utils import DynamicCache
    except ImportError:
        return None
    with _transformers_quiet():
        return _bench_transformers(model, prefill_len, decode_steps, gen, DynamicCache)


def _bench_transformers(model, prefill_len, decode_steps, gen, DynamicCache) -> dict:
    hf = transformers_model(model.config, model.weights, model.device, model.dtype)
    hf_config = hf.config
    dev = model.device
    ids = torch.randint(0, model.config.vocab_size, (1, prefill_len), generator=gen).to(dev)
    with torch.inference_mode():
        prefill_ms = time_ms(lambda: hf(input_ids=ids, logits_to_keep=1), dev, warmup=1,
                             reps=3 if dev.type == "cuda" else 1)
        cache = DynamicCache(config=hf_config)
        hf(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tok = ids[:, -1:]

        def decode():
            for _ in range(decode_steps):
                hf(input_ids=tok, past_key_values=cache, use_cache=True)
        decode_ms = time_ms(decode, dev, warmup=0, reps=1) / decode_steps
    import importlib.util

    fla = importlib.util.find_spec("fla") is not None
    return {"prefill_ms": prefill_ms, "decode_ms": decode_ms, "kernels_prefill": None, "kernels_decode": None,
            "host_launches_prefill": None, "host_launches_decode": None,
            "note": "delta rule and conv from flash-linear-attention" if fla else
                    "delta rule and conv on transformers' PyTorch fallbacks"}


# ---------------------------------------------------------------- the table


# The benchmark's rows, in the table's order.
ROWS = ("transformers-eager", "triton", "triton+cuda-graph", "triton+persistent")


# Above this many FLOPs per prefill the interpreter's run is no longer a quick test of the path (the tiny model's
# 16-token default is 0.007 GFLOP): the interpreter runs one program at a time in NumPy.
INTERPRETER_NOTE_FLOPS = 1e10


def interpreter_note(config, prefill_len: int, prefill_flops: float) -> str | None:
    """What to tell someone who benchmarks a large model on a CPU, before the long wait; None when it is quick."""
    if not runtime.interpreter_active() or prefill_flops < INTERPRETER_NOTE_FLOPS:
        return None
    return (f"note: no GPU here, so the triton rows run every kernel through the Triton interpreter (NumPy, one "
            f"program at a time): {config.name} with a {prefill_len}-token prefill ({prefill_flops / 1e9:,.0f} GFLOP) "
            f"can take hours. The CPU defaults (python -m qwen_lab.bench: the tiny model, 16 tokens) take seconds "
            f"and test the same path.")


def run(source: str = "qwen3.5-0.8b", prefill_len: int = 2048, decode_steps: int = 128, rows=None,
        seed: int = 0, progress: bool = True) -> dict:
    from .errors import ConfigError
    from .model import load_model

    unknown = [name for name in rows or () if name not in ROWS]
    if unknown:  # before the model is loaded and the floors measured
        raise ConfigError(f"rows: unknown {unknown}; expected some of {list(ROWS)}")
    rt = runtime.choose()
    model = load_model(source, backend="triton")
    limit = model.config.max_position_embeddings
    if prefill_len + decode_steps + 1 > limit:  # the cache holds the prompt, the timed steps and one warm-up step
        raise ConfigError(f"prefill_len={prefill_len} + decode_steps={decode_steps} (+ 1 warm-up step) exceed the "
                          f"model's max_position_embeddings={limit} ({model.config.name}); shorten --prefill-len or "
                          "--decode-steps")
    gen = torch.Generator().manual_seed(seed)
    costs = model_costs(model.config, model.weights, prefill_len)
    note = interpreter_note(model.config, prefill_len, costs["prefill_flops"])
    if note and progress:   # before anything takes long
        print(note, file=sys.stderr)
    floors = measure_floors(rt.device, rt.dtype)
    if floors["copy_GBps"]:
        floors["decode_ms"] = costs["decode_bytes"] / (floors["copy_GBps"] * 1e9) * 1e3
        floors["prefill_ms"] = costs["prefill_flops"] / (floors["matmul_TFLOPs"] * 1e12) * 1e3
    floors.update({k: costs[k] for k in ("weight_bytes", "decode_bytes", "prefill_flops")})
    wanted = list(rows or ROWS)
    result = {**run_info(rt.device), "date": time.strftime("%Y-%m-%d"),   # the table prints the day
              "dtype": str(rt.dtype).removeprefix("torch."), "config": model.config.name,
              "prefill_len": prefill_len, "decode_steps": decode_steps, "floors": floors, "rows": [],
              "skipped": []}
    from tqdm.auto import tqdm

    bar = tqdm(wanted, desc="bench", unit="row", disable=not progress, file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        status = lambda phase, name=name: bar.set_postfix_str(f"{name}: {phase}")  # noqa: E731
        if name == "transformers-eager":
            row = bench_transformers(model, prefill_len, decode_steps, gen)
            if row is None:
                result["skipped"].append("transformers-eager: transformers is not installed")
                continue
        elif name == "triton":
            row = bench_qwen_lab(model, prefill_len, decode_steps, graph=False, gen=gen, status=status)
        elif name == "triton+cuda-graph":
            if rt.device.type != "cuda":
                result["skipped"].append("triton+cuda-graph: CUDA Graphs need an NVIDIA GPU")
                continue
            row = bench_qwen_lab(model, prefill_len, decode_steps, graph=True, gen=gen, status=status)
        elif name == "triton+persistent":
            if rt.device.type != "cuda":
                result["skipped"].append("triton+persistent: the persistent step runs from a CUDA Graph, on an "
                                         "NVIDIA GPU")
                continue
            row = bench_qwen_lab(model, prefill_len, decode_steps, graph=True, gen=gen, status=status,
                                 persistent=True)
        row = {"name": name, **row, "tokens_per_s": 1e3 / row["decode_ms"]}
        if "decode_ms" in floors:
            row["decode_floor_share"] = floors["decode_ms"] / row["decode_ms"]
            row["prefill_floor_share"] = floors["prefill_ms"] / row["prefill_ms"]
        result["rows"].append(row)
    bar.close()
    return result


def format_rate(x) -> str:
    """A rate for the table: 3 significant digits below 10 (0.52 -> "0.520", 2.5 -> "2.50"), whole numbers from 10
    up (1456.2 -> "1456"), so that a slow row (a CPU run) does not print as 0."""
    if x is None:
        return "-"
    return format(x, "#.3g" if abs(x) < 10 else ".0f")


def format_table(result: dict) -> str:
    f = result["floors"]
    lines = [f"{result['config']} on {result['gpu']}, {result['dtype']}, prefill {result['prefill_len']} tokens, "
             f"decode after it ({result['date']})", ""]
    head = ("| row | prefill ms | decode ms/token | tokens/s | decode floor share | prefill floor share "
            "| kernels prefill / decode | host launches prefill / decode |")
    lines += [head, "|" + " --- |" * 8]

    def fmt(x, spec):
        return "-" if x is None else format(x, spec)
    for r in result["rows"]:
        lines.append(f"| {r['name']} | {fmt(r['prefill_ms'], '.2f')} | {fmt(r['decode_ms'], '.3f')} | "
                     f"{format_rate(r['tokens_per_s'])} | {fmt(r.get('decode_floor_share'), '.0%')} | "
                     f"{fmt(r.get('prefill_floor_share'), '.0%')} | {fmt(r['kernels_prefill'], 'd')} / "
                     f"{fmt(r['kernels_decode'], 'd')} | {fmt(r['host_launches_prefill'], 'd')} / "
                     f"{fmt(r['host_launches_decode'], 'd')} |")
    if "decode_ms" in f:
        lines += ["", f"floors: decode {f['decode_ms']:.3f} ms ({f['decode_bytes'] / 1e9:.3f} GB at "
                      f"{f['copy_GBps']:.0f} GB/s copy), prefill {f['prefill_ms']:.2f} ms "
                      f"({f['prefill_flops'] / 1e12:.2f} TFLOP at {f['matmul_TFLOPs']:.0f} TFLOP/s)"]
    for r in result["rows"]:
        if r.get("note"):
            lines.append(f"{r['name']}: {r['note']}")
    for s in result["skipped"]:
        lines.append(f"skipped: {s}")
    return "\n".join(lines)


def plot(result: dict, path: str | None = None):
    """Bars of prefill and decode time per row, with the measured floors as lines. Returns the Figure; saves it to
    `path` when given. Drawn without pyplot, so a notebook's plotting backend is left as it was."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .errors import ConfigError

    rows = result["rows"]
    if not rows:
        raise ConfigError("plot: the result has no measured row to draw (" + ("; ".join(result.get("skipped", ()))
                                                                             or "no row was asked for") + ")")
    names = [r["name"] for r in rows]
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2)
    for ax, key, title in ((axes[0], "prefill_ms", f"prefill {result['prefill_len']} tokens"),
                           (axes[1], "decode_ms", "decode, per token")):
        vals = [r[key] for r in rows]
        bars = ax.bar(names, vals, color=["#999999", "#4c72b0", "#55a868", "#c44e52"][:len(rows)])
        ax.bar_label(bars, labels=[f"{v:.3g} ms" for v in vals])
        if key in result["floors"]:
            ax.axhline(result["floors"][key], color="red", ls="--", label="hardware floor")
            ax.legend()
        ax.set_yscale("log")
        ax.set_ylabel("ms (log scale)")
        ax.set_title(title)
    fig.suptitle(f"{result['config']} on {result['gpu']}")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def main(argv=None) -> int:
    from .errors import QwenLabError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["ab"]:   # python -m qwen_lab.bench ab --switch NAME=A,B ...
        from . import bench_ab

        return bench_ab.main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m qwen_lab.bench",
                                description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--model", default=None, help="a preset, snapshot directory or hub id (default: qwen3.5-0.8b on a "
                                                 "GPU, tiny on a CPU, where the real shapes through the Triton "
                                                 "interpreter take hours)")
    p.add_argument("--prefill-len", type=int, default=None, help="default: 2048 on a GPU, 16 on a CPU")
    p.add_argument("--decode-steps", type=int, default=None, help="default: 128 on a GPU, 4 on a CPU")
    p.add_argument("--rows", nargs="*", default=None, choices=ROWS, help="subset of: " + " ".join(ROWS))
    p.add_argument("--json", default=None, help="write the result as JSON to this file")
    p.add_argument("--plot", default=None, help="write the bar chart to this PNG file")
    args = p.parse_args(argv)
    for flag, value in (("--prefill-len", args.prefill_len), ("--decode-steps", args.decode_steps)):
        if value is not None and value < 1:
            p.error(f"{flag} {value}: expected at least 1")
    for flag, path in (("--json", args.json), ("--plot", args.plot)):  # before the run, not after it
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not os.path.isdir(folder):
            p.error(f"{flag} {path}: the folder {folder} does not exist")
    gpu = runtime.choose().device.type == "cuda"   # a CPU runs the interpreter: tiny shapes, to test the path
    model = args.model or ("qwen3.5-0.8b" if gpu else "tiny")
    prefill_len = args.prefill_len or (2048 if gpu else 16)
    decode_steps = args.decode_steps or (128 if gpu else 4)
    try:
        result = run(model, prefill_len, decode_steps, rows=args.rows)
    except QwenLabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        if result["rows"]:
            plot(result, args.plot)
        else:  # every row asked for was skipped (a CPU, or no transformers): nothing to draw, and no PNG
            print(f"--plot {args.plot}: not drawn, no row was measured", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
