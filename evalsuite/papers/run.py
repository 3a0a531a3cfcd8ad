"""``evalsuite paper run ID --models ...``: run what a table needs, through the one task runner.

Each :class:`~evalsuite.papers.recipes.Job` of the item becomes one task per model (LongBench, lm-eval, per-token
loss, NIAH, the DRT passkey, summarisation; MQAR trains its own models, one sweep for all of them), run by
:func:`~evalsuite.tasks.runner.run_task` into its usual directory under ``<results>/runs/``: a rerun finds the same
directory by its config hash and does only what is missing, and a run made earlier with the task's own command (same
settings) is reused. Columns computed from cards need no run; ``bench`` columns are measured by ``evalsuite bench``
on a CUDA GPU and refused elsewhere.

A recipe's evaluation text (``dataset`` of ``loss`` and ``summarize``) is found by its name in a folder the user
gives, as LongBench's tasks are: ``--loss-data DIR`` holds ``DIR/<dataset>`` (a folder of documents, or one file
``<dataset>.<suffix>``), ``--summarize-data DIR`` holds ``DIR/<dataset>.jsonl``; the built-in corpora (``synthetic``,
``books``) need no folder. The run records that path, and ``paper render`` finds it again by that name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from glob import escape
from pathlib import Path

from evalsuite.data.builtin import BOOKS, SYNTHETIC
from evalsuite.errors import UserError
from evalsuite.papers.published import Item
from evalsuite.papers.recipes import GPU_KINDS, TOKEN_KINDS, Job, bench_command, describe, jobs


@dataclass(frozen=True)
class RunOptions:
    """Where results go and the data and limits of a paper run: ``loss_data`` and ``summarize_data`` are folders of
    evaluation texts by their recipes' dataset names (see the module docstring). ``limit``: at most this many units
    per task (LongBench records, lm-eval documents, loss documents, summaries, passkey samples), for a quick run."""

    results: Path = Path("results")
    longbench_data: str | None = None
    lm_eval_include: tuple[str, ...] = ()
    lm_eval_builtin: bool = True
    loss_data: str | None = None
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


def _longbench_task(job: Job, options: RunOptions, item_id: str):
    from evalsuite.tasks.longbench import LongBenchConfig, LongBenchTask

    config = LongBenchConfig(data=options.longbench_data, tasks=job.values("dataset"), batch_size=options.batch_size,
                             first_line=job.setting("first_line", "upstream"), max_samples=options.limit)  # fmt: skip
    return LongBenchTask(config)


def _lm_eval_task(job: Job, options: RunOptions, item_id: str):
    from evalsuite.tasks.lm_eval import LmEvalConfig, LmEvalTask

    shots = {c.recipe["task"]: c.recipe["shots"] for c in job.columns if c.recipe.get("shots") is not None}
    config = LmEvalConfig(tasks=job.values("task"), fewshot=shots, include_path=list(options.lm_eval_include),
                          builtin_tasks=options.lm_eval_builtin, limit=options.limit,
                          batch_size=options.batch_size)  # fmt: skip
    return LmEvalTask(config)


def text_source(job: Job, options: RunOptions, item_id: str) -> str:
    """The evaluation text of a loss or summarize job: a built-in corpus by its name, else its path in the folder of
    ``--loss-data`` / ``--summarize-data``; UserError where that folder does not hold it."""
    dataset = job.setting("dataset")
    if job.kind == "loss" and dataset in (SYNTHETIC, BOOKS):  # the built-in corpora, by the names the tasks take
        return dataset
    option, folder = {
        "loss": ("--loss-data", options.loss_data),
        "summarize": ("--summarize-data", options.summarize_data),
    }[job.kind]
    expected = f"{dataset}.jsonl" if job.kind == "summarize" else f"{dataset}/ or {dataset}.<suffix>"
    root = Path(folder) if folder is not None else None
    if root is None or not root.is_dir():
        raise UserError(f"{item_id} needs the {job.kind} text {dataset!r}: {option} DIR, a folder holding {expected}")
    if job.kind == "loss" and (root / dataset).is_dir():
        return str(root / dataset)
    found = [p for p in sorted(root.glob(f"{escape(dataset)}.*")) if job.kind == "loss" or p.name == f"{dataset}.jsonl"]
    if len(found) != 1:
        raise UserError(f"{item_id} needs the {job.kind} text {dataset!r}: {root} holds "
                        f"{len(found)} files named {expected}, not one")  # fmt: skip
    return str(found[0])


def _loss_task(job: Job, options: RunOptions, item_id: str):
    from evalsuite.tasks.loss import LossConfig, LossTask

    config = LossConfig(data=text_source(job, options, item_id), length=max(job.lengths), max_docs=options.limit,
                        batch_size=options.batch_size)  # fmt: skip
    return LossTask(config)


def _niah_task(job: Job, options: RunOptions, item_id: str):
    from evalsuite.tasks.niah import NiahConfig, NiahTask

    return NiahTask(NiahConfig(mode=job.setting("mode"), lengths=list(job.lengths), batch_size=options.batch_size))


def _passkey_task(job: Job, options: RunOptions, item_id: str):
    from evalsuite.tasks.drt_passkey import DrtConfig, DrtPasskeyTask

    return DrtPasskeyTask(DrtConfig(kind=job.setting("mode"), lengths=list(job.lengths), samples=options.limit))


def _summarize_task(job: Job, options: RunOptions, item_id: str):
    from evalsuite.tasks.summarize import SummarizeConfig, SummarizeTask

    config = SummarizeConfig(data=text_source(job, options, item_id), max_docs=options.limit,
                             batch_size=options.batch_size)  # fmt: skip
    return SummarizeTask(config)


TASK_BUILDERS = {
    "longbench": _longbench_task,
    "lm-eval": _lm_eval_task,
    "loss": _loss_task,
    "niah": _niah_task,
    "passkey": _passkey_task,
    "summarize": _summarize_task,
}
LENGTH_KINDS = ("loss", "niah", "passkey")  # run at the token counts their columns state


def mqar_task(job: Job, specs: list[str], options: RunOptions):
    """One sweep of the job's preset over ``specs`` (cards or architectures) at the job's widths and its cell."""
    from evalsuite.adapters.registry import split_spec
    from evalsuite.tasks.mqar import MQARSweep, MQARTask
    from evalsuite.tasks.mqar.sweep import load_preset

    foreign = [s for s in specs if split_spec(s)[0] != "native"]
    if foreign:
        raise UserError(f"MQAR trains its own models from cards; {', '.join(foreign)} is not a card")
    preset = job.setting("preset")
    cell = {"d_models": job.values("d_model"), "seq_lens": [job.setting("length")],
            "num_kv_pairs": [job.setting("num_kv_pairs")]}  # fmt: skip
    sweep = MQARSweep.from_dict({**load_preset(preset).to_dict(), "models": list(specs), **cell})
    return MQARTask(sweep, preset=preset, device=options.device)


def planned(item: Item, specs: list[str], options: RunOptions) -> list[tuple[Job, object]]:
    """Each run of ``item`` with its task, all built (so checked) before any runs; UserError for a bench column
    without a CUDA GPU, a length the paper does not state, missing data, or no models."""
    import torch

    gpu = torch.cuda.is_available() and not options.device.startswith("cpu")
    for column in item.columns:
        if column.recipe is not None and column.recipe["kind"] in GPU_KINDS and not gpu:
            raise UserError(
                f"{item.id}: column {column.label!r} ({describe(column.recipe)}) is measured on a CUDA GPU "
                f"({bench_command(column.recipe)}); this machine has none"
            )
    found = jobs(item)
    if found and not specs:
        raise UserError(f"{item.id}: name the models to run with --models (cards, hf:DIR, openai:NAME, ...)")
    for job in found:
        if job.kind in LENGTH_KINDS and not job.lengths:
            raise UserError(f"{item.id}: the paper states no length for {', '.join(c.label for c in job.columns)}")
        if job.kind == "longbench" and options.longbench_data is None:
            raise UserError(f"{item.id} needs longbench data: --longbench-data DIR (the official layout, <task>.jsonl)")
    return [(job, mqar_task(job, specs, options) if job.kind == "mqar" else TASK_BUILDERS[job.kind](job, options,
             item.id)) for job in found]  # fmt: skip


def run_item(item: Item, specs: list[str], options: RunOptions, say=print) -> list[JobRun]:
    """Run (or resume) every job of ``item`` on each model of ``specs``; ``say`` reports each run's directory."""
    from evalsuite.adapters.base import TOKENS
    from evalsuite.adapters.registry import AdapterOptions, load_adapter
    from evalsuite.tasks.runner import run_task

    plan = planned(item, specs, options)
    root = Path(options.results) / "runs"
    done: list[JobRun] = []
    for job, task in (p for p in plan if p[0].kind == "mqar"):
        results = run_task(task, None, progress=options.progress, runs_root=root)
        done += [JobRun(model_name(s), job, results["run_dir"]) for s in specs]
        say(f"mqar {job.setting('preset')}: {results['run_dir']}")
    model_runs = [p for p in plan if p[0].kind != "mqar"]
    for spec in specs if model_runs else []:
        adapter = load_adapter(spec, AdapterOptions(device=options.device, dtype=options.dtype))
        lacking = [c.label for job, _ in model_runs if job.kind in TOKEN_KINDS for c in job.columns]
        if lacking and TOKENS not in adapter.capabilities:  # before any of its runs
            raise UserError(f"{item.id}: model {adapter.name} gives no token-level scores (a text-only model); "
                            f"column(s) {', '.join(lacking)} need them")  # fmt: skip
        for job, task in model_runs:
            results = run_task(task, adapter, progress=options.progress, runs_root=root)
            done.append(JobRun(adapter.name, job, results["run_dir"]))
            say(f"{adapter.name} {job.kind}: {results['run_dir']}")
    return done
