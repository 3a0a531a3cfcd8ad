"""User-facing errors: one clear line, a non-zero exit, no traceback unless --debug."""

from __future__ import annotations

import importlib
from types import ModuleType


class UserError(Exception):
    """Something the user can fix (bad input, missing file, unknown name).

    The CLI prints ``error: <message>`` and exits with status 2; library callers can catch it.
    """


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
