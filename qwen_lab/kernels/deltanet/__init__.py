"""Gated DeltaNet: l2norm, the gates, and the gated delta rule in its recurrent (decode) and chunked (prefill) forms.

Shapes (batch 1, token-major): T tokens; q, k [T, Hk, Dk]; v [T, Hv, Dv] with Hv a multiple of Hk (value head
h reads q/k head h // (Hv / Hk)); g, beta [T, Hv] fp32; state S [Hv, Dk, Dv] fp32, updated in place.
Qwen3.5-0.8B: Hk = Hv = 16, Dk = Dv = 128.

    g = -exp(A_log) * softplus(a + dt_bias),  beta = sigmoid(b)        the gates (fp32)
    S <- exp(g_t) S;  S <- S + k_t (x) beta_t (v_t - S^T k_t);  o_t = S^T q_t     per token (q, k l2-normalised)

One file per form, each reading top-down (the math, the kernels, the launchers):
- teach_recurrent.py, teach_chunked.py: notebooks 08 and 09's own kernels (the exercises' solutions);
- gates.py: `deltanet_gates`, `l2norm`, and the softplus every kernel uses;
- recurrent.py: `delta_rule_recurrent`, `deltanet_decode_step` (gates inside) and `deltanet_conv_decode_step`
  (the causal conv inside as well): one token at a time, the decode form;
- chunk_prep.py: the chunked form's parallel half (the UT transform per chunk) and its workspace;
- chunk_scan.py: the chunked form's scan over chunks, and `delta_rule_chunked`, `deltanet_chunked` (the prefill);
- tuning.py: the switches (SCAN_GROUP, PREP_PERSISTENT, ...), the GPU configs, `force_config`, `_pick_in_place`;
- arguments.py, counters.py: the launchers' argument checks, the int32 counters the launches share on a device.

The switches and the replaceable tuning functions live in tuning.py, where the launchers read them. Notebook 09 and
the benchmarks set some on this package (`deltanet.PREP_PERSISTENT = False`): a read or a write of those names here
goes to tuning.py, so each has one value.
"""

from __future__ import annotations

import sys
import types

from . import tuning
from .chunk_prep import ChunkWorkspace, chunk_prep_kernel, chunk_workspace
from .chunk_scan import CHUNKED_MIN_HEAD_DIM, chunk_scan_kernel, delta_rule_chunked, deltanet_chunked
from .counters import _TICKETS, _tickets
from .gates import deltanet_gates, deltanet_gates_kernel, l2norm, l2norm_kernel
from .recurrent import (conv_decode_step_kernel, delta_rule_recurrent, delta_rule_recurrent_kernel,
                        deltanet_conv_decode_step, deltanet_decode_step)
from .tuning import _prep_programs, autotune_configs, chunk_class, force_config

__all__ = ["ChunkWorkspace", "autotune_configs", "chunk_workspace", "delta_rule_chunked", "delta_rule_recurrent",
           "deltanet_chunked", "deltanet_conv_decode_step", "deltanet_decode_step", "deltanet_gates", "force_config",
           "l2norm"]
# what notebook 09, the benchmarks, tests/sm90_compile.py, tests/test_pdl.py and qwen_lab/profile_step.py reach here
__all__ += ["CHUNKED_MIN_HEAD_DIM", "chunk_class", "chunk_prep_kernel", "chunk_scan_kernel", "conv_decode_step_kernel",
            "delta_rule_recurrent_kernel", "deltanet_gates_kernel", "l2norm_kernel", "_TICKETS", "_prep_programs",
            "_tickets"]

# Names read and written in tuning.py through this package (see the docstring). `triton`: the probe
# benchmarks/probe_scan_breakdown.py reaches triton.runtime.Autotuner through the package.
_IN_TUNING = frozenset({"SCAN_GROUP", "SCAN_BESIDE_PREP", "PREP_PERSISTENT", "PREP_PROGRAMS_PER_SM",
                        "PREP_ITEM_SCAN_STEPS", "_PICKS", "_launch", "_pick_in_place", "_time_in_graph", "triton"})


def __getattr__(name):
    if name in _IN_TUNING:
        return getattr(tuning, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _IN_TUNING:
            setattr(tuning, name, value)
        else:
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
