"""lm-eval tasks as a task of the runner: one record per lm-eval task, so a run resumes task by task.

Each lm-eval task is evaluated on its own through ``lm_eval.simple_evaluate`` with our adapter as lm-eval's model
(:class:`evalsuite.adapters.lm_eval_bridge.EvalsuiteLM`), at its number of shots (``fewshot``, default the task's
own); its record holds every metric lm-eval reports for it (``acc``, ``acc_norm``, ``perplexity``,
``word_perplexity``, ...; lm-eval's ``,none`` filter suffix dropped), the number of documents and lm-eval's version.
Datasets come from lm-eval's task definitions (the Hugging Face cache, or the hub when online) or from task YAML
files in ``include_path`` (any local JSON/CSV data). ``evalsuite paper run`` runs the papers' lm-eval tables
through it; ``evalsuite run lm-eval --set tasks=[...]`` runs it alone.

Before the run directory is claimed, every task is looked up and its request types checked against the model:
multiple-choice and log-likelihood tasks need log-likelihoods, perplexity tasks (``loglikelihood_rolling``) need
token-level scores, generation tasks need generation. A text-only API model is refused there, in one line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD, TOKENS, TextAdapter
from evalsuite.errors import UserError, require
from evalsuite.runs.rundir import RunDir
from evalsuite.runs.store import file_sha256
from evalsuite.tasks.base import NEED_TEXT, Item, ItemTask, Plan, register_task

# What each lm-eval request type asks of the model.
OUTPUT_NEEDS = {
    "multiple_choice": LOGLIKELIHOOD,
    "loglikelihood": LOGLIKELIHOOD,
    "loglikelihood_rolling": TOKENS,
    "generate_until": GENERATE,
}


@dataclass
class LmEvalConfig:
    """``tasks``: lm-eval task names; ``fewshot``: shots per task (absent: the task's own); ``include_path``:
    folders of task YAML files; ``builtin_tasks``: index lm-eval's own tasks too; ``limit``: documents per task."""

    tasks: list[str] = field(default_factory=list)
    fewshot: dict[str, int] = field(default_factory=dict)
    include_path: list[str] = field(default_factory=list)
    builtin_tasks: bool = True
    limit: int | None = None
    batch_size: int = 1
    max_length: int | None = None

    def __post_init__(self):
        if not self.tasks:
            raise UserError("lm-eval needs at least one task name")
        if any(n < 0 for n in self.fewshot.values()) or set(self.fewshot) - set(self.tasks):
            raise UserError(f"lm-eval fewshot must map tasks of {self.tasks} to shots >= 0, got {self.fewshot}")
        if (self.limit is not None and self.limit < 1) or self.batch_size < 1:
            raise UserError("lm-eval limit and batch_size must be at least 1")
        for folder in self.include_path:
            if not Path(folder).is_dir():
                raise UserError(f"lm-eval include path {folder} is not a directory")
        if not self.builtin_tasks and not self.include_path:
            raise UserError("lm-eval without its built-in tasks needs an include path")


@dataclass(frozen=True, kw_only=True)
class LmEvalPlan(Plan):
    """``output_types``: each task's lm-eval request type (the checks of the module docstring are done)."""

    output_types: dict[str, str]


def task_manager(config: LmEvalConfig):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(config.include_path) or None, include_defaults=config.builtin_tasks)


def _output_types(config: LmEvalConfig, manager) -> dict[str, str]:
    """Each task's request type; UserError for a name lm-eval does not know, or a group (its members are tasks)."""
    from lm_eval.tasks import get_task_dict

    unknown = [n for n in config.tasks if not manager.match_tasks([n])]
    if unknown:
        raise UserError(f"unknown lm-eval task(s) {', '.join(unknown)} (lm-eval's task list, or an include path)")
    types = {}
    for name, task in get_task_dict(list(config.tasks), manager).items():
        label = getattr(name, "group_name", name)
        if not hasattr(task, "OUTPUT_TYPE"):
            raise UserError(f"lm-eval {label} is a group of tasks; name its tasks instead")
        types[str(label)] = task.OUTPUT_TYPE
    return types


def metric_name(key: str) -> str:
    """lm-eval's ``acc,none`` -> ``acc``; other filters stay (``exact_match,strict-match``)."""
    return key.removesuffix(",none")


@register_task
class LmEvalTask(ItemTask):
    """lm-eval tasks on any adapter, one record (every metric) per task."""

    name = "lm-eval"
    needs = frozenset({GENERATE})  # a model, at least; what each lm-eval task's requests need is checked in prepare
    Config = LmEvalConfig
    shards = False  # lm-eval runs one task at a time on one process here

    def prepare(self, adapter: TextAdapter) -> LmEvalPlan:
        lm_eval = require("lm_eval", "lm-eval", "the lm-eval task")
        config = self.config
        types = _output_types(config, task_manager(config))
        for task in config.tasks:  # in the order given, so the refusal names the first task the model cannot run
            output = types.get(task)
            need = OUTPUT_NEEDS.get(output)
            if need is not None and need not in adapter.capabilities:
                raise UserError(
                    f"lm-eval task {task} ({output}) needs {NEED_TEXT[need]}, which model {adapter.name} does not "
                    f"give (it offers: {', '.join(sorted(adapter.capabilities))})"
                )
        yamls = sorted(p for folder in config.include_path for p in Path(folder).rglob("*.yaml"))
        hashed = {**asdict(config), "include_path": file_sha256(yamls) if yamls else None, "batch_size": None,
                  "lm_eval": getattr(lm_eval, "__version__", None)}  # fmt: skip
        shown = {**hashed, "include_path": list(config.include_path), "batch_size": config.batch_size}
        return LmEvalPlan(config=hashed, shown=shown, output_types=types)

    def items(self, plan: LmEvalPlan, adapter: TextAdapter) -> list[Item]:
        return [Item((f"{t}|{self.config.fewshot.get(t, 'default')}",), t) for t in self.config.tasks]

    def batches(self, plan: LmEvalPlan, adapter: TextAdapter, items: Sequence[Item]) -> list[list[Item]]:
        return [list(items)] if items else []  # one task index for all of them (lm-eval's takes seconds to build)

    def evaluate(self, plan: LmEvalPlan, adapter: TextAdapter, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        import lm_eval

        from evalsuite.adapters.lm_eval_bridge import EvalsuiteLM

        config = self.config
        manager = task_manager(config)
        lm = EvalsuiteLM(adapter=adapter, batch_size=config.batch_size, max_length=config.max_length)
        for item in items:
            task = item.data
            out = lm_eval.simple_evaluate(model=lm, tasks=[task], num_fewshot=config.fewshot.get(task),
                                          limit=config.limit, task_manager=manager, log_samples=False)  # fmt: skip
            # metric keys are "metric,filter"; the rest ("alias", "sample_len") describe the task
            scores = {k: v for k, v in out["results"][task].items() if "," in k and isinstance(v, (int, float))}
            metrics = {metric_name(k): v for k, v in scores.items() if "_stderr" not in k}
            stderr = {metric_name(k).replace("_stderr", ""): v for k, v in scores.items() if "_stderr" in k}
            higher = out.get("higher_is_better", {}).get(task, {})
            yield {
                "key": item.keys[0],
                "task": "lm-eval",
                "subtask": task,
                "shots": out["configs"][task].get("num_fewshot"),
                "output_type": plan.output_types.get(task),
                "metrics": metrics,
                "stderr": stderr,
                "higher_is_better": {metric_name(k): v for k, v in higher.items()},
                "n": int(out["n-samples"][task]["effective"]),
                "config_hash": run.config_hash,
            }

    def aggregate(self, plan: LmEvalPlan, rows: list[dict], adapter: TextAdapter, run: RunDir) -> tuple[list, dict]:
        """Long records (one per task and metric, with ``shots``) and the summary ``{task: {shots, metrics}}``."""
        records = [
            {"model": adapter.name, "task": "lm-eval", "subtask": row["subtask"], "length": None, "depth": None,
             "metric": metric, "value": value, "n": row["n"], "shots": row["shots"]}
            for row in rows for metric, value in row["metrics"].items()
        ]  # fmt: skip
        summary = {"tasks": {row["subtask"]: {"shots": row["shots"], "metrics": row["metrics"]} for row in rows}}
        return records, summary
