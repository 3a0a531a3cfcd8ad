"""User-facing errors: one clear line, a non-zero exit, no traceback unless --debug."""

from __future__ import annotations

import importlib
import signal
from types import ModuleType


class UserError(Exception):
    """Something the user can fix (bad input, missing file, unknown name).

    The CLI prints ``error: <message>`` and exits with status 2; library callers can catch it.
    """


class Interrupted(BaseException):
    """SIGINT (Ctrl-C) or SIGTERM (what schedulers send first), as the ``evalsuite`` command's handlers raise it.

    ``signum``: the signal; ``note``: what the run directory being written kept, added by the run directory as the
    exception passes it (None: no run was being written, or nothing is known). The CLI prints ``interrupted by
    SIGTERM: <note>`` and exits with :attr:`status` (128 + signum, as a shell reports death by the signal).

    A BaseException but not a KeyboardInterrupt: click and typer turn a KeyboardInterrupt into a bare status 130,
    which would lose the signal and the note; like KeyboardInterrupt it passes every ``except Exception``.
    """

    def __init__(self, signum: int, note: str | None = None):
        super().__init__(signum, note)
        self.signum, self.note = signum, note

    @property
    def status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        name = signal.Signals(self.signum).name
        return f"interrupted by {name}: {self.note}" if self.note else f"interrupted by {name}"


def require(module: str, extra: str, user: str) -> ModuleType:
    """``importlib.import_module(module)``, or a UserError naming the extra that installs it.

    ``extra`` is one of the ``[project.optional-dependencies]`` of pyproject.toml and ``user`` what needs it
    (``"evalsuite serve"``). Only a missing ``module`` (its top-level package included) is turned into the
    error; a module it imports that is missing propagates, since that is a broken install, not a missing extra.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing != module and not module.startswith(missing + "."):
            raise
        raise missing_extra(extra, user) from None


def missing_extra(extra: str, user: str) -> UserError:
    """The one line that says ``user`` needs ``extra`` and how to install it."""
    return UserError(f"{user} needs the {extra!r} extra: pip install 'evalsuite[{extra}]'")
