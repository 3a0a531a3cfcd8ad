"""The kernels under ``torch.vmap`` over the cells of a stacked model (evalsuite/kernels/cells.py): each Triton
kernel's rule folds the cells into its batch and each cell gets exactly its own call's output and gradients (the
kernels under the Triton interpreter); the GSA reference runs once per cell; a per-cell argument that the kernel
takes once for the whole batch is refused."""

import pytest
import torch
import torch.nn.functional as F

CELLS, B, T, H, D = 2, 2, 32, 2, 16


def _vmap_matches_each_cell(fn, *inputs):
    """``vmap(fn)`` over the leading cell dimension of ``inputs`` against ``fn`` per cell: equal outputs and
    gradients of a sum of squares."""
    stacked = [x.detach().clone().requires_grad_() for x in inputs]
    out = torch.vmap(fn)(*stacked)
    out.float().square().sum().backward()
    alone = [x.detach().clone().requires_grad_() for x in inputs]
    outs = torch.stack([fn(*(x[c] for x in alone)) for c in range(CELLS)])
    outs.float().square().sum().backward()
    torch.testing.assert_close(out, outs, rtol=0, atol=0)
    for s, a in zip(stacked, alone, strict=True):
        torch.testing.assert_close(s.grad, a.grad, rtol=0, atol=0)


def _qkv(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(CELLS, B, T, H, D, generator=g).to(dtype) for _ in range(3)]


def _log_gates(*shape):
    return F.logsigmoid(torch.randn(CELLS, B, T, *shape, generator=torch.Generator().manual_seed(1)))


def test_forgetting_attention_and_gate_scan():
    from evalsuite.kernels.forgetting.cumsum import cumsum_over_time_triton
    from evalsuite.kernels.forgetting.forward import forgetting_attention_triton

    def fox(q, k, v, log_f):
        return forgetting_attention_triton(q, k, v, cumsum_over_time_triton(log_f))

    _vmap_matches_each_cell(fox, *_qkv(torch.bfloat16), _log_gates(H))


def test_gate_scan_compiles_under_vmap():
    """The gate scan of stacked cells inside torch.compile (the stacked MQAR step): one graph (``fullgraph``), the
    operator folded over the cells, with torch.cumsum's values and gradients."""
    from evalsuite.kernels.forgetting.cumsum import cumsum_over_time_triton

    def loss(log_f):
        return torch.vmap(lambda x: cumsum_over_time_triton(F.logsigmoid(x)))(log_f).square().sum()

    def reference(log_f):
        return F.logsigmoid(log_f).cumsum(2).square().sum()

    logits = torch.randn(CELLS, B, T, H, generator=torch.Generator().manual_seed(2))
    results = []
    for fn in (reference, torch.compile(loss, fullgraph=True)):
        x = logits.clone().requires_grad_()
        value = fn(x)
        results.append((value, *torch.autograd.grad(value, x)))
    for expected, compiled in zip(*results, strict=True):
        torch.testing.assert_close(compiled, expected, rtol=1e-5, atol=1e-5)


def test_lightning():
    from evalsuite.kernels.lightning.chunk import lightning_chunk_triton

    slope = torch.rand(H)
    _vmap_matches_each_cell(lambda q, k, v: lightning_chunk_triton(q, k, v, slope)[0], *_qkv())


def test_gated_slot_kernel_and_reference():
    from evalsuite.kernels.gated_slot import gated_slot_attention

    for backend in ("triton", "chunked"):  # the reference: one call per cell (a branch on the gates' values)

        def gsa(q, k, v, g, backend=backend):
            return gated_slot_attention(q, k, v, g, scale=0.5, backend=backend)[0]

        _vmap_matches_each_cell(gsa, *_qkv(), _log_gates(H, 16))


def test_grouped_cross_attention():
    from evalsuite.kernels.grouped_cross.forward import gca_triton

    g = torch.Generator().manual_seed(2)
    q = torch.randn(CELLS, B, 2, 16, H, D, generator=g)  # [cells, B, chunks, Sq, H, D]
    k, v = (torch.randn(CELLS, B, 2, 2, 16, H, D, generator=g) for _ in range(2))  # 2 retrieved chunks of 16
    w = torch.rand(CELLS, B, 2, 2, generator=g)
    _vmap_matches_each_cell(gca_triton, q, k, v, w)


def test_a_per_cell_table_is_refused():
    from evalsuite.kernels.lightning.chunk import lightning_chunk_triton

    q, k, v = _qkv()
    slopes = torch.rand(CELLS, H)  # the kernel takes one [H] table for all rows
    with pytest.raises(ValueError, match="argument 3 differs per cell"):
        torch.vmap(lambda q, k, v, s: lightning_chunk_triton(q, k, v, s)[0])(q, k, v, slopes)
