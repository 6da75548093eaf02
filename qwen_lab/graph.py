"""CUDA Graph capture and replay of the decode step and of the prefill.

A decode step launches about 130 small kernels (129 for Qwen3.5-0.8B, and the sampler's); from Python each
launch costs 11-16 us on the H200, more than most of these kernels run. A CUDA Graph records the whole step
once and replays it with one call: the GPU then starts the kernels back to back, with no host between them. The
four steps:

1. static buffers: the input token, its position, the uniform number for sampling, the logits and every
   scratch tensor live at fixed addresses (the cache is already preallocated);
2. warm-up on a side stream, so Triton compiles (and autotunes) every kernel before capture;
3. capture `step(token, position) -> sample -> next token` into the graph;
4. replay: each replay reads the token the previous replay wrote, samples the next one on the device and
   advances the position, so the host only launches the graph (and reads the token when it must).

What breaks capture, and what this module says when it does (the three classic errors):
- a host synchronisation (`.item()`, `.cpu()`, `print(tensor)`, `torch.cuda.synchronize()`) inside the step;
- an allocation whose address changes, or a shape that changes between replays (shapes are frozen);
- kernels launched on another stream than the capture stream (warm-up must happen on a side stream first).

The prefill, in buckets. A graph freezes shapes, and a prompt can have any length T. The prefill is therefore
split greedily into pieces whose lengths come from a fixed set of buckets, largest first:

    PREFILL_BUCKETS = (2048, 1024, 256, 64, 16, 4, 1)
# The GPUs (a part of their name) whose decode is faster with the persistent step than with the plan's kernels, as
# benchmarks/bench_persistent.py measured it (docs/performance.md); the switch persistent_decode overrides this.
PERSISTENT_FASTER_ON: tuple[str, ...] = ()
    77 -> 64 + 4 + 4 + 4 + 1,   2048 -> 2048,   3000 -> 2048 + 256 + 256 + 256 + 64 + 64 + 16 + 16 + 16 + 4 + 4

and each bucket size s has one captured step `model.step(ids[:s], positions[:s], cache)` reading its token ids
and positions from static device buffers, writing the logits of its last position into one shared static
buffer. The pieces run one after another at increasing positions, and that equals one prefill of the whole
prompt, with no padding and no mask:
- the kernels read the positions from device memory, so a piece at positions p .. p+s-1 is an ordinary step;
- attention writes the piece's keys and values into the KV cache and reads all earlier ones from it;
- the causal convolution carries its last W-1 inputs in the conv state, the delta rule its state matrix, from
  one piece to the next, exactly as they carry them from the prefill to the first decode step.
Padding a prompt up to one bucket and masking the padding, the usual way to serve many lengths from a few
graphs, would be wrong here: attention can mask padded keys, but the Gated DeltaNet has no mask, and padded
tokens would enter its conv state and its recurrent state. With at most a few pieces per bucket size, the
number of replays stays small (77 tokens: five replays, 2048: one).

All the bucket graphs share one memory pool: they never run at the same time and hand each other nothing but
the cache and the logits buffer, which live outside the pool, so their scratch tensors can share memory.
"""

from __future__ import annotations

import inspect

import torch

from .errors import GenerationError, QwenLabError
from .kernels.persistent import PersistentDecode
from .plan import fast_plan
from .switches import switches

PREFILL_BUCKETS = (2048, 1024, 256, 64, 16, 4, 1)
# The GPUs (a part of their name) whose decode is faster with the persistent step than with the plan's kernels, as
# benchmarks/bench_persistent.py measured it (docs/performance.md); the switch persistent_decode overrides this.
PERSISTENT_FASTER_ON: tuple[str, ...] = ()

LIKELY_CAUSES = (
    "Likely causes: (1) a host synchronisation inside the captured step (.item(), .cpu(), .tolist(), print of a "
    "CUDA tensor, torch.cuda.synchronize()); (2) an operation whose shape or allocation changes between calls "
    "(capture freezes shapes and addresses); (3) work on a stream other than the capture stream, or kernels that "
    "were never warmed up (Triton compiles on first call, which cannot happen during capture)."
)


class GraphCaptureError(QwenLabError, RuntimeError):
    """Capturing a CUDA Graph failed; the message says why it most likely did."""


def capture(fn, warmup: int = 2, pool=None):
    """Warm `fn` up on a side stream, then capture it. Returns (graph, fn's output during capture).

    warmup: calls before capture (Triton compiles and autotunes on the first call; one is enough once every
    kernel is compiled). pool: a `torch.cuda.graph_pool_handle()` shared with other graphs that never run
    concurrently with this one (None: a private pool).
    """
    if not torch.cuda.is_available():
        raise GraphCaptureError("CUDA Graphs need an NVIDIA GPU; this machine has none")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph, pool=pool):
            out = fn()
    except Exception as e:  # torch reports capture failures as RuntimeError/AcceleratorError with terse text
        raise GraphCaptureError(f"capture failed: {type(e).__name__}: {e}\n{LIKELY_CAUSES}") from e
    return graph, out


def prefill_pieces(T: int, buckets=PREFILL_BUCKETS) -> list[int]:
    """Split a prompt of T tokens greedily into bucket sizes, largest first: 77 -> [64, 4, 4, 4, 1].

    The pieces sum to T; the bucket 1 (required) makes every T reachable.
    """
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise GenerationError(f"T={T!r}; expected the prompt length, an integer >= 1")
    sizes = _check_buckets(buckets)
    pieces, left = [], T
    for s in sizes:
        n, left = divmod(left, s)
        pieces += [s] * n
    return pieces


def buckets_used(*lengths: int, buckets=PREFILL_BUCKETS) -> tuple[int, ...]:
    """The bucket sizes that prompts of these lengths are split into, and the bucket 1, largest first.

    Capturing only these (`PrefillGraphs(model, cache, buckets=buckets_used(2048))`, here (2048, 1)) serves those
    lengths in the same pieces as every bucket would: the greedy split never takes a size it skipped. Each bucket's
    warm-up compiles and tunes the kernels for its length, minutes on a fresh GPU for the whole set.
    """
    sizes = {1}
    for T in lengths:
        sizes.update(prefill_pieces(T, buckets))
    return tuple(sorted(sizes, reverse=True))


def _check_buckets(buckets) -> list[int]:
    """The bucket sizes, validated, distinct and largest first."""
    try:
        sizes = list(buckets)
    except TypeError:
        raise GenerationError(f"buckets={buckets!r}; expected a sequence of positive integers") from None
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise GenerationError(f"buckets={tuple(sizes)!r}; expected a non-empty sequence of positive integers")
    if 1 not in sizes:
        raise GenerationError(f"buckets={tuple(sizes)!r}; expected the bucket 1 among them, so that every prompt "
                              f"length splits into buckets")
    return sorted(set(sizes), reverse=True)


class PrefillGraphs:
    """The prefill of `model` into `cache` as CUDA Graphs, one per bucket size, for prompts of any length.

    Captured at construction (before any real prefill: the warm-up runs each step for real and writes the
    cache, which is reset afterwards unless `reset_cache=False`). Buckets larger than the cache, or than
    `max_len` (the longest prompt expected; default the cache's capacity), are not captured: longer prompts
    still run, in more pieces. `run(ids, start)` prefills ids at positions start .. start+T-1 and returns the
    static logits buffer [1, V] of the last position (read or clone it before the next run).
    """

    def __init__(self, model, cache, buckets=PREFILL_BUCKETS, max_len: int | None = None, *,
                 warmup: int = 1, reset_cache: bool = True):
        sizes = _check_buckets(buckets)
        if model.device.type != "cuda" or not torch.cuda.is_available():
            raise GraphCaptureError(f"CUDA Graphs need the model on an NVIDIA GPU; this model is on {model.device}")
        if max_len is not None and (isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1):
            raise GenerationError(f"max_len={max_len!r}; expected None or an integer >= 1")
        limit = cache.max_len if max_len is None else min(int(max_len), cache.max_len)
        self.buckets = tuple(s for s in sizes if s <= limit)           # never empty: 1 <= limit
        self.model, self.cache = model, cache
        plan = fast_plan(model)
        dev = model.device
        n = self.buckets[0]
        self.ids = torch.zeros(n, dtype=torch.long, device=dev)       # the piece's token ids (first s entries)
        self.positions = torch.arange(n, device=dev)                   # the piece's positions (first s entries)
        self._arange = torch.arange(n, device=dev)                     # 0 .. n-1, to build positions on the device
        self.logits = torch.empty(1, model.config.vocab_size, dtype=model.dtype, device=dev)
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        for s in self.buckets:  # largest first: the later, smaller captures reuse the pool's free blocks
            def body(s=s):
                return plan.step(self.ids[:s], self.positions[:s], cache, logits_out=self.logits)
            self.graphs[s], _ = capture(body, warmup=warmup, pool=self.pool)
        if reset_cache:
            cache.reset()

    def pieces(self, T: int) -> list[int]:
        """The bucket sizes a prompt of T tokens is replayed as."""
        return prefill_pieces(T, self.buckets)

    def run(self, ids: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Prefill ids (LongTensor [T] on the model's device) at positions start .. start+T-1, piece by piece.

        Only device work: per piece, a copy of its ids, its positions (start + offset + arange(s)) and one
        replay. Returns the static logits [1, V] of the last position.
        """
        if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.dtype != torch.long:
            raise GenerationError(f"ids: expected a LongTensor [T], got "
                                  f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}"
                                  f"{'' if not isinstance(ids, torch.Tensor) else ' ' + str(ids.dtype)}")
        if ids.device != self.ids.device:
            raise GenerationError(f"ids: expected a tensor on {self.ids.device}, got one on {ids.device}")
        T = ids.numel()
        if T == 0:
            raise GenerationError("ids: the prompt is empty; expected at least one token id")
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise GenerationError(f"start={start!r}; expected an integer >= 0")
        if start + T > self.cache.max_len:
            raise GenerationError(f"the prompt has {T} tokens from position {start}, but the cache holds "
                                  f"max_len={self.cache.max_len} positions; shorten the prompt or use a larger cache")
        offset = start
        for s in self.pieces(T):
            self.ids[:s].copy_(ids[offset - start:offset - start + s])
            torch.add(self._arange[:s], offset, out=self.positions[:s])
            self.graphs[s].replay()
            offset += s
        return self.logits


def sampler(model):
    """`model.ops["sample"]` as draw(logits, temperature, top_k, top_p, uniform, out=None), its scratch allocated once.

    The course's kernel (kernels/sampling/) takes a `workspace`; without one it allocates its scratch and clears
    a counter on every call, which inside a captured step is a memset replayed with every token, and in an eager
    loop an allocation per token. Here one workspace serves every draw of the generation. A sampler without that
    argument (the reference, a learner's own) is called as it is, and one without `out` has its result copied
    there.
    """
    sample = model.ops["sample"]
    params = inspect.signature(sample).parameters
    extra = {}
    if "workspace" in params:
        from .kernels import sampling

        extra["workspace"] = sampling.sampling_workspace(model.config.vocab_size, model.device)
    in_place = "out" in params

    def draw(logits, temperature, top_k, top_p, uniform, out=None):
        if out is not None and in_place:
            return sample(logits, temperature, top_k, top_p, uniform, out=out, **extra)
        token = sample(logits, temperature, top_k, top_p, uniform, **extra)
        return token if out is None else out.copy_(token.reshape(out.shape))

    return draw


def use_persistent(device: torch.device, choice: bool | None = None) -> bool:
    """Whether a decode graph on `device` replays the persistent step: `choice` (the switch persistent_decode by
    default) when set, else whether the GPU is one it measured faster on (PERSISTENT_FASTER_ON). Never on a CPU."""
    if device.type != "cuda":
        return False
    choice = switches.persistent_decode if choice is None else choice
    if choice is not None:
        return bool(choice)
    name = torch.cuda.get_device_name(device)
    return any(part in name for part in PERSISTENT_FASTER_ON)


class DecodeGraph:
    """One decode step of `model` over `cache`, sampling included, captured once and replayed per token.

    The graph must be built before the prefill: warm-up runs the step for real, which writes the cache, so
    the cache is reset afterwards (`reset_cache=False` leaves that to a caller who captures more graphs). Then
    `prime(token, position, counter)` after the prefill (counter: the index of the next uniform, 1 after the
    prompt's draw) and `replay()` per token.

    persistent: the step as one persistent launch (qwen_lab.kernels.persistent: it picks the greedy token and
    advances the position itself; with temperature > 0 the sampler then draws from its logits instead), or the
    plan's kernels; None: `use_persistent`. `check()` raises if a wait of the persistent step ran out (a host sync:
    once, after the last replay).
    """

    def __init__(self, model, cache, temperature: float, top_k: int, top_p: float, uniforms: torch.Tensor, *,
                 reset_cache: bool = True, persistent: bool | None = None):
        dev = model.device
        self.model, self.cache = model, cache
        plan = fast_plan(model)
        self.persistent = use_persistent(dev, persistent)
        self.step = PersistentDecode(plan.model, cache) if self.persistent else None
        if self.step is not None:   # its own buffers: the kernel reads the token and position there
            self.token, self.position = self.step.token, self.step.position
        else:
            self.token = torch.zeros(1, dtype=torch.long, device=dev)     # in: the last token; out: the next one
            self.position = torch.zeros(1, dtype=torch.long, device=dev)  # position of self.token
        self.counter = torch.zeros(1, dtype=torch.long, device=dev)   # which uniform number to use
        self.uniform = torch.zeros(1, dtype=torch.float32, device=dev)
        self.uniforms = uniforms                                       # [n] drawn once per generation
        self.sampling = (temperature, top_k, top_p)
        self.logits = None

        # The sampler's scratch is allocated here, before the capture, so the graph records only kernels. The graph
        # keeps the addresses, not the tensors: this object holds them for as long as the graph may be replayed
        # (freed, their memory would go to the next allocation, and every replay would write over it).
        self.draw = sampler(model)

        def body():
            if self.step is not None:
                logits = self.step.step(check=False)[-1]     # the greedy token and position + 1 written already
            else:
                logits = plan.step(self.token, self.position, cache)[-1]
            if self.step is None or temperature > 0:
                torch.index_select(self.uniforms, 0, self.counter, out=self.uniform)
                self.draw(logits, *self.sampling, self.uniform[0], out=self.token[0])
            if self.step is None:
                self.position.add_(1)
            self.counter.add_(1)
            return logits

        self.graph, self.logits = capture(body)
        if reset_cache:
            cache.reset()
        if self.step is not None:
            self.step.reset()   # the warm-up's steps advanced the counters' epoch

    def prime(self, token: torch.Tensor, position: int, counter: int) -> None:
        """Set the static inputs: the token just sampled, its position, and the index of the next uniform."""
        self.token.copy_(token.reshape(1))
        self.position.fill_(position)
        self.counter.fill_(counter)

    def replay(self) -> torch.Tensor:
        """One decode step: returns the static tensor holding the next token (read or clone it before the next
        replay overwrites it)."""
        self.graph.replay()
        return self.token

    def check(self) -> None:
        """Raise if a wait of the persistent step gave up (reads its error records: a host sync); else nothing."""
        if self.step is not None:
            self.step.check()
