"""``evalsuite paper run ID --models ...``: run what a table needs, through the one task runner.

Each :class:`~evalsuite.papers.recipes.Job` of the item becomes one task per model (LongBench, lm-eval, per-token
loss, NIAH, the DRT passkey, summarisation; MQAR trains its own models, one sweep for all of them), run by
:func:`~evalsuite.tasks.runner.run_task` into its usual directory under ``<results>/runs/``: a rerun finds the same
directory by its config hash and does only what is missing, and a run made earlier with the task's own command (same
settings) is reused. Columns computed from cards need no run; ``bench`` columns are measured by ``evalsuite bench``
on a CUDA GPU and refused elsewhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.published import Item
from evalsuite.papers.recipes import GPU_KINDS, TOKEN_KINDS, Job, bench_command, describe, jobs


@dataclass(frozen=True)
class RunOptions:
    """Where results go and the data and limits of a paper run. ``limit``: at most this many units per task (LongBench
    records, lm-eval documents, loss documents, summaries, passkey samples), for a quick run."""

    results: Path = Path("results")
    longbench_data: str | None = None
    lm_eval_include: tuple[str, ...] = ()
    lm_eval_builtin: bool = True
    loss_data: str = "synthetic"
    summarize_data: str | None = None
    limit: int | None = None
    batch_size: int = 1
    device: str = "auto"
    dtype: str = "float32"
    progress: bool = True


@dataclass(frozen=True)
class JobRun:
    """One finished (or resumed) run: the model's recorded name, the job and its run directory."""

    model: str
    job: Job
    run_dir: str


def split_models(text: str | None) -> list[str]:
    """``--models`` -> model specs: commas separate models, but a ``key=value`` piece is an option of the spec before
    it (``fox-pro-tiny,openai:m,base_url=URL,api=completions`` is two models)."""
    specs: list[str] = []
    for piece in (p.strip() for p in (text or "").split(",")):
        if not piece:
            continue
        if specs and re.match(r"[A-Za-z_][\w-]*=", piece):
            specs[-1] += f",{piece}"
        else:
            specs.append(piece)
    return specs


def model_name(spec: str) -> str:
    """The name a model's runs are recorded under, without loading it: a card's name; ``openai:NAME`` -> NAME with
    ``/`` as ``--``; ``hf:SOURCE`` -> the directory's (or hub id's last part's, or GGUF file's stem) name, as the
    adapters name themselves."""
    from evalsuite.adapters.registry import split_spec
    from evalsuite.cards import load_card

    kind, name = split_spec(spec)
    head, *options = name.split(",")
    if kind == "native":
        return load_card(head).name
    if kind == "openai":
        return head.replace("/", "--")
    gguf = next((o.partition("=")[2] for o in options if o.startswith("gguf_file=")), None)
    if gguf or head.endswith(".gguf"):
        return Path(gguf or head).stem
    return Path(head.rstrip("/")).name


def _longbench_task(job: Job, options: RunOptions):
    from evalsuite.tasks.longbench import LongBenchConfig, LongBenchTask

    config = LongBenchConfig(data=options.longbench_data, tasks=job.values("dataset"), batch_size=options.batch_size,
                             first_line=job.setting("first_line", "upstream"), max_length=job.setting("max_length"),
                             max_samples=options.limit)  # fmt: skip
    return LongBenchTask(config)


def _lm_eval_task(job: Job, options: RunOptions):
    from evalsuite.tasks.lm_eval import LmEvalConfig, LmEvalTask

    shots = {c.recipe["task"]: c.recipe["shots"] for c in job.columns if c.recipe.get("shots") is not None}
    config = LmEvalConfig(tasks=job.values("task"), fewshot=shots, include_path=list(options.lm_eval_include),
                          builtin_tasks=options.lm_eval_builtin, limit=options.limit,
                          batch_size=options.batch_size)  # fmt: skip
    return LmEvalTask(config)


def _loss_task(job: Job, options: RunOptions):
    from evalsuite.tasks.loss import LossConfig, LossTask

    return LossTask(LossConfig(data=options.loss_data, length=max(job.values("length")), max_docs=options.limit,
                               batch_size=options.batch_size))  # fmt: skip


def _niah_task(job: Job, options: RunOptions):
    from evalsuite.tasks.niah import NiahConfig, NiahTask

    return NiahTask(NiahConfig(mode=job.setting("mode"), lengths=job.values("length"), batch_size=options.batch_size))


def _passkey_task(job: Job, options: RunOptions):
    from evalsuite.tasks.drt_passkey import DrtConfig, DrtPasskeyTask

    return DrtPasskeyTask(DrtConfig(kind=job.setting("kind"), lengths=job.values("length"), samples=options.limit))


def _summarize_task(job: Job, options: RunOptions):
    from evalsuite.tasks.summarize import SummarizeConfig, SummarizeTask

    config = SummarizeConfig(data=options.summarize_data, max_docs=options.limit, batch_size=options.batch_size)
    return SummarizeTask(config)


TASK_BUILDERS = {
    "longbench": _longbench_task,
    "lm-eval": _lm_eval_task,
    "loss": _loss_task,
    "niah": _niah_task,
    "passkey": _passkey_task,
    "summarize": _summarize_task,
}
# What a job's data option is called, for the error when it is missing.
DATA_OPTIONS = {
    "longbench": ("longbench_data", "--longbench-data DIR (the official layout, <task>.jsonl)"),
    "summarize": ("summarize_data", "--summarize-data FILE (JSONL of documents and summaries)"),
}


def mqar_task(job: Job, specs: list[str], options: RunOptions):
    """One sweep of the job's preset over ``specs`` (cards or architectures) at the job's widths."""
    from evalsuite.adapters.registry import split_spec
    from evalsuite.tasks.mqar import MQARSweep, MQARTask
    from evalsuite.tasks.mqar.sweep import load_preset

    foreign = [s for s in specs if split_spec(s)[0] != "native"]
    if foreign:
        raise UserError(f"MQAR trains its own models from cards; {', '.join(foreign)} is not a card")
    preset = job.setting("preset")
    sweep = MQARSweep.from_dict({**load_preset(preset).to_dict(), "models": list(specs),
                                 "d_models": job.values("d_model")})  # fmt: skip
    return MQARTask(sweep, preset=preset, device=options.device)


def check_runnable(item: Item, specs: list[str], options: RunOptions) -> list[Job]:
    """The item's jobs; UserError for a bench column without a CUDA GPU, a missing data option, or no models."""
    import torch

    gpu = torch.cuda.is_available() and not options.device.startswith("cpu")
    for column in item.columns:
        if column.recipe is not None and column.recipe["kind"] in GPU_KINDS and not gpu:
            raise UserError(
                f"{item.id}: column {column.label!r} ({describe(column.recipe)}) is measured on a CUDA GPU "
                f"({bench_command(column.recipe)}); this machine has none"
            )
    found = jobs(item)
    for job in found:
        option, how = DATA_OPTIONS.get(job.kind, (None, None))
        if option is not None and getattr(options, option) is None:
            raise UserError(f"{item.id} needs {job.kind} data: {how}")
    if found and not specs:
        raise UserError(f"{item.id}: name the models to run with --models (cards, hf:DIR, openai:NAME, ...)")
    return found


def run_item(item: Item, specs: list[str], options: RunOptions, say=print) -> list[JobRun]:
    """Run (or resume) every job of ``item`` on each model of ``specs``; ``say`` reports each run's directory."""
    from evalsuite.adapters.base import TOKENS
    from evalsuite.adapters.registry import AdapterOptions, load_adapter
    from evalsuite.tasks.runner import run_task

    found = check_runnable(item, specs, options)
    root = Path(options.results) / "runs"
    done: list[JobRun] = []
    for job in (j for j in found if j.kind == "mqar"):
        results = run_task(mqar_task(job, specs, options), None, progress=options.progress, runs_root=root)
        done += [JobRun(model_name(s), job, results["run_dir"]) for s in specs]
        say(f"mqar {job.setting('preset')}: {results['run_dir']}")
    model_jobs = [j for j in found if j.kind != "mqar"]
    for spec in specs if model_jobs else []:
        adapter = load_adapter(spec, AdapterOptions(device=options.device, dtype=options.dtype))
        lacking = [c.label for j in model_jobs if j.kind in TOKEN_KINDS for c in j.columns]
        if lacking and TOKENS not in adapter.capabilities:  # before any of its runs
            raise UserError(f"{item.id}: model {adapter.name} gives no token-level scores (a text-only model); "
                            f"column(s) {', '.join(lacking)} need them")  # fmt: skip
        for job in model_jobs:
            results = run_task(TASK_BUILDERS[job.kind](job, options), adapter, progress=options.progress,
                               runs_root=root)  # fmt: skip
            done.append(JobRun(adapter.name, job, results["run_dir"]))
            say(f"{adapter.name} {job.kind}: {results['run_dir']}")
    return done
