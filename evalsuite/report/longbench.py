"""LongBench tables in the layout of the FoX paper's Table 2 (arXiv:2503.02130): one row per model, the task
columns grouped by category, each group followed by its mean, and an overall average.

Categories (LongBench, arXiv:2308.14508): Single-Doc QA (narrativeqa, qasper, multifieldqa_en), Multi-Doc QA
(hotpotqa, 2wikimqa, musique), Summarization (gov_report, qmsum, multi_news), Few-shot (trec, triviaqa,
samsum), Code (lcc, repobench-p), and Synthetic (passage_count, passage_retrieval_en), shown only when some
model's results name one of its tasks. The Chinese tasks are not part of this table and are left out.

Means: a category's mean is over its tasks in the table, and blank when a model lacks any of them (never an
average over fewer tasks); the overall average is the mean of the category means, as LongBench's own tables
compute "Avg" (so every category weighs the same whatever its number of tasks). Scores are the rounded task
scores of ``result.json`` (``round(100 * mean, 2)``).

LongBench-E (``e=True``): one table per length bucket ("0-4k", "4-8k", "8k+"; files ``_0-4k``, ``_4-8k``,
``_8kplus``), over the tasks that have an ``_e`` file (narrativeqa, musique and qmsum have none: no columns).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from evalsuite.errors import UserError
from evalsuite.metrics.longbench import BUCKETS, E_TASKS
from evalsuite.report.tables import FORMATS, write_table

# (category, [(task, column label)]) in the order of the FoX paper's Table 2; Synthetic last, when present.
CATEGORIES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Single-Doc QA", (("narrativeqa", "NarrativeQA"), ("qasper", "Qasper"), ("multifieldqa_en", "MFQA-en"))),
    ("Multi-Doc QA", (("hotpotqa", "HotpotQA"), ("2wikimqa", "2WikiMQA"), ("musique", "MuSiQue"))),
    ("Summarization", (("gov_report", "GovReport"), ("qmsum", "QMSum"), ("multi_news", "MultiNews"))),
    ("Few-shot", (("trec", "TREC"), ("triviaqa", "TriviaQA"), ("samsum", "SAMSum"))),
    ("Code", (("lcc", "LCC"), ("repobench-p", "RepoBench-P"))),
    ("Synthetic", (("passage_count", "PassageCount"), ("passage_retrieval_en", "PassageRetrieval-en"))),
)
OPTIONAL_CATEGORIES = frozenset({"Synthetic"})
MEAN_LABEL = "Avg"  # the mean column under each category, and the overall average's group
OVERALL = "Overall"
BUCKET_SUFFIX = {"0-4k": "0-4k", "4-8k": "4-8k", "8k+": "8kplus"}  # file-name friendly


def _layout(results_by_model: Mapping[str, Mapping[str, object]], e: bool) -> list[tuple[str, list[tuple[str, str]]]]:
    """The categories and tasks of the table: every non-optional category, optional ones when some model has
    one of their tasks (a key, even with a null score, so that the LongBench-E bucket tables share columns)."""
    present = {task for scores in results_by_model.values() for task in scores}
    layout = []
    for category, tasks in CATEGORIES:
        kept = [(task, label) for task, label in tasks if not e or task in E_TASKS]
        if kept and (category not in OPTIONAL_CATEGORIES or any(task in present for task, _ in kept)):
            layout.append((category, kept))
    return layout


def _value(x: object) -> float:
    return float("nan") if x is None else float(x)


def longbench_table(results_by_model: Mapping[str, Mapping[str, float | None]], *, e: bool = False) -> pd.DataFrame:
    """Table 2 as a DataFrame: index ``model``, columns a MultiIndex (category, label).

    ``results_by_model``: model -> ``{task: score}`` (one bucket's scores when ``e``; :func:`bucket_results`
    picks them). Each category's columns are its tasks' labels and ``"Avg"`` (its mean); the last column is
    ``("Overall", "Avg")``, the mean of the category means. Missing scores are NaN, and so is every mean
    that would need them.
    """
    if not results_by_model:
        raise UserError("no LongBench results to tabulate")
    layout = _layout(results_by_model, e)
    columns, rows = [], []
    for category, tasks in layout:
        columns += [(category, label) for _, label in tasks] + [(category, MEAN_LABEL)]
    columns.append((OVERALL, MEAN_LABEL))
    for scores in results_by_model.values():
        row, category_means = [], []
        for _, tasks in layout:
            values = [_value(scores.get(task)) for task, _ in tasks]
            mean = float(np.mean(values))  # NaN when any task is missing
            row += values + [mean]
            category_means.append(mean)
        row.append(float(np.mean(category_means)))
        rows.append(row)
    index = pd.Index(list(results_by_model), name="model")
    return pd.DataFrame(rows, index=index, columns=pd.MultiIndex.from_tuples(columns))


def bucket_results(
    results_by_model: Mapping[str, Mapping[str, Mapping[str, float | None]]], bucket: str
) -> dict[str, dict[str, float | None]]:
    """From LongBench-E results (model -> task -> {bucket: score}), model -> {task: score} of one bucket."""
    if bucket not in BUCKETS:
        raise UserError(f"unknown LongBench-E bucket {bucket!r}; choose from {list(BUCKETS)}")
    out: dict[str, dict[str, float | None]] = {}
    for model, scores in results_by_model.items():
        out[model] = {}
        for task, buckets in scores.items():
            if not isinstance(buckets, Mapping):
                raise UserError(f"{model}: {task} has a single score {buckets!r}, not LongBench-E buckets")
            out[model][task] = buckets.get(bucket)
    return out


def flat_columns(table: pd.DataFrame) -> pd.DataFrame:
    """The table with one header row: task labels as they are, each mean as "<category> Avg", then "Avg"."""
    names = []
    for category, label in table.columns:
        if category == OVERALL:
            names.append(MEAN_LABEL)
        elif label == MEAN_LABEL:
            names.append(f"{category} {MEAN_LABEL}")
        else:
            names.append(label)
    flat = table.copy()
    flat.columns = names
    return flat


def write_longbench_tables(
    results_by_model: Mapping[str, Mapping[str, object]],
    out_stem: Path | str,
    e: bool = False,
    formats: Sequence[str] = FORMATS,
) -> list[Path]:
    """Write the Table 2 layout as ``<out_stem>.{csv,md,tex}``; with ``e``, ``<out_stem>_<bucket>.*`` per bucket
    (buckets "0-4k", "4-8k", "8kplus").

    ``results_by_model``: model -> ``result.json`` content (``{task: score}``, or ``{task: {bucket: score}}``
    with ``e``). CSV and Markdown get one header row (:func:`flat_columns`); LaTeX keeps the category row
    above the task row where pandas can render it (its LaTeX writer needs jinja2; without it, flat columns).
    Returns the written paths (per table, in ``formats`` order).
    """
    stems: list[tuple[str, Mapping[str, Mapping[str, object]]]]
    if e:
        stems = [(f"{out_stem}_{BUCKET_SUFFIX[b]}", bucket_results(results_by_model, b)) for b in BUCKETS]
    else:
        for model, scores in results_by_model.items():
            bucketed = [task for task, value in scores.items() if isinstance(value, Mapping)]
            if bucketed:
                raise UserError(f"{model}: {bucketed[0]} has LongBench-E buckets; tabulate with e=True")
        stems = [(str(out_stem), results_by_model)]
    paths: list[Path] = []
    for stem, results in stems:
        table = longbench_table(results, e=e)
        for fmt in formats:
            grouped = fmt == "tex" and importlib.util.find_spec("jinja2") is not None
            paths += write_table(table if grouped else flat_columns(table), stem, [fmt])
    return paths
