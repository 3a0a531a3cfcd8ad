"""Where a linear-attention op's time goes, kernel by kernel (``evalsuite bench profile-ops``).

For each op (GSA, Lightning), provider (``bench linear``'s: ours, fla, the chunked PyTorch twins), T and mode (forward,
forward + backward) at fixed tokens per call (B = tokens // T, H = 16, D = 64, GSA's 64 slots, bf16 on CUDA and
float32 on a CPU), the call ``bench linear`` times: 3 warm-up calls, then ``calls`` calls under ``torch.profiler``.
Per case, each kernel's device time per call (on a CPU each op's self time) and its share. Writes
``OUT/profile_ops.txt`` (the tables) and ``profile_ops.json`` (with device, versions, commit). A long T over few heads
shows here which kernels grow with T at fixed tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalsuite.bench.common import Unavailable, format_kernel_rows, kernel_table
from evalsuite.bench.linear import op_builder
from evalsuite.bench.linear_ops import OP_PROVIDERS, OPS

MODES = ("fwd", "fwdbwd")


def _profile_case(op, provider, T, mode, *, tokens, calls, dtype, device) -> dict:
    """One case's record: ``status`` ok with ``device_ms`` and ``kernels``, or why not. The call is ``bench
    linear``'s (:func:`evalsuite.bench.linear.op_builder`)."""
    from torch.profiler import ProfilerActivity, profile

    rec = {"op": op, "provider": provider, "T": T, "B": max(1, tokens // T), "mode": mode}
    cuda = device.type == "cuda"
    try:
        call = op_builder(op, provider, mode, (rec["B"], T, 16, 64, 64, dtype), device)()
    except Unavailable as exc:
        return {**rec, "status": f"unavailable: {exc}"}

    def run():
        for leaf in call.leaves:
            leaf.grad = None
        call.fn()

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    for _ in range(3):
        run()
    sync()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(calls):
            run()
        sync()
    total, rows = kernel_table(prof, calls, cuda)
    return {**rec, "status": "ok", "device_ms": total / 1e3, "kernels": rows}


def profile_ops(out, *, ops=OPS, providers=None, seq_lens=(1024, 16384, 65536), modes=MODES, tokens: int = 65536,
                calls: int = 10, device="auto") -> list[dict]:  # fmt: skip
    """Profile every (op, provider of that op, T, mode) (module doc); ``providers``: of ``bench linear``'s op providers
    (default: ours, ``*_triton`` on CUDA and ``*_chunked`` on a CPU). Returns the records."""
    from evalsuite.bench.common import env_info
    from evalsuite.errors import UserError
    from evalsuite.runtime import resolve_device

    device = resolve_device(device)
    ours = "triton" if device.type == "cuda" else "chunked"
    providers = tuple(providers or (f"gsa_{ours}", f"lightning_{ours}"))
    known = {p for names in OP_PROVIDERS.values() for p in names}
    bad = [o for o in ops if o not in OPS] + [p for p in providers if p not in known]
    bad += [m for m in modes if m not in MODES]
    if bad:
        raise UserError(f"unknown op/provider/mode {', '.join(map(str, bad))}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    records, lines = [], []
    cases = [(op, provider, T, mode) for op in ops for provider in providers if provider in OP_PROVIDERS[op]
             for T in seq_lens for mode in modes]  # fmt: skip
    for op, provider, T, mode in cases:
        rec = _profile_case(op, provider, T, mode, tokens=tokens, calls=calls, dtype=dtype, device=device)
        records.append(rec)
        head = f"== {op} {provider} {mode} T={T} B={rec['B']}: "
        if rec["status"] != "ok":
            case = [head + rec["status"]]
        else:
            case = [head + f"{rec['device_ms']:.3f} ms of kernels a call"]
            case += format_kernel_rows(rec["kernels"][:15], rec["device_ms"] * 1e3) + [""]
        print("\n".join(case), flush=True)
        lines += case
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "profile_ops.txt").write_text("\n".join(lines) + "\n")
    doc = {"env": env_info(), "params": {"ops": list(ops), "providers": list(providers), "seq_lens": list(seq_lens),
                                         "modes": list(modes), "tokens": tokens, "calls": calls, "H": 16, "D": 64,
                                         "slots": 64, "dtype": str(dtype).removeprefix("torch.")},
           "records": records}  # fmt: skip
    (out / "profile_ops.json").write_text(json.dumps(doc, indent=1) + "\n")
    return records
