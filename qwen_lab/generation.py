"""Generation: the prefill, the decode steps, the loop, and the command line `python -m qwen_lab.generate`.

    prefill:      token = sample(step(prompt, positions 0..T-1, cache))      (chunked delta rule, flash attention)
    decode_step:  token = sample(step(token, position, cache)), position += 1
    decode_loop:  decode steps until EOS or the budget

The steps run the model's fast route (qwen_lab.plan). With cuda_graph (the default with the Triton backend on a
GPU) each decode step is one replay of a captured step that also samples (qwen_lab.graph.DecodeGraph). Sampling
draws its uniform number on the device from a seeded generator, so a run is reproducible and the loop needs no host
synchronisation except to look at the token (EOS, streaming).
"""

from __future__ import annotations

import argparse
import math
import numbers
import operator
import sys
from typing import Callable, NamedTuple

import torch

from .errors import GenerationError
from .graph import DecodeGraph, sampler
from .plan import fast_plan


class Args(NamedTuple):
    """generate()'s arguments after check_args."""
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    cuda_graph: bool | None
    max_len: int | None
    eos_token_ids: list[int] | None


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


def check_length(T: int, max_new_tokens: int, max_len, limit: int, flag: str | None = None) -> int:
    """The cache's capacity for a prompt of T tokens and max_new_tokens more (max_len: the caller's capacity, None
    for just enough), against the model's max_position_embeddings `limit`. `flag`: the command line's name of
    max_new_tokens, for its message."""
    if max_len is None:
        if T + max_new_tokens > limit:
            if flag is not None:
                raise GenerationError(f"{flag} {max_new_tokens}: the prompt ({T} tokens) + {max_new_tokens} new "
                                      f"tokens exceed the model's max_position_embeddings={limit}")
            raise GenerationError(f"the prompt ({T} tokens) + max_new_tokens ({max_new_tokens}) = "
                                  f"{T + max_new_tokens} exceeds the model's max_position_embeddings={limit}")
        return T + max_new_tokens
    if T > max_len:
        raise GenerationError(f"the prompt has {T} tokens but the cache holds max_len={max_len}; "
                              f"shorten the prompt or raise max_len")
    if T + max_new_tokens > max_len:
        raise GenerationError(f"prompt ({T}) + max_new_tokens ({max_new_tokens}) = {T + max_new_tokens} exceeds "
                              f"the cache's max_len={max_len}")
    if max_len > limit:
        raise GenerationError(f"max_len={max_len} exceeds the model's max_position_embeddings={limit}")
    return max_len


def check_args(max_new_tokens, temperature, top_k, top_p, seed, cuda_graph=None, max_len=None, eos_token_ids=None,
               stream=None, status=None) -> Args:
    """Every argument of generate() but the model and the prompt, checked once, for the API and the command line
    alike: -> Args of plain Python values; GenerationError naming the first bad one."""
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
    return Args(max_new_tokens, temperature, top_k, top_p, int(seed), cuda_graph, max_len, eos_token_ids)


# ---------------------------------------------------------------- the seams: prefill, decode_step, decode_loop
def prefill(runner, ids: torch.Tensor, cache, draw, sampling: tuple, uniform: torch.Tensor) -> torch.Tensor:
    """The prompt's step (ids [T] at positions 0 .. T-1) and the first new token, drawn on the device -> [1].

    Launched eagerly: it runs once per call, and capturing it (graph.PrefillGraphs) costs a warm-up step and a
    capture per bucket size, more than the launches it would save."""
    logits = runner.step(ids, torch.arange(ids.numel(), device=ids.device), cache)[-1]
    return draw(logits, *sampling, uniform).reshape(1)


def decode_step(runner, token: torch.Tensor, position: torch.Tensor, cache, draw, sampling: tuple,
                uniform: torch.Tensor) -> torch.Tensor:
    """One decode step launched from Python: the token at `position` (advanced in place) -> the next token [1]."""
    logits = runner.step(token, position, cache)[-1]
    position += 1
    return draw(logits, *sampling, uniform).reshape(1)


def decode_loop(next_token: Callable[[int, torch.Tensor], torch.Tensor], token: torch.Tensor, max_new_tokens: int,
                eos: set, stream: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """The new tokens from the first one (`token`): `next_token(n, token)` makes token n + 1 from token n (a graph
    replay or a decode_step) until the budget or an EOS token (included). The one host synchronisation per token is
    the look at it, and only where EOS or streaming needs it."""
    out: list[torch.Tensor] = []
    for n in range(max_new_tokens):
        out.append(token)
        if stream is not None or eos:
            tok = int(token)
            if stream is not None:
                stream(tok)
            if tok in eos:
                break
        if n + 1 < max_new_tokens:
            token = next_token(n, token)
    return out


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
    replay each decode step from a captured step (DecodeGraph). The model runs its fast route (qwen_lab.plan).
    """
    if not all(hasattr(model, attr) for attr in ("check_ids", "step", "new_cache", "config")):
        raise GenerationError(f"model={model!r}; expected a model from qwen_lab.load_model() (a Qwen35Model), "
                              f"not a {type(model).__name__}")
    a = check_args(max_new_tokens, temperature, top_k, top_p, seed, cuda_graph, max_len, eos_token_ids, stream,
                   status)
    ids = model.check_ids(input_ids)
    T = ids.numel()
    capacity = check_length(T, a.max_new_tokens, a.max_len, model.config.max_position_embeddings)
    eos = set(model.config.eos_token_ids if a.eos_token_ids is None else a.eos_token_ids)
    use_graph = a.cuda_graph
    if use_graph is None:
        use_graph = model.device.type == "cuda" and model.backend == "triton"
    if use_graph and model.device.type != "cuda":
        raise GenerationError("cuda_graph=True needs the model on a CUDA GPU; this model is on "
                              f"{model.device}")
    if a.max_new_tokens == 0:
        return torch.empty(0, dtype=torch.long)

    runner = fast_plan(model)
    device, sampling = model.device, (a.temperature, a.top_k, a.top_p)
    rng = torch.Generator(device=device).manual_seed(a.seed)
    # one uniform number per new token, drawn once; two more for the graph's warm-up steps, which also draw
    uniforms = torch.rand(a.max_new_tokens + 2, generator=rng, device=device)
    cache = runner.new_cache(capacity)
    graph = None
    # without a `status` of the caller's, a progress line of its own where the warm-up is long (a notebook's first
    # generate() on a GPU compiles and tunes every kernel for a minute or more), gone once the first token is drawn
    line = status_line(model) if status is None else None
    say = status or (line.set_postfix_str if line is not None else (lambda phase: None))
    try:
        if use_graph:  # captured before the prefill: its warm-up writes the cache, which it then resets
            say("capturing the decode step (its warm-up compiles and tunes the decode kernels on their first run)")
            graph = DecodeGraph(runner, cache, *sampling, uniforms)
        # one scratch for every draw of this generation: the graph's own where there is one (the prompt's draw runs
        # before the first replay, on the same stream, so the two never overlap)
        draw = graph.draw if graph is not None else sampler(runner)
        say(f"prefill of {T} tokens")
        token = prefill(runner, ids, cache, draw, sampling, uniforms[0])
    finally:
        if line is not None:
            line.close()
    if graph is not None:
        graph.prime(token, T, 1)

        def next_token(n, token):
            return graph.replay().clone()
    else:
        position = torch.tensor([T], device=device)

        def next_token(n, token):
            return decode_step(runner, token, position, cache, draw, sampling, uniforms[n + 1])
    tokens = decode_loop(next_token, token, a.max_new_tokens, eos, stream)
    if graph is not None:
        graph.check()   # the persistent step's bounded waits: an error instead of tokens from a broken step
    return torch.cat(tokens).cpu()


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
    p.add_argument("--model", default="tiny-english", metavar="SOURCE",
                   help="snapshot directory, preset ('tiny-english': trained on English prose; 'tiny': random "
                        "weights; 'qwen3.5-0.8b') or hub id (default: %(default)s)")
    p.add_argument("--prompt", default="The GPU reads every weight once per token, so", metavar="TEXT",
                   help="the text to continue (default: '%(default)s')")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the snapshot's chat template as a user message (default: off)")
    p.add_argument("--max-new-tokens", type=int, default=32, metavar="N",
                   help="stop after N new tokens, or earlier at an end-of-sequence token; on a CPU (the Triton "
                        "interpreter) each token of the tiny-english model takes about a second, of the real shapes "
                        "far longer (default: %(default)s)")
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
        cuda_graph = False if args.no_cuda_graph else None
        check_args(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.seed, cuda_graph)
        rt = runtime.choose(args.device, args.dtype)   # once: the model is built on it
        if args.backend == "triton":
            print(rt.reason, file=sys.stderr)
        tok = load_tokenizer(args.model)  # first: a snapshot without its tokenizer fails before its weights load
        model = load_model(args.model, backend=args.backend, rt=rt)
        text = args.prompt
        if args.chat:
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = tok.encode(text)
        # the ids of both generation_config.json (the tokenizer's) and config.json (the model's), as generate()
        # stops by default
        eos = list(dict.fromkeys([*tok.eos_token_ids, *model.config.eos_token_ids]))
        decoder = tok.stream_decoder()
        check_length(len(ids), args.max_new_tokens, None, model.config.max_position_embeddings, "--max-new-tokens")
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
                       cuda_graph=cuda_graph, eos_token_ids=eos,
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


if __name__ == "__main__":
    sys.exit(main())
