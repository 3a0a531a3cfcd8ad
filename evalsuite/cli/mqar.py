"""``evalsuite mqar`` (a training sweep on multi-query associative recall) and ``evalsuite plot mqar``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import app, plot_app
from evalsuite.cli.options import (
    BackendOpt,
    DeviceOpt,
    OutOpt,
    RepairOpt,
    SeedOpt,
    _csv_list,
    _key_values,
    _only_main,
)
from evalsuite.errors import UserError


@app.command()
def mqar(
    preset: Annotated[str, typer.Option(help="Preset in tasks/mqar.yaml: ci, gsa-paper, zoology-fig2.")] = "ci",
    models: Annotated[str | None, typer.Option(help="Comma-separated cards or architectures, or 'all'.")] = None,
    d_model: Annotated[str | None, typer.Option(help="Comma-separated model widths.")] = None,
    seq_len: Annotated[str | None, typer.Option(help="Comma-separated sequence lengths.")] = None,
    kv_pairs: Annotated[str | None, typer.Option(help="Comma-separated kv-pair counts.")] = None,
    pairing: Annotated[str | None, typer.Option(help="zip (pair lengths with kv counts) or product.")] = None,
    lr: Annotated[str | None, typer.Option(help="Comma-separated learning rates (best over them is reported).")] = (
        None
    ),
    layers: Annotated[int | None, typer.Option(min=1, help="Layers per model.")] = None,
    heads: Annotated[int | None, typer.Option(min=1, help="Attention heads (default: d_model / preset head_dim).")] = (
        None
    ),
    mlp: Annotated[bool | None, typer.Option("--mlp/--no-mlp", help="MLP in every block.")] = None,
    max_steps: Annotated[int | None, typer.Option(min=1, help="Training steps per cell (early stop > 0.99).")] = None,
    batch_size: Annotated[int | None, typer.Option(min=1, help="Training batch size.")] = None,
    workers: Annotated[int, typer.Option(min=1, help="Subprocesses training cells at once on one device.")] = 1,
    threads: Annotated[int, typer.Option(min=1, help="Cells trained at once in each worker (CUDA streams).")] = 1,
    cuda_graph: Annotated[
        bool | None, typer.Option("--cuda-graph/--no-cuda-graph", help="Replay training steps as CUDA graphs.")
    ] = None,
    compile: Annotated[
        bool | None, typer.Option("--compile/--no-compile", help="torch.compile the forward (default: on CUDA).")
    ] = None,
    stack: Annotated[
        bool, typer.Option("--stack/--no-stack", help="Cells differing only in lr/seed train as one stacked model.")
    ] = False,
    stack_size: Annotated[
        int | None, typer.Option(min=2, help="Cells per stacked model at most (with --stack; default 8).")
    ] = None,
    time_limit: Annotated[float | None, typer.Option(help="Seconds after which no new cell starts.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = None,
    out: OutOpt = None,
    repair: RepairOpt = False,
    attention: BackendOpt = "auto",
    progress: Annotated[bool, typer.Option(help="Show a progress bar (else one line per finished cell).")] = True,
    report: Annotated[bool, typer.Option(help="Write tables and plots into the run directory.")] = True,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            help="Any sweep field KEY=VALUE (YAML value; e.g. tie_head=true, "
            "grad_clip=null, schedule=epoch-cosine); repeatable, applied last.",
        ),
    ] = None,
):
    """Train models on multi-query associative recall (Zoology's MQAR) over a sweep; table and plots."""
    from evalsuite.tasks.mqar import MQARSweep, default_run_dir, run_mqar, sweep_from_options

    # the attention backend is checked against each model's family by the task, before anything is written
    sweep = sweep_from_options(
        preset, models=_csv_list(models, str, "--models"), d_models=_csv_list(d_model, int, "--d-model"),
        seq_lens=_csv_list(seq_len, int, "--seq-len"), num_kv_pairs=_csv_list(kv_pairs, int, "--kv-pairs"),
        pairing=pairing, lrs=_csv_list(lr, float, "--lr"), num_layers=layers, num_heads=heads, use_mlp=mlp,
        max_steps=max_steps, batch_size=batch_size, seed=seed,
    )  # fmt: skip
    if settings:
        sweep = MQARSweep.from_dict({**sweep.to_dict(), **_key_values(settings)})
    run_dir = out or default_run_dir(sweep, preset)
    stacked = (stack_size or True) if stack else False  # True: stacks of the task's default size
    results = run_mqar(sweep, run_dir, device=device, attention=attention, workers=workers, threads=threads,
                       cuda_graph=cuda_graph, compile=compile, stack=stacked, time_limit=time_limit, progress=progress,
                       preset=preset, on_record=None if progress else _echo_mqar_cell, repair=repair)  # fmt: skip
    _only_main()
    _show_sweep(results, preset, run_dir, report)


def _show_sweep(results: dict, preset: str, run_dir: Path, report: bool) -> None:
    """The sweep's progress, failed cells and best-accuracy table (and, with ``report``, its tables and plots in the
    run directory); a UserError when a cell failed or a model's best cell missed the preset's accuracy check."""
    from evalsuite.report.mqar import best_over_lr, best_table, load_mqar, write_mqar_report
    from evalsuite.tasks.mqar import check_best

    summary = results["summary"]
    cells, errors, threshold = summary["cells"], summary["errors"], summary["sweep"]["check_accuracy"]
    typer.echo(f"mqar {preset}: {cells['finished']}/{cells['total']} cells in {run_dir}")
    for error in errors:
        typer.echo(f"  cell failed: {error}", err=True)
    if cells["pending"]:
        typer.echo(f"  {len(cells['pending'])} cells pending; rerun the same command to resume")
    if results["records"]:
        typer.echo(best_table(best_over_lr(load_mqar([run_dir]))).to_markdown(floatfmt=".3f"))
        for path in write_mqar_report([run_dir], run_dir) if report else []:
            typer.echo(f"wrote {path}")
    if threshold is not None:
        check_best(results, threshold)
    if errors:
        raise UserError(f"{len(errors)} MQAR cell(s) failed; see the messages above")


def _echo_mqar_cell(r: dict) -> None:
    variant = f" [{r['variant']}]" if r.get("variant") else ""
    seed = f" seed={r['seed']}" if r.get("seed") is not None else ""
    typer.echo(
        f"  {r['model']}{variant} T={r['length']} kv={r['num_kv_pairs']} d={r['d_model']} lr={r['lr']:g}{seed}: "
        f"accuracy {r['value']:.4f} after {r['steps']} steps ({r['train_seconds']:.0f} s)",
        err=True,
    )


@plot_app.command("mqar")
def plot_mqar_cmd(
    runs: Annotated[list[Path], typer.Argument(help="MQAR run directories (or folders of them).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output directory.")] = Path("results/plots/mqar"),
):
    """MQAR: accuracy vs d_model (one panel per setting), accuracy vs state size, best-accuracy tables."""
    from evalsuite.report.mqar import write_mqar_report

    for path in write_mqar_report(runs, out):
        typer.echo(f"wrote {path}")
