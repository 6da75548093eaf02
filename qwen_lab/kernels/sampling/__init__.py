"""The sampling family: the next token drawn on the device (greedy, temperature, top-k, top-p), no host sync.

- `teach.py`: notebook 11's sampler as the learner writes it (PyTorch operations around a sort).
- `radix_select.py`: the library's kernels, `sample` and its scratch (`sampling_workspace`): the kept set found
  by a radix select over the probabilities' bits, no sort.
- `tuning.py`: the launch configuration (`_GPU` on a GPU, a small one under the interpreter).

`sample` calls `sampling_workspace` through this package, so a wrapped one put here (a test's counter) is what
runs.
"""

from .radix_select import (FLOAT32_MAX, FLOAT32_TINY, KEY_BITS, LOG2E, SamplingWorkspace, sample,
                           sample_draw_kernel, sample_max_kernel, sample_round_kernel, sampling_workspace)
from .tuning import _GPU, _Config

__all__ = ["FLOAT32_MAX", "FLOAT32_TINY", "KEY_BITS", "LOG2E", "SamplingWorkspace", "_Config", "_GPU", "sample",
           "sample_draw_kernel", "sample_max_kernel", "sample_round_kernel", "sampling_workspace"]
