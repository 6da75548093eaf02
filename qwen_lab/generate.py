"""The generation loop, and `python -m qwen_lab.generate`.

    prefill:  logits = model.step(prompt, positions 0..T-1, cache)        (chunked delta rule, flash attention)
    decode:   token = sample(logits); logits = model.step(token, position, cache), until EOS or the budget

With cuda_graph (the default with the Triton backend on a GPU) each decode step is one replay of a captured step
that also samples (qwen_lab.graph.DecodeGraph). The prefill runs once per call and is launched eagerly; a caller
that prefills many prompts into one cache can replay it from qwen_lab.graph.PrefillGraphs.

Sampling draws its uniform number on the device from a seeded generator, so a run is reproducible
and the loop needs no host synchronisation except to look at the token (EOS, streaming).
"""

from __future__ import annotations

import argparse
import math
import numbers
import operator
import sys
import types
from typing import Callable

import torch

from .errors import GenerationError
from .graph import DecodeGraph, sampler


def _number(name, value, kind, expect):
    """value as a Python int or float when it is one (NumPy scalars included: a sweep over np.arange gives them);
    GenerationError naming the argument otherwise. A bool is not a number here."""
    if isinstance(value, bool) or not isinstance(value, kind):
        kind_name = f"{type(value).__module__}.{type(value).__name__}"
        got = f" (a {kind_name})" if type(value).__module__ != "builtins" else ""  # a tensor prints like a number
        raise GenerationError(f"{name}={value!r}{got}; expected {expect}")
    return int(value) if kind is numbers.Integral else float(value)


def check_sampling_args(max_new_tokens, temperature, top_k, top_p) -> tuple[int, float, int, float]:
    """The sampling arguments as Python numbers; GenerationError naming the first bad one."""
    integer, real = numbers.Integral, numbers.Real
    max_new_tokens = _number("max_new_tokens", max_new_tokens, integer, "an integer >= 0")
    if max_new_tokens < 0:
        raise GenerationError(f"max_new_tokens={max_new_tokens!r}; expected an integer >= 0")
    temperature = _number("temperature", temperature, real, "a finite number >= 0 (0 = greedy)")
    if not math.isfinite(temperature) or temperature < 0:
        raise GenerationError(f"temperature={temperature!r}; expected a finite number >= 0 (0 = greedy)")
    # the sampler scales the logits by log2(e) / temperature in float32: where that factor overflows, every
    # probability would be NaN. The kernel's own test, applied before any work, so both backends refuse alike.
    from .kernels.sampling import FLOAT32_MAX, LOG2E

    if temperature > 0 and not LOG2E / temperature < FLOAT32_MAX:
        raise GenerationError(f"temperature={temperature!r} is too small for the sampler's float32 math (more than "
                              f"{LOG2E / FLOAT32_MAX:.3g} needed); use 0 for greedy")
    top_k = _number("top_k", top_k, integer, "an integer >= 0 (0 = no top-k filter)")
    if top_k < 0:
        raise GenerationError(f"top_k={top_k!r}; expected an integer >= 0 (0 = no top-k filter)")
    top_p = _number("top_p", top_p, real, "a number in (0, 1] (1 = no nucleus filter)")
    if not (0 < top_p <= 1):
        raise GenerationError(f"top_p={top_p!r}; expected a number in (0, 1] (1 = no nucleus filter)")
    return max_new_tokens, temperature, top_k, top_p


def _token_id_list(ids) -> list[int]:
    """eos_token_ids as a list of ints (GenerationError for anything else)."""
    try:
        if isinstance(ids, (str, bytes)):
            raise TypeError
        items = list(ids)  # once: ids may be an iterator
        if any(isinstance(t, bool) for t in items):
            raise TypeError
        return [operator.index(t) for t in items]
    except TypeError:
        raise GenerationError(f"eos_token_ids={ids!r}; expected a list of token ids (ints), or None for the "
                              f"snapshot's") from None


def check_seed(seed) -> None:
    """The sampling seed: an integer that fits a 64-bit generator seed (GenerationError otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not -2**63 <= int(seed) < 2**64:
        raise GenerationError(f"seed={seed!r}; expected an integer (a 64-bit seed)")


@torch.inference_mode()
def generate(model, input_ids, max_new_tokens: int = 32, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int = 0, cuda_graph: bool | None = None, *, max_len: int | None = None,
             eos_token_ids=None, stream: Callable[[int], None] | None = None,
             status: Callable[[str], None] | None = None) -> torch.Tensor:
    """Generate up to max_new_tokens after input_ids; returns a LongTensor (CPU) of the new tokens.

    temperature 0 is greedy; top_k 0 and top_p 1 disable those filters. Generation stops after an EOS token
    (included in the result): `eos_token_ids` defaults to the snapshot's. `max_len` is the cache capacity
    (default: prompt + max_new_tokens); a prompt that does not fit raises. `stream(token_id)` is called for
    each new token as it is produced; `status(phase)` before each phase of the warm-up (a progress display: on a GPU
    the first call of each kernel compiles and tunes it). cuda_graph: None = with backend 'triton' on a GPU,
    replay each decode step from a captured step (DecodeGraph).
    """
    if not all(hasattr(model, attr) for attr in ("check_ids", "step", "new_cache", "config")):
        raise GenerationError(f"model={model!r}; expected a model from qwen_lab.load_model() (a Qwen35Model), "
                              f"not a {type(model).__name__}")
    max_new_tokens, temperature, top_k, top_p = check_sampling_args(max_new_tokens, temperature, top_k, top_p)
    check_seed(seed)
    if cuda_graph is not None and not isinstance(cuda_graph, bool):
        raise GenerationError(f"cuda_graph={cuda_graph!r}; expected True, False or None (None: a graph with "
                              "backend 'triton' on a GPU)")
    if max_len is not None:
        max_len = _number("max_len", max_len, numbers.Integral, "a positive integer (the cache's capacity in tokens)")
        if max_len < 1:
            raise GenerationError(f"max_len={max_len!r}; expected a positive integer (the cache's capacity in tokens)")
    if eos_token_ids is not None:
        eos_token_ids = _token_id_list(eos_token_ids)
    for name, fn in (("stream", stream), ("status", status)):
        if fn is not None and not callable(fn):
            raise GenerationError(f"{name}={fn!r}; expected a function of one argument, or None")
    ids = model.check_ids(input_ids)
    T = ids.numel()
    limit = model.config.max_position_embeddings
    if max_len is None:
        if T + max_new_tokens > limit:
            raise GenerationError(f"the prompt ({T} tokens) + max_new_tokens ({max_new_tokens}) = "
                                  f"{T + max_new_tokens} exceeds the model's max_position_embeddings={limit}")
        capacity = T + max_new_tokens
    else:
        capacity = max_len
        if T > capacity:
            raise GenerationError(f"the prompt has {T} tokens but the cache holds max_len={capacity}; "
                                  f"shorten the prompt or raise max_len")
        if T + max_new_tokens > capacity:
            raise GenerationError(f"prompt ({T}) + max_new_tokens ({max_new_tokens}) = {T + max_new_tokens} exceeds "
                                  f"the cache's max_len={capacity}")
        if capacity > limit:
            raise GenerationError(f"max_len={capacity} exceeds the model's max_position_embeddings={limit}")
    eos = set(model.config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    if cuda_graph is None:
        cuda_graph = model.device.type == "cuda" and model.backend == "triton"
    use_graph = cuda_graph
    if use_graph and model.device.type != "cuda":
        raise GenerationError("cuda_graph=True needs the model on a CUDA GPU; this model is on "
                              f"{model.device}")
    if max_new_tokens == 0:
        return torch.empty(0, dtype=torch.long)

    device = model.device
    rng = torch.Generator(device=device).manual_seed(int(seed))
    # one uniform number per new token, drawn once; two more for the graph's warm-up steps, which also draw
    uniforms = torch.rand(max_new_tokens + 2, generator=rng, device=device)
    cache = model.new_cache(capacity)
    runner = None
    # without a `status` of the caller's, a progress line of its own where the warm-up is long (a notebook's first
    # generate() on a GPU compiles and tunes every kernel for a minute or more), gone once the first token is drawn
    line = status_line(model) if status is None else None
    say = status or (line.set_postfix_str if line is not None else (lambda phase: None))
    try:
        if use_graph:  # captured before the prefill: its warm-up writes the cache, which it then resets
            say("capturing the decode step (its warm-up compiles and tunes the decode kernels on their first run)")
            runner = DecodeGraph(model, cache, temperature, top_k, top_p, uniforms)
        # one scratch for every draw of this generation: the graph's own where there is one (the prompt's draw runs
        # before the first replay, on the same stream, so the two never overlap)
        sample = runner.draw if runner is not None else sampler(model)
        say(f"prefill of {T} tokens")
        # The prefill runs once per call, so it is launched eagerly: capturing it (graph.PrefillGraphs) costs a
        # warm-up step and a capture per bucket size, more than the launches it would save. The decode step
        # replays once per token and pays for its capture after a few tokens.
        logits = model.step(ids, torch.arange(T, device=device), cache)[-1]
        token = sample(logits, temperature, top_k, top_p, uniforms[0]).reshape(1)
    finally:
        if line is not None:
            line.close()
    position = torch.tensor([T], device=device)
    if runner is not None:
        runner.prime(token, T, 1)
    out: list[torch.Tensor] = []
    for n in range(max_new_tokens):
        out.append(token)
        if stream is not None or eos:
            tok = int(token)  # the one host synchronisation per token: EOS and streaming need to see it
            if stream is not None:
                stream(tok)
            if tok in eos:
                break
        if n + 1 == max_new_tokens:
            break
        if runner is not None:
            token = runner.replay().clone()
        else:
            logits = model.step(token, position, cache)[-1]
            token = sample(logits, temperature, top_k, top_p, uniforms[n + 1]).reshape(1)
            position += 1
    return torch.cat(out).cpu()


def status_line(model):
    """A one-line progress display on stderr for generate()'s warm-up ("warm-up, <phase> [elapsed]"; set the phase
    with .set_postfix_str, remove it with .close()) where it is long: the course's Triton kernels on a GPU, whose
    first calls compile and tune. None elsewhere (on a CPU the interpreter starts at once)."""
    if not (model.device.type == "cuda" and model.backend == "triton"):
        return None
    from tqdm.auto import tqdm

    return tqdm(desc="warm-up", bar_format="{desc}{postfix} [{elapsed}]", file=sys.stderr, leave=False)


def _parser() -> argparse.ArgumentParser:
    """The command line of `python -m qwen_lab.generate`."""
    p = argparse.ArgumentParser(prog="python -m qwen_lab.generate",
                                description="Generate text with Qwen3.5 built from the course's Triton kernels.")
    p.add_argument("--model", default="tiny", metavar="SOURCE",
                   help="snapshot directory, preset ('tiny', 'qwen3.5-0.8b') or hub id (default: %(default)s)")
    p.add_argument("--prompt", default="The GPU reads every weight once per token, so", metavar="TEXT",
                   help="the text to continue (default: '%(default)s')")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the snapshot's chat template as a user message (default: off)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="stop after N new tokens, or earlier at an end-of-sequence token; on a CPU (the Triton "
                        "interpreter) each token of the tiny model takes about half a second, of the real shapes far "
                        "longer (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="sampling temperature; 0 picks the most likely token every time (greedy) "
                        "(default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="sample among the K most likely tokens only; 0 = no top-k filter (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, metavar="P",
                   help="sample among the most likely tokens whose probabilities add up to P (nucleus); "
                        "1 = no filter (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the sampling: the same seed gives the same tokens (default: %(default)s)")
    p.add_argument("--no-cuda-graph", action="store_true",
                   help="launch every kernel from Python instead of replaying a captured decode step "
                        "(default: replay on a GPU with --backend triton)")
    p.add_argument("--backend", choices=("triton", "torch"), default="triton",
                   help="'triton': the course's kernels; 'torch': the PyTorch reference (qwen_lab.reference) "
                        "(default: %(default)s)")
    p.add_argument("--device", default=None,
                   help="a torch device such as 'cuda', 'cuda:1' or 'cpu' (default: the GPU when there is one, "
                        "else the CPU)")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"),
                   help="the model's dtype (default: bf16 on a GPU, fp16 below compute capability 8.0, fp32 on "
                        "a CPU)")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)

    import time

    from . import load_model, load_tokenizer, runtime
    from .errors import QwenLabError

    printed = False  # the prompt is on stdout: an error must start on a line of its own
    bar = None
    try:
        check_sampling_args(args.max_new_tokens, args.temperature, args.top_k, args.top_p)
        check_seed(args.seed)
        if args.backend == "triton":
            print(runtime.choose(args.device, args.dtype).reason, file=sys.stderr)
        tok = load_tokenizer(args.model)  # first: a snapshot without its tokenizer fails before its weights load
        model = load_model(args.model, device=args.device, dtype=args.dtype, backend=args.backend)
        text = args.prompt
        if args.chat:
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = tok.encode(text)
        # the ids of both generation_config.json (the tokenizer's) and config.json (the model's), as generate()
        # stops by default
        eos = list(dict.fromkeys([*tok.eos_token_ids, *model.config.eos_token_ids]))
        decoder = tok.stream_decoder()
        limit = model.config.max_position_embeddings
        if len(ids) + args.max_new_tokens > limit:
            raise GenerationError(f"--max-new-tokens {args.max_new_tokens}: the prompt ({len(ids)} tokens) + "
                                  f"{args.max_new_tokens} new tokens exceed the model's max_position_embeddings="
                                  f"{limit}")
        # On a GPU the first run compiles and tunes every kernel: a progress line on stderr until the first token,
        # then the prompt and the stream (printed after the line is cleared, so that it does not overwrite them).
        bar = status_line(model)

        def show_prompt():
            nonlocal printed
            if not printed:
                if bar is not None:
                    bar.close()
                print(text, end="", flush=True)
                printed = True

        def on_token(t):
            show_prompt()
            print(decoder.push(t), end="", flush=True)
        t0 = time.perf_counter()
        new = generate(model, torch.tensor(ids), max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                       cuda_graph=False if args.no_cuda_graph else None, eos_token_ids=eos,
                       stream=on_token, status=bar.set_postfix_str if bar is not None else None)
        show_prompt()  # no new token at all (--max-new-tokens 0)
        dt = time.perf_counter() - t0
        print(decoder.flush(), file=sys.stdout)
        print(f"[{len(new)} tokens in {dt:.2f} s, {len(new) / max(dt, 1e-9):.1f} tokens/s, {model}]", file=sys.stderr)
    except QwenLabError as e:
        if bar is not None:
            bar.close()
        if printed:
            print(flush=True)
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


class _CallableModule(types.ModuleType):
    """`qwen_lab.generate` is both this module (for `python -m qwen_lab.generate`) and the function generate():
    once the submodule is imported, the package attribute of that name is the module, so the module forwards
    calls to the function."""

    def __call__(self, *args, **kwargs):
        return generate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    sys.exit(main())
