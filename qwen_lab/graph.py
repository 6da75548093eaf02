"""CUDA Graph capture and replay of the decode step.

A decode step launches a couple of hundred small kernels; from Python each launch costs 11-16 us on the
H200, more than most of these kernels run. A CUDA Graph records the whole step once and replays it with
one call, at about 1 us per kernel. The four steps:

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
"""

from __future__ import annotations

import inspect

import torch

from .errors import QwenLabError

LIKELY_CAUSES = (
    "Likely causes: (1) a host synchronisation inside the captured step (.item(), .cpu(), .tolist(), print of a "
    "CUDA tensor, torch.cuda.synchronize()); (2) an operation whose shape or allocation changes between calls "
    "(capture freezes shapes and addresses); (3) work on a stream other than the capture stream, or kernels that "
    "were never warmed up (Triton compiles on first call, which cannot happen during capture)."
)


class GraphCaptureError(QwenLabError, RuntimeError):
    """Capturing a CUDA Graph failed; the message says why it most likely did."""


def capture(fn, warmup: int = 2):
    """Warm `fn` up on a side stream, then capture it. Returns (graph, fn's output during capture)."""
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
        with torch.cuda.graph(graph):
            out = fn()
    except Exception as e:  # torch reports capture failures as RuntimeError/AcceleratorError with terse text
        raise GraphCaptureError(f"capture failed: {type(e).__name__}: {e}\n{LIKELY_CAUSES}") from e
    return graph, out


class DecodeGraph:
    """One decode step of `model` over `cache`, sampling included, captured once and replayed per token.

    The graph must be built before the prefill: warm-up runs the step for real, which writes the cache, so
    the cache is reset afterwards. Then `prime(token, position)` after the prefill and `replay()` per token.
    """

    def __init__(self, model, cache, temperature: float, top_k: int, top_p: float, uniforms: torch.Tensor):
        dev = model.device
        self.model, self.cache = model, cache
        self.token = torch.zeros(1, dtype=torch.long, device=dev)     # in: the last token; out: the next one
        self.position = torch.zeros(1, dtype=torch.long, device=dev)  # position of self.token
        self.counter = torch.zeros(1, dtype=torch.long, device=dev)   # which uniform number to use
        self.uniform = torch.zeros(1, dtype=torch.float32, device=dev)
        self.uniforms = uniforms                                       # [n] drawn once per generation
        self.sampling = (temperature, top_k, top_p)
        self.logits = None

        sample = model.ops["sample"]
        writes_in_place = "out" in inspect.signature(sample).parameters

        def body():
            logits = model.step(self.token, self.position, cache)[-1]
            torch.index_select(self.uniforms, 0, self.counter, out=self.uniform)
            if writes_in_place:
                sample(logits, *self.sampling, self.uniform[0], out=self.token[0])
            else:
                self.token.copy_(sample(logits, *self.sampling, self.uniform[0]).reshape(1))
            self.position.add_(1)
            self.counter.add_(1)
            return logits

        self.graph, self.logits = capture(body)
        cache.reset()

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
