"""Grouped Cross Attention kernels on a GPU (arXiv:2410.01651 App. B): forward and gradients (q, k, v, w) against
``gca_reference`` in float64 on the same rounded inputs, at DRT's shapes (64 chunks of 64 tokens, K = 8 retrieved
chunks, H = 12, D = 64) in bf16 and fp32 with both softmax settings, and edge cases: 65-row chunks (query chunk +
landmark: a 128-row tile and two key blocks), empty retrieval slots (w = 0), strided k/v, D = 32 fp16, D = 128, one
query per chunk. The backward is bitwise deterministic and the dispatcher takes the kernel on CUDA. Committed H100
errors: 2.4e-3 (bf16), 2.9e-4 (fp16), 5.3e-7 (fp32) (results/kernels/gca/gca_parity.json)."""

import pytest
import torch

from evalsuite.bench.common import rel_error
from evalsuite.kernels.grouped_cross import grouped_cross_attention
from evalsuite.kernels.grouped_cross.forward import gca_triton
from evalsuite.kernels.grouped_cross.reference import gca_reference

pytestmark = pytest.mark.gpu
LIMITS = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-4}  # relative error, every output
# (name, B, C, Sq, K, Skv, H, D, dtype, softmax_one, variant)
CASES = [
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.bfloat16, True, ""),
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.bfloat16, False, ""),
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.float32, True, ""),
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.float32, False, ""),
    ("lmk-65", 2, 8, 65, 8, 65, 12, 64, torch.bfloat16, True, "zero_slots"),
    ("rag-63", 2, 8, 63, 8, 65, 12, 64, torch.float32, False, "zero_slots"),  # fp32 grads: <= 64 rows (common.py)
    ("strided", 2, 16, 64, 4, 64, 4, 64, torch.bfloat16, True, "strided"),
    ("d32", 1, 16, 33, 3, 20, 4, 32, torch.float16, True, ""),
    ("d128", 1, 16, 64, 8, 64, 4, 128, torch.bfloat16, False, ""),
    ("decode", 4, 1, 1, 8, 64, 12, 64, torch.bfloat16, True, ""),
]


def _inputs(B, C, Sq, K, Skv, H, D, dtype, variant, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    q = randn(B, C, Sq, H, D)
    if variant == "strided":  # [B, C, K, H, Skv, D] storage seen as [B, C, K, Skv, H, D]
        k, v = (randn(B, C, K, H, Skv, D).transpose(3, 4) for _ in range(2))
    else:
        k, v = (randn(B, C, K, Skv, H, D) for _ in range(2))
    w = torch.randn(B, C, K, device="cuda", generator=g).softmax(-1)
    if variant == "zero_slots":  # early chunks see fewer than K past chunks: the tail slots are empty
        w[:, : C // 2, K // 2 :] = 0.0
    return q, k, v, w, randn(B, C, Sq, H, D)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{str(c[8])[6:]}-{int(c[9])}" for c in CASES])
def test_kernel_matches_float64_reference(case):
    name, B, C, Sq, K, Skv, H, D, dtype, softmax_one, variant = case
    torch.backends.cuda.matmul.allow_tf32 = False
    q, k, v, w, do = _inputs(B, C, Sq, K, Skv, H, D, dtype, variant)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, w)]
    o = gca_triton(*leaves, softmax_one=softmax_one)
    grads = torch.autograd.grad(o, leaves, do)
    ref = [x.detach().double().requires_grad_() for x in (q, k, v, w)]
    o_ref = gca_reference(*ref, softmax_one=softmax_one)
    ref_grads = torch.autograd.grad(o_ref, ref, do.double())
    errors = {n: rel_error(a, b) for n, a, b in zip("o dq dk dv dw".split(), (o, *grads), (o_ref, *ref_grads),
                                                    strict=True)}  # fmt: skip
    assert max(errors.values()) < LIMITS[dtype], errors
    assert o.dtype == dtype and grads[3].dtype == w.dtype
    again = torch.autograd.grad(gca_triton(*leaves, softmax_one=softmax_one), leaves, do)
    assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))  # a deterministic backward
    with torch.no_grad():
        assert torch.equal(grouped_cross_attention(q, k, v, w, softmax_one=softmax_one), o.detach())
