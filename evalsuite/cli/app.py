"""The Typer application and its command groups; the command modules register on them (:mod:`evalsuite.cli.main`
imports each)."""

from __future__ import annotations

from typing import Annotated

import typer

app = typer.Typer(
    help="Long-context evaluation for efficient-attention language models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
plot_app = typer.Typer(help="Draw figures from run directories.", no_args_is_help=True)
app.add_typer(plot_app, name="plot")
bench_app = typer.Typer(help="Benchmarks (GPU): kernel timings and memory against the peers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")


@app.callback()
def _root(debug: Annotated[bool, typer.Option(help="Show full tracebacks on errors.")] = False):
    """The root options; :func:`evalsuite.cli.main.main` reads ``--debug`` from the arguments itself, since it
    handles the errors that end a command."""
