"""Fold the records of MQAR sweeps run elsewhere into a committed sweep directory.

A GPU session runs a preset with ``RESUME=<committed dir>`` into its own ``$OUT`` (``scripts/mqar_gpu.sh``), often
as several sweeps side by side (a model subset per GPU, torchrun ranks writing ``records.rank-N.jsonl``). Each
source holds the committed records it started from plus its new cells; this appends to the target's
``records.jsonl`` every source record whose cell (``config_hash``) the target does not have yet, in the sources'
order, and prints what it took. Draw the tables and plots afterwards with ``evalsuite plot mqar DIR --out DIR``.

Usage: python scripts/merge_mqar_records.py results/mqar/zoology-fig2 /tmp/res/mqar/zooA/zoology-fig2 [...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from evalsuite.rundir import shard_files
from evalsuite.store import append_jsonl, read_jsonl


def source_records(directory: Path) -> list[dict]:
    """Every record of a sweep directory: ``records.jsonl``, then the rank files of an unmerged torchrun run."""
    files = [directory / "records.jsonl", *shard_files(directory)]
    return [r for f in files if f.is_file() for r in read_jsonl(f)]


def merge(target: Path, sources: list[Path]) -> list[dict]:
    """Append to ``target/records.jsonl`` the source records of cells it lacks; returns them."""
    path = target / "records.jsonl"
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist (the target is a committed sweep directory)")
    seen = {r["config_hash"] for r in read_jsonl(path)}
    new = []
    for source in sources:
        if not source.is_dir():
            raise SystemExit(f"error: {source} is not a directory")
        for record in source_records(source):
            if record["config_hash"] not in seen:
                seen.add(record["config_hash"])
                new.append(record)
    for record in new:
        append_jsonl(path, record)
    return new


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", type=Path, help="the committed sweep directory (holds records.jsonl)")
    ap.add_argument("sources", type=Path, nargs="+", help="sweep directories of the session's runs")
    args = ap.parse_args(argv)
    new = merge(args.target, args.sources)
    for r in new:
        print(json.dumps({k: r.get(k) for k in ("model", "length", "d_model", "lr", "value", "steps")}))
    print(f"{len(new)} new record(s) appended to {args.target / 'records.jsonl'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
