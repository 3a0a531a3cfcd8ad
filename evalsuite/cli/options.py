"""What the commands share: the options of every command that runs a model, and small helpers (parsing
lists, loading an adapter, running a task through the runner)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Annotated

import typer

from evalsuite.errors import UserError

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
RepairOpt = Annotated[
    bool, typer.Option(help="Set aside corrupt lines of the run directory's records (their items run again).")
]
CheckpointOpt = Annotated[
    Path | None, typer.Option(help="Checkpoint directory (ours or an official release), overriding the card.")
]
PlotOpt = Annotated[
    bool, typer.Option("--plot/--no-plot", help="Draw the run's figure (PNG and PDF) into its run directory.")
]
CompileOpt = Annotated[
    bool,
    typer.Option(
        "--compile/--no-compile",
        help="Native models: full-sequence forwards through torch.compile (faster long windows; compiles per shape).",
    ),
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


def _adapter(model: str, device: str, dtype: str, checkpoint: Path | None, backend: str, compile: bool = False):
    from evalsuite.adapters.registry import AdapterOptions, load_adapter

    options = AdapterOptions(device=device, dtype=dtype, checkpoint=checkpoint, attention=backend, compile=compile)
    return load_adapter(model, options)


def _csv_list(value: str | None, cast, option: str, allow_empty: bool = False) -> list | None:
    """``"64,128"`` -> ``[64, 128]``; None stays None. A value with no item (``""``, ``","``) is a UserError unless
    ``allow_empty`` (an option where ``''`` means "none"): taken as "the default" it would be ignored silently."""
    if value is None:
        return None
    kind = "numbers" if cast in (int, float) else "values"
    try:
        items = [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{option} takes comma-separated {kind}, got {value!r}") from None
    if not items and not allow_empty:
        raise UserError(f"{option} needs at least one of its comma-separated {kind}, got {value!r}")
    return items


def _batch_size(value: str, allow_auto: bool) -> int | str:
    """``--batch-size``: a positive integer, or ``auto`` where the task sizes batches from free memory."""
    if value == "auto" and allow_auto:
        return value
    if not value.isdigit() or int(value) < 1:
        choices = "a positive integer or 'auto'" if allow_auto else "a positive integer (the DRT tests take no 'auto')"
        raise UserError(f"--batch-size must be {choices}; got {value!r}")
    return int(value)


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


def _run(task, adapter, out: Path | None, repair: bool = False) -> dict:
    """Run a task through the runner; the result carries the run directory it was written to."""
    from evalsuite.tasks.runner import run_task

    results = run_task(task, adapter, out, repair=repair)
    _only_main()
    return results


def _only_main() -> None:
    """Under torchrun, end every rank but 0 once the run is done: rank 0 alone prints and writes tables and plots."""
    from evalsuite.runs import distributed

    if not distributed.current().is_main:
        raise typer.Exit(0)
