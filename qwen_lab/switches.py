"""Every switch of the engine, in one place: `from qwen_lab.switches import switches`.

A switch is read where it acts, at each call, so a script or a test can flip it between two steps. Its value comes,
first found: from `switches.set(...)` (a `with` block), from its environment variable (1, true, yes or on turn it
on, any other value off), from its default.

| switch | environment | default | what it does |
| --- | --- | --- | --- |
| deterministic | QWEN_LAB_DETERMINISTIC | off | split-K sums added in a fixed order: bitwise repeatable |
| tune | QWEN_LAB_TUNE | on | time the decode plans on a shape's first call (off: the first that fits) |
| tuning_cache | QWEN_LAB_TUNING_CACHE | on | keep the picks on disk for later processes (qwen_lab.tunings) |
| pdl | QWEN_LAB_PDL | on | programmatic dependent launch on Hopper and newer |
| gemv_persist | QWEN_LAB_GEMV_PERSIST | on | offer the persistent decode GEMV to the plan timing |
| tma | QWEN_LAB_TMA | on | offer the prefill GEMM's TMA tiles to its autotuner |
| attn_tma | QWEN_LAB_ATTN_TMA | off | offer the prefill flash attention's TMA tiles to its autotuner |
| split_norms | QWEN_LAB_SPLIT_NORMS | off | a prompt's add + norm split between the GEMMs around it (plan) |
| persistent_decode | QWEN_LAB_PERSISTENT_DECODE | where faster | the decode graph replays the persistent step, one launch per token (kernels/persistent); unset: on the GPUs where it measured faster (graph.PERSISTENT_FASTER_ON) |
| decode_prefetch | - | on | decode attention asks L2 for its keys and values before it waits |
| gate_apart_from_tokens | - | 64 | from this many query tokens the attention's gate is a pass of its own |
| scan_group | - | 8 | chunks per counter of the DeltaNet scan beside its prep |
| scan_beside_prep | - | on | under PDL the DeltaNet scan starts beside the chunk prep (off: after) |
| prep_persistent | - | on | the chunk prep as a fixed set of programs (an int: that many) |

One way to force a kernel's configuration, for a timing script or a test: `with switches.force_config(
"chunk_scan_kernel", triton.Config({"BV": 32}, num_warps=4)): ...`. Every launch of that kernel inside the block
uses it instead of the tuner's pick.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

from .errors import ConfigError


def env_on(name: str, default: bool) -> bool:
    """Whether the environment variable `name` is on: 1, true, yes or on (any case) turn it on, any other value off;
    unset, `default`."""
    value = os.environ.get(name)
    return default if value is None else value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Switch:
    env: str | None     # its environment variable (None: set in code only)
    default: object


SWITCHES = {
    "deterministic": Switch("QWEN_LAB_DETERMINISTIC", False),
    "tune": Switch("QWEN_LAB_TUNE", True),
    "tuning_cache": Switch("QWEN_LAB_TUNING_CACHE", True),
    "pdl": Switch("QWEN_LAB_PDL", True),
    "gemv_persist": Switch("QWEN_LAB_GEMV_PERSIST", True),
    "tma": Switch("QWEN_LAB_TMA", True),
    "attn_tma": Switch("QWEN_LAB_ATTN_TMA", False),
    "split_norms": Switch("QWEN_LAB_SPLIT_NORMS", False),
    "persistent_decode": Switch("QWEN_LAB_PERSISTENT_DECODE", None),   # None: where it measured faster
    "decode_prefetch": Switch(None, True),
    "gate_apart_from_tokens": Switch(None, 64),
    "scan_group": Switch(None, 8),
    "scan_beside_prep": Switch(None, True),
    "prep_persistent": Switch(None, True),
}


class Switches:
    """The engine's switches as attributes (`switches.deterministic`), read at each call; `set` and `force_config`
    change them for a `with` block."""

    def __init__(self):
        object.__setattr__(self, "_values", {})   # name -> value set in code (over the environment)
        object.__setattr__(self, "_forced", {})   # kernel name -> the config every launch of it uses
        object.__setattr__(self, "_lock", threading.Lock())

    def __getattr__(self, name: str):
        switch = SWITCHES.get(name)
        if switch is None:
            raise AttributeError(f"switches.{name}: no such switch; expected one of {', '.join(SWITCHES)}")
        if name in self._values:
            return self._values[name]
        if switch.env is not None:
            return env_on(switch.env, switch.default)
        return switch.default

    def __setattr__(self, name: str, value) -> None:
        raise ConfigError(f"switches.{name} = {value!r}: set switches with `with switches.set({name}=...)`, or "
                          f"through the environment")

    @contextlib.contextmanager
    def set(self, **values):
        """The switches given set to these values for the `with` block (None: back to the environment's value)."""
        for name in values:
            if name not in SWITCHES:
                raise ConfigError(f"switches.set({name}=...): no such switch; expected one of {', '.join(SWITCHES)}")
        with self._lock:
            saved = {name: self._values.get(name, _UNSET) for name in values}
            for name, value in values.items():
                if value is None:
                    self._values.pop(name, None)
                else:
                    self._values[name] = value
        try:
            yield self
        finally:
            with self._lock:
                for name, value in saved.items():
                    if value is _UNSET:
                        self._values.pop(name, None)
                    else:
                        self._values[name] = value

    def forced(self, kernel: str):
        """The configuration forced on the kernel named `kernel` (its Python function's name), or None."""
        return self._forced.get(kernel)

    @contextlib.contextmanager
    def force_config(self, kernel: str, config):
        """Every launch of the kernel named `kernel` inside the `with` block runs `config` (a triton.Config, or
        for the few kernels that take plain sizes, the dict their launcher documents) instead of the tuner's pick."""
        if not isinstance(kernel, str) or not kernel:
            raise ConfigError(f"force_config: kernel={kernel!r}; expected a kernel's name, e.g. 'chunk_scan_kernel'")
        with self._lock:
            saved = self._forced.get(kernel, _UNSET)
            self._forced[kernel] = config
        try:
            yield config
        finally:
            with self._lock:
                if saved is _UNSET:
                    self._forced.pop(kernel, None)
                else:
                    self._forced[kernel] = saved

    def set_in_code(self) -> dict:
        """The switches `set` holds now (name -> value), over the environment."""
        return dict(self._values)

    def describe(self) -> dict:
        """Every switch and its value now, for a benchmark's record."""
        return {name: getattr(self, name) for name in SWITCHES}


_UNSET = object()
switches = Switches()

__all__ = ["SWITCHES", "Switch", "Switches", "env_on", "switches"]
