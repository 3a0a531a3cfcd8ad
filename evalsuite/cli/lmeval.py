"""``evalsuite lm-eval``: run lm-eval (EleutherAI's harness) tasks on any adapter, through the ``evalsuite`` model
of :mod:`evalsuite.adapters.lm_eval_bridge` and ``lm_eval.simple_evaluate``. Registered on the app of
:mod:`evalsuite.cli`, which imports this module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import app
from evalsuite.cli.options import (
    BackendOpt,
    CheckpointOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    _adapter,
    _csv_list,
    _note_random_weights,
)
from evalsuite.errors import UserError, require


@app.command("lm-eval")
def lm_eval_cmd(
    model: ModelOpt,
    tasks: Annotated[str, typer.Option(help="Comma-separated lm-eval task or group names (globs allowed).")],
    include_path: Annotated[
        list[Path] | None, typer.Option(help="Folder of extra lm-eval task YAML files (repeatable).")
    ] = None,
    builtin_tasks: Annotated[
        bool, typer.Option(help="Index lm-eval's built-in tasks too (some 10 s); off: only --include-path tasks.")
    ] = True,
    limit: Annotated[
        float | None, typer.Option(help="At most this many documents per task (below 1: a fraction).")
    ] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="Few-shot examples per prompt (default: the task's).")] = None,
    batch_size: Annotated[int, typer.Option(help="Sequences per forward pass; prompts per generate call.")] = 1,
    max_length: Annotated[
        int | None, typer.Option(help="Longest sequence one forward pass sees [default: the model's max_length].")
    ] = None,
    gen_kwargs: Annotated[
        str | None, typer.Option(help="Generation overrides as lm-eval takes them: 'temperature=0,max_gen_toks=64'.")
    ] = None,
    seed: Annotated[int | None, typer.Option(help="One seed for lm-eval's Python, numpy, torch and few-shot RNGs.")] = (
        None
    ),
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write lm-eval's results as JSON here.")] = None,
    log_samples: Annotated[bool, typer.Option(help="Include every document's requests and responses in --output.")] = (
        False
    ),
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Run lm-eval tasks on a model (as `lm_eval --model evalsuite --model_args model=M`); print lm-eval's table."""
    names = _check_options(tasks, include_path, builtin_tasks, limit, batch_size, max_length)
    lm_eval = require("lm_eval", "lm-eval", "evalsuite lm-eval")
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import handle_non_serializable, make_table

    from evalsuite.adapters.lm_eval_bridge import EvalsuiteLM, load_tasks

    task_manager = TaskManager(
        include_path=[str(p) for p in include_path] if include_path else None, include_defaults=builtin_tasks
    )
    unknown = [n for n in names if not task_manager.match_tasks([n])]
    if unknown:
        raise UserError(f"unknown lm-eval task(s) {', '.join(unknown)} (see `lm-eval ls tasks`, or --include-path)")
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    lm = EvalsuiteLM(adapter=adapter, batch_size=batch_size, max_length=max_length)
    built = load_tasks(task_manager, task_manager.match_tasks(names), adapter)  # every task checked before a request
    rngs = ("random", "numpy_random", "torch_random", "fewshot_random")
    seeds = {} if seed is None else {f"{k}_seed": seed for k in rngs}
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=built,
        num_fewshot=num_fewshot,
        limit=int(limit) if limit is not None and limit >= 1 else limit,
        gen_kwargs=gen_kwargs,
        task_manager=task_manager,
        log_samples=log_samples,
        **seeds,
    )
    if results is None:  # a non-zero rank of a distributed run; not ours, but lm-eval's contract
        return
    results["config"].update(model=model, batch_size=batch_size, device=str(adapter.device))
    typer.echo(make_table(results))
    if "groups" in results:
        typer.echo(make_table(results, "groups"))
    _note_random_weights(adapter)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False))
        typer.echo(f"  results: {output}")


def _check_options(
    tasks: str,
    include_path: list[Path] | None,
    builtin_tasks: bool,
    limit: float | None,
    batch_size: int,
    max_length: int | None,
) -> list[str]:
    """The task names of ``--tasks``; a UserError for any option lm-eval would reject later or not at all."""
    names = _csv_list(tasks, str, "--tasks")
    if limit is not None and limit <= 0:
        raise UserError("--limit must be positive")
    if batch_size < 1 or (max_length is not None and max_length < 1):
        raise UserError("--batch-size and --max-length must be at least 1")
    for path in include_path or []:
        if not path.is_dir():
            raise UserError(f"--include-path {path} is not a directory")
    if not builtin_tasks and not include_path:
        raise UserError("--no-builtin-tasks leaves no tasks; give --include-path")
    return names
