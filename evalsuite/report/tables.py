"""Write result tables as CSV, Markdown and LaTeX, and build summary pivots from the long table."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from evalsuite.errors import UserError
from evalsuite.report.records import run_labels
from evalsuite.runs.store import atomic_write_bytes

FORMATS = ("csv", "md", "tex")

# LaTeX special characters and their escaped forms (model names like "fox_pro" must not break a document).
_LATEX_ESCAPES = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def write_table(
    df: pd.DataFrame,
    out_stem: Path | str,
    formats: Iterable[str] = FORMATS,
    floatfmt: str = ".2f",
) -> list[Path]:
    """Write ``df`` to ``<out_stem>.<fmt>`` for each format in ``formats`` ("csv", "md", "tex").

    CSV keeps full precision so it reads back equal; Markdown and LaTeX round floats with ``floatfmt``
    and show missing values as blanks. The index is written only when it carries information
    (anything but a default ``RangeIndex``). Returns the written paths in the order of ``formats``.
    """
    formats = list(formats)
    unknown = [fmt for fmt in formats if fmt not in FORMATS]
    if unknown:
        raise UserError(f"unknown table format(s) {unknown}; choose from {list(FORMATS)}")
    index = not isinstance(df.index, pd.RangeIndex)
    render = {"csv": _to_csv, "md": _to_markdown, "tex": _to_latex}
    # Append the suffix rather than Path.with_suffix, so stems like "ppl_v0.1" keep their dots.
    return [atomic_write_bytes(f"{out_stem}.{fmt}", render[fmt](df, index, floatfmt)) for fmt in formats]


def _to_csv(df: pd.DataFrame, index: bool, floatfmt: str) -> str:
    return df.to_csv(index=index)


def _to_markdown(df: pd.DataFrame, index: bool, floatfmt: str) -> str:
    # tabulate treats only None as missing, so turn NaN/<NA> into None first.
    shown = df.astype(object).where(df.notna(), None)
    return shown.to_markdown(index=index, floatfmt=floatfmt, missingval="") + "\n"


def _to_latex(df: pd.DataFrame, index: bool, floatfmt: str) -> str:
    """LaTeX ``tabular`` via pandas when it can (its Styler needs jinja2), else our own simple writer."""
    try:
        return df.to_latex(index=index, na_rep="", escape=True, float_format=lambda x: format(x, floatfmt))
    except ImportError:
        return simple_tabular(df, index=index, floatfmt=floatfmt)


def simple_tabular(df: pd.DataFrame, index: bool = True, floatfmt: str = ".2f") -> str:
    """A dependency-free booktabs ``tabular`` for ``df`` (single-level header and index)."""
    header = ([_latex_cell(df.index.name or "")] if index else []) + [_latex_cell(c) for c in df.columns]
    align = ("l" if index else "") + "".join("r" if pd.api.types.is_numeric_dtype(df[c]) else "l" for c in df)
    lines = [f"\\begin{{tabular}}{{{align}}}", "\\toprule", " & ".join(header) + " \\\\", "\\midrule"]
    for label, row in zip(df.index, df.itertuples(index=False), strict=True):
        cells = ([_latex_cell(label)] if index else []) + [_latex_cell(v, floatfmt) for v in row]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}", ""]
    return "\n".join(lines)


def _latex_cell(value: object, floatfmt: str = ".2f") -> str:
    if value is None or value is pd.NA or (isinstance(value, float) and value != value):
        return ""
    text = format(value, floatfmt) if isinstance(value, float) else str(value)
    return "".join(_LATEX_ESCAPES.get(ch, ch) for ch in text)


def pivot_loss(df: pd.DataFrame, lengths: Sequence[int] | None = None, metric: str = "perplexity") -> pd.DataFrame:
    """Wide table of the loss task: one row per run (labelled by model), one column per context length.

    Rows are labelled by model name, with the run directory's name added when a model has several runs
    (e.g. seeds), so that nothing is averaged silently. ``lengths`` picks and orders the columns
    (a length with no value gives a blank column); the default is every length present.
    """
    rows = df[(df["task"] == "loss") & (df["metric"] == metric) & df["length"].notna()]
    if rows.empty:
        raise UserError(f"no loss-task '{metric}' records to tabulate")
    runs = rows[["model", "run_dir"]].drop_duplicates().sort_values(["model", "run_dir"])
    keys = list(zip(runs["model"], runs["run_dir"], strict=True))
    labels = dict(zip(keys, run_labels(list(runs["model"]), list(runs["run_dir"])), strict=True))
    rows = rows.assign(label=[labels[key] for key in zip(rows["model"], rows["run_dir"], strict=True)])
    # aggfunc="last": a length recorded twice within one run keeps its latest value.
    wide = rows.pivot_table(index="label", columns="length", values="value", aggfunc="last")
    wide = wide.reindex(index=[labels[key] for key in keys])
    if lengths is not None:
        wide = wide.reindex(columns=list(lengths))
    wide.index.name = "model"
    wide.columns = [int(c) for c in wide.columns]
    wide.columns.name = "length"
    return wide
