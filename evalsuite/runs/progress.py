"""Progress bars with ETA for every long loop (rich) on a terminal; a line every LOG_EVERY_S seconds in a log file
(a background GPU run's log shows how far it got); silent when disabled."""

from __future__ import annotations

import contextlib
import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LOG_EVERY_S = 60.0


class _Bar:
    def __init__(self, progress: Progress | None, task_id):
        self._progress, self._task = progress, task_id

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(self, *, completed: int | None = None, description: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, description=description)


class _LogLines(_Bar):
    """The bar's API, printing ``description: done/total (pct), elapsed, eta`` at most every ``every`` seconds."""

    def __init__(self, total: int | None, description: str, completed: int, every: float):
        super().__init__(None, None)
        self.total, self.description, self.done, self.every = total, description, completed, every
        self.start_done = completed
        self.t0 = self.last = time.monotonic()

    def advance(self, n: int = 1) -> None:
        self.update(completed=self.done + n)

    def update(self, *, completed: int | None = None, description: str | None = None) -> None:
        self.done = self.done if completed is None else completed
        self.description = description or self.description
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            print(self.line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        elapsed = now - self.t0
        text = f"{self.description}: {self.done}"
        if self.total:
            text += f"/{self.total} ({100 * self.done / self.total:.0f}%)"
        text += f", elapsed {elapsed:.0f} s"
        rate = (self.done - self.start_done) / elapsed if elapsed > 0 else 0
        if self.total and rate > 0:
            text += f", eta {(self.total - self.done) / rate:.0f} s"
        return text


@contextlib.contextmanager
def progress_bar(
    total: int | None, description: str, enabled: bool = True, completed: int = 0, log_every_s: float = LOG_EVERY_S
):
    """``with progress_bar(n, "loss") as bar: ... bar.advance()``; drawn on stderr when it is a terminal, else a
    line every ``log_every_s`` seconds (a redrawn bar would leave a log only its last frame)."""
    console = Console(file=sys.stderr)
    if not enabled:
        yield _Bar(None, None)
        return
    if not console.is_terminal:
        yield _LogLines(total, description, completed, log_every_s)
        return
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("elapsed"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    ]
    with Progress(*columns, console=console) as progress:
        yield _Bar(progress, progress.add_task(description, total=total, completed=completed))
