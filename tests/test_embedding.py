"""The embedding gather against qwen_lab.reference.embedding."""

import pytest
import torch

from qwen_lab import reference
from qwen_lab.course import checks
from qwen_lab.config import QWEN35_0_8B, TINY
from qwen_lab.errors import KernelError
from qwen_lab.kernels import count_launches
from qwen_lab.kernels.embedding import embedding


def _table(V, H, g, rt):
    return checks.randn(V, H, g=g, dtype=rt.dtype, device=rt.device)


@pytest.mark.parametrize("T,V,H", [(1, 7, 5), (13, 37, 70), (40, TINY.vocab_size, TINY.hidden_size),
                                   (3, 300, 129)])
def test_matches_reference(rt, gen, T, V, H):
    weight = _table(V, H, gen, rt)
    ids = torch.randint(0, V, (T,), generator=gen).to(rt.device)
    with count_launches() as launches:
        out = embedding(ids, weight)
    assert launches["embedding_kernel"] == 1
    # a gather is exact: no tolerance
    checks.compare("embedding", out, reference.embedding(ids, weight), atol=0, rtol=0)


def test_int32_ids_strided_ids_and_out_buffer(rt, gen):
    V, H = 50, 24
    weight = _table(V, H, gen, rt)
    both = torch.randint(0, V, (9, 2), generator=gen, dtype=torch.int32).to(rt.device)
    ids = both[:, 1]                                  # stride 2
    out = checks.poison_(torch.empty(9, H, device=rt.device, dtype=rt.dtype))
    got = embedding(ids, weight, out=out)
    assert got.data_ptr() == out.data_ptr()
    checks.compare("embedding", got, reference.embedding(ids.long(), weight), atol=0, rtol=0)


def test_strided_table_rows_and_2d_ids(rt, gen):
    V, H = 30, 16
    big = _table(V, 3 * H, gen, rt)
    weight = big[:, H:2 * H]                          # row stride 3H != H
    ids = torch.randint(0, V, (2, 5), generator=gen).to(rt.device)
    out = embedding(ids, weight)
    assert out.shape == (2, 5, H)
    checks.compare("embedding", out, reference.embedding(ids, weight), atol=0, rtol=0)


def test_out_of_range_ids_give_zero_rows_and_never_read_outside(rt, gen):
    V, H = 20, 8
    # the table is a slice of a bigger buffer whose neighbouring rows are NaN: an out-of-bounds read
    # would show up as NaN in the output
    store = torch.full((V + 4, H), float("nan"), device=rt.device, dtype=rt.dtype)
    weight = store[2:V + 2]
    weight.copy_(_table(V, H, gen, rt))
    ids = torch.tensor([3, -1, V, 0, V + 1, -2, V - 1], device=rt.device)
    out = embedding(ids, weight)
    bad = (ids < 0) | (ids >= V)
    assert torch.equal(out[bad], torch.zeros_like(out[bad]))
    good = ~bad
    checks.compare("embedding", out[good], reference.embedding(ids[good], weight), atol=0, rtol=0)


def test_empty_ids(rt, gen):
    weight = _table(10, 4, gen, rt)
    out = embedding(torch.empty(0, dtype=torch.long, device=rt.device), weight)
    assert out.shape == (0, 4)


def test_bad_arguments_are_named(rt, gen):
    weight = _table(10, 4, gen, rt)
    with pytest.raises(KernelError, match="ids"):
        embedding(torch.zeros(3, device=rt.device), weight)
    with pytest.raises(KernelError, match="weight"):
        embedding(torch.zeros(3, dtype=torch.long, device=rt.device), weight[0])
    with pytest.raises(KernelError, match="contiguous"):
        embedding(torch.zeros(3, dtype=torch.long, device=rt.device), weight.t())
    with pytest.raises(KernelError, match="out"):
        embedding(torch.zeros(3, dtype=torch.long, device=rt.device), weight,
                  out=torch.empty(3, 5, device=rt.device, dtype=rt.dtype))


def test_check_kernel_accepts_it(rt):
    checks.check_kernel(
        "embedding", embedding, reference.embedding, quiet=True,
        cases=[lambda g: dict(ids=torch.randint(0, 64, (11,), generator=g).to(rt.device),
                              weight=checks.randn(64, 33, g=g, dtype=rt.dtype, device=rt.device),
                              out=torch.empty(11, 33, device=rt.device, dtype=rt.dtype))])


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 7, 2048])
def test_gpu_qwen35_table(gen, T):
    cfg = QWEN35_0_8B
    cuda_gen = torch.Generator("cuda").manual_seed(int(torch.randint(2**31, (), generator=gen)))
    weight = torch.randn(cfg.vocab_size, cfg.hidden_size, generator=cuda_gen, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (T,), generator=gen).cuda()
    ids[0] = cfg.vocab_size - 1                       # the last row: the largest offset into the table
    out = embedding(ids, weight)
    checks.compare("embedding", out, reference.embedding(ids, weight), atol=0, rtol=0)


@pytest.mark.gpu
def test_gpu_bad_ids_zero_rows():
    weight = torch.randn(100, 1024, device="cuda", dtype=torch.bfloat16)
    ids = torch.tensor([5, -3, 100, 99], device="cuda")
    out = embedding(ids, weight)
    assert torch.equal(out[1:3], torch.zeros_like(out[1:3]))
    assert torch.equal(out[[0, 3]], weight[[5, 99]])


def test_launches_inside_uncounted_are_not_counted(rt, gen):
    """count_launches counts a call's own launches; a launcher's first-call timing runs go through `uncounted`."""
    from qwen_lab.kernels import count_launches, uncounted
    from qwen_lab.kernels.embedding import embedding

    w = torch.randn(20, 8, generator=gen).to(rt.device, rt.dtype)
    ids = torch.tensor([3, 0, 19], device=rt.device)
    with count_launches() as outer:
        embedding(ids, w)
        with uncounted():
            embedding(ids, w)
            with count_launches() as inner:  # a count opened inside still sees its own launches
                embedding(ids, w)
        embedding(ids, w)
    assert outer["embedding_kernel"] == 2 and inner["embedding_kernel"] == 1


# ---------------------------------------------------------------- the teaching kernels (notebook 01)


def test_teaching_file_is_the_notebooks_solution():
    """embedding/teach.py holds notebook 01's exercise solutions (vector add, gather) character for character."""
    from notebook_source import assert_teaches

    assert_teaches("01_triton_basics_embedding.ipynb", "qwen_lab/kernels/embedding/teach.py")


@pytest.mark.parametrize("n", [1, 255, 257, 1000])
def test_teaching_vector_add(rt, gen, n):
    from qwen_lab.kernels.embedding import teach

    x, y = checks.randn(n, g=gen, dtype=rt.dtype, device=rt.device), checks.randn(n, g=gen, dtype=rt.dtype,
                                                                                  device=rt.device)
    out = checks.poison_(torch.empty_like(x))
    assert teach.my_add(x, y, out=out) is out
    checks.compare("my_add", out, x + y, atol=0, rtol=0)


@pytest.mark.parametrize("T,V,H", [(1, 7, 5), (13, 37, 70), (40, TINY.vocab_size, TINY.hidden_size)])
def test_teaching_embedding_gather(rt, gen, T, V, H):
    from qwen_lab.kernels.embedding import teach

    weight = _table(V, H, gen, rt)
    ids = torch.randint(0, V, (T,), generator=gen).to(rt.device)
    checks.compare("my_embedding", teach.my_embedding(ids, weight), reference.embedding(ids, weight), atol=0, rtol=0)
