"""Kernel-level benchmark commands, ``evalsuite bench srmsnorm|gemv|sass|profile-ops``: thin layers over
:mod:`evalsuite.bench`. Registered on the ``bench`` group when :mod:`evalsuite.cli.main` imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import bench_app
from evalsuite.cli.bench import LinearOpsOpt, RoundsOpt, _check_choices
from evalsuite.cli.options import DeviceOpt, _csv_list
from evalsuite.errors import UserError


@bench_app.command("srmsnorm")
def bench_srmsnorm_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown).")] = Path(
        "results/runs/bench/srmsnorm"
    ),
    seq_lens: Annotated[str, typer.Option(help="Sequence lengths at feature dim 3072.")] = "1024,2048,4096,8192,16384,"
    "32768",
    dims: Annotated[str, typer.Option(help="Feature dims at sequence length 4096.")] = "1024,2048,3072,4096,6144,8192,"
    "12288,16384",
    batch: Annotated[int, typer.Option(help="Sequences a call (the paper does not give it).", min=1)] = 1,
    providers: Annotated[str, typer.Option(help="triton, torch, torch_compile; comma-separated.")] = (
        "triton,torch,torch_compile"
    ),
    modes: Annotated[str, typer.Option(help="fwd, bwd; comma-separated.")] = "fwd,bwd",
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    rounds: RoundsOpt = 10,
    device: DeviceOpt = "auto",
):
    """SRMSNorm's Triton kernels against PyTorch, forward and backward (the Lightning paper's Figure 7)."""
    from evalsuite.bench import srmsnorm

    lists = {
        "seq_lens": _csv_list(seq_lens, int, "--seq-lens"),
        "dims": _csv_list(dims, int, "--dims"),
        "providers": _csv_list(providers, str, "--providers"),
        "modes": _csv_list(modes, str, "--modes"),
    }
    srmsnorm.bench_srmsnorm(out, **lists, batch=batch, rounds=rounds, dtype=dtype, device=device)
    typer.echo(f"wrote {out}/{srmsnorm.JSON_NAME} and .md")


@bench_app.command("gemv")
def bench_gemv_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown).")] = Path(
        "results/runs/bench/gemv"
    ),
    shapes: Annotated[
        str | None,
        typer.Option(help="Maps as NxK, comma-separated [default: every map of a FoX/GSA/TNL decode step]."),
    ] = None,
    rows: Annotated[str, typer.Option(help="Rows of x (the decode batch), comma-separated, 1 to 16.")] = "1,8",
    providers: Annotated[str, typer.Option(help="torch, triton, auto; comma-separated.")] = "torch,triton,auto",
    config: Annotated[
        list[str] | None,
        typer.Option(help="The kernel at BLOCK_N,BLOCK_K,WARPS,STAGES as one more provider; repeatable."),
    ] = None,
    calls: Annotated[int, typer.Option(help="Calls a sample, each on its own copy of W.", min=1)] = 20,
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    rounds: RoundsOpt = 10,
    device: DeviceOpt = "auto",
):
    """Decode-step linear maps: our few-row GEMV kernel against F.linear (cuBLAS), in CUDA graphs, interleaved."""
    from evalsuite.bench import gemv

    maps = None
    if shapes is not None:
        maps = [_map_shape(text) for text in _csv_list(shapes, str, "--shapes")]
    gemv.bench_gemv(out, shapes=maps, rows=_csv_list(rows, int, "--rows"), configs=config or (), calls=calls,
                    providers=_csv_list(providers, str, "--providers"), rounds=rounds, dtype=dtype,
                    device=device)  # fmt: skip
    typer.echo(f"wrote {out}/{gemv.JSON_NAME} and .md")


def _map_shape(text: str) -> tuple[int, int]:
    """``"7168x1536"`` -> (7168, 1536); one UserError line for anything else."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise UserError(f"--shapes takes NxK maps such as 7168x1536, got {text!r}")
    return int(parts[0]), int(parts[1])


@bench_app.command("sass")
def bench_sass_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON).")] = Path("results/runs/bench/sass"),
    kernels: Annotated[
        str,
        typer.Option(
            help="forgetting-fwd, forgetting-dq, forgetting-dkdv, gsa-read, gsa-pair, gsa-dgate; comma-separated."
        ),
    ] = "forgetting-fwd,forgetting-dq,forgetting-dkdv",
    head_dims: Annotated[str, typer.Option(help="Comma-separated head dims (64, 128; GSA: dk = dv = m).")] = "64,128",
    arch: Annotated[int, typer.Option(help="Compute capability to compile for, as 90 for sm_90a (H100/H200).")] = 90,
):
    """Instruction mix per loop iteration (or whole kernel) of our attention kernels compiled for sm_90a, no GPU."""
    from evalsuite.bench import sass

    names = _csv_list(kernels, str, "--kernels")
    _check_choices({"--kernels": names}, {"--kernels": sass.KERNELS})
    dims = _csv_list(head_dims, int, "--head-dims")
    _check_choices({"--head-dims": [str(d) for d in dims]}, {"--head-dims": ("64", "128")})
    records = sass.sass_loops(out, kernels=names, head_dims=dims, arch=arch)
    typer.echo(sass.format_loops(records))
    typer.echo(f"wrote {out}/{sass.JSON_NAME}")


@bench_app.command("profile-ops")
def bench_profile_ops_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (.txt and .json).")] = Path(
        "results/runs/bench/profile-ops"
    ),
    ops: LinearOpsOpt = "gsa,lightning",
    providers: Annotated[
        str | None, typer.Option(help="Comma-separated (default: ours, *_triton on CUDA, *_chunked on a CPU).")
    ] = None,
    seq_lens: Annotated[str, typer.Option(help="Comma-separated T values.")] = "1024,16384,65536",
    modes: Annotated[str, typer.Option(help="Comma-separated: fwd, fwdbwd.")] = "fwd,fwdbwd",
    tokens: Annotated[int, typer.Option(help="Tokens a call (B = tokens // T).", min=1)] = 65536,
    calls: Annotated[int, typer.Option(help="Profiled calls per case.", min=1)] = 10,
    device: DeviceOpt = "auto",
):
    """Kernel-by-kernel device time of GSA and Lightning Attention calls (torch.profiler), per T and mode."""
    from evalsuite.bench import profile_ops

    profile_ops.profile_ops(out, ops=_csv_list(ops, str, "--ops"), providers=_csv_list(providers, str, "--providers"),
                            seq_lens=_csv_list(seq_lens, int, "--seq-lens"), modes=_csv_list(modes, str, "--modes"),
                            tokens=tokens, calls=calls, device=device)  # fmt: skip
    typer.echo(f"wrote {out}/profile_ops.txt and .json")
