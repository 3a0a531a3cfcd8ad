"""LongBench v1 (arXiv:2308.14508), as the official ``pred.py`` / ``eval.py`` run it, and the FoX variant.

Per record of each task (``tasks/longbench.yaml`` holds the 21 prompt templates and generation lengths):

1. ``prompt = template.format(**record)``, tokenised with the model's own tokenizer (its BOS convention);
2. over ``max_length`` tokens, middle truncation: the first and last ``int(max_length / 2)`` tokens, each half
   decoded without special tokens and concatenated (re-tokenised when generating, as upstream);
3. with ``chat`` (chat models), the prompt is wrapped in the model's chat template, except for trec, triviaqa,
   samsum, lsht, lcc and repobench-p (upstream's list); FoX (base models) never does;
4. greedy decoding of the task's ``max_new_tokens``;
5. scoring (:mod:`evalsuite.metrics.longbench`): upstream cuts the prediction to its first line for trec,
   triviaqa, samsum and lsht; FoX (``first_line="fox"``) for every task. The rule is recorded in each record.
   A sample scores the max over its answers; a task scores ``round(100 * mean, 2)``; LongBench-E per length
   bucket.

``max_length`` defaults to upstream's ``model2maxlen`` rule for the model's context: ``1000 * floor(L / 1000) -
500`` (3500 at 4K, 7500 at 8K, 15500 at 16K; FoX passes 15500).

Deviation, documented: upstream's samsum special case (``min_length`` of one new token and a newline
end-of-sequence) is not reproduced; samsum generates its full budget, and the first-line rule then gives the
same scored text unless the model's first token is a newline.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from evalsuite.adapters.base import TextAdapter
from evalsuite.data.haystack import decode_skip_special
from evalsuite.data.longbench import ON_BAD_RECORD, LongBenchRecord, read_task, task_file
from evalsuite.errors import UserError
from evalsuite.generation.types import GenerationConfig
from evalsuite.metrics import longbench as metrics
from evalsuite.resources import builtin_dir, read_yaml
from evalsuite.runs.rundir import RunDir
from evalsuite.runs.store import file_sha256
from evalsuite.tasks.base import RUNS_ROOT, Item, ItemTask, Plan, register_task
from evalsuite.tasks.runner import run_task

FIRST_LINE_RULES = ("upstream", "fox")


def load_spec() -> dict:
    """``tasks/longbench.yaml``: task sets and each task's prompt template and ``max_new_tokens``."""
    return read_yaml(builtin_dir("tasks") / "longbench.yaml", "LongBench task spec")


def default_max_length(model_max_length: int) -> int:
    """Upstream's prompt budget for a model of ``model_max_length`` tokens (``config/model2maxlen.json``)."""
    return max(500, 1000 * (model_max_length // 1000) - 500)


@dataclass
class LongBenchConfig:
    """One LongBench run. ``tasks``: names, or a set of ``tasks/longbench.yaml`` (``fox``, ``english``); ``e``:
    LongBench-E (``<task>_e.jsonl``, scored per length bucket)."""

    data: str | None = None
    tasks: list[str] | None = None  # default: the FoX paper's 14 English tasks
    e: bool = False
    max_length: int | None = None  # prompt token budget; default from the model's max_length
    first_line: str = "upstream"  # upstream | fox
    chat: bool = False
    fuzzy: str | None = None  # code_sim backend: levenshtein | difflib (default: the metrics module's)
    on_bad_record: str = "error"  # error | skip
    max_samples: int | None = None  # per task, for quick runs
    batch_size: int = 1
    seed: int = 42  # upstream's seed_everything(42); greedy decoding does not depend on it

    def __post_init__(self):
        if not self.data:
            raise UserError(
                "LongBench needs --data DIR: a folder in the official layout (<task>.jsonl, <task>_e.jsonl)"
            )
        if self.first_line not in FIRST_LINE_RULES:
            raise UserError(f"--first-line must be upstream or fox, got {self.first_line!r}")
        if self.on_bad_record not in ON_BAD_RECORD:
            raise UserError(f"--on-bad-record must be error or skip, got {self.on_bad_record!r}")
        if self.batch_size < 1 or (self.max_samples is not None and self.max_samples < 1):
            raise UserError("--batch-size and --max-samples must be at least 1")
        if self.fuzzy is not None and self.fuzzy not in metrics.FUZZY_BACKENDS:
            raise UserError(f"--fuzzy must be one of {', '.join(metrics.FUZZY_BACKENDS)}, got {self.fuzzy!r}")


@dataclass(frozen=True, kw_only=True)
class LongBenchPlan(Plan):
    """The run resolved for one model: the task spec, the chosen ``tasks``, the prompt budget ``max_length``, the
    code-similarity backend, the records to run and the notes on bad records ``skipped``."""

    spec: dict
    tasks: list[str]
    max_length: int
    fuzzy: str
    records: list[LongBenchRecord]
    skipped: list


def resolve_tasks(names: list[str] | None, spec: dict, e: bool) -> list[str]:
    """Task names from names or set names; unknown names and tasks without a LongBench-E file are errors."""
    chosen: list[str] = []
    for name in names or ["fox"]:
        for task in spec[name] if name in ("fox", "english") else [name]:
            if task not in spec["tasks"]:
                raise UserError(f"unknown LongBench task {task!r}; known: fox, english, {', '.join(spec['tasks'])}")
            if e and task not in spec["e_tasks"]:
                raise UserError(f"LongBench-E has no {task}; its tasks: {', '.join(spec['e_tasks'])}")
            if task not in chosen:
                chosen.append(task)
    return chosen


def build_prompt(template: str, record: LongBenchRecord, adapter: TextAdapter, max_length: int, chat: bool):
    """(prompt text, its token count, whether it was truncated) for one record (see the module docstring)."""
    tok = adapter.tokenizer
    prompt = template.format(**record.fields())
    ids = tok.encode(prompt)
    truncated = len(ids) > max_length
    if truncated:
        half = int(max_length / 2)
        prompt = decode_skip_special(tok, ids[:half]) + decode_skip_special(tok, ids[-half:])
    if chat:
        prompt = tok.chat_template([{"role": "user", "content": prompt}])
    return prompt, len(tok.encode(prompt)), truncated


@register_task
class LongBenchTask(ItemTask):
    """LongBench v1 / LongBench-E: generate an answer per record, score it with the official metrics."""

    name = "longbench"
    command = "longbench"
    Config = LongBenchConfig

    def prepare(self, adapter: TextAdapter) -> LongBenchPlan:
        config = self.config
        metrics.check_metrics_installed("evalsuite longbench")
        if not Path(config.data).is_dir():
            raise UserError(f"LongBench data directory {config.data} does not exist")
        if config.chat and not getattr(adapter.tokenizer, "has_chat_template", False):
            raise UserError(f"--chat needs a chat template; model {adapter.name}'s tokenizer has none")
        spec = load_spec()
        tasks = resolve_tasks(config.tasks, spec, config.e)
        if config.max_length is not None:
            max_length = config.max_length
        elif adapter.max_length is not None:
            max_length = default_max_length(adapter.max_length)
        else:
            raise UserError(f"model {adapter.name} has no max_length; pass --max-length")
        records, skipped = [], []
        for task in tasks:
            read, bad = read_task(config.data, task, e=config.e, on_bad_record=config.on_bad_record)
            records += read[: config.max_samples]
            skipped += bad
        fuzzy = config.fuzzy or metrics.DEFAULT_FUZZY
        data_sha256 = file_sha256([task_file(Path(config.data), t, config.e) for t in tasks])
        hashed = {**asdict(config), "data": data_sha256, "tasks": tasks, "max_length": max_length, "fuzzy": fuzzy,
                  "batch_size": None}  # fmt: skip
        shown = {**hashed, "data": config.data, "data_sha256": data_sha256, "batch_size": config.batch_size}
        return LongBenchPlan(config=hashed, shown=shown, spec=spec, tasks=tasks, max_length=max_length, fuzzy=fuzzy,
                             records=records, skipped=skipped)  # fmt: skip

    def default_dir(self, plan: LongBenchPlan, adapter: TextAdapter, chash: str) -> Path:
        return RUNS_ROOT / "longbench" / f"{adapter.name}-{'e-' if self.config.e else ''}{chash}"

    def items(self, plan: LongBenchPlan, adapter: TextAdapter) -> list[Item]:
        return [Item((f"{r.task}|{r.index}|{r.id or ''}",), r) for r in plan.records]

    def batches(self, plan: LongBenchPlan, adapter: TextAdapter, items: Sequence[Item]) -> list[list[Item]]:
        """The records :meth:`evaluate` generates for together: up to ``batch_size`` of one task, in order."""
        size = self.config.batch_size
        return [group[i : i + size] for group in _by_task(items).values() for i in range(0, len(group), size)]

    def evaluate(self, plan: LongBenchPlan, adapter: TextAdapter, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        by_task = _by_task(items)
        size = self.config.batch_size
        for task, group in by_task.items():
            spec = plan.spec["tasks"][task]
            chat = self.config.chat and task not in plan.spec["no_chat"]
            gen = GenerationConfig(max_new_tokens=int(spec["max_new_tokens"]), temperature=0.0, seed=self.config.seed)
            for start in range(0, len(group), size):
                batch = group[start : start + size]
                built = [build_prompt(spec["prompt"], it.data, adapter, plan.max_length, chat) for it in batch]
                outputs = adapter.generate_until([p for p, _, _ in built], gen)
                for item, (_, n_tokens, truncated), out in zip(batch, built, outputs, strict=True):
                    yield self._record(plan, item, n_tokens, truncated, chat, out.text, run.config_hash)

    def _record(self, plan: LongBenchPlan, item: Item, n_tokens: int, truncated: bool, chat: bool, prediction: str,
                chash: str) -> dict:  # fmt: skip
        r: LongBenchRecord = item.data
        score = metrics.score_sample(
            r.task, prediction, list(r.answers), list(r.all_classes or []), first_line=self.config.first_line,
            fuzzy=plan.fuzzy,
        )  # fmt: skip
        return {
            "key": item.keys[0],
            "task": "longbench",
            "subtask": r.task,
            "length": r.length,
            "id": r.id,
            "source": f"{Path(r.file).name}:{r.line}",
            "prompt_tokens": n_tokens,
            "truncated": truncated,
            "chat": chat,
            "prediction": prediction,
            "answers": list(r.answers),
            "all_classes": None if r.all_classes is None else list(r.all_classes),
            "first_line": self.config.first_line,
            "fuzzy": plan.fuzzy,
            "scores": {"score": score},
            "config_hash": chash,
        }

    def aggregate(self, plan: LongBenchPlan, rows: list[dict], adapter: TextAdapter, run: RunDir) -> tuple[list, dict]:
        """Per-task scores (×100, 2 d.p.) as long records, and upstream's ``result.json`` shape in the summary."""
        by_task: dict[str, list[dict]] = defaultdict(list)
        for row in rows:
            by_task[row["subtask"]].append(row)
        records, scores = [], {}
        for task in plan.tasks:
            task_rows = by_task.get(task, [])
            if not task_rows:
                continue
            if self.config.e:
                values, lengths = [r["scores"]["score"] for r in task_rows], [r["length"] for r in task_rows]
                scores[task] = metrics.bucket_scores(values, lengths)  # upstream's --e rounding
                for bucket, value in scores[task].items():
                    n = sum(metrics.length_bucket(n) == bucket for n in lengths)
                    records.append(self._long(adapter, f"{task}@{bucket}", value, n))
            else:
                scores[task] = metrics.task_score([row["scores"]["score"] for row in task_rows])
                records.append(self._long(adapter, task, scores[task], len(task_rows)))
        summary = {
            "scores": scores,
            "e": self.config.e,
            "first_line": self.config.first_line,
            "fuzzy": plan.fuzzy,
            "max_length": plan.max_length,
            "truncated": sum(bool(row["truncated"]) for row in rows),
            "skipped_records": plan.skipped,
        }
        return records, summary

    @staticmethod
    def _long(adapter: TextAdapter, subtask: str, value: float | None, n: int) -> dict:
        return {"model": adapter.name, "task": "longbench", "subtask": subtask, "length": None, "depth": None,
                "metric": "score", "value": value, "n": n}  # fmt: skip


def _by_task(items: Sequence[Item]) -> dict[str, list[Item]]:
    by_task: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        by_task[item.data.task].append(item)
    return by_task


def run_longbench(adapter: TextAdapter, config: LongBenchConfig, out_dir=None, progress: bool = True) -> dict:
    """Run or resume LongBench; returns ``results.json``'s content (``summary["scores"]``: upstream's shape)."""
    return run_task(LongBenchTask(config), adapter, out_dir, progress)
