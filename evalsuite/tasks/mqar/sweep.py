"""The MQAR sweep: its settings (a dataclass read from ``tasks/mqar.yaml`` presets), its cells, and the config that
keys each cell's record.

A cell's config hash (:func:`cell_config`) is what a rerun compares against ``records.jsonl``, so its content must
not change: run directories written before (e.g. ``results/mqar/zoology-fig2``) resume on it, training nothing.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from evalsuite.cards import ModelCard, architecture_card, load_card
from evalsuite.data.mqar import check_setting
from evalsuite.errors import UserError
from evalsuite.models.registry import architecture_names
from evalsuite.resources import task_presets
from evalsuite.runs.store import config_hash
from evalsuite.tasks.base import RUNS_ROOT
from evalsuite.training.train import TrainConfig

RUNS_DIR = RUNS_ROOT / "mqar"


@dataclass
class MQARSweep:
    """One sweep: the grid, the model overrides, the data, and the training budget of every cell.

    ``models``: card names, architecture names (:func:`evalsuite.models.registry.architecture_names`; these win over
    cards of the same name and are built from the preset alone), or ``"all"`` for every registered architecture at
    run time (so rerunning after a new architecture lands adds its rows). ``pairing``: ``"zip"`` pairs ``seq_lens``
    with ``num_kv_pairs`` elementwise; ``"product"`` crosses them (invalid pairs skipped). ``num_heads`` or
    ``head_dim`` sets the head count (``head_dim`` wins: heads = d_model / head_dim); ``model_overrides[name]`` adds
    config keys for one model, a value given as ``{d_model: value}`` per width (e.g. GSA's slots = d_model / 4).
    ``batch_size`` may map seq_len -> batch. ``model_lrs[name]`` replaces ``lrs`` for one model (families whose
    useful band differs, e.g. GSA's above attention's).

    The training recipe: ours by default (warmup then cosine over ``max_steps``, decay on matrices only, clipping,
    bf16 on CUDA) or, field by field, Zoology's (arXiv:2312.04927, the GSA authors' fork): ``tie_head: true``
    (the LM head is the embedding; None keeps each family's default), ``schedule: epoch-cosine`` with
    ``cosine_epochs: 64`` (epochs of ``num_train // batch`` steps), ``warmup_steps: 0``, ``decay_all_params:
    true``, ``grad_clip: null``, ``amp: none`` (fp32). Each family keeps its own block.

    Ablations and seeds: every cell runs once per entry of ``seeds`` (None: once, at ``seed``) and once per recipe
    ``variants`` entry besides the base recipe (``{"untied": {"tie_head": False}, ...}``, any fields but the grid's
    and the data's), so the differences are measured in one pool of cells.
    """

    models: list[str] = field(default_factory=lambda: ["all"])
    d_models: list[int] = field(default_factory=lambda: [64, 128, 256, 512])
    seq_lens: list[int] = field(default_factory=lambda: [512])
    num_kv_pairs: list[int] = field(default_factory=lambda: [64])
    pairing: str = "zip"
    lrs: list[float] = field(default_factory=lambda: [1e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2])
    model_lrs: dict = field(default_factory=dict)  # model name -> its own learning rates instead of ``lrs``
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
    schedule: str = "warmup-cosine"
    cosine_epochs: int = 64
    decay_all_params: bool = False
    tie_head: bool | None = None
    seed: int = 123
    seeds: list[int] | None = None  # training seeds (model init, batch order) of every cell; data keeps ``seed``
    variants: dict = field(default_factory=dict)  # name -> sweep fields it changes: a recipe ablation (see below)
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
        for name, lrs in self.model_lrs.items():
            if not isinstance(lrs, list | tuple) or not lrs:
                raise UserError(f"MQAR sweep: model_lrs[{name}] must be a non-empty list")
        widths = [d for d in self.d_models if isinstance(d, bool) or not isinstance(d, int) or d < 1]
        if widths:
            raise UserError(f"MQAR sweep: d_models must be positive integers, got {', '.join(map(str, widths))}")
        for where, lrs in [("lrs", self.lrs), *((f"model_lrs[{n}]", v) for n, v in self.model_lrs.items())]:
            bad = [lr for lr in lrs if not _positive_number(lr)]
            if bad:
                raise UserError(f"MQAR sweep: {where} must be positive learning rates, got {', '.join(map(str, bad))}")
        if isinstance(self.batch_size, dict):
            self.batch_size = {int(k): int(v) for k, v in self.batch_size.items()}
        if self.seeds is not None and (not isinstance(self.seeds, list | tuple) or not self.seeds):
            raise UserError("MQAR sweep: seeds must be a non-empty list (or null)")
        for name, changes in self.variants.items():
            fixed = sorted(set(changes) & (_GRID_FIELDS | set(_DATA_FIELDS) | {"variants", "seeds"}))
            if not name or not isinstance(changes, dict) or fixed:
                raise UserError(f"MQAR sweep: variant {name!r} must be a mapping of recipe fields; it may not change "
                                f"{', '.join(fixed) or 'nothing else'}")  # fmt: skip
            self.for_variant(name)  # validates its fields and values
        for seq_len, _ in self.settings():
            self.train_config(1e-3, seq_len)  # validate the training settings early

    @classmethod
    def from_dict(cls, d: dict) -> MQARSweep:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown MQAR sweep key(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)

    def for_variant(self, variant: str) -> MQARSweep:
        """The sweep with recipe variant ``variant`` applied ("" : the base recipe)."""
        if not variant:
            return self
        if variant not in self.variants:
            raise UserError(f"MQAR sweep: unknown variant {variant!r}; known: {', '.join(self.variants)}")
        return MQARSweep.from_dict({**self.to_dict(), **self.variants[variant], "variants": {}})

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
            for n in architecture_names() if name == "all" else [name]:
                if n not in names:
                    names.append(n)
        return names

    def lrs_for(self, model: str) -> list[float]:
        """The learning rates ``model`` is trained at."""
        return list(self.model_lrs.get(model, self.lrs))

    def batch_for(self, seq_len: int) -> int:
        if isinstance(self.batch_size, dict):
            if seq_len not in self.batch_size:
                raise UserError(f"MQAR sweep: batch_size has no entry for seq_len {seq_len}")
            return self.batch_size[seq_len]
        return int(self.batch_size)

    def train_config(self, lr: float, seq_len: int) -> TrainConfig:
        """The training settings of a cell at ``lr`` and ``seq_len`` (whose batch size sets the epoch length)."""
        return TrainConfig(
            lr=lr,
            max_steps=self.max_steps,
            warmup_steps=min(self.warmup_steps, self.max_steps),
            weight_decay=self.weight_decay,
            grad_clip=self.grad_clip,
            eval_every=self.eval_every,
            early_stop=self.early_stop,
            amp=self.amp,
            schedule=self.schedule,
            steps_per_epoch=self.num_train // self.batch_for(seq_len) if self.schedule == "epoch-cosine" else None,
            cosine_epochs=self.cosine_epochs,
            decay_all_params=self.decay_all_params,
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
        if self.tie_head is not None:
            out["tie_word_embeddings"] = self.tie_head
        for key, value in self.model_overrides.get(model, {}).items():
            if isinstance(value, dict):  # per width: {d_model: value}
                by_width = {int(d): v for d, v in value.items()}
                if d_model not in by_width:
                    raise UserError(f"MQAR sweep: model_overrides[{model}][{key}] has no entry for d_model {d_model}")
                value = by_width[d_model]
            out[key] = value
        return out


def _positive_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


_GRID_FIELDS = {"models", "d_models", "seq_lens", "num_kv_pairs", "pairing", "lrs", "model_lrs"}
_DATA_FIELDS = ("vocab_size", "power_a", "random_non_queries", "num_passes", "num_train", "num_test", "seed")


@dataclass(frozen=True)
class Cell:
    """One training run. ``seed``: its training seed (None: the sweep's ``seed``); ``variant``: its recipe variant
    ("": the base recipe)."""

    model: str
    d_model: int
    seq_len: int
    num_kv_pairs: int
    lr: float
    seed: int | None = None
    variant: str = ""

    def training_seed(self, sweep: MQARSweep) -> int:
        return sweep.seed if self.seed is None else self.seed


def sweep_cells(sweep: MQARSweep) -> list[Cell]:
    """Every cell of the grid, in the order they run.

    Settings outermost (cells of one setting share its data). Within a setting, each model's learning rates nearest
    the middle of its own (in log space; the larger on a tie) come first, so a sweep cut short by a time limit
    already holds the likeliest best cells; then the widest models first, so concurrent workers finish together.
    """
    models = sweep.model_names()
    ranked = {m: _likeliest_first(sweep.lrs_for(m)) for m in models}
    return [
        Cell(m, d, t, kv, ranked[m][rank], seed, variant)
        for t, kv in sweep.settings()
        for rank in range(max(map(len, ranked.values())))
        for d in sorted(sweep.d_models, reverse=True)
        for m in models
        if rank < len(ranked[m])
        for variant in ["", *sweep.variants]
        for seed in sweep.seeds or [None]
    ]


def _likeliest_first(lrs: list[float]) -> list[float]:
    logs = [math.log(lr) for lr in lrs]
    middle = (min(logs) + max(logs)) / 2
    return sorted(lrs, key=lambda lr: (round(abs(math.log(lr) - middle), 9), -lr))


def resolve_model(name: str) -> ModelCard:
    """An architecture name gives a bare card of that architecture (preset config only); else a model card."""
    if name in architecture_names():
        return architecture_card(name)
    return load_card(name)


def data_config(sweep: MQARSweep, seq_len: int, num_kv_pairs: int) -> dict:
    """The settings of :func:`evalsuite.data.mqar.mqar_data` for one (seq_len, kv pairs) setting."""
    return {"seq_len": seq_len, "num_kv_pairs": num_kv_pairs, **{k: getattr(sweep, k) for k in _DATA_FIELDS}}


def cell_config(sweep: MQARSweep, cell: Cell, card: ModelCard | None = None) -> dict:
    """Everything that defines a cell's result; its hash keys the cell's record. ``card``: the cell's model
    (:func:`resolve_model`), when the caller has it already. A cell of the base recipe at the sweep's seed hashes
    as the same cell of a sweep without seeds or variants."""
    card = card or resolve_model(cell.model)
    sweep = sweep.for_variant(cell.variant)
    return {
        "task": "mqar",
        "model": {
            "name": cell.model,
            "architecture": card.architecture,
            "card_config": card.config,
            "overrides": sweep.overrides(cell.model, cell.d_model),
        },
        "data": data_config(sweep, cell.seq_len, cell.num_kv_pairs),
        "train": sweep.train_config(cell.lr, cell.seq_len).to_dict(),
        "batch_size": sweep.batch_for(cell.seq_len),
        "eval_batch_size": sweep.eval_batch_size,
        "init_seed": cell.training_seed(sweep),
    }


def hashes_at_smaller_budgets(sweep: MQARSweep, cell: Cell, budgets, card: ModelCard | None = None) -> dict[str, int]:
    """``{config hash: budget}`` of ``cell`` trained with ``max_steps`` = each of ``budgets`` below the sweep's own,
    where that run would have followed the same trajectory up to its end: the schedule does not depend on
    ``max_steps`` (``epoch-cosine``) and the warmup fits in the smaller budget. A record of such a run that stopped
    early is the record this cell would write (raising a budget retrains only the cells that did not solve)."""
    own = sweep.for_variant(cell.variant)
    if own.schedule != "epoch-cosine":
        return {}
    out = {}
    for budget in budgets:
        if own.warmup_steps <= budget < sweep.max_steps:
            smaller = MQARSweep.from_dict({**sweep.to_dict(), "max_steps": budget})
            out[config_hash(cell_config(smaller, cell, card))] = budget
    return out


# --------------------------------------------------------------------------------------------- presets


def load_preset(name: str) -> MQARSweep:
    """A named preset from ``tasks/mqar.yaml``."""
    presets = task_presets("mqar")
    if name not in presets:
        raise UserError(f"unknown MQAR preset {name!r}; known: {', '.join(presets)}")
    return MQARSweep.from_dict(presets[name])


def sweep_from_options(preset: str, **options) -> MQARSweep:
    """A preset with command-line overrides applied (``None`` values leave the preset's value).

    Options are ``MQARSweep`` field names; ``num_heads`` also clears the preset's ``head_dim``, ``lrs`` its
    ``model_lrs``.
    """
    base = load_preset(preset).to_dict()
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(base))
    if unknown:
        raise UserError(f"unknown MQAR sweep option(s): {', '.join(unknown)}")
    if "num_heads" in given:
        base["head_dim"] = None
    if "lrs" in given:  # learning rates given on the command line apply to every model
        base["model_lrs"] = {}
    return MQARSweep.from_dict({**base, **given})


def default_run_dir(sweep: MQARSweep, preset: str | None) -> Path:
    """``results/runs/mqar/<preset>`` for an unmodified preset, else ``<preset or 'custom'>-<sweep hash>``."""
    if preset is not None and sweep.to_dict() == load_preset(preset).to_dict():
        return RUNS_DIR / preset
    return RUNS_DIR / f"{preset or 'custom'}-{config_hash(sweep.to_dict())}"
