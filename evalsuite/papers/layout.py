"""A table in a paper's layout, written as Markdown, LaTeX (booktabs) or CSV.

A :class:`Grid` is what every writer takes: the row-label header, each column's label, group and direction (↑
higher is better, ↓ lower), and body rows of printed cells, each possibly marked best or second best. Marks follow
each column's direction over the rows shown (:func:`marks`), as the papers mark them: bold for the best, underline
for the second (``best_second``), or bold only (``bold_best``). Markdown underlines with ``<u>``, LaTeX with
``\\underline``; check marks become ``\\checkmark``, printed powers of ten math, and a ``$TeX$`` formula (in a
caption, or a cell such as a FLOPs formula: docs/paper-tables.md) stays TeX. A cell of several lines keeps them
(Markdown ``<br>``, LaTeX ``\\shortstack``).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

ARROWS = {"higher": "↑", "lower": "↓"}
_LATEX_ESCAPES = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}  # fmt: skip
_LATEX_SYMBOLS = {"✓": r"\checkmark{}", "↑": r"$\uparrow$", "↓": r"$\downarrow$", "−": "$-$", "≠": r"$\neq$",
                  "×": r"$\times$"}  # fmt: skip
_POWER = re.compile(r"×10([⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)")
_MATH = re.compile(r"(\$[^$]+\$)")
_FROM_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


@dataclass(frozen=True)
class Cell:
    text: str
    mark: str | None = None  # "best" | "second"


@dataclass(frozen=True)
class Line:
    """A body row: its label, cells (one per column), the row group it sits under and, in ``paper render``, where it
    comes from (``paper``, ``ours``, ``ours − paper``: a CSV column)."""

    label: str
    cells: tuple[Cell, ...]
    group: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Grid:
    """``labels``: the columns as printed; ``groups``: the spanning header over each (None: none); ``better``: each
    column's direction (adds the arrow unless the printed label has one)."""

    row_header: str
    labels: tuple[str, ...]
    groups: tuple[str | None, ...]
    better: tuple[str | None, ...]
    lines: tuple[Line, ...]

    def headers(self) -> list[str]:
        return [lab if lab.endswith(("↑", "↓")) or b not in ARROWS else f"{lab} {ARROWS[b]}"
                for lab, b in zip(self.labels, self.better, strict=True)]  # fmt: skip

    def spans(self) -> list[tuple[str | None, int]]:
        """Consecutive columns under one group: ``[(group, width), ...]``."""
        out: list[tuple[str | None, int]] = []
        for group in self.groups:
            if out and out[-1][0] == group and group is not None:
                out[-1] = (group, out[-1][1] + 1)
            else:
                out.append((group, 1))
        return out


def marks(values: list[float | None], better: str | None, style: str) -> list[str | None]:
    """Per value: ``best``, ``second`` or None, by ``better`` (ties share a mark; ``style`` best_second, bold_best or
    none)."""
    ranked = sorted({v for v in values if v is not None}, reverse=better == "higher")
    if style == "none" or better not in ARROWS or not ranked:
        return [None] * len(values)
    tiers = {ranked[0]: "best"}
    if style == "best_second" and len(ranked) > 1:
        tiers[ranked[1]] = "second"
    return [tiers.get(v) if v is not None else None for v in values]


def to_markdown(grid: Grid) -> str:
    """A GitHub Markdown table; column groups in a line above it (Markdown has one header row), row groups as
    bold rows."""

    def show(cell: Cell) -> str:
        text = cell.text.replace("|", "\\|").replace("\n", "<br>")
        return {"best": f"**{text}**", "second": f"<u>{text}</u>"}.get(cell.mark, text) if text else ""

    out = []
    if any(grid.groups):
        spans, start = [], 0
        for group, width in grid.spans():
            if group is not None:
                first, last = grid.labels[start], grid.labels[start + width - 1]
                spans.append(f"{group} ({first}" + (f" – {last})" if width > 1 else ")"))
            start += width
        out.append("Column groups: " + "; ".join(spans) + "\n")
    out.append("| " + " | ".join([grid.row_header, *grid.headers()]) + " |")
    out.append("|" + "|".join([":---", *(["---:"] * len(grid.labels))]) + "|")
    group = None
    for line in grid.lines:
        if line.group != group and line.group is not None:
            out.append(f"| **{line.group}** |" + " |" * len(grid.labels))
        group = line.group
        out.append("| " + " | ".join([line.label.replace("|", "\\|"), *map(show, line.cells)]) + " |")
    return "\n".join(out) + "\n"


def latex_escape(text: str) -> str:
    """Text as LaTeX: special characters escaped, ``×10⁹`` as ``$\\times 10^{9}$``, ✓ as ``\\checkmark``, a ``$TeX$``
    formula as it is, the lines of a multi-line text stacked."""
    if "\n" in text:
        return r"\shortstack[l]{" + r" \\ ".join(map(latex_escape, text.split("\n"))) + "}"
    out = []
    for k, piece in enumerate(_MATH.split(text)):  # odd pieces: the formulas
        if k % 2:
            out.append(piece)
            continue
        for i, part in enumerate(_POWER.split(piece)):  # odd parts: the exponents
            if i % 2:
                out.append(rf"$\times 10^{{{part.translate(_FROM_SUPERSCRIPT)}}}$")
            else:
                out.append("".join(_LATEX_SYMBOLS.get(ch, _LATEX_ESCAPES.get(ch, ch)) for ch in part))
    return "".join(out)


def to_latex(grid: Grid, caption: str | None = None, label: str | None = None) -> str:
    """A booktabs ``table``: ``\\multicolumn`` group headers with ``\\cmidrule``, arrows, ``\\textbf`` best,
    ``\\underline`` second best, row groups as italic spanning rows."""

    def show(cell: Cell) -> str:
        text = latex_escape(cell.text)
        return {"best": rf"\textbf{{{text}}}", "second": rf"\underline{{{text}}}"}.get(cell.mark, text) if text else ""

    n = len(grid.labels)
    lines = [r"\begin{table}[t]", r"\centering"]
    if caption:
        lines.append(rf"\caption{{{latex_escape(caption)}}}" + (rf"\label{{{label}}}" if label else ""))
    lines += [rf"\begin{{tabular}}{{l{'r' * n}}}", r"\toprule"]
    if any(grid.groups):
        heads, rules, start = [""], [], 2
        for group, width in grid.spans():
            heads.append(rf"\multicolumn{{{width}}}{{c}}{{{latex_escape(group)}}}" if group else "")
            if group:
                rules.append(rf"\cmidrule(lr){{{start}-{start + width - 1}}}")
            start += width
        lines += [" & ".join(heads) + r" \\", " ".join(rules)]
    lines += [" & ".join(latex_escape(h) for h in [grid.row_header, *grid.headers()]) + r" \\", r"\midrule"]
    group = None
    for line in grid.lines:
        if line.group != group and line.group is not None:
            lines.append(rf"\multicolumn{{{n + 1}}}{{l}}{{\textit{{{latex_escape(line.group)}}}}} \\")
        group = line.group
        lines.append(" & ".join([latex_escape(line.label), *map(show, line.cells)]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def to_csv(grid: Grid) -> str:
    """CSV of the cells as printed: a header row of column groups when there are any, then the labels as printed
    (no arrows added, no marks); a ``source`` column when rows name one, a ``group`` column when rows have groups."""
    sources = any(line.source for line in grid.lines)
    row_groups = any(line.group for line in grid.lines)
    first = [*(["source"] if sources else []), *(["group"] if row_groups else [])]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    if any(grid.groups):
        writer.writerow([""] * (len(first) + 1) + [g or "" for g in grid.groups])
    writer.writerow([*first, grid.row_header, *grid.labels])
    for line in grid.lines:
        lead = [*([line.source or ""] if sources else []), *([line.group or ""] if row_groups else [])]
        writer.writerow([*lead, line.label, *(c.text for c in line.cells)])
    return buffer.getvalue()
