"""A single-process run against the same run under ``torchrun --nproc-per-node 1``: same records? what overhead?

Runs ``evalsuite loss`` (a per-token loss run: model load, every window's forward pass, results.json) twice per
repeat, fresh run directories each time: plainly (``python -m evalsuite loss ...``) and through torchrun
(``python -m torch.distributed.run --standalone --nproc-per-node 1 -m evalsuite loss ...``, which takes the
distributed path: process group, rank file, merge). It compares the two runs' records (``results.json``) and
per-token curves (``loss_per_token.npz``) and writes the wall times of the whole commands to
``DIR/torchrun_overhead.json``:

    python scripts/torchrun_overhead.py --out results/runs/torchrun-overhead/<device> --model fox-pro --length 16384

Exit status 1 when the records differ. CPU smoke test: ``--model fox-pro-tiny --device cpu --length 256``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Folder for the runs and torchrun_overhead.json.")
    p.add_argument("--model", default="fox-pro-tiny", help="Card name or YAML path.")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda (torchrun's rank uses cuda:LOCAL_RANK).")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--data", default="synthetic", help="The loss task's --data.")
    p.add_argument("--length", type=int, default=2048, help="Window length in tokens.")
    p.add_argument("--max-docs", type=int, default=8, help="Windows scored per run.")
    p.add_argument("--batch-size", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1, help="Runs of each kind (medians are reported).")
    return p.parse_args(argv)


def _command(a: argparse.Namespace, out: Path) -> list[str]:
    return ["-m", "evalsuite", "loss", "--model", a.model, "--device", a.device, "--dtype", a.dtype, "--data",
            a.data, "--length", str(a.length), "--max-docs", str(a.max_docs), "--batch-size", str(a.batch_size),
            "--out", str(out)]  # fmt: skip


def _timed(cmd: list[str]) -> float:
    """Wall seconds of ``cmd``; its output is shown only if it fails."""
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return seconds


def _compare(a: Path, b: Path) -> dict:
    """Whether the two run directories hold the same records and curves (bit for bit), and the curves' max gap."""
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    ca, cb = (np.load(d / "loss_per_token.npz") for d in (a, b))
    gap = float(np.max(np.abs(ca["loss_per_token"] - cb["loss_per_token"])))
    return {
        "records_identical": ra["records"] == rb["records"] and ra["summary"] == rb["summary"],
        "curve_identical": bool(np.array_equal(ca["loss_per_token"], cb["loss_per_token"]))
        and bool(np.array_equal(ca["count"], cb["count"])),
        "curve_max_abs_diff": gap,
        "config_hash_identical": ra["config_hash"] == rb["config_hash"],
        "device": ra["provenance"].get("device"),
        "torchrun_world_size": rb["provenance"].get("world_size"),
    }


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    # rank files and results land in fresh directories: a finished loss run would be returned as it is
    plain, launched, checks = [], [], []
    for i in range(a.repeats):
        p, t = a.out / f"plain-{i}", a.out / f"torchrun-{i}"
        for d in (p, t):
            if d.exists():
                sys.exit(f"error: {d} exists; choose an empty --out")
        plain.append(_timed([sys.executable, *_command(a, p)]))
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1"]
        launched.append(_timed([*torchrun, *_command(a, t)]))
        checks.append(_compare(p, t))
    result = {
        "what": "evalsuite loss, plain vs torchrun --nproc-per-node 1 (wall seconds of the whole command)",
        "model": a.model,
        "device": checks[0]["device"],
        "host": platform.node(),
        "config": {k: getattr(a, k) for k in ("data", "length", "max_docs", "batch_size", "dtype", "device")},
        "plain_s": plain,
        "torchrun_s": launched,
        "plain_median_s": statistics.median(plain),
        "torchrun_median_s": statistics.median(launched),
        "overhead_s": statistics.median(launched) - statistics.median(plain),
        "overhead_pct": 100 * (statistics.median(launched) / statistics.median(plain) - 1),
        "records_identical": all(c["records_identical"] for c in checks),
        "curve_identical": all(c["curve_identical"] for c in checks),
        "curve_max_abs_diff": max(c["curve_max_abs_diff"] for c in checks),
        "torchrun_world_size": checks[0]["torchrun_world_size"],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    path = a.out / "torchrun_overhead.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("plain_median_s", "torchrun_median_s", "overhead_s",
                                             "records_identical", "curve_identical")}))  # fmt: skip
    print(f"wrote {path}")
    return 0 if result["records_identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
