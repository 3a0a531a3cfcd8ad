"""Multi-query associative recall (MQAR): Zoology's ``multiquery_ar`` data, trained per cell, swept.

**Data** (:func:`multiquery_ar`, identical in distribution to Zoology's generator). Each example of
``seq_len`` tokens starts with the key-value block ``k1 v1 k2 v2 ... k_n v_n`` (repeated ``num_passes``
times), keys drawn without replacement from ``[1, V/2)`` and values from ``[V/2, V)``. Every key is then
queried once in the rest of the sequence: query ``i`` sits at offset ``2 * gap_i`` of the query region,
the gaps drawn without replacement from ``range(space)``, ``space = (seq_len - context) / 2``, with
probability ``∝ a * x^(a-1)`` at ``x = gap + 1`` (``a = power_a = 0.01`` puts most queries early), in the
order of successive sampling (the first key gets the first draw). Other query-region tokens are 0, or
uniform in ``[0, V)`` with ``random_non_queries``. Labels are -100 except at each query key's position,
whose label is that key's value: the model must emit the value right after reading the key.

Randomness comes only from the ``numpy.random.Generator`` passed in (no global RNG), so a seed gives the
same arrays on any machine. Weighted sampling without replacement uses the exponential race (sort by
``Exp(1) / w``), which has exactly the law of successive sampling, the law of ``numpy``'s weighted
``choice(replace=False)`` that Zoology calls.

**Sweep** (:func:`run_mqar`): models x d_model x (seq_len, kv pairs) x learning rate; each cell trains a
fresh model with :func:`evalsuite.train.train` and appends one record (query accuracy on the test set) to
``records.jsonl``. Cells are keyed by a hash of their config, so a rerun skips finished cells: an
interrupted sweep loses at most the cells in flight, and new models add rows to an existing run directory.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing as mp
import queue
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import yaml

from evalsuite.cards import ARCHITECTURES, ModelCard, builtin_dir, load_card
from evalsuite.errors import UserError
from evalsuite.progress import progress_bar
from evalsuite.provenance import device_name, provenance
from evalsuite.store import RECORDS_FILE, RESULTS_FILE, append_jsonl, atomic_write_json, config_hash, read_jsonl
from evalsuite.train import (
    IGNORE_INDEX,
    TrainConfig,
    autocast_dtype,
    build_model,
    fixed_batches,
    masked_accuracy,
    shuffled_batches,
    train,
)

_CHUNK = 1024  # examples generated per vectorised step; fixed, because the data depends on it

# ------------------------------------------------------------------------------------------ generator


def check_setting(seq_len: int, num_kv_pairs: int, vocab_size: int, num_passes: int = 1) -> None:
    """Zoology's constraints on one data setting (UserError when violated)."""
    if seq_len % 2:
        raise UserError(f"MQAR sequence length must be even, got {seq_len}")
    if vocab_size <= seq_len:
        raise UserError(f"MQAR vocab size {vocab_size} must exceed the sequence length {seq_len}")
    if num_kv_pairs < 1 or num_passes < 1:
        raise UserError("MQAR needs at least one kv pair and one pass")
    if num_kv_pairs * 2 * num_passes + num_kv_pairs * 2 > seq_len:
        raise UserError(
            f"MQAR: {num_kv_pairs} kv pairs x {num_passes} pass(es) and their queries need "
            f"{num_kv_pairs * 2 * (num_passes + 1)} tokens, more than the sequence length {seq_len}"
        )
    if num_kv_pairs > vocab_size // 2 - 1:
        raise UserError(f"MQAR: {num_kv_pairs} distinct keys do not fit in [1, {vocab_size // 2})")


def power_law_weights(space: int, power_a: float) -> np.ndarray:
    """Unnormalised gap weights ``a * x^(a-1)`` for gaps ``0 .. space-1`` (``x = gap + 1``), ``[space]``."""
    return power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)


def uniform_ordered_sample(rng: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """``[rows, k]`` indices into ``range(n)``: per row, k distinct, uniformly random, in random order."""
    u = rng.random((rows, n))
    idx = np.argpartition(u, k - 1, axis=1)[:, :k]  # the k smallest uniforms: a uniform k-subset
    order = np.take_along_axis(u, idx, axis=1).argsort(axis=1, kind="stable")  # their ranks: a uniform order
    return np.take_along_axis(idx, order, axis=1)


def weighted_ordered_sample(rng: np.random.Generator, rows: int, weights: np.ndarray, k: int) -> np.ndarray:
    """``[rows, k]`` indices into ``weights`` drawn without replacement, in draw order, with the law of
    successive sampling (each draw ``∝ weight`` among those left).

    Exponential race: item i finishes at ``E_i / w_i`` with ``E_i ~ Exp(1)``; the first to finish is i with
    probability ``w_i / sum(w)`` and, by memorylessness, the rest race on among the others.
    """
    finish = -np.log1p(-rng.random((rows, weights.shape[0]))) / weights  # E / w, E = -log(1 - U)
    idx = np.argpartition(finish, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(finish, idx, axis=1).argsort(axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)


def multiquery_ar(
    num_examples: int,
    seq_len: int,
    num_kv_pairs: int,
    rng: np.random.Generator,
    *,
    vocab_size: int = 8192,
    power_a: float = 0.01,
    random_non_queries: bool = False,
    num_passes: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """MQAR examples (see the module docstring).

    Returns:
        inputs ``[N, seq_len]`` int64 and labels ``[N, seq_len]`` int64 (-100 except at query positions).
    """
    check_setting(seq_len, num_kv_pairs, vocab_size, num_passes)
    half = vocab_size // 2
    context = 2 * num_kv_pairs * num_passes
    weights = power_law_weights((seq_len - context) // 2, power_a)
    inputs = np.zeros((num_examples, seq_len), dtype=np.int64)
    labels = np.full((num_examples, seq_len), IGNORE_INDEX, dtype=np.int64)
    for lo in range(0, num_examples, _CHUNK):
        n = min(_CHUNK, num_examples - lo)
        keys = 1 + uniform_ordered_sample(rng, n, half - 1, num_kv_pairs)  # [n, kv] in [1, V/2)
        values = half + uniform_ordered_sample(rng, n, vocab_size - half, num_kv_pairs)  # [n, kv] in [V/2, V)
        gaps = weighted_ordered_sample(rng, n, weights, num_kv_pairs)  # [n, kv]; key i is queried at gap i
        block = np.empty((n, 2 * num_kv_pairs), dtype=np.int64)
        block[:, 0::2], block[:, 1::2] = keys, values
        x, y = inputs[lo : lo + n], labels[lo : lo + n]
        x[:, :context] = np.tile(block, num_passes)
        query_pos = context + 2 * gaps
        np.put_along_axis(x, query_pos, keys, axis=1)
        np.put_along_axis(y, query_pos, values, axis=1)
        if random_non_queries:  # Zoology replaces every remaining 0 (only query-region fillers are 0)
            fill = rng.integers(0, vocab_size, size=x.shape)
            np.copyto(x, fill, where=x == 0)
    return inputs, labels


# ---------------------------------------------------------------------------------------------- sweep


@dataclass
class MQARSweep:
    """One sweep: the grid, the model overrides, the data, and the training budget of every cell.

    ``models``: card names, architecture names (``evalsuite.cards.ARCHITECTURES``; these win over cards of
    the same name and are built from the preset alone), or ``"all"`` for every registered architecture at
    run time (so rerunning after a new architecture lands adds its rows). ``pairing``: ``"zip"`` pairs
    ``seq_lens`` with ``num_kv_pairs`` elementwise; ``"product"`` crosses them (invalid pairs skipped).
    ``num_heads`` or ``head_dim`` sets the head count (``head_dim`` wins: heads = d_model / head_dim);
    ``model_overrides[name]`` adds config keys for one model. ``batch_size`` may map seq_len -> batch.
    """

    models: list[str] = field(default_factory=lambda: ["all"])
    d_models: list[int] = field(default_factory=lambda: [64, 128, 256, 512])
    seq_lens: list[int] = field(default_factory=lambda: [512])
    num_kv_pairs: list[int] = field(default_factory=lambda: [64])
    pairing: str = "zip"
    lrs: list[float] = field(default_factory=lambda: [1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2])
    num_layers: int = 4
    num_heads: int | None = None
    head_dim: int | None = 64
    use_mlp: bool = False
    model_overrides: dict = field(default_factory=dict)
    vocab_size: int = 8192
    power_a: float = 0.01
    random_non_queries: bool = False
    num_passes: int = 1
    num_train: int = 100_000
    num_test: int = 3_000
    batch_size: int | dict = 128
    eval_batch_size: int = 256
    max_steps: int = 1000
    warmup_steps: int = 50
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    eval_every: int = 100
    early_stop: float | None = 0.99
    amp: str = "auto"
    seed: int = 123
    check_accuracy: float | None = None  # fail the command unless each model's best cell exceeds this
    cpu_threads: int | None = None  # torch threads on a CPU device (1 suits tiny models on shared machines)
    description: str = ""

    def __post_init__(self):
        for name in ("models", "d_models", "seq_lens", "num_kv_pairs", "lrs"):
            value = getattr(self, name)
            if not isinstance(value, list | tuple) or not value:
                raise UserError(f"MQAR sweep: {name} must be a non-empty list")
            setattr(self, name, list(value))
        if self.pairing not in ("zip", "product"):
            raise UserError(f"MQAR sweep: pairing must be 'zip' or 'product', got {self.pairing!r}")
        if self.pairing == "zip" and len(self.seq_lens) != len(self.num_kv_pairs):
            raise UserError("MQAR sweep: pairing 'zip' needs as many seq_lens as num_kv_pairs")
        if isinstance(self.batch_size, dict):
            self.batch_size = {int(k): int(v) for k, v in self.batch_size.items()}
        self.train_config(1e-3)  # validate the training settings early

    @classmethod
    def from_dict(cls, d: dict) -> MQARSweep:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown MQAR sweep key(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def settings(self) -> list[tuple[int, int]]:
        """(seq_len, num_kv_pairs) pairs of the grid."""
        if self.pairing == "zip":
            pairs = list(zip(self.seq_lens, self.num_kv_pairs, strict=True))
            for t, kv in pairs:
                check_setting(t, kv, self.vocab_size, self.num_passes)
            return pairs
        pairs = []
        for t, kv in itertools.product(self.seq_lens, self.num_kv_pairs):
            try:
                check_setting(t, kv, self.vocab_size, self.num_passes)
            except UserError:
                continue
            pairs.append((t, kv))
        if not pairs:
            raise UserError("MQAR sweep: no valid (seq_len, num_kv_pairs) pair in the grid")
        return pairs

    def model_names(self) -> list[str]:
        names = []
        for name in self.models:
            for n in ARCHITECTURES if name == "all" else [name]:
                if n not in names:
                    names.append(n)
        return names

    def batch_for(self, seq_len: int) -> int:
        if isinstance(self.batch_size, dict):
            if seq_len not in self.batch_size:
                raise UserError(f"MQAR sweep: batch_size has no entry for seq_len {seq_len}")
            return self.batch_size[seq_len]
        return int(self.batch_size)

    def train_config(self, lr: float) -> TrainConfig:
        return TrainConfig(
            lr=lr,
            max_steps=self.max_steps,
            warmup_steps=min(self.warmup_steps, self.max_steps),
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            eval_every=self.eval_every,
            early_stop=self.early_stop,
            amp=self.amp,
        )

    def overrides(self, model: str, d_model: int) -> dict:
        """Config overrides of one model at one width."""
        heads = self.num_heads or 1
        if self.head_dim:
            if d_model % self.head_dim:
                raise UserError(f"MQAR sweep: d_model {d_model} is not a multiple of head_dim {self.head_dim}")
            heads = d_model // self.head_dim
        out = dict(vocab_size=self.vocab_size, hidden_size=d_model, num_layers=self.num_layers, num_heads=heads)
        out["use_mlp"] = self.use_mlp
        return {**out, **self.model_overrides.get(model, {})}


@dataclass(frozen=True)
class Cell:
    model: str
    d_model: int
    seq_len: int
    num_kv_pairs: int
    lr: float


def sweep_cells(sweep: MQARSweep) -> list[Cell]:
    """Every cell of the grid, in the order they run.

    Settings outermost (cells of one setting share its data). Within a setting, learning rates nearest the
    sweep's middle (in log space) come first, so a sweep cut short by a time limit already holds the
    likeliest best cells; then the widest models first, so concurrent workers finish together.
    """
    logs = [math.log(lr) for lr in sweep.lrs]
    middle = (min(logs) + max(logs)) / 2
    lrs = sorted(sweep.lrs, key=lambda lr: abs(math.log(lr) - middle))
    return [
        Cell(m, d, t, kv, lr)
        for t, kv in sweep.settings()
        for lr in lrs
        for d in sorted(sweep.d_models, reverse=True)
        for m in sweep.model_names()
    ]


def resolve_model(name: str) -> ModelCard:
    """An architecture name gives a bare card of that architecture (preset config only); else a model card."""
    if name in ARCHITECTURES:
        return ModelCard(name=name, architecture=name, tokenizer="none", weights={"source": "random"})
    return load_card(name)


def data_config(sweep: MQARSweep, seq_len: int, num_kv_pairs: int) -> dict:
    keys = ("vocab_size", "power_a", "random_non_queries", "num_passes", "num_train", "num_test", "seed")
    return {"seq_len": seq_len, "num_kv_pairs": num_kv_pairs, **{k: getattr(sweep, k) for k in keys}}


def cell_config(sweep: MQARSweep, cell: Cell) -> dict:
    """Everything that defines a cell's result; its hash keys the cell's record."""
    card = resolve_model(cell.model)
    return {
        "task": "mqar",
        "model": {
            "name": cell.model,
            "architecture": card.architecture,
            "card_config": card.config,
            "overrides": sweep.overrides(cell.model, cell.d_model),
        },
        "data": data_config(sweep, cell.seq_len, cell.num_kv_pairs),
        "train": sweep.train_config(cell.lr).to_dict(),
        "batch_size": sweep.batch_for(cell.seq_len),
        "eval_batch_size": sweep.eval_batch_size,
        "init_seed": sweep.seed,
    }


def mqar_data(config: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Train and test sets of one data config; independent seeded streams for each split."""
    gen = {k: config[k] for k in ("vocab_size", "power_a", "random_non_queries", "num_passes")}
    out = {}
    for split, n, stream in (("train", config["num_train"], 0), ("test", config["num_test"], 1)):
        rng = np.random.default_rng([config["seed"], config["seq_len"], config["num_kv_pairs"], stream])
        out[split] = multiquery_ar(n, config["seq_len"], config["num_kv_pairs"], rng, **gen)
    return out


# ------------------------------------------------------------------------------------------ state size


def decode_state_size(model: torch.nn.Module, length: int, dtype: torch.dtype) -> dict | None:
    """Bytes a model keeps per sequence to decode the next token after ``length`` tokens, or None.

    Each architecture reports it through a ``decode_state_size(length, dtype)`` method returning
    ``{"kind", "elements", "bytes", "dtype"}``: ``kind="recurrent"`` for a fixed state, ``"kv-cache"`` for
    attention, whose state grows with ``length`` (as Zoology counts attention; see ``ForgettingTransformer``).
    """
    own = getattr(model, "decode_state_size", None)
    return own(length, dtype) if callable(own) else None


# ------------------------------------------------------------------------------------------- one cell


def run_cell(
    sweep: MQARSweep,
    cell: Cell,
    device: torch.device,
    data: dict[str, tuple[torch.Tensor, torch.Tensor]],
    attention: str = "auto",
    on_step=None,
) -> dict:
    """Train one fresh model on one cell's data; return its record (long format plus MQAR fields)."""
    config = cell_config(sweep, cell)
    chash = config_hash(config)
    card = resolve_model(cell.model)
    model = build_model(card, config["model"]["overrides"], seed=sweep.seed).to(device)
    if hasattr(model, "set_attention_backend"):
        model.set_attention_backend(attention)
    tcfg = sweep.train_config(cell.lr)
    amp_dtype = autocast_dtype(tcfg.amp, device)
    train_x, train_y = data["train"]
    test_x, test_y = data["test"]
    order_rng = np.random.default_rng([sweep.seed, cell.seq_len, cell.num_kv_pairs, 2])
    batches = shuffled_batches(train_x, train_y, sweep.batch_for(cell.seq_len), order_rng)
    test_batches = fixed_batches(test_x, test_y, sweep.eval_batch_size)

    def evaluate(m):
        return masked_accuracy(m, test_batches(), amp_dtype)

    result = train(model, batches, tcfg, evaluate=evaluate, on_step=on_step)
    state = decode_state_size(model, cell.seq_len, amp_dtype or torch.float32)
    final = result.final_eval or {}
    return {
        "model": cell.model,
        "task": "mqar",
        "subtask": f"kv{cell.num_kv_pairs}/d{cell.d_model}/lr{cell.lr:g}",
        "length": cell.seq_len,
        "metric": "accuracy",
        "value": final.get("accuracy"),
        "n": final.get("n"),
        "architecture": card.architecture,
        "d_model": cell.d_model,
        "num_kv_pairs": cell.num_kv_pairs,
        "lr": cell.lr,
        "num_layers": config["model"]["overrides"]["num_layers"],
        "num_heads": config["model"]["overrides"]["num_heads"],
        "use_mlp": config["model"]["overrides"]["use_mlp"],
        "params": sum(p.numel() for p in model.parameters()),
        "state_kind": state and state["kind"],
        "state_elements": state and state["elements"],
        "state_bytes": state and state["bytes"],
        "state_dtype": state and state["dtype"],
        "test_loss": final.get("loss"),
        "best_accuracy": (result.best_eval or {}).get("accuracy"),
        "steps": result.steps,
        "stopped_early": result.stopped_early,
        "diverged": result.diverged,
        "train_seconds": round(result.seconds, 2),
        "history": result.history,
        "config_hash": chash,
        "config": config,
        "provenance": provenance(
            device=device_name(device),
            dtype="bfloat16 autocast" if amp_dtype is not None else "float32",
            attention=attention,
            seed=sweep.seed,
        ),
    }


class _DataCache:
    """Generated data per data config, on the device, kept for the process (cells share their data)."""

    def __init__(self, device: torch.device):
        self.device, self._data = device, {}

    def get(self, config: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        key = config_hash(config)
        if key not in self._data:
            self._data.clear()  # one setting at a time: cells run setting by setting
            arrays = mqar_data(config)
            self._data[key] = {
                split: (torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
                for split, (x, y) in arrays.items()
            }
        return self._data[key]


# ---------------------------------------------------------------------------------------------- sweep


def load_preset(name: str) -> MQARSweep:
    """A named preset from ``tasks/mqar.yaml``."""
    path = builtin_dir("tasks") / "mqar.yaml"
    presets = yaml.safe_load(path.read_text(encoding="utf-8"))["presets"]
    if name not in presets:
        raise UserError(f"unknown MQAR preset {name!r}; known: {', '.join(presets)}")
    return MQARSweep.from_dict(presets[name])


def default_run_dir(sweep: MQARSweep, preset: str | None) -> Path:
    """``results/runs/mqar/<preset>`` for an unmodified preset, else ``<preset or 'custom'>-<sweep hash>``."""
    if preset is not None and sweep.to_dict() == load_preset(preset).to_dict():
        return Path("results/runs/mqar") / preset
    return Path("results/runs/mqar") / f"{preset or 'custom'}-{config_hash(sweep.to_dict())}"


def finished_hashes(run_dir: Path) -> set[str]:
    return {r["config_hash"] for r in read_jsonl(run_dir / RECORDS_FILE) if "config_hash" in r}


def _worker(sweep_dict, device, attention, threads, cells, results, deadline):
    """Subprocess: pull cells until none are left (or the deadline passed); report steps and records."""
    if threads:
        torch.set_num_threads(threads)
    sweep = MQARSweep.from_dict(sweep_dict)
    dev = torch.device(device)
    cache = _DataCache(dev)
    while deadline is None or time.time() < deadline:
        try:
            index, cell = cells.get(timeout=1)
        except queue.Empty:
            break
        try:
            data = cache.get(data_config(sweep, cell.seq_len, cell.num_kv_pairs))
            record = run_cell(sweep, cell, dev, data, attention, on_step=_step_reporter(results, index))
            results.put(("record", index, record))
        except Exception as e:  # noqa: BLE001 - the parent reports it; other cells go on
            results.put(("error", index, f"{type(e).__name__}: {e}"))
    results.put(("done", None, None))


def _step_reporter(results, index, every: int = 10):
    def report(step):
        if step % every == 0:
            results.put(("steps", index, every))

    return report


def run_mqar(
    sweep: MQARSweep,
    out_dir: Path,
    *,
    device: str = "auto",
    attention: str = "auto",
    workers: int = 1,
    time_limit: float | None = None,
    progress: bool = True,
    preset: str | None = None,
    on_record=None,
) -> dict:
    """Run (or resume) a sweep into ``out_dir``; write ``results.json``; return it.

    ``workers > 1`` trains that many cells at once in subprocesses on the same device (small models leave a
    GPU mostly idle, so concurrent cells raise throughput). ``time_limit`` (seconds) starts no new cell once
    spent; the summary then lists the cells still pending, and a rerun finishes them. ``on_record(record)``
    is called after each finished cell (e.g. a log line where no progress bar is shown).
    """
    from evalsuite.adapters.native import resolve_device

    dev = resolve_device(device)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    records_path = out_dir / RECORDS_FILE
    cells = sweep_cells(sweep)
    for name in {c.model for c in cells}:
        resolve_model(name)  # fail early on an unknown model
    hashes = [config_hash(cell_config(sweep, c)) for c in cells]
    done = finished_hashes(out_dir)
    pending = [(i, c) for i, (c, h) in enumerate(zip(cells, hashes, strict=True)) if h not in done]
    deadline = None if time_limit is None else time.time() + time_limit
    errors: list[str] = []
    threads = torch.get_num_threads()
    if dev.type == "cpu" and sweep.cpu_threads:
        # Tiny models gain little from more threads, and OpenMP threads that wait on each other slow to a
        # crawl when other processes share the cores.
        torch.set_num_threads(sweep.cpu_threads)
    try:
        _run_cells(sweep, cells, pending, dev, attention, workers, deadline, progress, records_path, errors, on_record)
    finally:
        torch.set_num_threads(threads)
    return summarize(sweep, out_dir, cells, hashes, errors, preset, dev)


def _run_cells(sweep, cells, pending, dev, attention, workers, deadline, progress, records_path, errors, on_record):
    """Train the pending cells (in this process or in workers), appending each record as it finishes."""
    steps_per_cell = sweep.max_steps
    with progress_bar(len(cells) * steps_per_cell, "mqar", enabled=progress, completed=0) as bar:
        bar.update(completed=(len(cells) - len(pending)) * steps_per_cell)

        def finish(index, record, advanced):
            append_jsonl(records_path, record)
            if on_record is not None:
                on_record(record)
            bar.advance(steps_per_cell - advanced)
            c = cells[index]
            bar.update(description=f"mqar {c.model} d={c.d_model} lr={c.lr:g}: {record['value']:.3f}")

        if workers <= 1 or len(pending) <= 1:
            cache = _DataCache(dev)
            for index, cell in pending:
                if deadline is not None and time.time() >= deadline:
                    break
                bar.update(description=f"mqar {cell.model} d={cell.d_model} T={cell.seq_len} lr={cell.lr:g}")
                data = cache.get(data_config(sweep, cell.seq_len, cell.num_kv_pairs))
                record = run_cell(sweep, cell, dev, data, attention, on_step=lambda s: bar.advance())
                finish(index, record, record["steps"])
        else:
            errors += _run_parallel(sweep, pending, dev, attention, workers, deadline, bar, finish)


def _run_parallel(sweep, pending, dev, attention, workers, deadline, bar, finish) -> list[str]:
    """Spread ``pending`` cells over subprocesses; the parent alone writes records (no file locking)."""
    ctx = mp.get_context("spawn")
    cells, results = ctx.Queue(), ctx.Queue()
    for item in pending:
        cells.put(item)
    threads = max(1, (torch.get_num_threads() or 1) // workers)
    procs = [
        ctx.Process(
            target=_worker, args=(sweep.to_dict(), str(dev), attention, threads, cells, results, deadline), daemon=True
        )
        for _ in range(min(workers, len(pending)))
    ]
    for p in procs:
        p.start()
    advanced: dict[int, int] = {}
    errors, running = [], len(procs)
    while running:
        try:
            kind, index, payload = results.get(timeout=5)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                errors.append("a worker process died")
                break
            continue
        if kind == "steps":
            advanced[index] = advanced.get(index, 0) + payload
            bar.advance(payload)
        elif kind == "record":
            finish(index, payload, advanced.get(index, 0))
        elif kind == "error":
            errors.append(payload)
        else:
            running -= 1
    for p in procs:
        p.join(timeout=30)
    cells.cancel_join_thread()  # cells left after a time limit must not keep this process from exiting
    return errors


def best_records(records: list[dict]) -> list[dict]:
    """Long-format records of the best accuracy over learning rates per (model, setting, d_model)."""
    import pandas as pd

    from evalsuite.report.mqar import best_over_lr, records_frame

    df = records_frame(records)
    if df.empty:
        return []
    out = []
    for row in best_over_lr(df).to_dict("records"):
        out.append(
            {
                "model": row["model"],
                "task": "mqar",
                "subtask": f"kv{row['num_kv_pairs']}/d{row['d_model']}/best-lr",
                "length": int(row["length"]),
                "metric": "accuracy_best_lr",
                "value": row["accuracy"],
                "n": None if pd.isna(row["n"]) else int(row["n"]),
                "d_model": int(row["d_model"]),
                "num_kv_pairs": int(row["num_kv_pairs"]),
                "lr": row["lr"],
                "lrs_tried": int(row["lrs"]),
                "state_kind": row["state_kind"],
                "state_bytes": None if math.isnan(row["state_bytes"]) else int(row["state_bytes"]),
            }
        )
    return out


def summarize(sweep, out_dir, cells, hashes, errors, preset, dev) -> dict:
    """Write and return ``results.json``: the sweep, best-over-lr records of every cell in the run directory,
    the cells of this sweep still pending, and provenance."""
    records = read_jsonl(out_dir / RECORDS_FILE)
    done = {r.get("config_hash") for r in records}
    pending = [asdict(c) for c, h in zip(cells, hashes, strict=True) if h not in done]
    results = {
        "task": "mqar",
        "preset": preset,
        "sweep": sweep.to_dict(),
        "cells": {"total": len(cells), "finished": len(cells) - len(pending), "pending": pending},
        "errors": errors,
        "records": best_records(records),
        # the numbers come from the records: what they all share, then where this summary was written
        "provenance": {**shared_provenance(records), "summary": provenance(device=device_name(dev))},
    }
    atomic_write_json(out_dir / RESULTS_FILE, results)
    return results


def shared_provenance(records: list[dict]) -> dict:
    """Provenance fields with one value across all records (devices, versions, dtype, ...); several values of a
    field are listed, sorted, under the field's name."""
    values: dict[str, set] = {}
    for r in records:
        for key, value in (r.get("provenance") or {}).items():
            if key not in ("created", "host"):
                values.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    out = {}
    for key, found in sorted(values.items()):
        decoded = sorted((json.loads(v) for v in found), key=str)
        out[key] = decoded[0] if len(decoded) == 1 else decoded
    return out


def check_best(results: dict, threshold: float) -> None:
    """UserError unless every model's best cell is above ``threshold`` (the ``check_accuracy`` of a preset)."""
    best: dict[str, float] = {}
    for r in results["records"]:
        best[r["model"]] = max(best.get(r["model"], -math.inf), r["value"])
    low = {m: v for m, v in best.items() if v <= threshold}
    if low or not best:
        shown = ", ".join(f"{m} {v:.3f}" for m, v in low.items()) or "no finished cells"
        raise UserError(f"MQAR check failed: best accuracy must exceed {threshold} ({shown})")


def sweep_from_options(preset: str, **options) -> MQARSweep:
    """A preset with command-line overrides applied (``None`` values leave the preset's value).

    Options are ``MQARSweep`` field names; ``num_heads`` also clears the preset's ``head_dim``.
    """
    base = load_preset(preset).to_dict()
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(base))
    if unknown:
        raise UserError(f"unknown MQAR sweep option(s): {', '.join(unknown)}")
    if "num_heads" in given:
        base["head_dim"] = None
    return MQARSweep.from_dict({**base, **given})
