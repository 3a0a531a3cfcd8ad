"""Fold the records of MQAR sweeps run elsewhere into a committed sweep directory.

A GPU machine runs a preset (``evalsuite mqar --preset NAME``) into its own folder, starting from a copy of the
committed ``records.jsonl``, often as several sweeps side by side (a model subset per GPU, torchrun ranks writing
``records.rank-N.jsonl``). Each source holds the committed records it started from plus its new cells; this
appends to the target's ``records.jsonl`` every source record whose cell (``config_hash``) the target does not have
yet, in the sources' order, and prints what it took. Draw the tables and plots afterwards with
``evalsuite plot mqar DIR --out DIR``. With ``--replace`` a source record also takes the place of the target's
record of the same cell (the file rewritten atomically): for cells rerun after a fix outside their config (GSA's
cells on its exact kernels, results/linear-kernels/); every record's provenance names the commit it ran on.

Usage: python scripts/merge_mqar_records.py [--replace] results/mqar/zoology-fig2 /tmp/res/mqar/zooA/zoology-fig2 [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evalsuite.runs.rundir import shard_files
from evalsuite.runs.store import append_jsonl, atomic_write_bytes, read_jsonl


def source_records(directory: Path) -> list[dict]:
    """Every record of a sweep directory: ``records.jsonl``, then the rank files of an unmerged torchrun run."""
    files = [directory / "records.jsonl", *shard_files(directory)]
    return [r for f in files if f.is_file() for r in read_jsonl(f)]


def merge(target: Path, sources: list[Path], replace: bool = False) -> list[dict]:
    """Append to ``target/records.jsonl`` the source records of cells it lacks (with ``replace``, also put each in
    place of the target's record of its cell); returns the records taken, the first of each cell in source order."""
    path = target / "records.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist (the target is a committed sweep directory)")
    existing = read_jsonl(path)
    seen = {r["config_hash"] for r in existing}
    taken: dict[str, dict] = {}
    for source in sources:
        if not source.is_dir():
            raise SystemExit(f"error: {source} is not a directory")
        for record in source_records(source):
            cell = record["config_hash"]
            if cell not in taken and (replace or cell not in seen):
                taken[cell] = record
    if replace:
        kept = [taken.get(r["config_hash"], r) for r in existing]
        added = [r for cell, r in taken.items() if cell not in seen]
        atomic_write_bytes(path, "".join(json.dumps(r, default=str) + "\n" for r in kept + added))
    else:
        for record in taken.values():
            append_jsonl(path, record)
    return list(taken.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path, help="the committed sweep directory (holds records.jsonl)")
    ap.add_argument("sources", type=Path, nargs="+", help="sweep directories run elsewhere")
    ap.add_argument("--replace", action="store_true", help="source records replace the target's of the same cell")
    args = ap.parse_args(argv)
    new = merge(args.target, args.sources, args.replace)
    for r in new:
        print(json.dumps({k: r.get(k) for k in ("model", "length", "d_model", "lr", "value", "steps")}))
    done = "taken into (replacing their cells' records)" if args.replace else "appended to"
    print(f"{len(new)} new record(s) {done} {args.target / 'records.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
