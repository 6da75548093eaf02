"""The int32 counters that DeltaNet launches share on a device: the fused decode step's tickets (which program of a
key head writes its shifted conv state, recurrent.py) and the chunk scan's `ready` counts (how many chunks of a
group the prep has published, chunk_scan.py). Every launch leaves them at zero."""

from __future__ import annotations

import torch

from ...errors import KernelError
from .. import device_key


_TICKETS: dict = {}  # device -> int32 counters (conv_decode_step_kernel, chunk_scan_kernel), zero between launches
_TICKETS_KEPT: list = []  # buffers outgrown, which a captured graph may still read


def _tickets(device, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters on `device`, allocated once (each launch leaves them at zero again): the
    tickets of the fused decode step and the chunk scan's `ready` counters, which never run at the same time.

    Allocated on the first call, which must not be inside a CUDA Graph capture: memory allocated there would
    belong to the graph's pool (graph.capture warms every kernel up outside the capture first). A longer prompt
    may need a bigger buffer later; the smaller one is kept, since a captured graph may still use it. The
    counters are shared by every launch on the device, so two DeltaNet layers must not run concurrently on two
    streams.
    """
    key = device_key(device)
    buf = _TICKETS.get(key)
    if buf is None or buf.numel() < n:
        if key.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelError("deltanet: its counters are allocated on the first call of a length, which must come "
                              "before CUDA Graph capture (run the call once to warm it up)")
        if buf is not None:
            _TICKETS_KEPT.append(buf)
        # never an inference tensor (as one made by a first call under torch.inference_mode() would be): the scan's
        # autotuner restores the counters with copy_, which PyTorch refuses on such a tensor outside that mode
        with torch.inference_mode(False):
            buf = _TICKETS[key] = torch.zeros(max(n, 4096), dtype=torch.int32, device=key)
    return buf
