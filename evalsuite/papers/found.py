"""Our values for a table's columns, found in the run directories under a results folder.

:func:`scan` reads every finished run (``results.json``) under the folder once, and the MQAR cell records
(``records.jsonl``, or the committed ``records.jsonl.gz``); :func:`find` then gives, for a column's recipe and a
model, the value the paper's table would print, on the paper's scale (proportions as percentages). Where several
runs hold a value (a quick ``--limit`` run and a full one, a rerun with other settings), the one over the most
samples wins, then the newest; the value names its run directory. A ``bench`` column's value comes from the benchmark
files under the folder (:mod:`evalsuite.papers.found_bench`).
"""

from __future__ import annotations

import functools
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.found_bench import BENCH_FINDERS
from evalsuite.papers.recipes import data_name

# lm-eval metrics that are proportions: the papers print them as percentages.
PROPORTIONS = {"acc", "acc_norm", "exact_match", "em", "f1", "mcc", "contains", "accuracy"}


@dataclass(frozen=True)
class Found:
    """One cell's value, the number of samples behind it and the run directory it comes from."""

    value: float
    n: int | None
    source: str


@dataclass(frozen=True)
class Results:
    """What a results folder holds: each finished run's ``results.json`` (with ``run_dir`` and ``mtime``) and every
    MQAR cell record (with ``run_dir``)."""

    root: Path
    runs: tuple[dict, ...]
    mqar: tuple[dict, ...]

    def of(self, task: str, model: str) -> Iterator[dict]:
        return (r for r in self.runs if r.get("task") == task and r.get("model") == model)

    def models(self) -> list[str]:
        names = {r.get("model") for r in self.runs} | {r.get("model") for r in self.mqar}
        return sorted(n for n in names if n)


def _record_files(root: Path) -> Iterator[Path]:
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in ("records.jsonl", "records.jsonl.gz"):
            if name in files:
                yield Path(folder) / name


def _read_lines(path: Path) -> Iterator[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:  # a torn last line of an interrupted run
                    return


def scan(root: Path | str) -> Results:
    """Every finished run and MQAR record under ``root`` (nothing when it does not exist)."""
    root = Path(root)
    runs, mqar = [], []
    if root.is_dir():
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            if "results.json" in files:
                path = Path(folder) / "results.json"
                try:
                    results = json.loads(path.read_text())
                except (OSError, ValueError):
                    raise UserError(f"{path} is not readable JSON") from None
                if isinstance(results, dict) and results.get("task") != "mqar":
                    runs.append({**results, "run_dir": folder, "mtime": path.stat().st_mtime})
        for path in _record_files(root):
            lines = _read_lines(path)
            first = next(lines, None)
            if first is not None and first.get("task") == "mqar":
                mqar += [{**r, "run_dir": str(path.parent)} for r in (first, *lines)]
    return Results(root, tuple(runs), tuple(mqar))


def _best(found: Iterator[tuple[Found, float]]) -> Found | None:
    """The value over the most samples, then the newest run's."""
    ranked = sorted(found, key=lambda pair: (pair[0].n or 0, pair[1]))
    return ranked[-1][0] if ranked else None


def _longbench(results: Results, recipe: dict, model: str):
    for run in results.of("longbench", model):
        config = run.get("config") or {}
        if config.get("e") or config.get("first_line") != recipe.get("first_line", "upstream"):
            continue
        score = (run.get("summary") or {}).get("scores", {}).get(recipe["dataset"])
        n = next((r.get("n") for r in run.get("records", []) if r.get("subtask") == recipe["dataset"]), None)
        if score is not None:
            yield Found(float(score), n, run["run_dir"]), run["mtime"]


def _lm_eval(results: Results, recipe: dict, model: str):
    scale = 100 if recipe["metric"] in PROPORTIONS else 1
    for run in results.of("lm-eval", model):
        for r in run.get("records", []):
            shots_ok = recipe.get("shots") is None or r.get("shots") == recipe["shots"]
            if r.get("subtask") == recipe["task"] and r.get("metric") == recipe["metric"] and shots_ok:
                yield Found(float(r["value"]) * scale, r.get("n"), run["run_dir"]), run["mtime"]


def _of_dataset(results: Results, task: str, model: str, dataset: str) -> Iterator[dict]:
    """``model``'s runs of ``task`` on the evaluation text ``dataset`` (by its name: see ``data_name``)."""
    return (run for run in results.of(task, model) if data_name((run.get("config") or {}).get("data")) == dataset)


def _loss(results: Results, recipe: dict, model: str):
    metric = {"ppl": "perplexity"}[recipe["metric"]]
    for run in _of_dataset(results, "loss", model, recipe["dataset"]):
        for r in run.get("records", []):
            if r.get("metric") == metric and r.get("length") == recipe["length"]:
                yield Found(float(r["value"]), r.get("n"), run["run_dir"]), run["mtime"]


def _cell_mean(results: Results, task: str, model: str, match, length: int, metrics: tuple[str, ...]):
    """The mean over a length's cells (NIAH depths, passkey bins) of the first of ``metrics`` a run has."""
    for run in results.of(task, model):
        if not match(run.get("config") or {}):
            continue
        records = [r for r in run.get("records", []) if r.get("length") == length and r.get("value") is not None]
        metric = next((m for m in metrics if any(r.get("metric") == m for r in records)), None)
        values = [float(r["value"]) for r in records if r.get("metric") == metric]
        if values:
            yield Found(sum(values) / len(values), len(values), run["run_dir"]), run["mtime"]


def _niah(results: Results, recipe: dict, model: str):
    match = lambda c: c.get("mode") == recipe["mode"]  # noqa: E731
    yield from _cell_mean(results, "niah", model, match, recipe["length"], ("judge", "score"))


def _passkey(results: Results, recipe: dict, model: str):
    match = lambda c: c.get("kind") == recipe["mode"]  # noqa: E731
    for found, mtime in _cell_mean(results, "drt-passkey", model, match, recipe["length"], ("accuracy",)):
        yield Found(found.value * 100, found.n, found.source), mtime


def _summarize(results: Results, recipe: dict, model: str):
    for run in _of_dataset(results, "summarize", model, recipe["dataset"]):
        for r in run.get("records", []):
            if r.get("metric") == recipe["metric"]:
                yield Found(float(r["value"]) * 100, r.get("n"), run["run_dir"]), run["mtime"]


@functools.lru_cache(maxsize=256)
def preset_keys(preset: str, model: str, setting: tuple[int, int, int], budgets: tuple[int, ...]) -> frozenset[str]:
    """The config hashes (record keys) of ``model``'s cells of an MQAR preset at ``setting`` (d_model, sequence length,
    key-value pairs), and of the same cells under the smaller step ``budgets`` (a pure function of its arguments and
    the preset file: cached)."""
    from evalsuite.runs.store import config_hash
    from evalsuite.tasks.mqar import MQARSweep
    from evalsuite.tasks.mqar.sweep import (
        cell_config,
        hashes_at_smaller_budgets,
        load_preset,
        resolve_model,
        sweep_cells,
    )

    d_model, length, pairs = setting
    sweep = MQARSweep.from_dict({**load_preset(preset).to_dict(), "models": [model], "d_models": [d_model],
                                 "seq_lens": [length], "num_kv_pairs": [pairs]})  # fmt: skip
    card = resolve_model(model)
    keys = set()
    for cell in sweep_cells(sweep):
        keys.add(config_hash(cell_config(sweep, cell, card)))
        keys.update(hashes_at_smaller_budgets(sweep, cell, budgets, card))
    return frozenset(keys)


def _mqar(results: Results, recipe: dict, model: str):
    """The best accuracy over the preset's learning rates, from records of exactly the preset's cells (their config
    hashes), a cell solved under a smaller step budget included (as the sweep itself reuses it)."""
    records = [r for r in results.mqar if r.get("model") == model]
    if not records:
        return
    budgets = tuple(sorted({(r.get("config") or {}).get("train", {}).get("max_steps") for r in records} - {None}))
    keys = preset_keys(recipe["preset"], model, (recipe["d_model"], recipe["length"], recipe["num_kv_pairs"]), budgets)
    cells = [r for r in records if r.get("key", r.get("config_hash")) in keys and r.get("value") is not None]
    by_dir: dict[str, dict] = {}
    for r in cells:  # a cell trained again elsewhere (a budget probe) is another run: one directory's sweep wins
        by_dir.setdefault(r["run_dir"], {})[r.get("key", r.get("config_hash"))] = r  # its latest record per cell
    if by_dir:
        sweep_dir = max(sorted(by_dir), key=lambda d: len(by_dir[d]))
        top = max(by_dir[sweep_dir].values(), key=lambda r: r["value"])
        yield Found(float(top["value"]) * 100, top.get("n"), sweep_dir), 0.0  # accuracy in %


# One finder per run kind of evalsuite.papers.recipes.RUN_KINDS (a test checks they match).
FINDERS = {"longbench": _longbench, "lm-eval": _lm_eval, "loss": _loss, "niah": _niah, "passkey": _passkey,
           "summarize": _summarize, "mqar": _mqar}  # fmt: skip


def find(results: Results, recipe: dict | None, model: str) -> Found | None:
    """Our value of a run-based or bench column for ``model`` (its recorded name), or None."""
    if recipe is not None and recipe["kind"] == "bench" and recipe["op"] in BENCH_FINDERS:
        found = BENCH_FINDERS[recipe["op"]](results.root, recipe, model)
        return _best((Found(value, n, source), mtime) for value, n, source, mtime in found)
    if recipe is None or recipe["kind"] not in FINDERS:
        return None
    return _best(FINDERS[recipe["kind"]](results, recipe, model))
