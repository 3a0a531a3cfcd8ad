"""The scaling run: NIAH (standard mode) on 1 GPU and under ``torchrun`` on N GPUs; cells per minute, speedup,
efficiency against the target (0.9) and the records' equality with the single-GPU run. Optionally MQAR, one cell per
rank at a time, at 1 rank and N ranks.

    python scripts/scaling_run.py --out results/runs/scaling --gpus 1,2,4 --samples 16 --max-new-tokens 256

Runs, each a command of its own into ``DIR/runs/<name>`` (its output in ``DIR/logs/<name>.log``):

* ``niah-plain``: ``python -m evalsuite niah --mode standard ...`` in one process (the single-GPU baseline);
* ``niah-torchrun-<N>`` for every N of ``--gpus`` (N = 1 always included: the launcher's own overhead, unless
  ``--skip-niah-torchrun-1``; measured at 0.99 of the plain run in results/scaling/niah-mqar-2gpu-256-tokens/):
  ``python -m torch.distributed.run --standalone --nproc-per-node N -m evalsuite niah ...`` (that is ``torchrun``);
* with ``--mqar-preset NAME``: ``mqar-torchrun-<N>``, ``torchrun ... -m evalsuite mqar --preset NAME`` (one worker,
  one thread: each rank trains one cell at a time; the preset's accuracy check is switched off, ``--mqar-set`` sizes
  the sweep). Its baseline is the 1-rank run.

Defaults: card ``fox-pro-random`` (the FoX (Pro) 760M shapes with random weights; ``fox-pro`` itself loads the
released weights), lengths 4096,8192,16384, bfloat16 autocast on CUDA (float32 on a CPU). ``--samples N`` is the
number of needle depths per length, evenly spaced over 0..100 % (standard-mode cells are deterministic: one cell per
length and depth; default: the NIAH preset's depths, 11 on a GPU).

Each run is timed whole (wall clock of the command: start-up, model load, every cell, results.json); cells per
minute = records / minutes. speedup = throughput_N / throughput_1 and efficiency = throughput_N / (N x throughput_1),
where throughput_1 is the plain run's (MQAR: the 1-rank run's). The work is dealt in units of one generate call
(``--batch-size`` cells of one length), round-robin: efficiency can only reach 1 when every rank gets the same work,
so choose ``--samples`` as a multiple of batch size x N (each run reports its units per rank). torchrun gives each
rank ``OMP_NUM_THREADS=1`` when N > 1 and the variable is unset; export it to give every run the same.

Records compared with the baseline's: every record of ``records.jsonl`` by key, and ``results.json``'s ``config``,
``config_hash``, ``records`` and ``summary``. Fields that legitimately differ and are ignored: ``results.json``'s
``provenance`` (creation time, ``world_size``, ``execute_seconds``) and ``run_dir``; in records, the time fields
MQAR writes (``train_seconds``, ``history[].seconds``, ``provenance.created``). NIAH records have no time fields
and must be equal (exit status 1 if not); MQAR differences are reported, not fatal (training on a GPU is not
bitwise deterministic in general).

Resume (rerun the same command with the same ``--out``): a run that finished under this script (its timing in
``DIR/logs/<name>.json`` and its ``results.json`` present) is not redone and keeps its recorded time, so a scaling
run can be spread over several commands, e.g. ``--gpus 1`` then ``--gpus 1,2`` then ``--gpus 1,2,4``. A run that did
not finish is timed again into a fresh directory: what it left is deleted (a resumed run's time would cover only
part of its cells). Finished runs timed on other devices or by another command are refused.

Writes ``DIR/scaling.json`` (devices, versions, git commit, exact commands, times, cells/min, speedup, efficiency,
records equality) and ``DIR/scaling.md``. CPU smoke test (gloo): ``--device cpu --model fox-pro-tiny --lengths 256,512
--samples 2 --gpus 1,2``; there the N processes share the CPU cores, so speedup and efficiency mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from evalsuite.runs.provenance import git_commit, versions  # noqa: E402
from evalsuite.runs.store import read_jsonl  # noqa: E402

TARGET = 0.9  # the goal: throughput at N GPUs >= 0.9 x N x the single-GPU throughput
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node"]
ENV_SHOWN = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "EVALSUITE_GIT_COMMIT", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE")
CPU_NOTE = (
    "device cpu: the N processes share this machine's CPU cores, so the times test the script and the launcher, and "
    "speedup and efficiency say nothing about scaling"
)
IGNORED = {
    "results.json": ["provenance (created, world_size, ...)", "run_dir"],
    "records": ["train_seconds", "history[].seconds", "provenance.created"],
}


class Refusal(Exception):
    """Bad input or a state the script will not touch: one ``error:`` line, exit status 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, like evalsuite's own errors
        raise Refusal(message)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="Folder for the runs, logs, scaling.json and scaling.md.")
    p.add_argument("--gpus", default="1,2,4", help="Comma-separated process counts N for torchrun (1 is added).")
    p.add_argument("--model", default="fox-pro-random", help="Card name or YAML path.")
    p.add_argument("--lengths", default="4096,8192,16384", help="Comma-separated NIAH context lengths.")
    p.add_argument("--samples", type=int, default=None, help="Needle depths per length (default: the preset's).")
    p.add_argument("--max-new-tokens", type=int, default=None, help="Tokens per answer (default: the preset's).")
    p.add_argument("--batch-size", type=int, default=4, help="Cells per generate call (the unit a rank gets).")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cuda (rank r: cuda:r) or cpu (gloo).")
    p.add_argument("--dtype", default=None, help="Default: bfloat16 on cuda, float32 on cpu.")
    p.add_argument("--mqar-preset", default=None, help="Also time this tasks/mqar.yaml preset's cells (1 vs N ranks).")
    p.add_argument("--mqar-set", action="append", default=[], metavar="KEY=VALUE",
                   help="Sweep field for the MQAR runs (evalsuite mqar --set); repeatable.")  # fmt: skip
    p.add_argument("--skip-niah-torchrun-1", action="store_true",
                   help="Leave out NIAH under torchrun at 1 rank (launcher overhead; MQAR's stays).")  # fmt: skip
    a = p.parse_args(argv)
    a.gpus = sorted({1, *_positive_ints(a.gpus, "--gpus", "process counts")})
    a.lengths = _positive_ints(a.lengths, "--lengths", "token counts")
    for option in ("samples", "max_new_tokens", "batch_size"):
        value = getattr(a, option)
        if value is not None and value < 1:
            raise Refusal(f"--{option.replace('_', '-')} must be at least 1, got {value}")
    a.dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    return a


def _positive_ints(text: str, option: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise Refusal(f"{option} takes comma-separated positive integers ({what}), got {text!r}")
    return values


def depths(samples: int | None) -> list[float] | None:
    """``samples`` needle depths evenly spaced over 0..100 % (one: 50 %); None: the preset's."""
    if samples is None:
        return None
    return [50.0] if samples == 1 else [round(100 * i / (samples - 1), 2) for i in range(samples)]


def _csv(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


# -- the machine ---------------------------------------------------------------------------------------------------


def device_info(device: str) -> dict:
    """Device names (``torch.cuda.get_device_name`` per visible GPU, or ``cpu``) and CUDA's version. Asked in a
    subprocess, so this process holds no CUDA context (and no GPU memory) while the runs go."""
    if device == "cpu":
        return {"count": 0, "names": ["cpu"], "cuda": None, "processor": platform.processor() or platform.machine()}
    code = (
        "import json, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "print(json.dumps({'count': n, 'names': [torch.cuda.get_device_name(i) for i in range(n)], "
        "'cuda': torch.version.cuda}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env())
    if done.returncode != 0:
        raise RuntimeError(f"cannot query the GPUs: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _env() -> dict:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""), "PYTHONUNBUFFERED": "1"}


# -- one run: a command, timed once --------------------------------------------------------------------------------


class Run:
    """A command writing one run directory, ``DIR/runs/<name>``; its timing in ``DIR/logs/<name>.json``."""

    def __init__(self, out: Path, name: str, ranks: int | None, args: list[str]):
        self.name, self.ranks = name, ranks
        self.dir = out / "runs" / name
        self.log, self.timing_path = out / "logs" / f"{name}.log", out / "logs" / f"{name}.json"
        launcher = ["-m", "evalsuite"] if ranks is None else [*TORCHRUN, str(ranks), "-m", "evalsuite"]
        self.argv = [sys.executable, *launcher, *args, "--out", str(self.dir)]
        # what identifies the command across machines (the interpreter's path and the folder may differ)
        self.signature = [*launcher, *args]

    def timing(self, devices: list[str]) -> dict | None:
        """The recorded timing if this run finished under this script before (else None: run it)."""
        if not self.timing_path.exists() or not (self.dir / "results.json").exists():
            return None
        timing = json.loads(self.timing_path.read_text())
        if timing.get("signature") != self.signature:
            raise Refusal(f"{self.dir} was made by another command ({timing.get('command')}); choose a new --out")
        if timing.get("devices") != devices:
            theirs = timing.get("devices")
            raise Refusal(f"{self.dir} was timed on {theirs}, this machine has {devices}; choose a new --out")
        return {**timing, "reused": True}

    def execute(self, devices: list[str]) -> dict:
        """Run the command in a fresh directory (what an unfinished earlier attempt left is deleted); its timing."""
        for leftover in (self.dir, self.timing_path):
            if leftover.is_dir():
                shutil.rmtree(leftover)
            elif leftover.exists():
                leftover.unlink()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        print(f"{self.name}: running (log: {self.log})", flush=True)
        with open(self.log, "w") as log:
            start = time.perf_counter()
            rc = subprocess.run(self.argv, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=Path.cwd()).returncode
            seconds = time.perf_counter() - start
        if rc != 0:
            lines = self.log.read_text(errors="replace").splitlines()
            reason = next((ln for ln in reversed(lines) if ln.startswith("error: ")), None)
            reason = reason[len("error: ") :] if reason else f"exit status {rc}"
            failure = Refusal if rc == 2 else RuntimeError  # 2: evalsuite refused the input
            raise failure(f"{self.name} failed: {reason} (command: {shlex.join(self.argv)}; log: {self.log})")
        timing = {
            "name": self.name,
            "command": shlex.join(self.argv),
            "signature": self.signature,
            "devices": devices,
            "git_commit": git_commit(),
            "started": started,
            "wall_s": round(seconds, 3),
        }
        self.timing_path.write_text(json.dumps(timing, indent=1) + "\n")
        return {**timing, "reused": False}


def latest_records(run_dir: Path) -> dict[str, dict]:
    """The run's records by key (a later line replaces an earlier one)."""
    return {r["key"]: r for r in read_jsonl(run_dir / "records.jsonl") if "key" in r}


def _strip_times(record: dict) -> dict:
    """A record without the fields that say when or how long (``IGNORED['records']``)."""
    out = {k: v for k, v in record.items() if k != "train_seconds"}
    if isinstance(out.get("history"), list):
        out["history"] = [{k: v for k, v in h.items() if k != "seconds"} if isinstance(h, dict) else h
                          for h in out["history"]]  # fmt: skip
    if isinstance(out.get("provenance"), dict):
        out["provenance"] = {k: v for k, v in out["provenance"].items() if k != "created"}
    return out


def compare(base: Path, other: Path) -> dict:
    """Whether ``other`` holds the records of ``base`` (ignoring the fields in ``IGNORED``); the first differences."""
    diffs: list[str] = []
    ra, rb = latest_records(base), latest_records(other)
    for key in sorted(ra.keys() ^ rb.keys()):
        diffs.append(f"record {key}: only in {base.name if key in ra else other.name}")
    for key in sorted(ra.keys() & rb.keys()):
        a, b = _strip_times(ra[key]), _strip_times(rb[key])
        fields = sorted(f for f in a.keys() | b.keys() if a.get(f) != b.get(f))
        if fields:
            diffs.append(f"record {key} differs in {', '.join(fields)}")
    results = [json.loads((d / "results.json").read_text()) for d in (base, other)]
    for part in ("config", "config_hash", "records", "summary"):
        if results[0].get(part) != results[1].get(part):
            diffs.append(f"results.json: {part} differs")
    pa, pb = (r.get("provenance") or {} for r in results)
    return {
        "records_equal": not diffs,
        "differences": diffs[:20],
        "provenance_fields_differing": sorted(k for k in pa.keys() | pb.keys() if pa.get(k) != pb.get(k)),
    }


# -- the plan --------------------------------------------------------------------------------------------------------


def niah_args(a: argparse.Namespace) -> list[str]:
    args = ["niah", "--model", a.model, "--mode", "standard", "--device", a.device, "--dtype", a.dtype,
            "--lengths", _csv(a.lengths), "--batch-size", str(a.batch_size)]  # fmt: skip
    if a.samples is not None:
        args += ["--depths", _csv(depths(a.samples))]
    if a.max_new_tokens is not None:
        args += ["--max-new-tokens", str(a.max_new_tokens)]
    return args


def mqar_args(a: argparse.Namespace) -> list[str]:
    args = ["mqar", "--preset", a.mqar_preset, "--device", a.device, "--workers", "1", "--threads", "1",
            "--no-progress", "--no-report", "--set", "check_accuracy=null"]  # fmt: skip
    for setting in a.mqar_set:
        args += ["--set", setting]
    return args


def niah_units(results: dict, batch_size: int) -> list[int]:
    """The lengths of the run's work units in run order: per length kept, ``batch_size`` cells per generate call."""
    config, skipped = results["config"], {s["length"] for s in results["summary"].get("skipped", [])}
    per_length = math.ceil(len(config["depths"]) / batch_size)
    return [n for n in config["lengths"] if n not in skipped for _ in range(per_length)]


def measured(run: Run, timing: dict, ranks: int, units: list | None) -> dict:
    """A run's row: its command, time, records, cells per minute and (given the units) how they were dealt."""
    records = len(latest_records(run.dir))
    row = {
        "name": run.name,
        "kind": "plain" if run.ranks is None else "torchrun",
        "ranks": ranks,
        "command": timing["command"],
        "argv": run.argv,
        "run_dir": str(run.dir),
        "log": str(run.log),
        "started": timing["started"],
        "git_commit": timing["git_commit"],
        "reused": timing["reused"],
        "devices": timing["devices"],
        "wall_s": timing["wall_s"],
        "records": records,
        "cells_per_min": records / (timing["wall_s"] / 60) if timing["wall_s"] > 0 else None,
    }
    results = json.loads((run.dir / "results.json").read_text())
    execute_s = results["provenance"].get("execute_seconds")  # the task's own work (rank 0: until every rank ends)
    if execute_s:
        row["execute_s"], row["startup_s"] = execute_s, round(timing["wall_s"] - execute_s, 3)
    if units is not None:
        counts = [len(units[r::ranks]) for r in range(ranks)]
        row["units"] = len(units)
        row["units_per_rank"] = counts
        row["balance_bound"] = len(units) / (ranks * max(counts)) if max(counts) else None
    return row


def score(rows: list[dict], base: dict, base_dir: Path, runs: dict[str, Run]) -> None:
    """Speedup, efficiency against the target and records equality of every row, against ``base``."""
    for row in rows:
        tput, tput1 = row["cells_per_min"], base["cells_per_min"]
        row["speedup"] = tput / tput1 if tput and tput1 else None
        row["efficiency"] = row["speedup"] / row["ranks"] if row["speedup"] is not None else None
        row["meets_target"] = row["efficiency"] >= TARGET if row["efficiency"] is not None else None
        if row.get("execute_s") and base.get("execute_s"):  # the same without each process's start-up
            row["work_efficiency"] = base["execute_s"] / (row["execute_s"] * row["ranks"])
        same = {"records_equal": True, "differences": [], "provenance_fields_differing": []}
        row.update(compare(base_dir, runs[row["name"]].dir) if row is not base else same)


def run_all(runs: list[Run], names: list[str]) -> dict[str, dict]:
    """Every run's timing: recorded before, or measured now. ``names``: the devices, rank r on ``names[r]``."""
    timings = {}
    for run in runs:
        devices = names[: run.ranks or 1]  # the devices this run uses
        timing = run.timing(devices)
        if timing is not None:
            print(f"{run.name}: finished before ({timing['wall_s']:.1f} s), not redone", flush=True)
        else:
            timing = run.execute(devices)
            print(f"{run.name}: {len(latest_records(run.dir))} records in {timing['wall_s']:.1f} s", flush=True)
        timings[run.name] = timing
    return timings


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None) -> int:
    a = _args(argv)
    info = device_info(a.device)
    if a.device == "cuda" and info["count"] == 0:
        raise Refusal("--device cuda, but no CUDA GPU is visible (use --device cpu for a CPU smoke test)")
    if a.device == "cuda" and info["count"] < max(a.gpus):
        raise Refusal(f"--gpus {_csv(a.gpus)} needs {max(a.gpus)} GPUs; {info['count']} visible")
    used = info["names"][: max(a.gpus)] if a.device == "cuda" else ["cpu"]
    a.out.mkdir(parents=True, exist_ok=True)

    niah = [Run(a.out, "niah-plain", None, niah_args(a))]
    niah += [Run(a.out, f"niah-torchrun-{n}", n, niah_args(a)) for n in a.gpus if n > 1 or not a.skip_niah_torchrun_1]
    mqar = [Run(a.out, f"mqar-torchrun-{n}", n, mqar_args(a)) for n in a.gpus] if a.mqar_preset else []
    timings = run_all(niah + mqar, info["names"] if a.device == "cuda" else ["cpu"] * max(a.gpus))

    plain = json.loads((niah[0].dir / "results.json").read_text())
    units = niah_units(plain, a.batch_size)
    by_name = {r.name: r for r in niah + mqar}
    niah_rows = [measured(r, timings[r.name], r.ranks or 1, units) for r in niah]
    score(niah_rows, niah_rows[0], niah[0].dir, by_name)
    mqar_rows = [measured(r, timings[r.name], r.ranks, None) for r in mqar]
    if mqar_rows:
        score(mqar_rows, mqar_rows[0], mqar[0].dir, by_name)

    report = {
        "what": "NIAH (standard) single process vs torchrun on N ranks, and optionally MQAR at 1 vs N ranks",
        "target_efficiency": TARGET,
        "efficiency": "throughput_N / (N x throughput_1); throughput = records / minutes of the whole command",
        "device": a.device,
        "devices": info["names"],
        "devices_used": used,  # the runs' own devices are in their rows
        "cuda": info["cuda"],
        "note": CPU_NOTE if a.device == "cpu" else None,
        "versions": versions(),
        "git_commit": git_commit(),
        "host": platform.node(),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env": {k: os.environ.get(k) for k in ENV_SHOWN},
        "resume": "finished runs keep their recorded time (reused: true); unfinished ones are re-timed from scratch",
        "ignored_in_comparison": IGNORED,
        "niah": {
            "model": a.model,
            "dtype": a.dtype,
            "config": plain["config"],
            "batch_size": a.batch_size,
            "baseline": niah[0].name,
            "runs": niah_rows,
        },
        "records_equal": all(r["records_equal"] for r in niah_rows),
        "mqar": None,
    }
    if mqar_rows:
        report["mqar"] = {
            "preset": a.mqar_preset,
            "settings": a.mqar_set,
            "baseline": mqar[0].name,
            "runs": mqar_rows,
            "records_equal": all(r["records_equal"] for r in mqar_rows),
        }
    (a.out / "scaling.json").write_text(json.dumps(report, indent=1) + "\n")
    (a.out / "scaling.md").write_text(markdown(report))
    print((a.out / "scaling.md").read_text())
    print(f"wrote {a.out / 'scaling.json'} and {a.out / 'scaling.md'}")
    if not report["records_equal"]:
        print("error: NIAH records differ from the single-process run's (see scaling.json)", file=sys.stderr)
        return 1
    return 0


def markdown(report: dict) -> str:
    """``scaling.md``: what ran where, a table per task, the commands."""
    v, niah = report["versions"], report["niah"]
    lines = [
        "# Scaling run",
        "",
        f"- devices: {', '.join(report['devices_used'])}" + (f" (CUDA {report['cuda']})" if report["cuda"] else ""),
        f"- torch {v['torch']}, triton {v['triton']}, python {v['python']}; commit {report['git_commit']}",
        f"- NIAH standard, {niah['model']} ({niah['dtype']}), lengths {_csv(niah['config']['lengths'])}, "
        f"{len(niah['config']['depths'])} depths, {niah['config']['max_new_tokens']} new tokens, "
        f"{niah['batch_size']} cells per generate call (the unit a rank gets)",
        f"- efficiency = throughput_N / (N x throughput_1), target {report['target_efficiency']}; times are whole "
        "commands (start-up and model load included); start-up = wall - the task's own time (results.json's "
        "`execute_seconds`, rank 0's), work efficiency = the efficiency of those task times",
    ]
    if report["note"]:
        lines.append(f"- **{report['note']}**")
    sections = [("NIAH", niah)]
    if report["mqar"]:
        sections.append((f"MQAR {report['mqar']['preset']}", report["mqar"]))
    for title, part in sections:
        units = "units" in part["runs"][0]
        lines += ["", f"## {title} (baseline: {part['baseline']})", ""]
        lines.append("| run | ranks | wall s | start-up s | records | cells/min | speedup | efficiency | >= target | "
                     "work efficiency | records equal |" + (" units per rank |" if units else ""))  # fmt: skip
        lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|" + ("---|" if units else ""))
        for r in part["runs"]:
            numbers = (f"{r[k]:.2f}" if r[k] is not None else "-" for k in ("cells_per_min", "speedup", "efficiency"))
            target = {True: "yes", False: "no", None: "-"}[r["meets_target"]]
            startup = f"{r['startup_s']:.1f}" if "startup_s" in r else "-"
            work = f"{r['work_efficiency']:.2f}" if "work_efficiency" in r else "-"
            cells = [r["name"], str(r["ranks"]), f"{r['wall_s']:.1f}", startup, str(r["records"]), *numbers, target,
                     work, "yes" if r["records_equal"] else "no"]  # fmt: skip
            if units:
                cells.append(",".join(map(str, r["units_per_rank"])))
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Commands (`python -m torch.distributed.run` is `torchrun`):", "", "```"]
    lines += [r["command"] for _, part in sections for r in part["runs"]]
    lines += ["```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
