"""The ``evalsuite`` command line: a thin layer over library functions (one small function per command)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Annotated

import typer

from evalsuite.errors import UserError

app = typer.Typer(
    help="Long-context evaluation for efficient-attention language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
plot_app = typer.Typer(help="Draw figures from run directories.", no_args_is_help=True)
app.add_typer(plot_app, name="plot")

_state = {"debug": False}

# Options shared by every command that runs a model.
ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Model card name or path to a card YAML.")]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[str, typer.Option(help="float32, or bfloat16/float16 autocast over fp32 weights.")]
SeedOpt = Annotated[int, typer.Option(help="Seed for data shuffles, rolls and sampling.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (default: results/runs/...).")]
CheckpointOpt = Annotated[
    Path | None, typer.Option(help="Checkpoint directory (ours or an official release), overriding the card.")
]
BackendOpt = Annotated[str, typer.Option(help="Attention backend: auto, triton, reference or dense.")]


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _adapter(model: str, device: str, dtype: str, checkpoint: Path | None, backend: str):
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card
    from evalsuite.kernels.forgetting import BACKENDS

    if backend not in BACKENDS:
        raise UserError(f"unknown attention backend {backend!r}; choose from {', '.join(BACKENDS)}")
    return NativeAdapter(load_card(model), device=device, dtype=dtype, checkpoint=checkpoint, attention_backend=backend)


@app.callback()
def _root(debug: Annotated[bool, typer.Option(help="Show full tracebacks on errors.")] = False):
    _state["debug"] = debug


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


@app.command()
def loss(
    model: ModelOpt,
    data: Annotated[str, typer.Option(help="File or directory (.txt, .jsonl[.xz], .npy), or 'synthetic'.")] = (
        "synthetic"
    ),
    length: Annotated[
        int | None, typer.Option(help="Window length in tokens, BOS included [default: 65536, or the model's max].")
    ] = None,
    max_docs: Annotated[int | None, typer.Option(help="Stop after this many windows.")] = None,
    roll: Annotated[bool, typer.Option(help="Rotate each window by a seeded random shift (LongCrawl64).")] = False,
    batch_size: Annotated[int, typer.Option(min=1, help="Windows per forward pass.")] = 1,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    seed: SeedOpt = 0,
    out: OutOpt = None,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Per-token loss L(i) and perplexity P(l) over one window per document (FoX §4.2)."""
    from evalsuite.tasks.loss import LossConfig, run_loss

    _seed_everything(seed)
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    length = length or min(65536, adapter.max_length or 65536)
    config = LossConfig(data=data, length=length, max_docs=max_docs, roll=roll, seed=seed, batch_size=batch_size)
    results = run_loss(adapter, config, out)
    docs = results["documents"]
    by_len = {r["length"]: r["value"] for r in results["records"] if r["metric"] == "perplexity"}
    shown = [lng for lng in sorted(by_len) if lng >= 64] or sorted(by_len)
    typer.echo(f"{model}: {docs['used']} windows of {length} tokens ({docs['skipped_too_short']} docs too short)")
    typer.echo("  P(l): " + ", ".join(f"{lng}: {by_len[lng]:.3f}" for lng in shown))
    if adapter.layout == "random":
        typer.echo("  note: random-init weights; these numbers test the pipeline, not the architecture")
    typer.echo(f"  results: {run_dir_of(results, out)}")


def run_dir_of(results: dict, out: Path | None) -> Path:
    return out or Path("results/runs/loss") / f"{results['model']}-{results['config_hash']}"


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


def main() -> None:
    """Console entry point: user errors become one line on stderr and exit status 2."""
    try:
        app(standalone_mode=False)
    except UserError as e:
        if _state["debug"]:
            raise
        typer.echo(f"error: {e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        typer.echo("interrupted; rerun the same command to resume", err=True)
        sys.exit(130)
    except SystemExit:
        raise
    except Exception as e:  # click usage errors arrive here too
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Exit):
            sys.exit(e.exit_code)
        if isinstance(e, click.exceptions.Abort):
            sys.exit(1)
        if _state["debug"]:
            raise
        typer.echo(f"error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
