"""The NIAH grid: the run's configuration and its presets (``tasks/niah.yaml``), the cells (length x depth x
sample) and how they are batched."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from evalsuite.data.haystack import SYNTHETIC
from evalsuite.errors import UserError
from evalsuite.resources import task_presets
from evalsuite.tasks.base import Item
from evalsuite.tasks.niah.prompts import check_depth

MODES = ("easy", "standard", "2hop")
AUTO = "auto"  # batch_size: prompts per call from free memory


@dataclass
class NiahConfig:
    """One NIAH run. ``None`` fields come from the preset (tasks/niah.yaml)."""

    mode: str = "easy"  # easy | standard | 2hop (text; the DRT passkey is evalsuite.tasks.drt_passkey)
    preset: str | None = None  # cpu | fox; None: cpu on a CPU device, fox otherwise
    lengths: list[int] | None = None
    depths: list[float] | None = None
    samples: int | None = None  # per cell (2hop)
    haystack: str = SYNTHETIC
    max_new_tokens: int | None = None
    stop_newline: bool = False
    batch_size: int | str = 4  # prompts per generate call; "auto": as many as fit in free memory
    judge: str | None = None  # openai:MODEL
    seed: int = 0

    def __post_init__(self):
        if self.mode not in MODES:
            raise UserError(f"unknown NIAH mode {self.mode!r}; use {', '.join(MODES)}")
        if self.lengths and min(int(x) for x in self.lengths) < 1:
            raise UserError("NIAH lengths must be positive token counts")
        for d in self.depths or []:
            check_depth(_as_number(d))
        if any(n is not None and n < 1 for n in (self.samples, self.max_new_tokens)):
            raise UserError("--samples and --max-new-tokens must be at least 1")
        if self.batch_size != AUTO and not (isinstance(self.batch_size, int) and self.batch_size >= 1):
            raise UserError(f"--batch-size must be a positive integer or {AUTO!r}; got {self.batch_size!r}")
        if self.mode != "2hop" and self.samples not in (None, 1):
            raise UserError("--samples applies to --mode 2hop only (easy/standard cells are deterministic)")

    @property
    def label(self) -> str:
        """``easy``, ``standard`` or ``2hop``: the run's name part and the records' subtask root."""
        return self.mode


def load_presets() -> dict:
    """The grid presets of ``tasks/niah.yaml``."""
    return task_presets("niah")


def preset_for(name: str | None, device_type: str) -> tuple[str, dict]:
    """(name, preset): the named one, or ``cpu`` on a CPU device and ``fox`` otherwise."""
    presets = load_presets()
    name = name or ("cpu" if device_type == "cpu" else "fox")
    if name not in presets:
        raise UserError(f"unknown NIAH preset {name!r}; known: {', '.join(presets)}")
    return name, presets[name]


def resolve_config(config: NiahConfig, device_type: str = "cpu") -> NiahConfig:
    """``config`` with its open fields filled from the preset (validated again as it is built); what gets hashed."""
    name, preset = preset_for(config.preset, device_type)
    return replace(
        config,
        preset=name,
        lengths=sorted({int(x) for x in (config.lengths or preset["lengths"])}),
        depths=sorted({_as_number(x) for x in (config.depths or preset["depths"])}),
        samples=config.samples if config.samples is not None else int(preset.get("samples", 1)),
        max_new_tokens=config.max_new_tokens if config.max_new_tokens is not None else int(preset["max_new_tokens"]),
        judge=None,
    )


def _as_number(x) -> float | int:
    x = float(x)
    return int(x) if x.is_integer() else x


@dataclass(frozen=True)
class Cell:
    """One grid point. ``depth`` is None for the DRT test (random needle positions)."""

    length: int
    depth: float | None
    sample: int = 0

    def key(self, subtask: str) -> str:
        depth = "-" if self.depth is None else f"{self.depth:g}"
        return f"{subtask}|{self.length}|{depth}|{self.sample}"


def grid_cells(config: NiahConfig) -> list[Cell]:
    """Cells in run order: by length, then depth, then sample (similar lengths share a batch)."""
    depths = config.depths or [None]
    return [Cell(L, d, s) for L in config.lengths for d in depths for s in range(config.samples)]


def subtasks(config: NiahConfig) -> tuple[str, ...]:
    """The record subtasks a cell produces."""
    return ("2hop", "1hop") if config.mode == "2hop" else (config.mode,)


def cells_by_length(cells: Sequence[Cell], size: int | Callable[[int], int]) -> Iterator[list[Cell]]:
    """Up to ``size`` cells of one length at a time (``size(length)`` when callable): prompts of one length need
    (almost) no padding."""
    by_length: dict[int, list[Cell]] = {}
    for cell in cells:
        by_length.setdefault(cell.length, []).append(cell)
    for length, group in by_length.items():
        n = size(length) if callable(size) else size
        for i in range(0, len(group), n):
            yield group[i : i + n]


def items_by_length(items: Sequence[Item], size: int | Callable[[int], int]) -> list[list[Item]]:
    """:func:`cells_by_length` over items whose data are cells (the units a rank gets under torchrun)."""
    by_cell = {it.data: it for it in items}
    return [[by_cell[c] for c in group] for group in cells_by_length([it.data for it in items], size)]


def split_by_max_length(cells: list[Cell], max_length: int | None, model: str) -> tuple[list[Cell], list[dict]]:
    """(cells the model can take, notes on the lengths skipped beyond its max_length); none left is an error."""
    skipped = sorted({c.length for c in cells if max_length is not None and c.length > max_length})
    kept = [c for c in cells if c.length not in skipped]
    if not kept:
        raise UserError(f"every length of the grid exceeds model {model}'s max_length {max_length}")
    return kept, [{"length": L, "reason": f"beyond model {model}'s max_length {max_length}"} for L in skipped]
