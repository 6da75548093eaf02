"""On the GPU: the widths of the larger Qwen3.5 sizes (seeded random weights, bf16) against transformers.

The course targets the 0.8B, but the engine reads every size from config.json. The larger dense sizes change
what the kernels see: a wider hidden state (so the decode GEMVs' K no longer fits the 0.8B's tiles), more value
heads than key heads in Gated DeltaNet (2 or 3 per q/k head), more query heads per KV head in gated attention, and
an untied LM head. These tests cut such a model to one block of the layer pattern (3 Gated DeltaNet layers and 1
gated attention layer) and hold it to the bar of `test_parity_gpu.py`: our bf16 logits no less accurate than
transformers' bf16 logits, both measured against transformers in float32.

- `wide-2to1`: hidden 2560, 32 value heads for 16 key heads, 16 query heads for 4 KV heads.
- `wide-3to1`: the 27B's widths (hidden 5120, SwiGLU 17408, 24 query heads for 4 KV heads, 48 value heads for
  16 key heads), 4 of its 64 layers.
"""

import pytest
import torch

import qwen_lab
from hf_models import assert_as_accurate_as_transformers, decode_after_prefill, hf_logits
from qwen_lab import bench
from qwen_lab.config import FULL, LINEAR, QWEN35_0_8B
from qwen_lab.model import Qwen35Model
from qwen_lab.weights import random_weights

# one worker of gpu_session.sh's pytest-xdist run takes every test here: it holds one size's three models at a
# time (up to 32 GB), which several workers building them side by side would not fit
pytestmark = [pytest.mark.gpu, pytest.mark.xdist_group("larger sizes")]

_BLOCK = (LINEAR, LINEAR, LINEAR, FULL)
SIZES = {
    "wide-2to1": QWEN35_0_8B.replace(
        hidden_size=2560, intermediate_size=9216, num_hidden_layers=4, layer_types=_BLOCK,
        num_attention_heads=16, num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=32,
        tie_word_embeddings=False, name="wide-2to1"),
    "wide-3to1": QWEN35_0_8B.replace(
        hidden_size=5120, intermediate_size=17408, num_hidden_layers=4, layer_types=_BLOCK,
        num_attention_heads=24, num_key_value_heads=4, linear_num_key_heads=16, linear_num_value_heads=48,
        tie_word_embeddings=False, name="wide-3to1"),
}


@pytest.fixture(scope="module", params=sorted(SIZES))
def models(request):
    config = SIZES[request.param]
    weights = random_weights(config, device="cuda", dtype=torch.bfloat16, seed=7)
    ours = Qwen35Model(config, weights, device=torch.device("cuda"), dtype=torch.bfloat16, backend="triton")
    hf32 = bench.transformers_model(config, weights, "cuda", torch.float32)
    hf16 = bench.transformers_model(config, weights, "cuda", torch.bfloat16)
    yield ours, hf32, hf16
    del ours, hf32, hf16
    torch.cuda.empty_cache()


def _ids(config, n, seed):
    return torch.randint(0, config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed)).cuda()


def test_the_sizes_are_what_they_claim(models):
    ours, hf32, _ = models
    cfg = ours.config
    assert cfg.linear_num_value_heads // cfg.linear_num_key_heads in (2, 3)
    assert not ours.weights.tied and ours.weights.lm_head.data_ptr() != ours.weights.embed.data_ptr()
    assert all(fn.__module__.startswith("qwen_lab.kernels.") for fn in ours.ops.values()), ours.ops   # kernels all
    assert hf32.lm_head.weight.shape == (cfg.vocab_size, cfg.hidden_size)


@pytest.mark.parametrize("T", [77, 300])
def test_bf16_prefill_is_as_accurate_as_transformers_bf16(models, T):
    ours, hf32, hf16 = models
    ids = _ids(ours.config, T, T)
    got = ours.forward(ids)
    assert torch.isfinite(got).all()
    err = assert_as_accurate_as_transformers(got, hf_logits(hf16, ids), hf_logits(hf32, ids), f"T={T}")
    print(f"{ours.config.name} T={T}: relative error {err:.4f}")


def test_bf16_decode_after_prefill_is_as_accurate_as_transformers_bf16(models):
    ours, hf32, hf16 = models
    ids = _ids(ours.config, 70, 1)
    want, theirs = hf_logits(hf32, ids), hf_logits(hf16, ids)
    for j, logits in enumerate(decode_after_prefill(ours, ids, 64)):
        assert_as_accurate_as_transformers(logits, theirs[63 + j], want[63 + j], f"decode step {j}")


def test_generation_through_the_graph_equals_eager(models):
    ours, _, _ = models
    prompt = _ids(ours.config, 16, 3)
    eager = qwen_lab.generate(ours, prompt, max_new_tokens=8, eos_token_ids=(), cuda_graph=False).tolist()
    graph = qwen_lab.generate(ours, prompt, max_new_tokens=8, eos_token_ids=(), cuda_graph=True).tolist()
    # the same kernels on the same inputs: the replayed decode step draws the tokens the eager loop draws
    assert graph == eager
    # greedy: the first token is the argmax of our own logits for the prompt
    assert eager[0] == ours.forward(prompt)[-1].argmax().item()
