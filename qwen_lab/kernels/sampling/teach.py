"""Notebook 11's sampler, as the learner writes it: one token from logits [V] on the device, in PyTorch operations.

With p = softmax(logits / temperature), token i is kept when
    top-k (k > 0):  #{j : p_j > p_i} < k            (fewer than k tokens strictly more likely)
    top-p (p < 1):  sum{p_j : p_j > p_i} < top_p    (the strictly more likely tokens hold less than top_p)
and the draw is the first index whose running kept mass exceeds u * (kept mass), u a 0-d tensor in [0, 1).
Temperature 0 is argmax. logits [V] -> a 0-d int64 tensor on the device, with no host synchronisation.

The cell below is solutions/11_decode_and_sampling.ipynb's exercise solution, character for character
(tests/test_sampling.py fails if the two drift apart): a sort, O(V log V). The library's form, radix_select.py,
finds the same kept set without sorting the vocabulary.
"""

import torch


# Exercise 11.1: sampling on the device
def sample_on_device(logits, temperature, top_k, top_p, uniform):
    """One token from logits [V], exactly as reference.sample, in O(V log V), with no host synchronisation.

    temperature, top_k, top_p: Python numbers (fixed for a whole generation, so branching on them is free);
    uniform: a 0-d float tensor in [0, 1) on the device. Returns a 0-d LongTensor on the device.
    """
    x = logits.float()
    if temperature == 0:
        return torch.argmax(x)                      # greedy: the lowest index among tied maxima
    p = torch.softmax(x / temperature, dim=-1)
    asc = torch.sort(p).values                      # ascending probabilities
    n_at_most = torch.searchsorted(asc, p, right=True)      # tokens with probability <= p_i (>= 1)
    n_greater = p.numel() - n_at_most
    mass_greater = asc.sum() - torch.cumsum(asc, 0)[n_at_most - 1]
    keep = torch.ones_like(p, dtype=torch.bool)
    if top_k > 0:
        keep &= n_greater < top_k
    if top_p < 1.0:
        keep &= mass_greater < top_p
    kept = torch.where(keep, p, torch.zeros_like(p))
    cdf = torch.cumsum(kept, 0)                     # running kept mass, in index order
    idx = torch.searchsorted(cdf, (uniform.float() * cdf[-1]).reshape(1), right=True)[0]
    # u * M can round up to the total mass: clamp to the last kept index, found without nonzero()
    index = torch.arange(p.numel(), device=p.device)
    last = torch.where(keep, index, torch.full_like(index, -1)).max()
    return torch.minimum(idx, last)
