"""The Forgetting Attention kernels' load and gate variants, interleaved in one process (``evalsuite bench tune
forgetting-tma``): where they pay is what ``C_TMA_MIN_T``, ``GATE_MMA_MIN_T``, ``BWD_TMA_MIN_T``,
``BWD_GATE_MMA_MIN_T`` and ``BWD_GATE_MMA_TMA_MIN_T`` in :mod:`evalsuite.kernels.forgetting.common` are set from
(results/kernels/fox-tuning/).

Two comparisons per head dim and T, at B = tokens_per_call // T, bf16 on a GPU:

* ``forward``: the forward kernel alone with the key cumsums through a 1-D descriptor (time-major storage, as
  ``cumsum_over_time`` returns it) against pointer loads of the same storage with a row pitch of T + 1 (which the
  launcher cannot give TMA), both with the bias on the ALU; the bias through the tensor cores (``gate_mma``:
  :mod:`evalsuite.kernels.forgetting.gate_operands`, its operands' pass included) against the one of the two that
  the launcher picks at that T (``gate_mma_baseline``: descriptors from ``C_TMA_MIN_T``, else pointers); SDPA causal
  and the kernel without the gate timed in the same rounds. ``gate_mma_rel_diff``: its output's relative difference
  from the ALU's (not the same bits: the MMA rounds the bias's sum at another point).
* ``backward``: the backward alone (both kernels and the Delta pass) with its tiles through descriptors against
  pointer loads, with and without the gate; with the gate, also its bias through the tensor cores (operands' pass
  included) through pointers (``gate_mma``, against the ALU's pointers) and through descriptors (``gate_mma_tma``,
  against ``gate_mma``). ``gate_mma_rel_diff``: the largest relative difference of its gradients from the ALU's.

Each record says whether the descriptor and pointer paths gave the same bits (they do the same arithmetic on the
same values). ``parts`` picks the comparisons: ``forward``, ``backward-gate``, ``backward-no-gate``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evalsuite.bench.common import interleaved_ms, ratio_fields, rel_error
from evalsuite.errors import UserError


def _inputs(B, T, H, D, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(B, T, H, D, device=device, generator=g).to(dtype) for _ in range(4))
    log_f = F.logsigmoid(torch.randn(B, T, H, device=device, generator=g) + 4.0)
    return q, k, v, do, log_f


def _forward_record(q, k, v, log_f, rounds) -> dict:
    from evalsuite.kernels.forgetting import common, cumsum_over_time, forward

    B, T, H, _ = q.shape
    cum_tma = cumsum_over_time(log_f)
    pitched = torch.empty(B, H, T + 1, device=q.device)
    pitched[..., :T] = cum_tma.transpose(1, 2)
    cum_ptr = pitched[..., :T].transpose(1, 2)  # the same values, time-major, rows not 16-byte aligned
    assert not common._time_contiguous(cum_ptr)
    # explicit configs so the comparison runs at any T (the shipped rule turns the descriptor off below C_TMA_MIN_T)
    alu = forward._fwd(q, k, v, cum_tma, None, tma=True, c_tma=True, gate_mma=False)[0]
    same = torch.equal(alu, forward._fwd(q, k, v, cum_ptr, None, tma=True, gate_mma=False)[0])
    mma = forward._fwd(q, k, v, cum_tma, None, tma=True, gate_mma=True)[0]
    calls = {"tma": lambda: forward._fwd(q, k, v, cum_tma, None, tma=True, c_tma=True, gate_mma=False),
             "pointers": lambda: forward._fwd(q, k, v, cum_ptr, None, tma=True, gate_mma=False),
             "gate_mma": lambda: forward._fwd(q, k, v, cum_tma, None, tma=True, gate_mma=True)}  # fmt: skip
    if q.is_cuda:
        qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        calls["no_gate"] = lambda: forward._fwd(q, k, v, None, None)
        calls["sdpa"] = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    samples = interleaved_ms(calls, rounds=rounds, device=q.device)
    rec = {"kind": "forward", "same_bits": bool(same), "gate_mma_rel_diff": rel_error(mma, alu), **_medians(samples)}
    rec.update(ratio_fields("tma_over_pointers", samples["tma"], samples["pointers"]))
    baseline = "tma" if common.key_cumsums_through_tma(T) else "pointers"
    rec["gate_mma_baseline"] = baseline
    rec.update(ratio_fields("gate_mma_over_alu", samples["gate_mma"], samples[baseline]))
    if "sdpa" in samples:
        rec.update(ratio_fields("tma_over_sdpa", samples["tma"], samples["sdpa"]))
        rec.update(ratio_fields("gate_mma_over_sdpa", samples["gate_mma"], samples["sdpa"]))
    return rec


def _backward_record(q, k, v, do, log_f, gated, rounds) -> dict:
    from evalsuite.kernels.forgetting import cumsum_over_time, forward
    from evalsuite.kernels.forgetting.backward import _bwd

    cum = cumsum_over_time(log_f) if gated else None
    o, lse = forward._fwd(q, k, v, cum, None, gate_mma=False)
    variants = {"tma": {"tma": True, "gate_mma": False}, "pointers": {"tma": False, "gate_mma": False}}
    if gated:
        variants.update(gate_mma={"tma": False, "gate_mma": True}, gate_mma_tma={"tma": True, "gate_mma": True})
    runs = {name: _bwd(do, q, k, v, cum, o, lse, None, **kw) for name, kw in variants.items()}
    pairs = [("tma", "pointers")] + [("gate_mma_tma", "gate_mma")] * gated
    same = all(a is None and b is None or torch.equal(a, b)
               for x, y in pairs for a, b in zip(runs[x], runs[y], strict=True))  # fmt: skip
    calls = {name: lambda kw=kw: _bwd(do, q, k, v, cum, o, lse, None, **kw) for name, kw in variants.items()}
    samples = interleaved_ms(calls, rounds=rounds, device=q.device)
    rec = {"kind": "backward", "gate": gated, "same_bits": bool(same), **_medians(samples)}
    rec.update(ratio_fields("tma_over_pointers", samples["tma"], samples["pointers"]))
    if gated:
        rec["gate_mma_rel_diff"] = max(rel_error(a, b) for a, b in zip(runs["gate_mma"], runs["pointers"], strict=True))
        rec.update(ratio_fields("gate_mma_over_pointers", samples["gate_mma"], samples["pointers"]))
        rec.update(ratio_fields("gate_mma_tma_over_gate_mma", samples["gate_mma_tma"], samples["gate_mma"]))
    return rec


def _medians(samples) -> dict:
    return {f"{name}_ms": float(torch.tensor(ms).median()) for name, ms in samples.items()}


PARTS = ("forward", "backward-gate", "backward-no-gate")


def tune(seq_lens=(1024, 4096, 16384, 65536), head_dims=(64, 128), n_heads: int = 16, tokens_per_call: int = 65536,
         rounds: int = 10, parts=PARTS, device: str | None = None, verbose: bool = True) -> dict:  # fmt: skip
    """The comparisons named in ``parts`` (:data:`PARTS`) at each (D, T), on ``device`` (default: the GPU; a CPU
    under the Triton interpreter, for tests). ``best``: per comparison and D, the smallest T from which the variant
    was faster (median ratio < 1) at every larger T measured, or None: ``forward``, ``backward_gate``,
    ``backward_no_gate`` (descriptors against pointers), ``gate_mma`` (the forward's bias through the tensor cores
    against the ALU path the launcher picks), ``backward_gate_mma`` (the same in the backward, through pointers) and
    ``backward_gate_mma_tma`` (its descriptors against its pointers)."""
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise UserError(f"unknown part {unknown[0]!r}; choose from {', '.join(PARTS)}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    records = []
    for D in head_dims:
        for T in seq_lens:
            B = max(1, tokens_per_call // T)
            q, k, v, do, log_f = _inputs(B, T, n_heads, D, torch.bfloat16 if device != "cpu" else torch.float16, device)
            shape = {"D": D, "T": T, "B": B, "H": n_heads}
            found = [_forward_record(q, k, v, log_f, rounds)] if "forward" in parts else []
            for gated, part in ((True, "backward-gate"), (False, "backward-no-gate")):
                if part in parts:
                    found.append(_backward_record(q, k, v, do, log_f, gated, rounds))
            for rec in found:
                rec.update(shape)
                if verbose:
                    label = rec["kind"] + ("" if rec["kind"] == "forward" else " gate" if rec["gate"] else " no gate")
                    mma = f" gate_mma/alu {rec['gate_mma_over_alu']:.3f}" if "gate_mma_over_alu" in rec else ""
                    if "gate_mma_over_pointers" in rec:
                        mma = (f" gate_mma/pointers {rec['gate_mma_over_pointers']:.3f}, its tma/pointers "
                               f"{rec['gate_mma_tma_over_gate_mma']:.3f}")  # fmt: skip
                    print(f"D={D:<4d} T={T:<6d} {label:17s} tma/pointers {rec['tma_over_pointers']:.3f} "
                          f"[{rec['tma_over_pointers_p20']:.3f}-{rec['tma_over_pointers_p80']:.3f}] "
                          f"same bits {rec['same_bits']}{mma}", flush=True)  # fmt: skip
            records += found
    return {"records": records, "best": _thresholds(records)}


def _thresholds(records) -> dict:
    best = {}
    for rec in records:
        name = rec["kind"] if rec["kind"] == "forward" else f"backward_{'gate' if rec['gate'] else 'no_gate'}"
        best.setdefault(name, {}).setdefault(str(rec["D"]), []).append((rec["T"], rec["tma_over_pointers"]))
        for ratio, key in (("gate_mma_over_alu", "gate_mma"), ("gate_mma_over_pointers", "backward_gate_mma"),
                           ("gate_mma_tma_over_gate_mma", "backward_gate_mma_tma")):  # fmt: skip
            if ratio in rec:
                best.setdefault(key, {}).setdefault(str(rec["D"]), []).append((rec["T"], rec[ratio]))
    out = {}
    for name, per_dim in best.items():
        out[name] = {}
        for D, points in per_dim.items():
            points.sort()
            start = None
            for T, ratio in reversed(points):
                if ratio >= 1:
                    break
                start = T
            out[name][D] = start
    return out
