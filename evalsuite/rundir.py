"""The run directory: one evaluation's files, and the promises it keeps.

A run directory holds ``config.json`` (the manifest: task, config hash, config), ``records.jsonl`` (one line per
finished item, appended as items finish, keyed by ``record["key"]``), ``results.json`` (the aggregate, written
atomically at the end) and any files a task keeps beside them (e.g. the loss task's ``state.npz``).

* **Claiming.** A directory belongs to one configuration: a run with another config hash is refused with one line.
  Directories written before manifests existed, or under an older config schema a task still recognises
  (``legacy_hashes``), are migrated: the manifest is (re)written and a note printed.
* **Resume.** :meth:`RunDir.latest` gives the records by key, a later line replacing an earlier one (a re-judged
  answer); a rerun skips what is there. Appends repair a torn tail first (:func:`evalsuite.store.append_jsonl`).
* **No litter.** A run that fails before writing anything removes the directory it created
  (:meth:`RunDir.abandon`), so a failed validation never leaves a claimed directory behind.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.store import RECORDS_FILE, RESULTS_FILE, append_jsonl, atomic_write_json, read_json_file, read_jsonl

MANIFEST_FILE = "config.json"


def check_writable(path: Path) -> None:
    """UserError unless ``path`` (a directory, existing or not) can be created and written to."""
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"cannot write to {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to {path}: {probe} is not writable")


class RunDir:
    """One run's directory; create it with :meth:`claim`."""

    def __init__(self, path: Path, task: str, config_hash: str, created: bool):
        self.path, self.task, self.config_hash, self._created = Path(path), task, config_hash, created

    @classmethod
    def claim(
        cls, path: Path | str, task: str, config_hash: str, config: dict, legacy_hashes: tuple[str, ...] = ()
    ) -> RunDir:
        """Take ``path`` for a run of ``task`` with ``config_hash`` (see the module docstring)."""
        path = Path(path)
        check_writable(path)
        manifest = path / MANIFEST_FILE
        body = {"task": task, "config_hash": config_hash, "config": config}
        if manifest.exists():
            old = read_json_file(manifest, "run manifest")
            # the hash covers the task name, so an old hash accepted here is a run of this task's records
            if old.get("config_hash") not in (config_hash, *legacy_hashes):
                raise UserError(
                    f"{path} holds a {old.get('task', 'different')} run with another configuration; "
                    "choose another --out"
                )
            if old.get("config_hash") != config_hash:
                atomic_write_json(manifest, body)
                _note(f"migrated {path} to the current config schema (same records, new config hash)")
            return cls(path, task, config_hash, created=False)
        if path.exists() and any((path / name).exists() for name in (RESULTS_FILE, RECORDS_FILE)):
            cls._check_legacy(path, task, (config_hash, *legacy_hashes))
            atomic_write_json(manifest, body)
            _note(f"migrated {path}: wrote its run manifest ({MANIFEST_FILE})")
            return cls(path, task, config_hash, created=False)
        created = not path.exists()
        atomic_write_json(manifest, body)
        return cls(path, task, config_hash, created=created)

    @staticmethod
    def _check_legacy(path: Path, task: str, accepted: tuple[str, ...]) -> None:
        """A directory from before manifests: its files must be this task's, and of this config when they say."""
        results = path / RESULTS_FILE
        if results.exists():
            old = read_json_file(results, "results file")
            old_hash = old.get("config_hash")
            if old_hash not in (None, *accepted) or (old_hash is None and old.get("task") != task):
                raise UserError(f"{path} holds a finished run with another configuration; choose another --out")
        rows = read_jsonl(path / RECORDS_FILE)
        if any(r.get("task") not in (None, task) for r in rows[:1]):
            raise UserError(f"{path} holds records of another task; choose another --out")

    # -- records -----------------------------------------------------------------------------------------------

    @property
    def records_path(self) -> Path:
        return self.path / RECORDS_FILE

    def records(self) -> list[dict]:
        return read_jsonl(self.records_path)

    def latest(self) -> dict[str, dict]:
        """Records by ``key``; a later line for a key replaces the earlier one."""
        return {r["key"]: r for r in self.records() if "key" in r}

    def append(self, record: dict) -> None:
        append_jsonl(self.records_path, record)

    # -- results -----------------------------------------------------------------------------------------------

    def load_results(self) -> dict | None:
        """The finished results of this configuration, or None."""
        path = self.path / RESULTS_FILE
        if not path.exists():
            return None
        results = read_json_file(path, "results file")
        return results if results.get("config_hash") == self.config_hash else None

    def save_results(self, results: dict) -> None:
        atomic_write_json(self.path / RESULTS_FILE, results)

    def abandon(self) -> None:
        """Remove the directory if this claim created it and nothing but the manifest was written."""
        if self._created and self.path.is_dir() and {p.name for p in self.path.iterdir()} <= {MANIFEST_FILE}:
            shutil.rmtree(self.path, ignore_errors=True)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)
