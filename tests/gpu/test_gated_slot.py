"""Gated Slot Attention kernels on a GPU at the MQAR d = 512 cell's head dim (D = 128; B = 2, T = 256, H = 2 keep the
float64 token loop short), against a float64 recurrence: exact under saturated gates, and at large slot scores exact
in float32 while bf16 stays at the floor of one bf16 rounding of the scores; the state scans in segments, forced at
that shape and as shipped at a long sequence over few heads; gsa-tiny's small heads (dk 32 over 16 slots). Committed
H100 numbers at B = 4, T = 512, H = 4: results/linear-kernels/gsa/ (every error at most 6.4e-3),
results/linear-kernels/gsa-score-scale/h100.jsonl."""

import pytest
import torch

from evalsuite.bench.common import rel_error
from evalsuite.kernels.gated_slot import common, reference
from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton
from gpu.gsa_checks import NAMES, gate_rows, score_scale_rows

pytestmark = pytest.mark.gpu
GRADS = ("dq", "dk", "dlog_alpha")
SHAPE = (2, 256, 2, 128)


def test_saturated_gates_stay_exact():
    rows = gate_rows(SHAPE)
    assert [r["regime"] for r in rows] == ["mild", "strong", "saturated", "extreme"]
    assert rows[-1]["min_log_alpha"] < -100
    for row in rows:
        assert row["finite"] and max(row[k] for k in NAMES) < 1e-2, row


def test_error_against_the_score_scale():
    rows = {(r["scale"], r["variant"]): r for r in score_scale_rows(SHAPE, scales=(1.0, 30.0))}
    for scale in (1.0, 30.0):
        assert max(rows[scale, "kernel-fp32"][k] for k in ("o", *GRADS)) < 1e-3
    floor_1, floor_30 = (max(rows[s, "floor-bf16-scores"][k] for k in GRADS) for s in (1.0, 30.0))
    kernel_1, kernel_30 = (max(rows[s, "kernel-bf16"][k] for k in GRADS) for s in (1.0, 30.0))
    assert kernel_1 < 1e-2 and floor_30 > 10 * floor_1
    assert kernel_30 < 5 * (floor_30 + kernel_1)


def test_segment_scan_stays_exact():
    """The state scans in segments (forced here: 4 segments of one chunk at T = 256), exact under saturated gates as
    the one walk above."""
    rows = gate_rows(SHAPE, overrides={"SEG_PROGRAMS": 1 << 30, "SEG_CHUNKS": 1})
    assert rows[-1]["min_log_alpha"] < -100
    for row in rows:
        assert row["finite"] and max(row[k] for k in NAMES) < 1e-2, row


def test_shipped_segments_match_one_walk():
    """A long sequence over few heads (B 1, T 16384, H 4, D = m = 64, bf16) takes the segment scan with the shipped
    settings; output and gradients equal those of one walk per program (SEG_PROGRAMS = 0) up to bf16 rounding."""
    B, T, H, D = 1, 16384, 4, 64
    cfg = common.GPU_CONFIG
    n_chunks = T // cfg["CHUNK"]
    assert common.segment_chunks(n_chunks, 2 * D // cfg["STATE_BD"] * B * H, cfg) < n_chunks
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, D, device="cuda", generator=gen).bfloat16() for _ in range(4))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen)) / 16
    results = []
    for overrides in ({}, {"SEG_PROGRAMS": 0}):
        leaves = [x.clone().requires_grad_() for x in (q * D**-0.25, k * D**-0.25, v, g)]
        o, _ = gsa_chunk_triton(*leaves, scale=1.0, config={**cfg, **overrides})
        results.append([o, *torch.autograd.grad(o, leaves, do)])
    for name, a, b in zip(NAMES, *results, strict=True):
        assert a.isfinite().all() and rel_error(a, b) < 5e-3, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("B,T", [(2, 256), (2, 100), (8, 2048)])
def test_gsa_tiny_heads(dtype, B, T):
    """gsa-tiny's heads (2 of 32 dims, 16 slots; models/gsa-tiny.yaml) at its training shapes 256x2 and 2048x8 and a
    ragged T, forward and every gradient against the float64 chunked reference. The read kernel steps d by 16 here
    (common.read_tiles); with steps of 32, wider than its 16 slots, gsa-tiny's training step stopped with an illegal
    memory access on an H200."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, T, 2, 32, device="cuda", generator=gen) for _ in range(4))
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, 2, 16, device="cuda", generator=gen)) / 8
    leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [g.requires_grad_()]
    _check_against_chunked(leaves, do.to(dtype), 3e-2 if dtype == torch.bfloat16 else 1e-3)


def _check_against_chunked(leaves, do, tol):
    """The kernels' output and every gradient (q, k, v, log alpha leaves; cotangent ``do``) within ``tol`` of the
    float64 chunked reference's, all finite."""
    o, _ = gsa_chunk_triton(*leaves, scale=1.0)
    got = [o, *torch.autograd.grad(o, leaves, do)]
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    o_ref, _ = reference.gsa_chunked(*ref_leaves, 1.0)
    want = [o_ref, *torch.autograd.grad(o_ref, ref_leaves, do.double())]
    for name, a, b in zip(NAMES, got, want, strict=True):
        assert a.isfinite().all() and rel_error(a, b) < tol, name


@pytest.mark.parametrize("D", [64, 128])
def test_few_slots_under_wide_heads(D):
    """16 slots under heads of 64 and 128 (a supported shape no card uses): the dgate kernel's slot tile (16) is then
    4-8x narrower than its d step (min(DGATE_BD, D) = 64), the combination of the tile sweep's DGATE_BM 16 trial that
    ended in an illegal memory access on an H200 at D = m = 64 (results/linear-kernels/h200/tune_gsa_sweep.json).
    Forward and every gradient against the float64 chunked reference, bf16."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(2, 256, 2, D, device="cuda", generator=gen) for _ in range(4))
    g = torch.nn.functional.logsigmoid(torch.randn(2, 256, 2, 16, device="cuda", generator=gen)) / 8
    leaves = [(x * D**-0.25).bfloat16().requires_grad_() for x in (q, k)] + [v.bfloat16().requires_grad_()]
    leaves.append(g.requires_grad_())
    _check_against_chunked(leaves, do.bfloat16(), 3e-2)
