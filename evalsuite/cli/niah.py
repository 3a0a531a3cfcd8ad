"""``evalsuite niah`` (needle in a haystack: easy, standard, 2-hop), ``evalsuite passkey`` (the DRT paper's token-level
tests) and ``evalsuite plot niah``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import app, plot_app
from evalsuite.cli.options import (
    BackendOpt,
    CheckpointOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    OutOpt,
    PlotOpt,
    RepairOpt,
    SeedOpt,
    _adapter,
    _batch_size,
    _csv_list,
    _note_random_weights,
    _run,
    _seed_everything,
)

PresetOpt = Annotated[
    str | None, typer.Option(help="Grid preset in tasks/niah.yaml: cpu or fox (default: cpu on a CPU, else fox).")
]
LengthsOpt = Annotated[str | None, typer.Option(help="Comma-separated context lengths (tokens, BOS counted).")]
HaystackOpt = Annotated[
    str, typer.Option(help="File or directory (.txt, .jsonl[.xz]), 'synthetic' or 'books' (built in).")
]


@app.command()
def niah(
    model: ModelOpt,
    mode: Annotated[str, typer.Option(help="easy, standard or 2hop (chained facts + a 1-hop control).")] = "easy",
    preset: PresetOpt = None,
    lengths: LengthsOpt = None,
    depths: Annotated[str | None, typer.Option(help="Comma-separated needle depths in percent.")] = None,
    samples: Annotated[int | None, typer.Option(help="2hop: samples per cell (default: from the preset).")] = None,
    haystack: HaystackOpt = "synthetic",
    max_new_tokens: Annotated[
        int | None, typer.Option(help="Generated tokens per answer (default: the preset's; fox: 1024).")
    ] = None,
    stop_newline: Annotated[bool, typer.Option(help="Stop each answer at its first newline.")] = False,
    batch_size: Annotated[
        str, typer.Option(help="Prompts of one length per generate call, or 'auto' (as many as fit in GPU memory).")
    ] = "4",
    judge: Annotated[
        str | None,
        typer.Option(help="openai:MODEL: also score with the FoX judge ($OPENAI_API_KEY, $OPENAI_BASE_URL)."),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    seed: SeedOpt = 0,
    out: OutOpt = None,
    repair: RepairOpt = False,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
    plot: PlotOpt = True,
):
    """Needle in a haystack over lengths x depths (FoX §4.3): easy, standard, or 2-hop; records, a summary and its
    heatmap."""
    from evalsuite.metrics.judge import OpenAIJudge
    from evalsuite.tasks.niah import NiahConfig, NiahTask

    config = NiahConfig(
        mode=mode,
        preset=preset,
        lengths=_lengths(lengths),
        depths=_csv_list(depths, float, "--depths"),
        samples=samples,
        haystack=haystack,
        max_new_tokens=max_new_tokens,
        stop_newline=stop_newline,
        batch_size=_batch_size(batch_size, allow_auto=True),
        seed=seed,
    )
    task = NiahTask(config, OpenAIJudge.from_spec(judge) if judge else None)  # a missing API key fails first
    _seed_everything(seed)
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    _report(_run(task, adapter, out, repair), adapter, plot)


@app.command()
def passkey(
    model: ModelOpt,
    kind: Annotated[str, typer.Option(help="2hop (DRT §4.3: a 2-hop chain of token ids) or passkey (§4.2).")] = "2hop",
    preset: PresetOpt = None,
    lengths: LengthsOpt = None,
    samples: Annotated[int | None, typer.Option(help="Samples per length (default: from the preset).")] = None,
    haystack: HaystackOpt = "synthetic",
    batch_size: Annotated[str, typer.Option(help="Samples of one length per forward pass.")] = "4",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    seed: SeedOpt = 0,
    out: OutOpt = None,
    repair: RepairOpt = False,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
    plot: PlotOpt = True,
):
    """The DRT paper's token-level retrieval tests, teacher-forced: the 2-hop passkey or the passkey (arXiv:2410.01651
    §4.2-4.3), over lengths x samples with needles at random positions."""
    from evalsuite.tasks.drt_passkey import DrtConfig, DrtPasskeyTask

    size = _batch_size(batch_size, allow_auto=False)
    config = DrtConfig(preset, _lengths(lengths), samples, haystack, size, seed, kind=kind)
    _seed_everything(seed)
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    _report(_run(DrtPasskeyTask(config), adapter, out, repair), adapter, plot)


def _lengths(value: str | None) -> list[int] | None:
    items = _csv_list(value, float, "--lengths")
    return None if items is None else [int(x) for x in items]


def _report(results: dict, adapter, plot: bool) -> None:
    """The lengths skipped, the scores within and beyond the training length and, with ``plot``, the heatmap drawn
    into the run directory."""
    summary = results["summary"]
    for note in summary["skipped"]:
        typer.echo(f"  note: length {note['length']} skipped ({note['reason']})")
    typer.echo(f"{adapter.name}: NIAH {summary['label']}, train length {results['train_length']}")
    for s in summary["within_beyond"]:
        if s["metric"] in ("judge", "score", "match", "accuracy", "answer_exact"):
            cells = f"{s['cells_within']} + {s['cells_beyond']} cells"
            within, beyond = (f"{v:.3f}" if v is not None else "-" for v in (s["within"], s["beyond"]))
            typer.echo(f"  {s['subtask']:>9} {s['metric']:>12}: within {within}, beyond {beyond} ({cells})")
    _note_random_weights(adapter)
    typer.echo(f"  results: {results['run_dir']}")
    if plot and results["records"]:
        from evalsuite.report.niah import plot_niah

        run_dir = results["run_dir"]
        paths, _ = plot_niah([run_dir], Path(run_dir) / "heatmap")
        typer.echo(f"  heatmap: {paths[0]} (with other runs: evalsuite plot niah {run_dir} RUN... --out STEM)")


@plot_app.command("niah")
def plot_niah_cmd(
    runs: Annotated[list[Path], typer.Argument(help="NIAH run directories (or folders of them).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Output path stem.")] = Path("results/plots/niah"),
    metric: Annotated[
        str | None, typer.Option(help="judge, score, match, accuracy, ... (default: judge if judged, else score).")
    ] = None,
):
    """NIAH heatmaps (depth x length, dashed line at the training length) and a within/beyond summary table."""
    from evalsuite.report.niah import plot_niah

    paths, table = plot_niah(runs, out, metric=metric)
    typer.echo(table.drop(columns=["run"]).to_markdown(index=False, floatfmt=".3f"))
    for path in paths:
        typer.echo(f"wrote {path}")
