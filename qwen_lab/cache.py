"""Everything a sequence carries from one step to the next, allocated once.

- gated attention layers: a KV cache, key[i] and value[i] of shape [max_len, Hkv, D] in the model dtype;
- Gated DeltaNet layers: conv_state[i] [conv_dim, W-1] (the last W-1 conv *inputs*, oldest first, model
  dtype) and recurrent_state[i] [Hv, Dk, Dv] in float32 (a bf16 state drifts).

Lists are indexed by layer number; entries of the other layer kind are None. Nothing here is ever
reallocated, so a CUDA Graph can capture steps that read and write these buffers.
"""

from __future__ import annotations

import operator

import torch

from .config import FULL, LINEAR, Qwen35Config
from .errors import GenerationError


class Cache:
    def __init__(self, config: Qwen35Config, max_len: int, device, dtype):
        try:
            n_pos = None if isinstance(max_len, bool) else operator.index(max_len)
        except TypeError:
            n_pos = None
        if n_pos is None or n_pos <= 0:
            raise GenerationError(f"max_len={max_len!r}; expected a positive integer number of cached positions")
        c = config
        self.config, self.max_len = c, n_pos
        n = c.num_hidden_layers
        self.key: list[torch.Tensor | None] = [None] * n
        self.value: list[torch.Tensor | None] = [None] * n
        self.conv_state: list[torch.Tensor | None] = [None] * n
        self.recurrent_state: list[torch.Tensor | None] = [None] * n
        for i, kind in enumerate(c.layer_types):
            if kind == FULL:
                shape = (self.max_len, c.num_key_value_heads, c.head_dim)
                self.key[i] = torch.zeros(shape, device=device, dtype=dtype)
                self.value[i] = torch.zeros(shape, device=device, dtype=dtype)
            elif kind == LINEAR:
                self.conv_state[i] = torch.zeros(c.linear_conv_dim, c.linear_conv_kernel_dim - 1,
                                                 device=device, dtype=dtype)
                self.recurrent_state[i] = torch.zeros(c.linear_num_value_heads, c.linear_key_head_dim,
                                                      c.linear_value_head_dim, device=device, dtype=torch.float32)

    def reset(self) -> None:
        """Start a new sequence: zero the states in place (the KV cache needs no clearing: attention only reads
        positions that were written for this sequence)."""
        for t in self.conv_state + self.recurrent_state:
            if t is not None:
                t.zero_()

    def tensors(self):
        return [t for group in (self.key, self.value, self.conv_state, self.recurrent_state) for t in group
                if t is not None]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def __repr__(self) -> str:
        return f"Cache(max_len={self.max_len}, {self.nbytes() / 2**20:.1f} MiB)"
