"""Forgetting Attention for cached decoding: a forward-only kernel with split-K, and a kernel merging the splits.

Public entry point: :func:`forgetting_attention_decode_triton` -- for ``Tq <= Tk`` queries that are the last
``Tq`` positions of the keys (cached decoding, or prefill with ``Tq == Tk``), with optional left padding
``key_start``. Shapes, the function and the shared numerics: :mod:`evalsuite.kernels.forgetting.common`.

Design notes:
* With few queries (one token per step) there are too few (batch, head, query block) programs to fill the GPU,
  so the keys are split over several programs (split-K, :func:`_num_splits`). Each split writes its own
  normalised partial output and log-sum-exp (base 2); a second kernel (:func:`_merge_kernel`) merges them,
  weighting each split by its share of the softmax mass.
* A query row may see no key at all (all its keys are left padding, or a split holds none of its keys): such
  rows keep ``m = -inf`` with zero mass, write 0 and ``lse = -inf``, and weigh nothing in the merge. Whole
  blocks of left padding are skipped.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.forgetting import common
from evalsuite.kernels.forgetting.common import _check_inputs, _mm, _scales, _strides4, _upcast
from evalsuite.kernels.jit_helpers import wait_for_previous_kernel
from evalsuite.kernels.triton_utils import interpreting


@triton.jit
def _decode_kernel(
    Q,
    K,
    V,
    CQ,
    CK,
    KS,
    KL,
    KN,
    VN,
    LF,
    RS1,
    RD1,
    RS2,
    RD2,
    O_PART,
    LSE_PART,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    stride_cqb,
    stride_cqt,
    stride_cqh,
    stride_ckb,
    stride_ckt,
    stride_ckh,
    stride_knb,
    stride_knh,
    stride_vnb,
    stride_vnh,
    stride_lfb,
    stride_lfh,
    stride_rs1b,
    stride_rs1h,
    stride_rd1b,
    stride_rd1h,
    stride_rs2b,
    stride_rs2h,
    stride_rd2b,
    stride_rd2h,
    Tq,
    Tk,
    H,
    keys_per_split,
    sm_scale,
    mult,
    HAS_C: tl.constexpr,
    HAS_KS: tl.constexpr,
    HAS_KL: tl.constexpr,
    APPEND: tl.constexpr,
    HAS_LF: tl.constexpr,
    N_ROWS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    PDL: tl.constexpr,
):
    """Partial attention of query rows against one split of the keys.

    Query row i sits at absolute position ``Tk - Tq + i``; key j is visible when ``key_start[b] <= j <= pos``.
    With ``HAS_KL`` the key count is read from ``KL`` (a device scalar, ``<= Tk``) instead: a cache of capacity Tk
    holding fewer keys, whose length a CUDA graph cannot pass as an argument.
    With ``APPEND`` (one query, ``HAS_KL``) this step's key row is not in the cache yet: ``KL`` counts the keys
    before it, the new row is key ``KL`` (the query's own position), its k/v come from ``KN``/``VN`` ``[B, H, D]``
    and its cumulative log forget is the previous row's plus ``LF`` ``[B, H]`` (0 without ``HAS_LF``). The key loop
    stops before the new row and the split holding it adds it from registers (a check and select inside the loop
    cost 26% at batch 1 after 4K keys: results/decode/README.md); the programs of the last split also write it into
    the cache (K, V, CK), so the step needs no separate cache-append kernels (results/bench/h100/decode-6/ at commit
    164742b). ``N_ROWS`` (0-2) more ``[B, H, D]`` rows are copied by those programs, RS1 -> RD1 and RS2 -> RD2 (FoX
    (Pro)'s KV-shift rows): state the step writes, in the same launch.
    Grid: (B*H, cdiv(Tq, BLOCK_M), n_splits). Split s covers keys [s*keys_per_split, (s+1)*keys_per_split).
    Writes O_PART [S, B, H, Tq, D] (normalised within the split, 0 where nothing is visible) and
    LSE_PART [S, B, H, Tq] (log2 units, -inf where nothing is visible); :func:`_merge_kernel` merges the splits.
    """
    # torch.compile (inductor) passes Python floats as fp64; fp64 scales would turn the accumulator fp64
    sm_scale = tl.cast(sm_scale, tl.float32)
    mult = tl.cast(mult, tl.float32)
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Tq
    wait_for_previous_kernel(PDL)
    if HAS_KL:
        n_keys = tl.load(KL).to(tl.int32)
    else:
        n_keys = Tk
    if APPEND:
        n_keys = n_keys + 1
    pos = n_keys - Tq + offs_m

    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None].to(tl.int64) * stride_qt
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)  # fmt: skip
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    ck_base = CK + b * stride_ckb + h * stride_ckh
    if APPEND:
        new = n_keys - 1
        kn = tl.load(KN + b * stride_knb + h * stride_knh + offs_d)
        vn = tl.load(VN + b * stride_vnb + h * stride_vnh + offs_d)
        if HAS_C:
            c_new = tl.load(ck_base + (new - 1).to(tl.int64) * stride_ckt, mask=new > 0, other=0.0)
            if HAS_LF:
                c_new += tl.load(LF + b * stride_lfb + h * stride_lfh)
            cq = tl.zeros([BLOCK_M], dtype=tl.float32) + c_new  # Tq == 1: the block's one live row
        if pid_s == tl.num_programs(2) - 1:  # the last split never has more keys than another: off the critical path
            tl.store(k_base + new.to(tl.int64) * stride_kt + offs_d * stride_kd, kn)
            tl.store(v_base + new.to(tl.int64) * stride_vt + offs_d * stride_vd, vn)
            if HAS_C:
                tl.store(ck_base + new.to(tl.int64) * stride_ckt, c_new)
            if N_ROWS >= 1:
                copied = tl.load(RS1 + b * stride_rs1b + h * stride_rs1h + offs_d)
                tl.store(RD1 + b * stride_rd1b + h * stride_rd1h + offs_d, copied)
            if N_ROWS >= 2:
                copied = tl.load(RS2 + b * stride_rs2b + h * stride_rs2h + offs_d)
                tl.store(RD2 + b * stride_rd2b + h * stride_rd2h + offs_d, copied)
    elif HAS_C:
        cq = tl.load(CQ + b * stride_cqb + h * stride_cqh + offs_m.to(tl.int64) * stride_cqt, mask=row_ok, other=0.0)
    if HAS_KS:
        ks = tl.load(KS + b).to(tl.int32)
    else:
        ks = tl.full([], 0, dtype=tl.int32)

    lo = pid_s * keys_per_split
    # last key any row of this block may see, +1
    hi = tl.minimum(tl.minimum(lo + keys_per_split, n_keys), n_keys - Tq + tl.minimum(pid_m * BLOCK_M + BLOCK_M, Tq))
    if APPEND:  # the new row is not read from the cache (it may be in flight): the loop stops before it
        new_here = (lo <= new) & (new < hi)
        hi = tl.minimum(hi, new)
    lo = tl.maximum(lo, (ks // BLOCK_N) * BLOCK_N)  # skip whole blocks of left padding, stay block aligned

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < hi
        cols64 = cols.to(tl.int64)
        k = tl.load(k_base + cols64[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + cols64[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=col_ok[:, None], other=0.0)
        s = _mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST)
        if HAS_C:
            ck = tl.load(ck_base + cols64 * stride_ckt, mask=col_ok, other=0.0)
            s = s * sm_scale + (cq[:, None] - ck[None, :])
        visible = (cols[None, :] <= pos[:, None]) & col_ok[None, :] & (cols[None, :] >= ks)
        s = tl.where(visible, s, float("-inf"))
        m_new, m_use, alpha = _running_max(m_i, tl.max(s, 1), mult)
        p = tl.exp2(s * mult - (m_use * mult)[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new
    if APPEND:  # the new row, from registers, as one more key column (its bias cq - c_new is 0: Tq == 1)
        if new_here:
            s_new = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1)
            if HAS_C:
                s_new = s_new * sm_scale
            s_new = tl.where(new >= ks, s_new, float("-inf"))
            m_new, m_use, alpha = _running_max(m_i, s_new, mult)
            p_new = tl.exp2(s_new * mult - m_use * mult)
            l_i = l_i * alpha + p_new
            acc = acc * alpha[:, None] + p_new[:, None] * vn.to(tl.float32)[None, :]
            m_i = m_new

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i * mult + tl.log2(tl.where(empty, 1.0, l_i)))
    # O_PART / LSE_PART are contiguous [S, B*H, Tq, (D)]
    row = (pid_s * tl.num_programs(0) + pid_bh).to(tl.int64) * Tq + offs_m
    tl.store(O_PART + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
    tl.store(LSE_PART + row, lse, mask=row_ok)


@triton.jit
def _running_max(m_i, row_max, mult):
    """The online softmax's update for rows with running max ``m_i`` whose new scores peak at ``row_max``: the new
    running max, the shift the new scores take (0 for rows that have seen no visible key yet, which keep -inf: no
    inf - inf) and the factor ``alpha`` that rescales the old sums. ``[BLOCK_M]`` each; base 2 with ``mult``."""
    m_new = tl.maximum(m_i, row_max)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, m_use, tl.exp2((m_i - m_use) * mult)


@triton.jit
def _merge_kernel(O_PART, LSE_PART, OUT, S, rows, H, Tq, stride_ob, stride_ot, stride_oh,
                  HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
    """The splits' partial outputs merged into one query row: each weighted by its share of the softmax mass.

    Grid: (B*H*Tq,), one program a row of the ``[B, H, Tq]`` order of O_PART ``[S, rows, D]`` and LSE_PART
    ``[S, rows]`` (log2 units; -inf for a split that saw no key: weight 0). Writes OUT ``[B, Tq, H, D]`` (q's
    dtype); a row no split saw is 0. The same arithmetic as :func:`_merge_reference`, in one launch.
    """
    row = tl.program_id(0)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, HEAD_DIM)
    s_ok = offs_s < S
    wait_for_previous_kernel(PDL)
    lse = tl.load(LSE_PART + offs_s.to(tl.int64) * rows + row, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    part = tl.load(O_PART + (offs_s.to(tl.int64)[:, None] * rows + row) * HEAD_DIM + offs_d[None, :],
                   mask=s_ok[:, None], other=0.0)  # fmt: skip
    out = tl.sum(w[:, None] * part, 0) / tl.maximum(tl.sum(w, 0), 1e-30)
    b = (row // (H * Tq)).to(tl.int64)
    h = (row // Tq) % H
    t = row % Tq
    tl.store(OUT + b * stride_ob + t * stride_ot + h * stride_oh + offs_d, out.to(OUT.dtype.element_ty))


def _merge_reference(o_part: torch.Tensor, lse_part: torch.Tensor) -> torch.Tensor:
    """:func:`_merge_kernel` in PyTorch: o_part ``[S, B, H, Tq, D]``, lse_part ``[S, B, H, Tq]`` -> ``[B, H, Tq, D]``
    float32."""
    m = lse_part.amax(dim=0)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse_part - m)  # [S, B, H, Tq]; 0 for empty splits
    return (w[..., None] * o_part).sum(0) / w.sum(0).clamp_min(1e-30)[..., None]


def _num_splits(bh_blocks: int, Tk: int, block_n: int, device) -> int:
    """How many key splits to fill the GPU when there are few (batch, head, query block) programs."""
    if interpreting() or device.type != "cuda":
        n_sm = 4  # no device queries under the interpreter; a small number still exercises the split path
        min_keys = 2 * block_n
    else:
        n_sm = torch.cuda.get_device_properties(device).multi_processor_count
        min_keys = 4 * block_n  # keep each split long enough to amortise its partial write
    # At least 2 programs per SM, rounded up: on an H200 (24 heads of 64, bf16, caches rotated past the L2), batch 8
    # takes 2 splits in 52.9 us after 4K keys and 189 us after 16K against 68.0 and 252 us with 1; at batch 1 the
    # 11 splits this gives are within 1% of the best of 5 to 44 (results/kernels/fox-tuning/decode_sweep_h200.json).
    want = triton.cdiv(2 * n_sm, bh_blocks)
    return max(1, min(want, triton.cdiv(Tk, min_keys)))


def _append_rows(append, B: int, H: int, D: int, dtype: torch.dtype):
    """The ``append`` rows as the kernel reads them: k/v ``[B, H, D]`` in the cache's dtype with unit stride over D,
    log f ``[B, H]`` float32 or None."""
    k_new, v_new, log_f = append
    rows = []
    for t in (k_new, v_new):
        if t.shape != (B, 1, H, D):
            raise ValueError(f"append rows must be [B, 1, H, D] = {(B, 1, H, D)}; got {tuple(t.shape)}")
        t = t[:, 0].to(dtype)
        rows.append(t if t.stride(-1) == 1 else t.contiguous())
    if log_f is None:
        return rows[0], rows[1], None
    if log_f.shape != (B, 1, H):
        raise ValueError(f"append's log_f must be [B, 1, H] = {(B, 1, H)}; got {tuple(log_f.shape)}")
    return rows[0], rows[1], log_f[:, 0].float()


def _check_decode_args(q, k, v, cum_q, cum_k, key_start, key_length, append, copy_rows):
    """The decode call's arguments checked and normalised: ``(cum_q, cum_k, key_start, key_length, (kn, vn, lf))``
    with the cumulative gates float32, key_start int32 ``[B]``, key_length ``[1]`` and the append rows as
    :func:`_append_rows` gives them (all None without append). Raises ValueError on shapes that do not fit."""
    _check_inputs(q, k, v)
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != H or k.shape[3] != D or Tk < Tq:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not fit q shape {tuple(q.shape)}")
    rows = (None, None, None)
    if append is not None:
        if Tq != 1 or key_length is None or cum_q is not None:
            raise ValueError("append needs one query, key_length, and cum_q None (the new row's cum is computed)")
        if cum_k is not None and cum_k.dtype != torch.float32:
            raise ValueError("append writes into cum_k: it must be float32")
        rows = _append_rows(append, B, H, D, k.dtype)
    elif (cum_q is None) != (cum_k is None):
        raise ValueError("give both cum_q and cum_k, or neither")
    if copy_rows and (append is None or len(copy_rows) > 2):
        raise ValueError("copy_rows needs append, and at most two (src, dst) pairs")
    for src, dst in copy_rows:
        unit = src.stride(-1) == dst.stride(-1) == 1
        if src.shape != (B, H, D) or dst.shape != src.shape or dst.dtype != src.dtype or not unit:
            raise ValueError(f"copy_rows pairs must be [B, H, D] = {(B, H, D)}, one dtype, unit stride over D")
    if cum_k is not None:
        if cum_k.shape != (B, Tk, H) or (cum_q is not None and cum_q.shape != (B, Tq, H)):
            got = (None if cum_q is None else tuple(cum_q.shape), tuple(cum_k.shape))
            raise ValueError(f"cum_q/cum_k must be [B, Tq, H]/[B, Tk, H]; got {got[0]}/{got[1]}")
        cum_k = cum_k.float()  # with append already float32: the kernel writes into it
        cum_q = None if cum_q is None else cum_q.float()
    if key_start is not None:
        if key_start.shape != (B,):
            raise ValueError(f"key_start must be [B]; got {tuple(key_start.shape)}")
        key_start = key_start.to(device=q.device, dtype=torch.int32).contiguous()
    if key_length is not None:
        if key_length.numel() != 1 or key_length.device != q.device:
            raise ValueError(f"key_length must be one integer on {q.device}; got {tuple(key_length.shape)}")
        key_length = key_length.reshape(1)
    return cum_q, cum_k, key_start, key_length, rows


def forgetting_attention_decode_triton(q, k, v, cum_q=None, cum_k=None, *, scale=None, key_start=None,
                                       key_length=None, num_splits=None, append=None, copy_rows=(),
                                       config=None):  # fmt: skip
    """Forgetting Attention for queries that are the last ``Tq`` positions of ``Tk`` keys (forward only).

    Args:
        q: ``[B, Tq, H, D]``; k, v: ``[B, Tk, H, D]`` (bf16/fp16, any strides), ``Tq <= Tk``.
        cum_q, cum_k: ``[B, Tq, H]`` / ``[B, Tk, H]`` cumulative log forget gates, or both None.
        scale: logit scale, default ``1/sqrt(D)``.
        key_start: ``[B]`` integer, first valid key per sequence (left padding), or None.
        key_length: a one-element integer tensor on q's device, or None: only the first ``key_length`` of the
            ``Tk`` rows of k/v (and cum_k) are keys, and the queries are the last ``Tq`` of those. Read on the
            device, so a CUDA graph captured once replays at every cache length (the static decoder's step).
        num_splits: key splits (split-K); default picks enough programs to fill the GPU when Tq is small.
        append: ``(k_new, v_new, log_f)`` for one query (``Tq == 1``) with ``key_length``: this step's key row,
            ``[B, 1, H, D]`` each, and its log forget gate ``[B, 1, H]`` (or None: 0), not yet in the cache. The
            kernel writes them at row ``key_length`` of k/v (and, with cum_k, the previous row's cumulative log
            forget plus log_f into cum_k) and attends over ``key_length + 1`` keys; cum_q is then None (the
            query's own cumulative value is the new row's). The cache must have room for the row.
        copy_rows: with append, up to two ``(src, dst)`` pairs of ``[B, H, D]`` tensors (D contiguous) copied in
            the same launch (``dst.copy_(src)``; the KV-shift rows of FoX (Pro)).
        config: ``(BLOCK_N, num_warps, num_stages)``, default :func:`common.decode_config` (tuning).
    Returns:
        ``[B, Tq, H, D]`` in q's dtype; rows that see no key are 0 (as in the reference).
    """
    cum_q, cum_k, key_start, key_length, (kn, vn, lf) = _check_decode_args(
        q, k, v, cum_q, cum_k, key_start, key_length, append, copy_rows
    )
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    if Tq == 0:
        return q.new_empty(q.shape)
    BLOCK_N, num_warps, num_stages = config or common.decode_config()
    BLOCK_M = 16 if Tq <= 16 else (32 if (interpreting() or Tq <= 32) else 64)
    n_m = triton.cdiv(Tq, BLOCK_M)
    if num_splits is None:
        num_splits = _num_splits(B * H * n_m, Tk, BLOCK_N, q.device)
    keys_per_split = triton.cdiv(triton.cdiv(Tk, num_splits), BLOCK_N) * BLOCK_N
    num_splits = triton.cdiv(Tk, keys_per_split)

    has_c = cum_k is not None
    sm_scale, mult = _scales(scale, D, has_c)
    o_part = triton_utils.empty((num_splits, B, H, Tq, D), torch.float32, q.device)
    lse_part = triton_utils.empty((num_splits, B, H, Tq), torch.float32, q.device)
    unused = lse_part  # the pointer given for an input whose branch the constexpr flags compile out: never read
    cq = cum_q if cum_q is not None else unused
    ck = cum_k if has_c else unused
    cq_strides = cum_q.stride() if cum_q is not None else (0, 0, 0)
    ck_strides = cum_k.stride() if has_c else (0, 0, 0)
    ks = key_start if key_start is not None else unused
    kl = key_length if key_length is not None else unused
    has_lf = lf is not None
    kn, vn, lf = (unused if t is None else t for t in (kn, vn, lf))
    new_strides = (*kn.stride()[:2], *vn.stride()[:2], *lf.stride()[:2])
    pairs = [*copy_rows, *[(unused, unused)] * (2 - len(copy_rows))]
    row_args = [t for pair in pairs for t in pair]
    row_strides = [n for t in row_args for n in t.stride()[:2]]
    pdl = triton_utils.pdl(q.device)
    _decode_kernel[(B * H, n_m, num_splits)](
        q, k, v, cq, ck, ks, kl, kn, vn, lf, *row_args, o_part, lse_part,
        *_strides4(q), *_strides4(k), *_strides4(v), *cq_strides, *ck_strides, *new_strides, *row_strides,
        Tq, Tk, H, keys_per_split, sm_scale, mult,
        HAS_C=has_c, HAS_KS=key_start is not None, HAS_KL=key_length is not None, APPEND=append is not None,
        HAS_LF=has_lf, N_ROWS=len(copy_rows), HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        UPCAST=_upcast(q.dtype), PDL=pdl, launch_pdl=pdl,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip

    if num_splits == 1:
        return o_part[0].permute(0, 2, 1, 3).to(q.dtype)  # [B, H, Tq, D] -> [B, Tq, H, D]
    # one launch for the merge (torch's ops are two kernels a layer in the compiled step: decode-6's profile)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    rows = B * H * Tq
    _merge_kernel[(rows,)](o_part, lse_part, out, num_splits, rows, H, Tq, out.stride(0), out.stride(1), out.stride(2),
                           HEAD_DIM=D, BLOCK_S=triton.next_power_of_2(num_splits), PDL=pdl, launch_pdl=pdl,
                           num_warps=1)  # fmt: skip
    return out


# The appending step as an operator (torch.library), so that torch.compile keeps its launches opaque. Traced as a user
# Triton kernel, the decode kernel's writes would be found by analysing its TTIR, which fails on programmatic
# dependent launch's wait (inline assembly); inductor then takes every input as written and copies the caches.
@torch.library.custom_op(
    "evalsuite::forgetting_append_decode", mutates_args=("k_cache", "v_cache", "cum_cache", "rows_dst")
)
def forgetting_append_decode(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor | None, k_cache: torch.Tensor,
    v_cache: torch.Tensor, cum_cache: torch.Tensor | None, length: torch.Tensor, key_start: torch.Tensor | None,
    rows_src: list[torch.Tensor], rows_dst: list[torch.Tensor],
) -> torch.Tensor:  # fmt: skip
    """:func:`forgetting_attention_decode_triton` with ``append=(k, v, log_f)``, ``key_length=length`` and
    ``copy_rows=zip(rows_src, rows_dst)``: q ``[B, 1, H, D]`` -> ``[B, 1, H, D]`` (contiguous); writes this step's row
    into the caches and copies the rows."""
    out = forgetting_attention_decode_triton(q, k_cache, v_cache, None, cum_cache, key_start=key_start,
                                             key_length=length, append=(k, v, log_f),
                                             copy_rows=tuple(zip(rows_src, rows_dst, strict=True)))  # fmt: skip
    return out.contiguous()


@forgetting_append_decode.register_fake
def _(q, k, v, log_f, k_cache, v_cache, cum_cache, length, key_start, rows_src, rows_dst):
    return q.new_empty(q.shape)
