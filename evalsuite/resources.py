"""Built-in resources: the model cards (``models/``) and task specs (``tasks/``) that ship with evalsuite.

In a wheel they live inside the package (``evalsuite/_data/<kind>``, see pyproject.toml); in an editable
install at the repository root.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import yaml

from evalsuite.errors import UserError


def builtin_dir(kind: str) -> Path:
    """``models`` or ``tasks``: inside the installed package (wheel) or at the repo root (editable)."""
    packaged = resources.files("evalsuite") / "_data" / kind
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / kind


def read_yaml(path: Path, what: str) -> dict:
    """A YAML mapping from ``path``; one clear UserError line for a missing, malformed or non-mapping file."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UserError(f"cannot read {what} {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {path} is not UTF-8 text (byte {e.start}); is it a YAML file?") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(e, "problem", None) or "invalid YAML"
        raise UserError(f"{what} {path} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} is not a YAML mapping")
    return data


def task_presets(task: str) -> dict:
    """The ``presets`` mapping of ``tasks/<task>.yaml``."""
    path = builtin_dir("tasks") / f"{task}.yaml"
    presets = read_yaml(path, f"{task} task spec").get("presets")
    if not isinstance(presets, dict):
        raise UserError(f"{path} has no 'presets' mapping")
    return presets
