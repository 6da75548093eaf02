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
- tuning.py: the GPU configs and how a launch picks one (`_launch`, `_pick_in_place`);
- arguments.py, counters.py: the launchers' argument checks, the int32 counters the launches share on a device.

The family's switches (`scan_group`, `scan_beside_prep`, `prep_persistent`, and a config forced on one of its
kernels) are in `qwen_lab.switches`.
"""

from __future__ import annotations

from . import tuning
from .chunk_prep import ChunkWorkspace, chunk_prep_kernel, chunk_workspace
from .chunk_scan import CHUNKED_MIN_HEAD_DIM, chunk_scan_kernel, delta_rule_chunked, deltanet_chunked
from .counters import _TICKETS, _tickets
from .gates import deltanet_gates, deltanet_gates_kernel, l2norm, l2norm_kernel
from .recurrent import (conv_decode_step_kernel, delta_rule_recurrent, delta_rule_recurrent_kernel,
                        deltanet_conv_decode_step, deltanet_decode_step)
from .tuning import PREP_ITEM_SCAN_STEPS, PREP_PROGRAMS_PER_SM, _prep_programs, autotune_configs, chunk_class

__all__ = ["ChunkWorkspace", "autotune_configs", "chunk_workspace", "delta_rule_chunked", "delta_rule_recurrent",
           "deltanet_chunked", "deltanet_conv_decode_step", "deltanet_decode_step", "deltanet_gates", "l2norm",
           "tuning"]
# what notebook 09, the benchmarks, tests/sm90_compile.py, tests/test_pdl.py and qwen_lab/profile_step.py reach here
__all__ += ["CHUNKED_MIN_HEAD_DIM", "chunk_class", "chunk_prep_kernel", "chunk_scan_kernel", "conv_decode_step_kernel",
            "delta_rule_recurrent_kernel", "deltanet_gates_kernel", "l2norm_kernel", "_TICKETS", "_prep_programs",
            "_tickets", "PREP_ITEM_SCAN_STEPS", "PREP_PROGRAMS_PER_SM"]
