"""One small registry class behind the three extension points: model families, tasks and adapters.

A registry maps names to entries. Built-in entries register themselves when their module is imported; the
registry imports those modules lazily (``builtins``), so ``import evalsuite`` stays cheap. Modules named in
``$EVALSUITE_PLUGINS`` (comma-separated import paths) are imported too, so a user's own family, task or adapter
package plugs in with no edit to this repository::

    EVALSUITE_PLUGINS=my_lab.evalsuite_plugin evalsuite loss --model my-model

and a test (or notebook) can register an entry directly with :meth:`Registry.register`.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

from evalsuite.errors import UserError

T = TypeVar("T")
PLUGINS_ENV = "EVALSUITE_PLUGINS"
_plugins_loaded = False


def load_plugins() -> None:
    """Import every module named in ``$EVALSUITE_PLUGINS`` once per process."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for name in filter(None, (p.strip() for p in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(f"cannot import plugin {name!r} named in ${PLUGINS_ENV}: {e}") from None


class Registry(Generic[T]):
    """Named entries of one kind (``kind`` is used in error messages: "model family", "task", ...).

    ``builtins``: modules whose import registers the built-in entries (imported on first lookup).
    """

    def __init__(self, kind: str, builtins: tuple[str, ...] = ()):
        self.kind = kind
        self._builtins = builtins
        self._loaded = self._loading = False
        self._lock = threading.RLock()  # threads of one process (training/pool.py) must not see a half-loaded registry
        self._entries: dict[str, T] = {}

    def register(self, name: str, entry: T, *, replace: bool = False) -> T:
        """Add ``entry`` under ``name``; a second registration of a name is an error unless ``replace``."""
        if not replace and name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)

    def _load(self) -> None:
        if self._loaded:
            return
        with self._lock:
            if self._loaded or self._loading:  # loaded meanwhile, or a lookup from a builtin module being imported
                return
            self._loading = True
            try:
                for module in self._builtins:
                    importlib.import_module(module)
                load_plugins()
            finally:
                self._loading, self._loaded = False, True

    def get(self, name: str) -> T:
        """The entry named ``name``; UserError listing the known names otherwise."""
        self._load()
        if name not in self._entries:
            raise UserError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names()) or 'none'}")
        return self._entries[name]

    def names(self) -> list[str]:
        self._load()
        return list(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        self._load()
        return iter(list(self._entries.items()))

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._entries
