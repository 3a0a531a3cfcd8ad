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
bench_app = typer.Typer(help="Benchmarks (GPU): kernel timings and memory against the peers.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

_state = {"debug": False}

# Options shared by every command that runs a model.
ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="KIND:NAME (default kind native: a card name or a card's YAML path).")
]
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
DtypeOpt = Annotated[
    str, typer.Option(help="float32, bfloat16 or float16 (native: autocast over fp32 weights; hf: weights in it).")
]
SeedOpt = Annotated[int, typer.Option(help="Seed for data shuffles, rolls and sampling.")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="Run directory (default: results/runs/...).")]
CheckpointOpt = Annotated[
    Path | None, typer.Option(help="Checkpoint directory (ours or an official release), overriding the card.")
]
BackendOpt = Annotated[
    str, typer.Option(help="Attention backend of the model's family (FoX: auto, triton, reference, dense).")
]


def _seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _note_random_weights(adapter) -> None:
    if getattr(adapter, "layout", None) == "random":
        typer.echo("  note: random-init weights; these numbers test the pipeline, not the architecture")


def _adapter(model: str, device: str, dtype: str, checkpoint: Path | None, backend: str):
    from evalsuite.adapters.registry import AdapterOptions, load_adapter

    return load_adapter(model, AdapterOptions(device=device, dtype=dtype, checkpoint=checkpoint, attention=backend))


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
    batch_size: Annotated[int, typer.Option(help="Windows per forward pass.")] = 1,
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
    length = length if length is not None else min(65536, adapter.max_length or 65536)
    config = LossConfig(data=data, length=length, max_docs=max_docs, roll=roll, seed=seed, batch_size=batch_size)
    results = run_loss(adapter, config, out)
    _only_main()
    docs = results["summary"]["documents"]
    by_len = {r["length"]: r["value"] for r in results["records"] if r["metric"] == "perplexity"}
    shown = [lng for lng in sorted(by_len) if lng >= 64] or sorted(by_len)
    typer.echo(f"{model}: {docs['used']} windows of {length} tokens ({docs['skipped_too_short']} docs too short)")
    typer.echo("  P(l): " + ", ".join(f"{lng}: {by_len[lng]:.3f}" for lng in shown))
    _note_random_weights(adapter)
    typer.echo(f"  results: {results['run_dir']}")


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


def _csv_list(value: str | None, cast, option: str) -> list | None:
    """``"64,128"`` -> ``[64, 128]``; None stays None."""
    if value is None:
        return None
    try:
        return [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        kind = "numbers" if cast in (int, float) else "values"
        raise UserError(f"{option} takes comma-separated {kind}, got {value!r}") from None


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
    time_limit: Annotated[float | None, typer.Option(help="Seconds after which no new cell starts.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = None,
    out: OutOpt = None,
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
    from evalsuite.report.mqar import best_over_lr, best_table, load_mqar, write_mqar_report
    from evalsuite.tasks.mqar import MQARSweep, check_best, default_run_dir, run_mqar, sweep_from_options

    # the attention backend is checked against each model's family by the task, before anything is written
    sweep = sweep_from_options(
        preset,
        models=_csv_list(models, str, "--models"),
        d_models=_csv_list(d_model, int, "--d-model"),
        seq_lens=_csv_list(seq_len, int, "--seq-len"),
        num_kv_pairs=_csv_list(kv_pairs, int, "--kv-pairs"),
        pairing=pairing,
        lrs=_csv_list(lr, float, "--lr"),
        num_layers=layers,
        num_heads=heads,
        use_mlp=mlp,
        max_steps=max_steps,
        batch_size=batch_size,
        seed=seed,
    )
    if settings:
        sweep = MQARSweep.from_dict({**sweep.to_dict(), **_key_values(settings)})
    run_dir = out or default_run_dir(sweep, preset)
    results = run_mqar(
        sweep,
        run_dir,
        device=device,
        attention=attention,
        workers=workers,
        threads=threads,
        cuda_graph=cuda_graph,
        compile=compile,
        time_limit=time_limit,
        progress=progress,
        preset=preset,
        on_record=None if progress else _echo_mqar_cell,
    )
    _only_main()
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


@app.command()
def niah(
    model: ModelOpt,
    mode: Annotated[str, typer.Option(help="easy, standard, 2hop, or passkey (DRT's token-level passkey).")] = "easy",
    flavour: Annotated[
        str, typer.Option(help="2hop only: text (chained facts + 1-hop control) or drt (DRT token-level 2-hop).")
    ] = "text",
    preset: Annotated[
        str | None, typer.Option(help="Grid preset in tasks/niah.yaml: cpu or fox (default: cpu on a CPU, else fox).")
    ] = None,
    lengths: Annotated[str | None, typer.Option(help="Comma-separated context lengths (tokens, BOS counted).")] = None,
    depths: Annotated[str | None, typer.Option(help="Comma-separated needle depths in percent.")] = None,
    samples: Annotated[int | None, typer.Option(help="2hop: samples per cell (default: from the preset).")] = None,
    haystack: Annotated[str, typer.Option(help="File or directory (.txt, .jsonl[.xz]), or 'synthetic'.")] = (
        "synthetic"
    ),
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
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Needle in a haystack over lengths x depths (FoX §4.3): easy, standard, or 2-hop; records and a summary."""
    from evalsuite.metrics.judge import OpenAIJudge

    lengths_list = [int(x) for x in _csv_list(lengths, float, "--lengths") or []] or None
    if flavour not in ("text", "drt"):
        raise UserError(f"unknown --flavour {flavour!r}; use text or drt")
    if flavour == "drt" and mode != "2hop":
        raise UserError("--flavour applies to --mode 2hop only")
    batch_size = _batch_size(batch_size, allow_auto=flavour != "drt" and mode != "passkey")
    if flavour == "drt" or mode == "passkey":
        from evalsuite.tasks.drt_passkey import DrtConfig, DrtPasskeyTask

        test = "2-hop test" if mode == "2hop" else "passkey"
        if judge:
            raise UserError(f"the DRT {test} is scored teacher-forced; --judge does not apply")
        if depths:
            raise UserError(f"the DRT {test} places its needles at random positions; --depths does not apply")
        config = DrtConfig(preset, lengths_list, samples, haystack, batch_size, seed, kind=mode)
        task = DrtPasskeyTask(config)
    else:
        from evalsuite.tasks.niah import NiahConfig, NiahTask

        config = NiahConfig(
            mode=mode,
            preset=preset,
            lengths=lengths_list,
            depths=_csv_list(depths, float, "--depths"),
            samples=samples,
            haystack=haystack,
            max_new_tokens=max_new_tokens,
            stop_newline=stop_newline,
            batch_size=batch_size,
            seed=seed,
        )
        # a missing API key fails before the model loads
        task = NiahTask(config, OpenAIJudge.from_spec(judge) if judge else None)
    _seed_everything(seed)
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    results = _run(task, adapter, out)
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


def _batch_size(value: str, allow_auto: bool) -> int | str:
    """``--batch-size``: a positive integer, or ``auto`` where the task sizes batches from free memory."""
    if value == "auto" and allow_auto:
        return value
    if not value.isdigit() or int(value) < 1:
        choices = "a positive integer or 'auto'" if allow_auto else "a positive integer (the DRT tests take no 'auto')"
        raise UserError(f"--batch-size must be {choices}; got {value!r}")
    return int(value)


def _run(task, adapter, out: Path | None) -> dict:
    """Run a task through the runner; the result carries the run directory it was written to."""
    from evalsuite.tasks.base import run_task

    results = run_task(task, adapter, out)
    _only_main()
    return results


def _only_main() -> None:
    """Under torchrun, end every rank but 0 once the run is done: rank 0 alone prints and writes tables and plots."""
    from evalsuite import distributed

    world = distributed.current()
    if world is not None and not world.is_main:
        raise typer.Exit(0)


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
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Run any registered task, its options given as KEY=VALUE: the generic form of the task commands."""
    from evalsuite.tasks.base import TASKS

    task_obj = TASKS.get(task).from_options(_key_values(options or []))
    adapter = _adapter(model, device, dtype, checkpoint, attention) if model else None
    results = _run(task_obj, adapter, out)
    records = results["records"]
    typer.echo(f"{task}: {len(records)} records in {results['run_dir']}")
    if records:
        import pandas as pd

        columns = ["model", "subtask", "length", "depth", "metric", "value", "n"]
        shown = pd.DataFrame(records).reindex(columns=columns).head(40)
        typer.echo(shown.to_markdown(index=False, floatfmt=".4g"))


def _key_values(pairs: list[str]) -> dict:
    """``["lengths=[512, 1024]", "mode=easy"]`` -> ``{"lengths": [512, 1024], "mode": "easy"}`` (values as YAML)."""
    import yaml

    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set takes KEY=VALUE, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            raise UserError(f"--set {key.strip()}: cannot read {value!r} as a value") from None
    return out


@app.command("tasks")
def tasks_cmd():
    """List the registered tasks and what each needs from a model."""
    from evalsuite.tasks.base import TASKS

    for name, cls in TASKS.items():
        needs = ", ".join(sorted(cls.needs)) or "no model (trains its own)"
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        typer.echo(f"{name:14s} needs: {needs:28s} {doc}")


# The commands that share their work among torchrun's ranks (`torchrun --nproc-per-node N -m evalsuite CMD ...`).
SHARDED_COMMANDS = ("loss", "niah", "mqar", "longbench", "summarize", "run")


def main() -> None:
    """Console entry point: one line on stderr for every error; status 2 for bad input, 130 for Ctrl-C."""
    from evalsuite import distributed

    click = sys.modules[typer.BadParameter.__module__]  # click's exceptions (typer may ship its own click)
    rank = 0
    try:
        rank = _torchrun_checks(sys.argv[1:])
        rc = app(standalone_mode=False)
    except distributed.PeerFailed as e:  # rank 0 reports it; this rank leaves quietly
        sys.exit(2 if e.user_error else 1)
    except UserError as e:
        if _state["debug"]:
            raise
        typer.echo(f"error: {f'[rank {rank}] ' if rank else ''}{e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _interrupted(rank)
    except click.NoArgsIsHelpError as e:
        e.show()  # the help text
        sys.exit(0)
    except click.ClickException as e:  # usage errors: bad option values, unknown options
        typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        _interrupted(rank)
    except SystemExit:
        raise
    except Exception as e:
        if _state["debug"]:
            raise
        where = f"[rank {rank}] " if rank else ""
        typer.echo(f"error: {where}{type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)
    finally:
        distributed.teardown()
    if rc == 130:  # typer turns Ctrl-C into Exit(130), which standalone_mode=False returns instead of raising
        _interrupted(rank)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _torchrun_checks(args: list[str]) -> int:
    """Under torchrun: this process's rank; stdout muted on ranks other than 0 (rank 0 alone prints); a command
    that does not share its work refused on several ranks (N copies would each do all of it). 0 otherwise."""
    import os

    from evalsuite import distributed

    world = distributed.env_world()
    if world is None:
        return 0
    if world.rank:
        sys.stdout = open(os.devnull, "w")  # for the life of the process
    command = next((a for a in args if not a.startswith("-")), None)
    if world.size > 1 and command is not None and (command not in SHARDED_COMMANDS or command == "longbench"
                                                    and "score" in args):  # fmt: skip
        if world.rank:
            sys.exit(2)  # rank 0 says why
        raise UserError(
            f"`evalsuite {command}{' score' if command == 'longbench' else ''}` does not share its work among "
            f"ranks; run it without torchrun (commands that do: {', '.join(SHARDED_COMMANDS)})"
        )
    return world.rank


def _interrupted(rank: int = 0) -> None:
    if not rank:  # one line, not one per rank
        typer.echo("interrupted: finished items are saved; rerun the same command to resume", err=True)
    sys.exit(130)


# The downstream-task commands register on `app` (imported last: they use the shared options above).
# `evalsuite bench …` (cli_bench.py), `evalsuite serve` (cli_serve.py), `evalsuite lm-eval` (cli_lmeval.py) likewise.
from evalsuite import cli_bench, cli_lmeval, cli_serve, cli_tasks  # noqa: E402, F401

if __name__ == "__main__":
    # `python -m evalsuite.cli` runs this file as __main__; the commands live on evalsuite.cli's app
    from evalsuite.cli import main as _main

    _main()
