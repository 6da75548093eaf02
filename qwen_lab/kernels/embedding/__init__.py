"""The embedding family: out[t] = weight[ids[t]].

- `teach.py`: notebook 01's kernels as the learner writes them (a vector add, the gather).
- `gather.py`: the library's gather, the model's `embedding` operator.
"""

from .gather import embedding, embedding_kernel

__all__ = ["embedding", "embedding_kernel"]
