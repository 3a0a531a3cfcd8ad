"""``evalsuite paper``: the papers' tables and figures beside our numbers (list, show, run, render) and their
long-context claims tested here (claims), a thin layer over :mod:`evalsuite.papers`. Registered on the app when
:mod:`evalsuite.cli.main` imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import app
from evalsuite.cli.options import DeviceOpt, DtypeOpt
from evalsuite.errors import UserError

paper_app = typer.Typer(
    help="The four papers' tables and figures (list, show, run, render beside ours) and their claims tested here.",
    no_args_is_help=True,
)
app.add_typer(paper_app, name="paper")

ItemArg = Annotated[str, typer.Argument(help="A table or figure, e.g. fox:table2 (see `evalsuite paper list`).")]
PapersOpt = Annotated[
    list[Path] | None, typer.Option("--papers", help="A folder of more paper YAML files (repeatable).")
]
ResultsOpt = Annotated[
    Path, typer.Option("--results", help="Results folder: runs are found under it, `paper run` writes to <it>/runs.")
]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help="md, latex or csv.")]


def _papers(extra: list[Path] | None):
    from evalsuite.papers.published import load_papers

    return load_papers(tuple(extra or ()))


def _item(item_id: str, extra: list[Path] | None):
    from evalsuite.papers.published import find_item

    return find_item(_papers(extra), item_id)


def _check_format(fmt: str) -> str:
    from evalsuite.papers.render import FORMATS

    if fmt not in FORMATS:
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return fmt


@paper_app.command("list")
def paper_list(results: ResultsOpt = Path("results"), papers: PapersOpt = None):
    """Every table and figure of the papers: what regenerating it needs, and what the results folder has of it."""
    from evalsuite.papers.found import scan
    from evalsuite.papers.listing import entries, to_markdown

    typer.echo(to_markdown(entries(_papers(papers), scan(results))), nl=False)


@paper_app.command("show")
def paper_show(item_id: ItemArg, format: FormatOpt = "md", papers: PapersOpt = None):
    """Print a published table alone, labels and cells as the paper prints them."""
    from evalsuite.papers.render import show

    typer.echo(show(_item(item_id, papers), _check_format(format)), nl=False)


@paper_app.command("run")
def paper_run(
    item_id: ItemArg,
    models: Annotated[str, typer.Option(help="Comma-separated models: cards, hf:DIR, openai:NAME, ...")] = "",
    results: ResultsOpt = Path("results"),
    longbench_data: Annotated[
        str | None, typer.Option(help="LongBench data in the official layout (<task>.jsonl), for LongBench tables.")
    ] = None,
    lm_eval_include: Annotated[
        list[Path] | None, typer.Option(help="A folder of lm-eval task YAML files, for lm-eval tables (repeatable).")
    ] = None,
    lm_eval_builtin: Annotated[
        bool, typer.Option(help="Index lm-eval's built-in tasks (datasets from the HF cache or hub).")
    ] = True,
    loss_data: Annotated[
        str | None, typer.Option(help="Folder of the loss columns' texts: <dataset>/ or <dataset>.<suffix> each.")
    ] = None,
    summarize_data: Annotated[
        str | None, typer.Option(help="Folder of the summarization columns' texts: <dataset>.jsonl each.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="At most this many records, documents or samples per task (a quick run).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per generate call; sequences per forward pass.")] = 1,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    papers: PapersOpt = None,
):
    """Run what a table needs on each model (resumable: a rerun does only what is missing)."""
    from evalsuite.papers.run import RunOptions, run_item, split_models

    if limit is not None and limit < 1:
        raise UserError("--limit must be at least 1")
    item = _item(item_id, papers)
    options = RunOptions(results=results, longbench_data=longbench_data,
                         lm_eval_include=tuple(str(p) for p in lm_eval_include or ()), lm_eval_builtin=lm_eval_builtin,
                         loss_data=loss_data, summarize_data=summarize_data, limit=limit, batch_size=batch_size,
                         device=device, dtype=dtype)  # fmt: skip
    done = run_item(item, split_models(models), options, say=typer.echo)
    if not done:
        typer.echo(f"{item.id}: nothing to run (its columns come from the model cards)")
    names = ",".join(dict.fromkeys(run.model for run in done))
    typer.echo(f"next: evalsuite paper render {item.id}" + (f" --models {names}" if names else "")
               + (f" --results {results}" if results != Path("results") else ""))  # fmt: skip


@paper_app.command("render")
def paper_render(
    item_id: ItemArg,
    models: Annotated[
        str | None, typer.Option(help="Comma-separated models [default: the paper's cards and every model with runs].")
    ] = None,
    results: ResultsOpt = Path("results"),
    format: FormatOpt = "md",
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Also write <id>.md, .tex, .csv (and a figure's PNG/PDF) here.")
    ] = None,
    papers: PapersOpt = None,
):
    """Print a table with our rows beside the paper's (and ours - paper); --out writes every format and figures."""
    from evalsuite.papers.figures import draw
    from evalsuite.papers.found import scan
    from evalsuite.papers.render import default_models, our_rows, render, write_rendered
    from evalsuite.papers.run import model_name, split_models

    item = _item(item_id, papers)
    found = scan(results)
    names = [model_name(s) for s in split_models(models)] or default_models(item, found)
    ours = our_rows(item, names, found)
    typer.echo(render(item, ours, found, _check_format(format)), nl=False)
    if out is not None:
        written = write_rendered(item, ours, found, out)
        if item.kind == "figure":
            try:
                written += draw(item, names, found, out)
            except UserError as e:  # the tables are written; say why there is no picture
                typer.echo(f"figure not drawn: {e}", err=True)
        for path in written:
            typer.echo(f"wrote {path}")


@paper_app.command("claims")
def paper_claims(
    format: Annotated[
        str, typer.Option("--format", "-f", help="text (for a terminal) or md (results/claims).")
    ] = "text",
):
    """Print the papers' long-context claims tested here: statement, experiment, result and verdict of each."""
    from evalsuite.papers.claims import load_claims, render_markdown, render_text

    renderers = {"text": render_text, "md": render_markdown}
    if format not in renderers:
        raise UserError(f"--format must be text or md, got {format!r}")
    typer.echo(renderers[format](load_claims()), nl=False)
