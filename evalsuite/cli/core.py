"""The general commands: ``models``, ``tasks``, ``run TASK``, ``loss`` with ``plot loss``, and ``table``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import app, plot_app
from evalsuite.cli.options import (
    BackendOpt,
    CheckpointOpt,
    CompileOpt,
    DeviceOpt,
    DtypeOpt,
    OutOpt,
    PlotOpt,
    RepairOpt,
    SeedOpt,
    _adapter,
    _key_values,
    _note_random_weights,
    _run,
    _seed_everything,
)
from evalsuite.errors import UserError


@app.command()
def models():
    """List the model cards: architecture, parameters, context lengths, weights source."""
    from rich.console import Console
    from rich.table import Table

    from evalsuite.cards import count_params, list_cards

    table = Table("name", "architecture", "params (non-emb.)", "train length", "max length", "tokenizer", "weights")
    for card in list_cards():
        n = count_params(card)
        params = f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"
        table.add_row(
            card.name,
            card.architecture,
            params,
            str(card.train_length or "-"),
            str(card.max_length or "-"),
            card.tokenizer,
            card.weights_summary(),
        )
    Console(width=200).print(table)


@app.command("tasks")
def tasks_cmd():
    """List the registered tasks and what each needs from a model."""
    from evalsuite.tasks.base import TASKS

    for name, cls in TASKS.items():
        needs = ", ".join(sorted(cls.needs)) or "no model (trains its own)"
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        typer.echo(f"{name:14s} needs: {needs:28s} {doc}")


@app.command("run")
def run_cmd(
    task: Annotated[str, typer.Argument(help="A registered task (see `evalsuite tasks`).")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="KIND:NAME; tasks that train their own models take none.")
    ] = None,
    options: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", help="Task option KEY=VALUE (the value is read as YAML); repeatable."),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    out: OutOpt = None,
    repair: RepairOpt = False,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
    compile: CompileOpt = False,
):
    """Run any registered task, its options given as KEY=VALUE: the generic form of the task commands."""
    from evalsuite.tasks.base import TASKS

    task_obj = TASKS.get(task).from_options(_key_values(options or []))
    adapter = _adapter(model, device, dtype, checkpoint, attention, compile) if model else None
    results = _run(task_obj, adapter, out, repair)
    records = results["records"]
    typer.echo(f"{task}: {len(records)} records in {results['run_dir']}")
    if records:
        import pandas as pd

        columns = ["model", "subtask", "length", "depth", "metric", "value", "n"]
        shown = pd.DataFrame(records).reindex(columns=columns).head(40)
        typer.echo(shown.to_markdown(index=False, floatfmt=".4g"))


@app.command()
def loss(
    model: Annotated[
        list[str],
        typer.Option("--model", "-m", help="KIND:NAME; repeat --model to compare models in one plot."),
    ],
    data: Annotated[
        str, typer.Option(help="File or directory (.txt, .jsonl[.xz], .npy), 'synthetic' or 'books' (built in).")
    ] = ("synthetic"),
    length: Annotated[
        int | None, typer.Option(help="Window length in tokens, BOS included [default: 65536, or the model's max].")
    ] = None,
    max_docs: Annotated[int | None, typer.Option(help="Stop after this many windows.")] = None,
    roll: Annotated[bool, typer.Option(help="Rotate each window by a seeded random shift (LongCrawl64).")] = False,
    batch_size: Annotated[int, typer.Option(help="Windows per forward pass.")] = 1,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    seed: SeedOpt = 0,
    out: OutOpt = None,
    repair: RepairOpt = False,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
    compile: CompileOpt = False,
    plot: PlotOpt = True,
):
    """Per-token loss L(i) and perplexity P(l) over one window per document (FoX §4.2), and their plot; several
    models' curves in one plot with --model repeated."""
    from evalsuite.tasks.loss import LossConfig, LossTask

    if len(model) > 1 and (out is not None or checkpoint is not None):
        raise UserError("--out and --checkpoint name one model's run: give one --model with them")
    config = LossConfig(data=data, length=length, max_docs=max_docs, roll=roll, seed=seed, batch_size=batch_size)
    run_dirs = []
    for spec in model:
        _seed_everything(seed)
        adapter = _adapter(spec, device, dtype, checkpoint, attention, compile)
        results = _run(LossTask(config), adapter, out, repair)
        _report_loss(spec, results, adapter)
        run_dirs.append(Path(results["run_dir"]))
    if plot:
        from evalsuite.report.plots import plot_loss

        stem = run_dirs[0] / "loss" if len(run_dirs) == 1 else _comparison_stem(model)
        png = plot_loss(run_dirs, stem)[0]
        typer.echo(f"plot: {png} (with other runs: evalsuite plot loss RUN... --out STEM)")


def _report_loss(spec: str, results: dict, adapter) -> None:
    """The run's windows, P(l) at each length from 64 on, and where the run is."""
    length = results["config"]["length"]  # the task's default when not given: 65536, or the model's max_length
    docs = results["summary"]["documents"]
    by_len = {r["length"]: r["value"] for r in results["records"] if r["metric"] == "perplexity"}
    shown = [lng for lng in sorted(by_len) if lng >= 64] or sorted(by_len)
    typer.echo(f"{spec}: {docs['used']} windows of {length} tokens ({docs['skipped_too_short']} docs too short)")
    typer.echo("  P(l): " + ", ".join(f"{lng}: {by_len[lng]:.3f}" for lng in shown))
    _note_random_weights(adapter)
    typer.echo(f"  results: {results['run_dir']}")


def _comparison_stem(models: list[str]) -> Path:
    """``results/plots/loss_<a>_vs_<b>...``: a file name made of the model specs' safe characters."""
    names = ["".join(ch if ch.isalnum() or ch in "-." else "-" for ch in m.split(",")[0]) for m in models]
    return Path("results") / "plots" / ("loss_" + "_vs_".join(names))


@plot_app.command("loss")
def plot_loss_cmd(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (or folders of them).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output path stem; .png and .pdf are written.")] = Path(
        "results/plots/loss"
    ),
    window: Annotated[int, typer.Option(help="Centred moving-average window for L(i).")] = 101,
):
    """Overlay per-token loss runs: L(i) smoothed (left) and P(l) (right), dashed line at training length."""
    from evalsuite.report.plots import plot_loss

    for path in plot_loss(runs, out, window=window):
        typer.echo(f"wrote {path}")


@app.command()
def table(
    runs: Annotated[list[Path], typer.Argument(help="Run directories (or folders of them).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output path stem.")] = Path("results/tables/records"),
    formats: Annotated[str, typer.Option(help="Comma-separated: csv, md, tex.")] = "csv,md,tex",
):
    """Gather every record into one long table and write CSV / Markdown / LaTeX."""
    from evalsuite.report.records import gather_records
    from evalsuite.report.tables import write_table

    fmts = tuple(f.strip() for f in formats.split(",") if f.strip())
    bad = [f for f in fmts if f not in ("csv", "md", "tex")]
    if bad:
        raise UserError(f"unknown table format(s) {', '.join(bad)}; use csv, md, tex")
    df = gather_records(runs)
    if df.empty:
        raise UserError("no records found in the given run directories")
    for path in write_table(df, out, formats=fmts):
        typer.echo(f"wrote {path} ({len(df)} rows)")
