"""The NIAH task on the runner: its plan (the resolved grid), generation in batches of one length, re-judging."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from evalsuite.adapters.base import TextAdapter
from evalsuite.data.haystack import LastHaystack, haystack_identity
from evalsuite.generation.types import GenerationConfig
from evalsuite.metrics.cells import cell_means, within_beyond
from evalsuite.metrics.judge import OpenAIJudge
from evalsuite.runs import distributed
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.rundir import RunDir
from evalsuite.tasks.base import RUNS_ROOT, Item, ItemTask, Plan, register_task
from evalsuite.tasks.niah.grid import (
    AUTO,
    Cell,
    NiahConfig,
    grid_cells,
    items_by_length,
    resolve_config,
    split_by_max_length,
    subtasks,
)
from evalsuite.tasks.niah.jobs import Job, cell_jobs, score_job
from evalsuite.tasks.niah.prompts import prompt_sha256
from evalsuite.tasks.runner import run_task


@dataclass(frozen=True, kw_only=True)
class NiahPlan(Plan):
    """The grid resolved for one model: ``resolved`` (the config, preset filled in), the ``cells`` it can take and
    notes on the lengths ``skipped`` beyond its max_length; ``cells_per_call``: cells per generate call, or by
    length (``batch_size`` auto)."""

    resolved: NiahConfig
    cells: list[Cell]
    skipped: list[dict]
    cells_per_call: int | dict[int, int]

    @property
    def per_call(self) -> int | Callable[[int], int]:
        """``cells_per_call`` as :func:`~evalsuite.tasks.niah.grid.cells_by_length` takes it."""
        return self.cells_per_call if isinstance(self.cells_per_call, int) else self.cells_per_call.__getitem__


def cells_per_call(adapter: TextAdapter, config: NiahConfig) -> int | dict[int, int]:
    """Cells per generate call: ``batch_size`` prompts, or with ``auto`` per length what fits in free memory
    (:func:`evalsuite.generation.engine.prompts_per_call`), measured before any generation (the weights alone
    loaded). Every rank reaches the exchange below: the checks before it are the same on each."""
    per_cell = len(subtasks(config))
    if config.batch_size != AUTO:
        return max(1, config.batch_size // per_cell)
    from evalsuite.generation.engine import prompts_per_call

    new = config.max_new_tokens
    sizes = {n: max(1, prompts_per_call(adapter, n, new) // per_cell) for n in config.lengths}
    # under torchrun every rank must form the same batches: the smallest size fits all
    return {n: min(s[n] for s in distributed.current().all_gather(sizes)) for n in sizes}


@register_task
class NiahTask(ItemTask):
    """Generate an answer per prompt, score it offline (and with the judge when configured).

    Rerunning resumes: finished cells are skipped, cells whose judge call failed are judged again, and adding a
    judge to a finished run judges its stored predictions without generating again (the judge is not hashed).
    """

    name = "niah"
    command = "niah"
    Config = NiahConfig

    def __init__(self, config: NiahConfig | None = None, judge: OpenAIJudge | None = None):
        super().__init__(config)
        # built here, so a missing API key fails before any model work
        self.judge = (
            judge if judge is not None else (OpenAIJudge.from_spec(self.config.judge) if self.config.judge else None)
        )
        self._haystack = LastHaystack()  # a cache of the haystack built last (seconds for a long grid)

    def prepare(self, adapter: TextAdapter) -> NiahPlan:
        resolved = resolve_config(self.config, adapter.device.type)
        cells, skipped = split_by_max_length(grid_cells(resolved), adapter.max_length, adapter.name)
        hashed = {**asdict(resolved), "batch_size": None, "preset": None}  # neither changes a record
        hashed["haystack"] = haystack_identity(resolved.haystack, resolved.seed)
        shown = {**asdict(resolved), "haystack_id": hashed["haystack"]}
        return NiahPlan(config=hashed, shown=shown, resolved=resolved, cells=cells, skipped=skipped,
                        cells_per_call=cells_per_call(adapter, resolved))  # fmt: skip

    def default_dir(self, plan: NiahPlan, adapter: TextAdapter, chash: str) -> Path:
        return RUNS_ROOT / "niah" / f"{adapter.name}-{plan.resolved.label}-{chash}"

    def items(self, plan: NiahPlan, adapter: TextAdapter) -> list[Item]:
        names = subtasks(plan.resolved)
        return [Item(tuple(c.key(s) for s in names), c) for c in plan.cells]

    def batches(self, plan: NiahPlan, adapter: TextAdapter, items: Sequence[Item]) -> list[list[Item]]:
        """The cells :meth:`evaluate` generates for together: up to a batch of prompts of one length."""
        return items_by_length(items, plan.per_call)

    def execute(self, plan: NiahPlan, adapter: TextAdapter, run: RunDir, progress: bool = True) -> list[dict]:
        if self.judge is not None:
            stale = run.world.shard([r for r in run.latest().values() if _needs_judge(r)])  # each rank its share
            with progress_bar(len(stale), f"judge {adapter.name}", enabled=progress and bool(stale)) as bar:
                for record in stale:
                    run.append(_rejudge(record, self.judge))
                    bar.advance()
        return super().execute(plan, adapter, run, progress)

    def evaluate(self, plan: NiahPlan, adapter: TextAdapter, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        if not items:
            return
        config, tok = plan.resolved, adapter.tokenizer
        # FoX repeats a short haystack to the grid's longest length (the whole grid's, so a resumed run sees
        # the same text).
        haystack = self._haystack.get(config.haystack, tok, max(config.lengths), config.seed)
        for batch in items_by_length(items, plan.per_call):
            jobs = [j for it in batch for j in cell_jobs(config, it.data, haystack, tok) if j.key in it.keys]
            yield from self._answer(plan, adapter, jobs, run.config_hash)

    def _answer(self, plan: NiahPlan, adapter: TextAdapter, jobs: list[Job], chash: str) -> Iterator[dict]:
        """Generate for a batch of jobs (greedy, cached, batched), then score each answer."""
        config = plan.resolved
        stop = ["\n"] if config.stop_newline else []
        gen_config = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=0.0, stop=stop,
                                      seed=config.seed)  # fmt: skip
        generations = adapter.generate_until([j.prompt for j in jobs], gen_config)
        for job, gen in zip(jobs, generations, strict=True):
            prediction = gen.text.strip()  # FoX strips the decoded answer
            scores, verdict = score_job(job, prediction, self.judge)
            yield {
                "key": job.key,
                "task": "niah",
                "subtask": job.subtask,
                "length": job.cell.length,
                "depth": job.cell.depth,
                "sample": job.cell.sample,
                "prompt_sha256": prompt_sha256(job.prompt),
                "prompt_tokens": len(adapter.tokenizer.encode(job.prompt)),
                "prediction": prediction,
                "finish_reason": gen.finish_reason,
                "generated_tokens": len(gen.token_ids),
                "scores": scores,
                "judge": verdict,
                "judge_question": job.judge_question,
                "judge_reference": job.judge_reference,
                "key_phrases": list(job.key_phrases),
                **job.extra,
                "config_hash": chash,
            }

    def aggregate(self, plan: NiahPlan, rows: list[dict], adapter: TextAdapter, run: RunDir) -> tuple[list, dict]:
        records = cell_means(rows, adapter.name)
        summary = {
            "mode": plan.resolved.mode,
            "label": plan.resolved.label,
            "judge": self.judge.spec if self.judge is not None else _judge_of(rows),
            "skipped": plan.skipped,
            "within_beyond": within_beyond(records, adapter.train_length),
        }
        return records, summary


def run_niah(
    adapter: TextAdapter,
    config: NiahConfig,
    out_dir: Path | None = None,
    *,
    judge: OpenAIJudge | None = None,
    progress: bool = True,
) -> dict:
    """Run, resume or re-judge a NIAH evaluation; returns ``results.json``'s content.

    ``config.judge`` (``openai:MODEL``) builds the judge before anything is generated (a missing key fails
    first); or pass a ready ``judge``.
    """
    return run_task(NiahTask(config, judge), adapter, out_dir, progress)


def _needs_judge(record: dict) -> bool:
    """No verdict yet, or the last judge call failed (an unparseable reply is final, not retried)."""
    verdict = record.get("judge")
    return verdict is None or verdict.get("error") is not None


def _judge_of(rows: list[dict]) -> str | None:
    """The judge named in the records (``openai:MODEL``), several joined by commas, or None."""
    models = sorted({r["judge"]["model"] for r in rows if r.get("judge")})
    return ",".join(f"openai:{m}" for m in models) or None


def _rejudge(record: dict, judge: OpenAIJudge) -> dict:
    result = judge.rate(record["judge_question"], record["judge_reference"], record["prediction"])
    scores = {**record["scores"], "judge": result.score}
    return {**record, "scores": scores, "judge": result.to_dict()}
