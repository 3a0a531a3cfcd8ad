"""Progress bars with ETA for every long loop (rich), silent when disabled."""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class _Bar:
    def __init__(self, progress: Progress | None, task_id):
        self._progress, self._task = progress, task_id

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def update(self, *, completed: int | None = None, description: str | None = None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=completed, description=description)


@contextlib.contextmanager
def progress_bar(total: int | None, description: str, enabled: bool = True, completed: int = 0):
    """``with progress_bar(n, "loss") as bar: ... bar.advance()``; drawn on stderr when it is a terminal."""
    console = Console(file=sys.stderr)
    if not enabled or not console.is_terminal:  # a log file would get only the bar's last frame, mid-error
        yield _Bar(None, None)
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
