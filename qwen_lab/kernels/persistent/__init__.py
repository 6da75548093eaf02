"""The persistent decode step (issue 50): one launch per token, programs walking an instruction list.

- schedule.py: the work items of one decode step, their counters, and the deal to programs;
- items.py: one device function per item kind (GEMV tiles, the DeltaNet head, the attention's prep / splits /
  combine, the norms, the greedy token);
- decode.py: the persistent kernel (counters in global memory, bounded waits) and its launcher PersistentDecode;
- teach.py: the notebook's kernel, two dependent GEMVs in one launch with a counter.

docs/persistent.md describes the design.
"""

from __future__ import annotations

from .decode import PersistentDecode, persistent_decode_kernel
from .schedule import KIND_NAMES, Schedule, build_schedule, check_schedule
from .teach import two_gemvs, two_gemvs_kernel

__all__ = ["KIND_NAMES", "PersistentDecode", "Schedule", "build_schedule", "check_schedule",
           "persistent_decode_kernel", "two_gemvs", "two_gemvs_kernel"]
