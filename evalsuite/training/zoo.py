"""Train a preset of model cards alike: ``evalsuite train-lm --preset NAME`` (presets in ``tasks/train-lm.yaml``).

The ``zoo`` preset trains every seed family's small byte-level model (``models/zoo-*.yaml``) on the same corpus,
context, token count and recipe, with two seeds each, so that their long-context behaviour can be compared
(``results/claims/``). Members run as subprocesses of :func:`evalsuite.training.pool.run_pool`, several at once
on one GPU (a 2M-parameter model leaves most of it idle); each writes its own folder
``<out>/<card>-seed<seed>/`` (``checkpoint/``, ``train.json``), and a member whose ``train.json`` exists is not
trained again, so a rerun resumes (a member killed mid-way resumes from its snapshot). The parent writes
``<out>/zoo.json``: the preset, every member's final held-out scores and training time.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.resources import task_presets
from evalsuite.runs.provenance import device_name, provenance
from evalsuite.runs.store import atomic_write_json


@dataclass(frozen=True)
class TrainPreset:
    """A set of ``models`` (card names) trained alike: ``seeds`` of each, the :class:`LMTrainConfig` fields given."""

    name: str
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    seq_len: int
    batch_size: int
    steps: int
    finetune_steps: int = 0
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    eval_every: int = 250

    def train_config(self, corpus: str, seed: int, max_tokens: int | None = None):
        """The :class:`~evalsuite.training.lm_train.LMTrainConfig` of one member."""
        from evalsuite.training.lm_train import LMTrainConfig

        shared = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("name", "models", "seeds")}
        return LMTrainConfig(corpus=corpus, seed=seed, max_tokens=max_tokens, **shared)

    def members(self) -> list[tuple[str, int]]:
        """``(card, seed)`` of every run, seed-major so that every model's first seed finishes first."""
        return [(m, s) for s in self.seeds for m in self.models]


def load_preset(name: str) -> TrainPreset:
    """The preset ``name`` of ``tasks/train-lm.yaml``; one clear error for an unknown name or field."""
    presets = task_presets("train-lm")
    if name not in presets:
        raise UserError(f"unknown train-lm preset {name!r}; known: {', '.join(sorted(presets))}")
    spec = dict(presets[name])
    known = {f.name for f in fields(TrainPreset)} - {"name"}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise UserError(f"train-lm preset {name!r}: unknown field(s) {', '.join(unknown)}")
    spec["models"], spec["seeds"] = tuple(spec.get("models", ())), tuple(spec.get("seeds", (0,)))
    return TrainPreset(name=name, **spec)


def member_dir(out: Path, card: str, seed: int) -> Path:
    return Path(out) / f"{card}-seed{seed}"


def _train_member(item: tuple, report, *, corpus: str, out: str, preset: TrainPreset, device: str,
                  max_tokens: int | None) -> dict:  # fmt: skip
    """A :func:`run_pool` handler: train one ``(card, seed)`` member into its folder; returns its summary line.
    On a GPU each step is one CUDA graph (every zoo architecture's step captures)."""
    from evalsuite.cards import load_card
    from evalsuite.training.lm_train import train_lm

    card_name, seed = item
    folder = member_dir(Path(out), card_name, seed)
    card, config = load_card(card_name), preset.train_config(corpus, seed, max_tokens)
    summary = train_lm(card, config, folder, device=device, progress=False, cuda_graph=True)
    report(summary["steps"])
    return _summary_line(summary, folder)


def _summary_line(summary: dict, folder: Path) -> dict:
    final = summary["final_eval"]
    return {"model": summary["model"], "seed": summary["config"]["seed"], "params": summary["params"],
            "tokens_seen": summary["tokens_seen"], "seconds": round(summary["seconds"], 1),
            "held_out_loss": final["loss"], "held_out_accuracy": final["accuracy"], "folder": folder.name}  # fmt: skip


def train_preset(preset: TrainPreset, corpus: str, out: Path, *, device: str = "cuda", workers: int = 1,
                 max_tokens: int | None = None, log=print) -> dict:  # fmt: skip
    """Train every member of ``preset`` not yet trained under ``out``, ``workers`` at a time; write and return
    ``out/zoo.json`` (``{"preset", "members": [...], "provenance"}``). Failed members are reported and left for a
    rerun; the call raises after writing when any failed."""
    from evalsuite.training.pool import run_pool

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[tuple[str, int], dict] = {}
    todo = []
    for card, seed in preset.members():
        trained = member_dir(out, card, seed) / "train.json"
        if trained.exists():
            done[(card, seed)] = _summary_line(json.loads(trained.read_text()), trained.parent)
        else:
            todo.append((len(todo), (card, seed)))
    log(f"train-lm preset {preset.name}: {len(todo)} of {len(done) + len(todo)} runs to train, {workers} at a time")
    if todo:  # tokenise the corpus once, into the on-disk cache every worker then reads
        from evalsuite.cards import load_card
        from evalsuite.tokenizers import get_tokenizer
        from evalsuite.training.lm_train import corpus_tokens

        for spec in sorted({load_card(card).tokenizer for card in preset.models}):
            corpus_tokens(corpus, get_tokenizer(spec), max_tokens)
    items = dict(todo)
    handler = functools.partial(_train_member, corpus=str(corpus), out=str(out), preset=preset, device=device,
                                max_tokens=max_tokens)  # fmt: skip

    def finished(index: int, line: dict) -> None:
        done[items[index]] = line
        log(f"  {line['model']} seed {line['seed']}: held-out loss {line['held_out_loss']:.4f} in {line['seconds']} s")

    errors = run_pool(todo, functools.partial(_same, handler), workers=workers, on_result=finished,
                      on_error=lambda index, message: log(f"  failed: {items.get(index, '?')}: {message}"))  # fmt: skip
    summary = {
        "preset": asdict(preset),
        "corpus": str(corpus),
        "members": [done[m] for m in preset.members() if m in done],
        "provenance": provenance(device=device_name(device)),
    }
    atomic_write_json(out / "zoo.json", summary)
    if errors:
        raise UserError(f"{len(errors)} run(s) of preset {preset.name} failed (rerun to retry): {errors[0]}")
    return summary


def _same(handler):
    """``make_handler`` for :func:`run_pool`: the handler itself (it keeps no per-process state)."""
    return handler
