"""``evalsuite bench sass``: our kernels compiled for sm_90a on this CPU-only machine, and the loop finder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from evalsuite.bench.sass import innermost_loops

LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0020*/                   FADD R2, R3, R4 ;
        /*0030*/              @P0  BRA 0x10 ;
        /*0040*/                   FFMA R2, R3, R4, R5 ;
        /*0050*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], R24 ;
        /*0060*/                   MUFU.EX2 R6, R7 ;
        /*0070*/                   MUFU.EX2 R8, R9 ;
        /*0080*/             @!P1  BRA 0x50 ;
        /*0090*/                   FADD R2, R3, R4 ;
        /*00a0*/                   BRA 0x90 ;
        /*00b0*/                   EXIT ;
"""


def _sass_cli(out, kernels: str) -> subprocess.CompletedProcess:
    """``evalsuite bench sass --kernels KERNELS --head-dims 64`` in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["bench", "sass", "--kernels", kernels, "--head-dims", "64", "--out", str(out)]
    return subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip


def test_innermost_loops_reads_back_edges_with_tensor_core_work():
    """Two loops with an HGMMA (the second's body through its predicated branch), the idle loop at 0x90 left out."""
    loops = innermost_loops(LISTING)
    assert loops == [
        {"instructions": 3, "opcodes": {"HGMMA": 1, "FADD": 1, "BRA": 1}},
        {"instructions": 4, "opcodes": {"MUFU": 2, "HGMMA": 1, "BRA": 1}},
    ]


def test_an_outer_loop_holding_another_is_not_innermost():
    nested = LISTING.replace("/*00a0*/                   BRA 0x90 ;", "/*00a0*/                   BRA 0x0 ;")
    assert [loop["instructions"] for loop in innermost_loops(nested)] == [3, 4]


def test_the_forward_gate_costs_one_more_tensor_core_step(tmp_path):
    """The CLI compiles the forward at D = 64 (BLOCK 128 x 64, 4 warps: 64 scores per thread and key block) for
    sm_90a without a GPU. At T = 16K the gate's bias goes through the tensor cores (kernels/forgetting/
    gate_operands.py): the key loop issues the float instructions, exp2s and maxima of the loop without a gate, and
    two more HGMMA (the bias's K step for each of the warp group's two halves)."""
    done = _sass_cli(tmp_path, "forgetting-fwd")
    assert done.returncode == 0, done.stderr
    records = {rec["gate"]: rec for rec in json.loads((tmp_path / "sass_loops.json").read_text())}
    gated, plain = (records[g]["loops"][0]["opcodes"] for g in (True, False))  # loop 0: keys left of the diagonal
    for op in ("FADD", "FFMA", "FMUL", "MUFU", "FMNMX"):
        assert gated[op] == plain[op], op
    assert gated["HGMMA"] == plain["HGMMA"] + 2
    assert records[True]["arch"] == "sm_90a" and records[True]["registers"] > 0


def test_bad_kernel_name_is_one_clear_error(tmp_path):
    done = _sass_cli(tmp_path, "flash")
    assert done.returncode != 0 and "unknown --kernels value(s) flash" in done.stderr


def test_gsa_chunk_kernels_issue_their_products_unrolled(tmp_path):
    """The GSA read and pair kernels at D = m = 64 (one 64-slot tile, 4 warps: one m64n64k16 HGMMA per 16 of the
    contraction): read's 9 products of 64 x 64 tiles (q k^T, the 3 + 3 + 1 decay levels, q h0^T) and pair's 7 (the
    decay levels) come out as 36 and 28 HGMMA, with no loop around them, so ``whole`` counts the kernel. The dgate
    kernel (the backward's largest) compiles too, on the tensor cores."""
    done = _sass_cli(tmp_path, "gsa-read,gsa-pair,gsa-dgate")
    assert done.returncode == 0, done.stderr
    records = {rec["kernel"]: rec for rec in json.loads((tmp_path / "sass_loops.json").read_text())}
    hgmma = {k: r["whole"]["opcodes"].get("HGMMA", 0) for k, r in records.items()}
    assert hgmma["gsa-read"] == 36 and hgmma["gsa-pair"] == 28 and hgmma["gsa-dgate"] > 0
    assert all(r["gate"] is None and r["whole"]["instructions"] > 1000 for r in records.values())
    assert "gsa-read         D=64            kernel:" in done.stdout
