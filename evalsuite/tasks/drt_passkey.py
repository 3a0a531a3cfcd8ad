"""The DRT paper's token-level passkey tests (Grouped Cross Attention, arXiv:2410.01651, §4.2-4.3), teacher-forced.

**2-hop** (§4.3, the default ``kind``):

Six values of 5 random token ids; needles ``|DEF<v_a>-><v_b>|`` for the chain v0->v1->v2 and the distractor
chain v3->v4->v5, shuffled and inserted at sorted random positions of an L-token haystack window (L a multiple
of 64); the query ``|The path from<v0>is<v1>,<v2>`` is placed so that "is" starts the last 64-token chunk.
Scoring is teacher-forced: one forward pass, argmax at each answer position (:func:`drt_scores`). ``accuracy``
is DRT's rule (the greedy token at the last answer position), ``answer_token_acc`` the share of the 11 answer
tokens predicted right, ``answer_exact`` all of them.

**Passkey** (§4.2, ``kind="passkey"``): a passkey of 5 random token ids; the needle ``|The passkey is:<key>|`` at a
uniform position at least two chunks before the end; the question ``|What is the passkey? The passkey is<key>``
placed so that "is" starts the last 64-token chunk. ``accuracy`` is DRT's rule here: the greedy token at the first
passkey position (the released evaluator checks that one token); ``answer_exact`` all five.

Our deviations: seeded generators instead of DRT's global ones, and a BOS-first tokenizer keeps BOS at
position 0 (needles go after it). Records keep the NIAH shape (task ``niah``, subtask ``2hop-drt`` or
``passkey-drt``) so the NIAH heatmaps and tables show them; the run directory is
``results/runs/niah/<model>-<subtask>-<hash>``. The command is ``evalsuite passkey --kind 2hop|passkey``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from evalsuite.adapters.base import TOKENS, TokenAdapter
from evalsuite.data.haystack import SYNTHETIC, Haystack, LastHaystack, haystack_identity
from evalsuite.data.passkey import DrtSample, drt_sample, passkey_sample
from evalsuite.errors import UserError
from evalsuite.metrics.cells import cell_means, within_beyond
from evalsuite.runs.rundir import RunDir
from evalsuite.tasks.base import RUNS_ROOT, Item, ItemTask, Plan, register_task
from evalsuite.tasks.niah.grid import Cell, cells_by_length, items_by_length, preset_for, split_by_max_length
from evalsuite.tasks.runner import run_task

SUBTASKS = {"2hop": "2hop-drt", "passkey": "passkey-drt"}


def drt_scores(adapter: TokenAdapter, samples: Sequence[DrtSample]) -> list[dict]:
    """Teacher-forced scores of same-length samples, one forward pass for the batch.

    Per sample: ``accuracy`` (DRT's rule: the greedy token at the sample's ``scored`` answer position is right),
    ``answer_token_acc`` (fraction of the answer's tokens predicted right), ``answer_exact`` (all of them),
    and the predicted answer ids.
    """
    T = len(samples[0].input_ids)
    if any(len(s.input_ids) != T for s in samples):
        raise ValueError("drt_scores needs samples of one length")
    ids = torch.tensor([s.input_ids for s in samples], dtype=torch.long)
    pred = adapter.token_argmax(ids[:, :-1])  # pred[:, t] predicts ids[:, t + 1]
    out = []
    for b, s in enumerate(samples):
        lo, hi = s.answer_start, s.answer_start + s.answer_len
        guess = pred[b, lo - 1 : hi - 1].tolist()
        truth = s.input_ids[lo:hi]
        hits = [int(g == t) for g, t in zip(guess, truth, strict=True)]
        out.append(
            {
                "accuracy": hits[s.scored],
                "answer_token_acc": sum(hits) / len(hits),
                "answer_exact": int(all(hits)),
                "predicted_ids": guess,
                "answer_ids": truth,
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------


@dataclass
class DrtConfig:
    """One DRT passkey run. ``None`` fields come from the preset's ``drt`` section (tasks/niah.yaml)."""

    preset: str | None = None  # cpu | fox; None: cpu on a CPU device, fox otherwise
    lengths: list[int] | None = None  # multiples of 64
    samples: int | None = None  # per length
    haystack: str = SYNTHETIC
    batch_size: int = 4
    seed: int = 0
    kind: str = "2hop"  # 2hop (§4.3) | passkey (§4.2)

    def __post_init__(self):
        if self.kind not in SUBTASKS:
            raise UserError(f"unknown DRT test {self.kind!r}; choose from {', '.join(SUBTASKS)}")
        if self.lengths and min(int(x) for x in self.lengths) < 1:
            raise UserError("DRT passkey lengths must be positive token counts")
        if (self.samples is not None and self.samples < 1) or self.batch_size < 1:
            raise UserError("--samples and --batch-size must be at least 1")


@dataclass(frozen=True, kw_only=True)
class DrtPlan(Plan):
    """The test resolved for one model: the preset's name, the records' subtask, the cells the model can take
    (lengths x samples) and notes on the lengths ``skipped`` beyond its max_length."""

    preset: str
    subtask: str
    lengths: list[int]
    samples: int
    cells: list[Cell]
    skipped: list[dict]


@register_task
class DrtPasskeyTask(ItemTask):
    """Teacher-forced DRT 2-hop or passkey test over lengths x samples (needs token-level access)."""

    name = "drt-passkey"
    command = "passkey"
    needs = frozenset({TOKENS})
    Config = DrtConfig

    def __init__(self, config: DrtConfig | None = None):
        super().__init__(config)
        self._haystack = LastHaystack()  # a cache of the haystack built last (seconds for long windows)

    def prepare(self, adapter: TokenAdapter) -> DrtPlan:
        config = self.config
        preset, spec = preset_for(config.preset, adapter.device.type)
        lengths = sorted({int(x) for x in (config.lengths or spec["drt"]["lengths"])})
        samples = config.samples if config.samples is not None else int(spec["drt"].get("samples", 1))
        cells = [Cell(L, None, s) for L in lengths for s in range(samples)]
        cells, skipped = split_by_max_length(cells, adapter.max_length, adapter.name)
        hashed = {
            "lengths": lengths,
            "samples": samples,
            "haystack": haystack_identity(config.haystack, config.seed),
            "seed": config.seed,
            **({"kind": config.kind} if config.kind != "2hop" else {}),  # 2-hop runs keep their hashes
        }
        return DrtPlan(config=hashed, preset=preset, subtask=SUBTASKS[config.kind], lengths=lengths, samples=samples,
                       cells=cells, skipped=skipped)  # fmt: skip

    def default_dir(self, plan: DrtPlan, adapter: TokenAdapter, chash: str) -> Path:
        return RUNS_ROOT / "niah" / f"{adapter.name}-{plan.subtask}-{chash}"

    def items(self, plan: DrtPlan, adapter: TokenAdapter) -> list[Item]:
        return [Item((c.key(plan.subtask),), c) for c in plan.cells]

    def batches(self, plan: DrtPlan, adapter: TokenAdapter, items: Sequence[Item]) -> list[list[Item]]:
        """The cells :meth:`evaluate` scores in one forward pass: up to ``batch_size`` of one length."""
        return items_by_length(items, self.config.batch_size)

    def evaluate(self, plan: DrtPlan, adapter: TokenAdapter, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        if not items:
            return
        # one haystack window per sample
        haystack = self._haystack.get(self.config.haystack, adapter.tokenizer, max(plan.lengths) * plan.samples,
                                      self.config.seed)  # fmt: skip
        for batch in cells_by_length([it.data for it in items], self.config.batch_size):
            yield from self._records(plan, adapter, batch, haystack, run.config_hash)

    def _records(self, plan: DrtPlan, adapter: TokenAdapter, cells: list[Cell], haystack: Haystack, chash: str):
        """Teacher-forced samples for a batch of same-length cells: one forward pass."""
        tok, length = adapter.tokenizer, cells[0].length
        samples = []
        for cell in cells:
            rng = np.random.default_rng([self.config.seed, length, cell.sample])
            # Non-overlapping haystack windows, one per sample (wrapping around a short haystack), BOS kept first.
            window = haystack.ids[: haystack.n_prefix] + haystack.tokens(
                cell.sample * length, length - haystack.n_prefix
            )
            build = passkey_sample if self.config.kind == "passkey" else drt_sample
            samples.append(build(window, tok, rng, keep_prefix=haystack.n_prefix))
        for cell, sample, scores in zip(cells, samples, drt_scores(adapter, samples), strict=True):
            yield {
                "key": cell.key(plan.subtask),
                "task": "niah",
                "subtask": plan.subtask,
                "length": length,
                "depth": None,
                "sample": cell.sample,
                "prompt_sha256": hashlib.sha256(json.dumps(sample.input_ids).encode()).hexdigest(),
                "prompt_tokens": len(sample.input_ids),
                "prediction": scores.pop("predicted_ids"),
                "answer": scores.pop("answer_ids"),
                "scores": scores,
                "judge": None,
                "needle_starts": sample.needle_starts,
                "query_start": sample.query_start,
                "answer_start": sample.answer_start,
                "config_hash": chash,
            }

    def aggregate(self, plan: DrtPlan, rows: list[dict], adapter: TokenAdapter, run: RunDir) -> tuple[list, dict]:
        records = cell_means(rows, adapter.name)
        summary = {
            "label": plan.subtask,
            "preset": plan.preset,
            "skipped": plan.skipped,
            "within_beyond": within_beyond(records, adapter.train_length),
        }
        return records, summary


def run_drt_passkey(adapter: TokenAdapter, config: DrtConfig, out_dir=None, progress: bool = True) -> dict:
    """Run or resume the DRT passkey; returns ``results.json``'s content."""
    return run_task(DrtPasskeyTask(config), adapter, out_dir, progress)
