"""The IMMA operand split is exact: X = 65536 h + 256 l + m with signed bytes, for every X the kernel can make."""

import torch
import triton
import triton.language as tl

from strata.kernels.attention.prompt_imma import SPLIT_LIMIT, split3, split3_ref
from tests.kernels import DEVICE


def test_split_is_exact_for_every_integer_in_range():
    x = torch.arange(-SPLIT_LIMIT, SPLIT_LIMIT + 1, dtype=torch.int64)
    h, low, m = split3_ref(x)
    assert torch.equal(h.long() * 65536 + low.long() * 256 + m.long(), x)  # int8 casts wrapped nothing
    assert int(h.abs().max()) == 127 and int(low.min()) == -128 and int(m.max()) == 127


@triton.jit
def _split_kernel(y_ptr, h_ptr, l_ptr, m_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    h, low, m = split3(tl.load(y_ptr + i))
    tl.store(h_ptr + i, h)
    tl.store(l_ptr + i, low)
    tl.store(m_ptr + i, m)


def test_kernel_split_rounds_then_splits_like_the_mirror():
    g = torch.Generator().manual_seed(0)
    edges = torch.tensor([127.0, -127.0, 127.00001, -127.00002, 0.0, -0.0, 0.5 / 65536, -0.5 / 65536, 1.5 / 65536,
                          -1.5 / 65536, 1 / 256, -1 / 256, 0.99999994, 126.99999, 64.0, -64.0])
    y = torch.cat([edges, (torch.rand(1024 - len(edges), generator=g) * 2 - 1) * 127]).float()
    parts = [torch.empty(1024, dtype=torch.int8, device=DEVICE) for _ in range(3)]
    _split_kernel[(1,)](y.to(DEVICE), *parts, N=1024)
    x = torch.floor(y.double() * 65536 + 0.5).clamp(-SPLIT_LIMIT, SPLIT_LIMIT)
    inside = y.abs() <= 127
    assert ((x / 65536 - y.double()).abs()[inside] <= 0.5 / 65536).all()
    for got, want in zip(parts, split3_ref(x)):
        assert torch.equal(got.cpu(), want)
