"""Training throughput and peak training memory of whole models: ``evalsuite bench train``.

For each model card (its shapes, random weights) and shape ``LENGTHxBATCH``, full optimizer steps as the suite trains
its LMs (:mod:`evalsuite.training.lm_train`): :class:`~evalsuite.training.train_step.EagerStep` with bf16 autocast on
CUDA (``amp``), AdamW from :func:`~evalsuite.training.train.make_optimizer` with the FoX paper's betas (0.9, 0.95),
weight decay 0.1 and clipping at 1.0 (arXiv:2503.02130 App. B), the LM loss of
:func:`~evalsuite.training.lm_train.chunked_cross_entropy`, the model's default attention backend (its Triton kernels
on CUDA), on batches of random tokens.

The steps are timed by :func:`evalsuite.bench.common.time_providers`: each model's first step (compile, autotune:
``first_step_s``), a second, one whose peak device memory is taken, then ``rounds`` rounds of one step of every model
in turn (A B C D, A B C D, ...), so that each round's ratio of tokens/s to the ``baseline`` model's
(:func:`~evalsuite.bench.common.ratio_fields`) compares the same moment of the GPU (clocks, heat, neighbours). The
models are held on the device together when their weights and AdamW state fit in half of it; otherwise each is built
alone in turn, the baseline first, and a round's ratio pairs steps made apart (``interleaved: false``). Reported per
(model, shape): tokens/s and ms/step (median, p20, p80 over rounds), the median and spread of the per-round ratios,
the peak memory of a step and the parameter count.

Peak memory (CUDA) is the model's own: its weights and AdamW state (counted from their tensors) plus the most a step
allocates beyond what was allocated before it (gradients, activations, temporaries), so other models on the device
do not count; ``torch.cuda.max_memory_allocated``'s measure, without the allocator's cache.

The output folder is a run directory (:class:`~evalsuite.runs.rundir.RunDir`): a record per (model, shape) in
``records.jsonl``, and ``train_bench.json`` and ``train_bench.md`` rewritten as records come; a rerun into it skips
the pairs it holds (the baseline is timed again beside a new pair of its shape, so that new ratios compare one moment).
"""

from __future__ import annotations

import gc
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evalsuite.bench.common import (
    QUANTILES,
    Call,
    env_info,
    ratio_fields,
    ratio_text,
    time_providers,
    wall_seconds,
)
from evalsuite.errors import UserError
from evalsuite.runs.rundir import writing
from evalsuite.runs.store import atomic_write_bytes, atomic_write_json, config_hash
from evalsuite.training.train import AMP_MODES, TrainConfig

DEFAULT_MODELS = ("transformer-llama", "fox-pro", "transformer-pro", "fox-llama")  # the FoX paper's 760M models
# 16K tokens a step at four context lengths (GSA paper Fig. 4); 16384x1 is the FoX paper's Table 6 length.
DEFAULT_SHAPES = ((2048, 8), (4096, 4), (8192, 2), (16384, 1))
JSON_NAME, MD_NAME = "train_bench.json", "train_bench.md"
HOLD_BYTES_PER_PARAM = 12  # float32 weights + AdamW's two moments, held between steps (gradients are freed)
HOLD_FRACTION = 0.5  # the models are held together when that fits in this part of the device (the rest: a step)
LR = 3e-4


@dataclass
class _Trainee:
    """One model on the device with its training step (:class:`~evalsuite.training.train_step.EagerStep`)."""

    model: torch.nn.Module
    stepper: object

    def step(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.stepper(inputs, labels, LR)

    def held_bytes(self) -> int:
        """Bytes of the weights and the optimizer state: what stays on the device between steps."""
        state = [v for s in self.stepper.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return sum(t.numel() * t.element_size() for t in [*self.model.parameters(), *state])


@dataclass(frozen=True)
class _Settings:
    """How every model is built and timed."""

    device: torch.device
    attention: dict[str, str]  # model name -> attention backend
    checkpoint: bool  # recompute every block in the backward (activation checkpointing)
    amp: str
    seed: int
    rounds: int
    say: Callable[[str], None]


def parse_shape(text: str) -> tuple[int, int]:
    """``"16384x1"`` -> ``(16384, 1)`` (length, batch); UserError for anything else."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*", text)
    if match is None or int(match[1]) < 2 or int(match[2]) < 1:
        raise UserError(f"--shape takes LENGTHxBATCH (length >= 2, batch >= 1), e.g. 16384x1; got {text!r}")
    return int(match[1]), int(match[2])


def shape_name(shape: tuple[int, int]) -> str:
    return f"{shape[0]}x{shape[1]}"


def _build(card, s: _Settings) -> _Trainee:
    """``card``'s model (random weights from ``s.seed``) on the device with AdamW and the training step."""
    from evalsuite.training.lm_train import chunked_cross_entropy
    from evalsuite.training.train import EagerStep, autocast_dtype, build_model, make_optimizer

    model = build_model(card, seed=s.seed).to(s.device).train()
    if s.attention[card.name] != "auto":
        model.set_attention_backend(s.attention[card.name], s.device)
    if s.checkpoint:
        checkpoint_blocks(model)
    config = TrainConfig(lr=LR, betas=(0.9, 0.95), weight_decay=0.1, grad_clip=1.0, amp=s.amp)
    stepper = EagerStep(model, make_optimizer(model, config), chunked_cross_entropy, config.grad_clip,
                        autocast_dtype(s.amp, s.device))  # fmt: skip
    return _Trainee(model, stepper)


class _Checkpointed(torch.nn.Module):
    """A block whose activations are recomputed in the backward instead of kept (``torch.utils.checkpoint``)."""

    def __init__(self, block: torch.nn.Module):
        super().__init__()
        self.block = block

    def forward(self, *args, **kwargs):
        return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: torch.nn.Module) -> None:
    """Wrap each of ``model.blocks`` (the FoX, GSA and TNL families' layer stacks) in :class:`_Checkpointed`: a step
    then keeps one ``[B, T, D]`` input per layer and one layer's activations at a time, which is how 128K-token steps
    of these models fit a GPU (the papers' long-sequence speed runs do not say whether theirs recompute)."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        raise UserError(f"--checkpoint needs a model with a `blocks` layer stack (FoX, GSA, TNL); "
                        f"{type(model).__name__} has none")  # fmt: skip
    for i, block in enumerate(blocks):
        blocks[i] = _Checkpointed(block)


def _batch(vocab: int, shape: tuple[int, int], seed: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens: inputs and next-token labels ``[batch, length]``."""
    length, batch = shape
    rows = torch.randint(vocab, (batch, length + 1), generator=torch.Generator().manual_seed(seed)).to(device)
    return rows[:, :-1], rows[:, 1:]


def _builder(card, shape, s: _Settings, trainees: dict[str, _Trainee]) -> Callable[[], Call]:
    """:func:`time_providers`' builder of one model at ``shape``: the model (built once into ``trainees``) and its
    first step, timed (compile and autotune included)."""

    def build() -> Call:
        if card.name not in trainees:
            trainees[card.name] = _build(card, s)
            s.say(f"{card.name}: built, {trainees[card.name].model.num_params(False) / 1e6:.1f}M parameters")
        trainee = trainees[card.name]
        batch = _batch(trainee.model.vocab_size, shape, s.seed, s.device)
        first = wall_seconds(lambda: trainee.step(*batch), s.device)
        s.say(f"{card.name} {shape_name(shape)}: first step {first:.1f} s")
        return Call(lambda: trainee.step(*batch), (), {"first_step_s": first})

    return build


def _time(cards: list, shape, s: _Settings, trainees: dict[str, _Trainee]) -> tuple[dict, dict]:
    """Time ``cards``' models at ``shape`` in interleaved rounds: ``(fields, samples)`` per model name, the fields
    with the held and peak memory of a step (CUDA)."""
    builders = {c.name: _builder(c, shape, s, trainees) for c in cards}
    fields, samples = time_providers(builders, device=s.device, rounds=s.rounds, block_ms=0.0)
    for name, f in fields.items():
        if "peak_mem_mib" in f and name in trainees:
            held = trainees[name].held_bytes()
            f.update(held_bytes=held, peak_bytes=held + round(f.pop("peak_mem_mib") * 2**20))
    return fields, samples


def _quantiles(values) -> tuple[float, float, float]:
    median, p20, p80 = np.quantile(values, QUANTILES)
    return float(median), float(p20), float(p80)


def _record(card, shape, fields: dict, samples: list | None, base: list | None, context: dict) -> dict:
    """The record of one (model, shape): throughput, the per-round ratios to the baseline, memory, parameters."""
    from evalsuite.cards import count_params  # on the meta device: a model that failed to build is counted too

    length, batch = shape
    rec = {"key": f"{card.name}|{shape_name(shape)}", "op": "train_step", "model": card.name,
           "architecture": card.architecture, "length": length, "batch": batch, "tokens_per_step": length * batch,
           "params": count_params(card, non_embedding=False), "params_non_embedding": count_params(card),
           "status": fields["status"], **context}  # fmt: skip
    if fields["status"] != "ok":
        return rec
    rec["tokens_per_s"], rec["tokens_per_s_p20"], rec["tokens_per_s_p80"] = _quantiles(
        [length * batch * 1e3 / ms for ms in samples]
    )
    rec.update(ms_per_step=fields["ms"], ms_per_step_p20=fields["ms_p20"], ms_per_step_p80=fields["ms_p80"],
               round_ms=samples, rounds=len(samples), first_step_s=fields["first_step_s"])  # fmt: skip
    if "peak_bytes" in fields:
        rec.update(peak_memory_bytes=fields["peak_bytes"], peak_memory_gib=fields["peak_bytes"] / 2**30,
                   held_memory_gib=fields["held_bytes"] / 2**30)  # fmt: skip
    if base is not None and len(base) == len(samples):  # a round's tokens/s ratio: the baseline's ms over ours
        rec.update(ratio_fields("ratio_to_baseline", base, samples), baseline_round_ms=base)
    return rec


def _plan(names: list[str], shapes, done: set, baseline: str) -> dict[tuple, list[str]]:
    """Per shape, the models to time: those without a record (``done``: the records' keys), and the baseline beside
    them (first)."""
    plan = {}
    for shape in shapes:
        pending = [n for n in names if f"{n}|{shape_name(shape)}" not in done]
        if pending:
            plan[shape] = [baseline] + [n for n in pending if n != baseline]
    return plan


def _fits_together(cards, device: torch.device) -> bool:
    """Whether the models' weights and AdamW state fit in :data:`HOLD_FRACTION` of the device at once."""
    from evalsuite.cards import count_params

    if device.type != "cuda":
        return True
    need = sum(HOLD_BYTES_PER_PARAM * count_params(c, non_embedding=False) for c in cards)
    return need <= HOLD_FRACTION * torch.cuda.get_device_properties(device).total_memory


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _run_together(plan, cards, s: _Settings, emit) -> None:
    """Every model held on the device once built; at each shape its models timed interleaved."""
    trainees: dict[str, _Trainee] = {}
    for shape, todo in plan.items():
        fields, samples = _time([cards[n] for n in todo], shape, s, trainees)
        for name in todo:
            emit(cards[name], shape, fields[name], samples.get(name), samples.get(todo[0]))
        _free(s.device)


def _run_alone(plan, cards, s: _Settings, emit) -> None:
    """One model on the device at a time (the baseline first), timed at each of its shapes before the next."""
    baseline: dict[tuple, list | None] = {}
    for name in dict.fromkeys(n for todo in plan.values() for n in todo):
        trainees: dict[str, _Trainee] = {}
        for shape, todo in plan.items():
            if name in todo:
                fields, samples = _time([cards[name]], shape, s, trainees)
                baseline.setdefault(shape, samples.get(name))  # the baseline is each shape's first
                emit(cards[name], shape, fields[name], samples.get(name), baseline[shape])
        del trainees
        _free(s.device)


def _cards(models, attention: str) -> tuple[dict, dict[str, str]]:
    """Name -> card of each spec (a card's name or YAML path, ``@BACKEND`` for an attention backend of its own: the
    card renamed ``NAME@BACKEND``), and name -> attention backend (``attention`` where the spec names none); a model
    named twice is a UserError."""
    from dataclasses import replace

    from evalsuite.cards import load_card

    cards, backends = {}, {}
    for spec in models:
        path, _, backend = str(spec).partition("@")
        card = load_card(path)
        if backend:
            card = replace(card, name=f"{card.name}@{backend}")
        if card.name in cards:
            raise UserError(f"model {card.name} is named twice")
        cards[card.name], backends[card.name] = card, backend or attention
    return cards, backends


def _check_backends(cards: dict, backends: dict[str, str], device: torch.device) -> None:
    """Each model takes its attention backend (checked on a meta-device build, before anything runs)."""
    for name, card in cards.items():
        if backends[name] != "auto":
            with torch.device("meta"):
                model = card.build_module()
            model.set_attention_backend(backends[name], device)


def _check(names, shapes, baseline, rounds, amp) -> None:
    if not names or not shapes:
        raise UserError("give at least one --model and one --shape")
    if baseline not in names:
        raise UserError(f"--baseline {baseline} is not one of the models ({', '.join(names)})")
    if rounds < 1:
        raise UserError("--rounds must be at least 1")
    if amp not in AMP_MODES:
        raise UserError(f"--amp must be one of {', '.join(AMP_MODES)}, got {amp!r}")


def bench_train(out, *, models=DEFAULT_MODELS, shapes=DEFAULT_SHAPES, baseline: str | None = None, rounds: int = 10,
                device: str = "auto", attention: str = "auto", checkpoint: bool = False, amp: str = "auto",
                together: bool | None = None, seed: int = 0, verbose: bool = True,
                repair: bool = False) -> list[dict]:  # fmt: skip
    """Measure every (model, shape) not yet under ``out`` (module doc); returns all the folder's records.

    ``models``: cards (names or YAML paths; recorded by the card's name), each with an optional ``@BACKEND``
    attention backend of its own (recorded as ``NAME@BACKEND``; ``attention`` is the others'). ``checkpoint``:
    recompute every block in the backward (:func:`checkpoint_blocks`). ``shapes``: ``(length, batch)`` pairs.
    ``baseline``: the model whose tokens/s the ratios divide by (default: the first). ``together``: hold the models
    on the device together and interleave them (None: when they fit, :func:`_fits_together`). ``repair``: set aside
    corrupt lines of ``records.jsonl`` first. ``out`` is claimed for its device, ``amp``, ``attention``,
    ``checkpoint`` and ``seed`` (another run's there is a UserError) and locked while the run lasts.
    """
    from evalsuite.runtime import resolve_device

    cards, backends = _cards(models, attention)
    shapes = list(dict.fromkeys(tuple(shape) for shape in shapes))
    baseline = baseline or next(iter(cards), None)
    _check(list(cards), shapes, baseline, rounds, amp)
    dev = resolve_device(device)
    _check_backends(cards, backends, dev)
    env = env_info()
    env["device"] = env["device"] if dev.type == "cuda" else "cpu"
    resume = {"device": env["device"], "amp": amp, "attention": attention, "seed": seed}
    if checkpoint:  # runs without it keep their earlier folder's key
        resume["checkpoint"] = True
    say = (lambda text: print(text, flush=True)) if verbose else (lambda text: None)
    out = Path(out)
    with writing(out, "bench-train", config_hash(resume), resume, outputs=(JSON_NAME,), repair=repair) as run:
        records = {key: r for key, r in run.latest().items() if r.get("status") == "ok"}
        plan = _plan(list(cards), shapes, set(records), baseline)
        if plan:
            hold = together if together is not None else _fits_together(
                [cards[n] for n in dict.fromkeys(n for todo in plan.values() for n in todo)], dev)  # fmt: skip
            say(f"{len(plan)} shape(s); the models " + ("held together, timed interleaved" if hold else
                "built one at a time, timed in turn"))  # fmt: skip
            context = {"baseline": baseline, "interleaved": hold, "amp": amp, "checkpoint": checkpoint, "seed": seed,
                       "weights": f"random (seed {seed})", "env": env}  # fmt: skip
            done = set(records)

            def emit(card, shape, fields, samples, base) -> None:
                rec = _record(card, shape, fields, samples, base, {**context, "attention": backends[card.name]})
                if rec["key"] in done:  # the baseline timed again beside new pairs keeps its record
                    return
                records[rec["key"]] = rec
                run.append(rec)
                _save(out, records, env)
                ratio = f", {rec['ratio_to_baseline']:.3f}x {baseline}" if "ratio_to_baseline" in rec else ""
                what = f"{rec['tokens_per_s']:,.0f} tokens/s{ratio}" if rec["status"] == "ok" else rec["status"]
                say(f"{card.name} {shape_name(shape)}: {what}")

            settings = _Settings(dev, backends, checkpoint, amp, seed, rounds, say)
            (_run_together if hold else _run_alone)(plan, cards, settings, emit)
        _save(out, records, env)
        return list(records.values())


def format_markdown(records: list[dict], env: dict) -> str:
    """One table: per model and shape, tokens/s, ms/step, the ratio to the baseline, peak memory, parameters."""
    lines = [f"# Training throughput\n\n{env.get('device')}, torch {env.get('torch')}, commit "
             f"{env.get('git_commit')}. Tokens/s and ms/step: median (p20-p80) over rounds; ratio: median [p20-p80] "
             "of each round's tokens/s over the baseline's in the same round.", "",
             "| model | shape | params | tokens/s | ms/step | ratio to baseline | peak GiB | timed | status |",
             "|---|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for r in sorted(records, key=lambda r: (r["length"], r["batch"], r["model"])):
        cells = [r["model"], shape_name((r["length"], r["batch"])), f"{r['params'] / 1e6:.1f}M"]
        if r["status"] == "ok":
            ratio = f"{ratio_text(r, 'ratio_to_baseline')} {r['baseline']}" if "ratio_to_baseline" in r else "-"
            cells += [f"{r['tokens_per_s']:,.0f} ({r['tokens_per_s_p20']:,.0f}-{r['tokens_per_s_p80']:,.0f})",
                      f"{r['ms_per_step']:.1f}", ratio,
                      f"{r['peak_memory_gib']:.2f}" if "peak_memory_gib" in r else "-",
                      f"{r['rounds']} rounds" + (", interleaved" if r["interleaved"] else ", alone")]  # fmt: skip
        else:
            cells += ["-"] * 5
        lines.append("| " + " | ".join(cells + [r["status"][:60]]) + " |")
    return "\n".join(lines) + "\n"


def _save(out: Path, records: dict[str, dict], env: dict) -> None:
    values = list(records.values())
    atomic_write_json(out / JSON_NAME, {"env": env, "records": values})
    atomic_write_bytes(out / MD_NAME, format_markdown(values, env))
