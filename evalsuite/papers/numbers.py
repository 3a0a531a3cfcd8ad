"""Printed numbers: read a table cell as the paper prints it, and print ours in the same format.

Cells are strings exactly as printed ("63.5", "18.10", "759M", "2.72×10⁹", "1×10⁻³", "27k", "✓", "-"); a number is
parsed only to compute (ranks, differences), the string is what is shown. A column's format is inferred from its
printed cells: decimals, a magnitude suffix (k, M, B), a power of ten, and whether the paper drops trailing zeros
(the FoX paper's LongBench cells are Python's ``round(x, 2)``, so "63.5" beside "13.38").
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

SUFFIXES = {"": 1.0, "%": 1.0, "×": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
# A column's unit that counts in thousands, millions, billions, or bytes in GiB or GB (our memory is in bytes).
MAGNITUDES = {"K": 1e3, "M": 1e6, "B": 1e9, "GiB": 2.0**30, "GB": 1e9}
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
_TO_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")
_NUMBER = re.compile(
    r"^(?P<sign>[+\-−]?)(?P<mantissa>\d+(?:\.\d+)?)"
    r"(?:\s*[×x]\s*10\s*\^?\s*\{?(?P<exp>[⁻\-−]?[⁰¹²³⁴⁵⁶⁷⁸⁹\d]+)\}?|[eE](?P<e>[+\-]?\d+))?"
    r"\s*(?P<suffix>[kKMBGT%×]?)$"
)


@dataclass(frozen=True)
class Printed:
    """A printed number taken apart: ``mantissa`` as printed, its power of ten (``exponent``), ``suffix``."""

    value: float
    mantissa: str
    exponent: int | None
    suffix: str


def parse_printed(text: str | None) -> Printed | None:
    """The parts of a printed number; None for a cell that is not one ("✓", "-", "N/A", "64×Ld", empty)."""
    if text is None:
        return None
    match = _NUMBER.match(text.strip())
    if match is None:
        return None
    sign = -1.0 if match["sign"] in ("-", "−") else 1.0
    raw_exp = match["exp"] or match["e"]
    exponent = int(raw_exp.translate(_SUPERSCRIPT).replace("−", "-")) if raw_exp else None
    value = sign * float(match["mantissa"]) * SUFFIXES[match["suffix"]] * 10.0 ** (exponent or 0)
    return Printed(value, match["mantissa"], exponent, match["suffix"])


def parse_number(text: str | None) -> float | None:
    """The value of a printed cell ("63.5" -> 63.5, "759M" -> 7.59e8, "2.72×10⁹" -> 2.72e9); None if not a number."""
    printed = parse_printed(text)
    return None if printed is None else printed.value


def _decimals(mantissa: str) -> int:
    return len(mantissa.partition(".")[2])


@dataclass(frozen=True)
class NumberFormat:
    """How a column prints numbers: ``decimals`` after the point of the mantissa, ``trim`` (Python's
    ``str(round(x, decimals))``: trailing zeros dropped, one kept), ``suffix`` (k, M, B, %), ``exponent`` (the
    power of ten printed as ``×10ⁿ``)."""

    decimals: int = 2
    trim: bool = False
    suffix: str = ""
    exponent: int | None = None

    def format(self, value: float, extra: int = 0, signed: bool = False) -> str:
        """``value`` in this format, with ``extra`` more decimals (our exact counts beside the paper's rounded
        ones); ``signed``: a leading + for positive values (differences)."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return ""
        scale = SUFFIXES[self.suffix] * 10.0 ** (self.exponent or 0)
        mantissa = value / scale
        decimals = self.decimals + extra
        text = str(round(mantissa, decimals)) if self.trim and decimals else f"{mantissa:.{decimals}f}"
        if text.startswith("-") and float(text) == 0:
            text = text[1:]
        if signed and not text.startswith("-") and float(text) != 0:
            text = "+" + text
        if self.exponent is not None:
            return f"{text}×10{str(self.exponent).translate(_TO_SUPERSCRIPT)}"
        return text + self.suffix


def infer_format(printed: Iterable[str | None], default_decimals: int = 2) -> NumberFormat:
    """The format of a column from its printed cells (the most common suffix and power of ten, the most decimals);
    ``default_decimals`` when no cell is a number."""
    parts = [p for p in map(parse_printed, printed) if p is not None]
    if not parts:
        return NumberFormat(decimals=default_decimals)
    (suffix, exponent), _ = Counter((p.suffix, p.exponent) for p in parts).most_common(1)[0]
    same = [p for p in parts if (p.suffix, p.exponent) == (suffix, exponent)]
    decimals = max(_decimals(p.mantissa) for p in same)
    # round(x, 2) prints "63.5" and "55.0": fewer decimals than the column's most, but never none
    trim = decimals > 1 and any(0 < _decimals(p.mantissa) < decimals for p in same)
    return NumberFormat(decimals=decimals, trim=trim, suffix=suffix, exponent=exponent)
