"""Block-config sweep of the Gated Slot Attention chunk kernels (``evalsuite bench tune gsa``).

At one shape (default B = 4, T = 16384, H = 16, dk = dv = m = 64, bf16, scale 1) it times our forward and
forward+backward with the shipped :data:`~evalsuite.kernels.gated_slot.common.GPU_CONFIG`, then sweeps one kernel
family at a time, the others at the winners so far: the state scans (STATE_BD, STATE_WARPS, STATE_STAGES; objective
2 forward scans + 1 backward scan, as in one step), the read kernel (READ_BM, READ_WARPS; 2 calls), the pair kernel
(PAIR_BM, PAIR_WARPS; p and e), the write kernels (WRITE_BM, WRITE_BD, WRITE_WARPS; o, dq, dk, dv), the dgate kernel
(DGATE_BM, DGATE_WARPS), then (CHUNK, SUB) end to end. Every candidate goes to the launchers as their ``cfg``
argument. With ``configs`` (a list of overrides of GPU_CONFIG) it times those end to end instead of sweeping: the
state scans' segmenting (SEG_PROGRAMS, SEG_CHUNKS, SEG_WALKS) is timed so, e.g. ``[{}, {"SEG_PROGRAMS": 0}]`` (0: one
walk per program, never segments) at a long sequence over few heads.
``best`` is the fastest full configuration, a dict to paste into ``common.GPU_CONFIG``.
"""

from __future__ import annotations

import itertools
import time

import torch

from evalsuite.bench.common import time_ms

# READ_BM 32 faults on the H100 and DGATE_BM 16 on the H200 at the default shape (illegal memory access, triton
# 3.6), which ends the process: never list them here.
FAMILIES = [
    ("state scans", "states", {"STATE_BD": (16, 32, 64), "STATE_WARPS": (4, 8), "STATE_STAGES": (1, 2)}),
    ("read", "read", {"READ_BM": (64, 128), "READ_WARPS": (4, 8)}),
    ("pair", "pairs", {"PAIR_BM": (16, 32, 64), "PAIR_WARPS": (4, 8)}),
    ("write", "write", {"WRITE_BM": (32, 64), "WRITE_BD": (64, 128), "WRITE_WARPS": (4, 8)}),
    ("dgate", "dgate", {"DGATE_BM": (32, 64), "DGATE_WARPS": (4, 8)}),
]
BLOCKS = [(64, 16), (64, 8), (64, 32), (32, 16), (32, 8)]  # (CHUNK, SUB)


def _ms(fn) -> float:
    fn()
    return time_ms(fn, (), "cuda", warmup=10, rep=60)[0]


class _Problem:
    """Inputs ``[B, T, H, D]`` (m = D slots) and the launch sequence of one step, for timing configs."""

    def __init__(self, B, T, H, D, dtype=torch.bfloat16):
        gen = torch.Generator(device="cuda").manual_seed(0)
        self.q, self.k, self.v, self.do = (torch.randn(B, T, H, D, device="cuda", generator=gen).to(dtype)
                                           for _ in range(4))  # fmt: skip
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device="cuda", generator=gen)) / 8
        self.g = g.contiguous()
        self.leaves = [x.clone().requires_grad_(True) for x in (self.q, self.k, self.v, self.g)]

    def fwd(self, cfg):
        from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton

        with torch.no_grad():
            return gsa_chunk_triton(self.q, self.k, self.v, self.g, scale=1.0, config=cfg)[0]

    def step(self, cfg):
        from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton

        for x in self.leaves:
            x.grad = None
        gsa_chunk_triton(*self.leaves, scale=1.0, config=cfg)[0].backward(self.do)

    def family_ms(self, family: str, cfg) -> float:
        """The objective of one kernel family: its launches of one forward+backward step."""
        from evalsuite.kernels.gated_slot import chunk

        q, k, v, g, do = self.q, self.k, self.v, self.g, self.do
        hsk, hsv = chunk._states(k, v, g, None, None, cfg)
        z, dp = chunk._read(q, k, g, hsk, 1.0, cfg), chunk._read(do, v, g, hsv, 1.0, cfg)
        dhsk, dhsv, _ = chunk._state_adjoints(q, do, z, dp, g, None, None, False, 1.0, cfg)
        a_p, a_e = chunk._pairs(z, None, g, 1.0, 1, q.dtype, cfg), chunk._pairs(z, dp, g, 1.0, 2, q.dtype, cfg)
        calls = {
            "states": [lambda: chunk._states(k, v, g, None, None, cfg)] * 2
            + [lambda: chunk._state_adjoints(q, do, z, dp, g, None, None, False, 1.0, cfg)],
            "read": [lambda: chunk._read(q, k, g, hsk, 1.0, cfg), lambda: chunk._read(do, v, g, hsv, 1.0, cfg)],
            "pairs": [
                lambda: chunk._pairs(z, None, g, 1.0, 1, q.dtype, cfg),
                lambda: chunk._pairs(z, dp, g, 1.0, 2, q.dtype, cfg),
            ],  # fmt: skip
            "write": [
                lambda: chunk._write(v, z, None, g, hsv, a_p, 1.0, 1, v.dtype, cfg),
                lambda: chunk._write(k, z, dp, g, hsk, a_e, 1.0, 2, q.dtype, cfg),
                lambda: chunk._write_rev(q, g, dhsk, a_e, k.dtype, cfg),
                lambda: chunk._write_rev(do, g, dhsv, a_p, v.dtype, cfg),
            ],  # fmt: skip
            "dgate": [lambda: chunk._dgate(q, k, v, do, z, dp, g, hsk, hsv, dhsk, dhsv, 1.0, cfg)],
        }[family]
        return sum(_ms(c) for c in calls)


def _record(config, fn) -> dict:
    try:
        return {"config": config, "ms": fn()}
    except Exception as exc:  # noqa: BLE001 -- a config that does not compile or run is a result too
        return {"config": config, "error": f"{type(exc).__name__}: {exc}"[:300]}


def tune(shape=(4, 16384, 16, 64), configs=None, budget: float = 210.0, verbose: bool = True) -> dict:
    """The sweep (module doc) at ``shape = (B, T, H, D)``; ``configs``: overrides to time instead; ``budget``:
    seconds after which the sweeps still to come are skipped (the end-to-end block sizes then take only the first)."""
    from evalsuite.kernels.gated_slot.common import GPU_CONFIG

    start = time.time()
    problem = _Problem(*shape)
    shipped = dict(GPU_CONFIG)
    report = {"shape": dict(zip("BTHD", shape, strict=True)), "shipped": shipped}
    report["shipped_ms"] = {"fwd": _ms(lambda: problem.fwd(shipped)), "fwd_bwd": _ms(lambda: problem.step(shipped))}
    if verbose:
        print("shipped:", {k: f"{v:.3f} ms" for k, v in report["shipped_ms"].items()}, flush=True)
    if configs:
        rows = [_record(o, lambda o=o: _ms(lambda: problem.step({**shipped, **o}))) for o in configs]
        report.update(records=rows, best=_fastest(rows, shipped))
        return report
    best, rows = dict(shipped), []
    for name, family, space in FAMILIES:
        if time.time() - start > budget:
            rows.append({"family": name, "skipped": f"past the budget of {budget:.0f} s"})
            continue
        trials = [dict(zip(space, values, strict=True)) for values in itertools.product(*space.values())]
        done = [{"family": name, **_record(t, lambda t=t, f=family: problem.family_ms(f, {**best, **t}))}
                for t in trials]  # fmt: skip
        best.update(_fastest(done, {}))
        rows += done
        if verbose:
            print(f"{name}: best {_fastest(done, {})}", flush=True)
    blocks = BLOCKS if time.time() - start < budget + 20 else BLOCKS[:1]
    ends = [{"family": "blocks", **_record({"CHUNK": c, "SUB": s},
                                          lambda c=c, s=s: _ms(lambda: problem.step({**best, "CHUNK": c, "SUB": s})))}
            for c, s in blocks]  # fmt: skip
    best.update(_fastest(ends, {}))
    report.update(records=rows + ends, best=best)
    if verbose:
        print("best GPU_CONFIG:", best, flush=True)
    return report


def _fastest(rows, default) -> dict:
    timed = [r for r in rows if "ms" in r]
    return dict(min(timed, key=lambda r: r["ms"])["config"]) if timed else dict(default)
