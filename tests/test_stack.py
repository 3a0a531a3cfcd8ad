"""Cells trained together as one stacked model (evalsuite/training/stack.py, train_stack.py, tasks/mqar/stack.py):
each cell of a stack follows the same cell trained alone, step by step (losses, gradient norms, weights), a finished
cell stops changing, and an MQAR sweep with stacking writes the records it writes without."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from evalsuite.cards import architecture_card
from evalsuite.errors import UserError
from evalsuite.runs.store import config_hash
from evalsuite.tasks.mqar import MQARSweep, cell_config, run_mqar, sweep_cells
from evalsuite.tasks.mqar.stack import Unit, plan_units, snapshot_name, stack_groups, unit_handler
from evalsuite.training.stack import StackedAdamW, StackedModel, StackStep
from evalsuite.training.train import TrainConfig, build_model, gathered_cross_entropy, lr_at, make_optimizer
from evalsuite.training.train_stack import train_stack
from evalsuite.training.train_step import EagerStep

VOCAB, B, T, LABELS = 64, 4, 24, 4
CELLS = ((1e-3, 0), (3e-3, 1), (1e-2, 0))  # (lr, init seed): two rates at one seed, one rate at two seeds
LOSS = functools.partial(gathered_cross_entropy, labels_per_row=LABELS)
STEPS, FROZEN, FREEZE_AT = 6, 1, 3  # cell FROZEN finishes after step FREEZE_AT


def _tiny(arch: str, seed: int):
    overrides = dict(vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=2, use_mlp=False,
                     tie_word_embeddings=True, **({"num_slots": 8} if arch == "gsa" else {}))  # fmt: skip
    return build_model(architecture_card(arch), overrides, seed=seed)


def _batches(steps: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[steps, cells, B, T]`` inputs and labels, each cell its own rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (steps, len(CELLS), B, T), generator=g)
    y = torch.full_like(x, -100)
    y[..., T - 2 * LABELS :: 2] = torch.randint(0, VOCAB, (steps, len(CELLS), B, LABELS), generator=g)
    return x, y


@pytest.mark.parametrize(
    "arch, decay_all", [("fox-pro", False), ("transformer-llama", True), ("tnl", False), ("gsa", True)]
)
def test_stacked_steps_follow_each_cell_alone(arch, decay_all):
    """Three cells (two learning rates, two seeds) under a warmup schedule, clipping and AdamW: after every step each
    cell of the stack has the loss, gradient norm and weights of the cell trained alone (float32 summation order
    aside); a cell finished after step FREEZE_AT (learning rate 0) keeps its weights exactly while the others go
    on."""
    configs = [TrainConfig(lr=lr, max_steps=STEPS, warmup_steps=2, grad_clip=0.5, decay_all_params=decay_all)
               for lr, _ in CELLS]  # fmt: skip
    alone = [_tiny(arch, seed) for _, seed in CELLS]
    steppers = [EagerStep(m, make_optimizer(m, c), LOSS, 0.5, None) for m, c in zip(alone, configs, strict=True)]
    stack = StackedModel([_tiny(arch, seed) for _, seed in CELLS], LOSS)
    optimizer = StackedAdamW(stack, [c.lr for c in configs], weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8,
                             decay_dims=0 if decay_all else 2)  # fmt: skip
    stepper = StackStep(stack, optimizer, lambda s, x, y: s(x, y), 0.5, None)
    x, y = _batches(STEPS)
    for t in range(STEPS):
        running = [c for c in range(len(CELLS)) if not (c == FROZEN and t >= FREEZE_AT)]
        if t == FREEZE_AT:
            frozen = [p[FROZEN].clone() for p in stack.stacked]
        for c in running:
            steppers[c](x[t, c], y[t, c], lr_at(t, configs[c]))
        lrs = [lr_at(t, cfg) if c in running else 0.0 for c, cfg in enumerate(configs)]
        stepper(x[t], y[t], torch.tensor(lrs))
        for c in running:
            assert stepper.loss_sum[c].item() == pytest.approx(steppers[c].loss_sum.item(), rel=1e-5)
            assert stepper.grad_norm[c].item() == pytest.approx(steppers[c].grad_norm.item(), rel=1e-4)
            for name, p in zip(stack.names, stack.stacked, strict=True):
                torch.testing.assert_close(p[c], alone[c].get_parameter(name), rtol=1e-4, atol=3e-5)
            steppers[c].loss_sum.zero_()
        stepper.loss_sum.zero_()
    assert all(torch.equal(p[FROZEN], f) for p, f in zip(stack.stacked, frozen, strict=True))


def test_stack_refuses_what_it_cannot_stack():
    a, b = _tiny("fox-pro", 0), _tiny("fox-pro", 1)
    for model, value in ((a, 0.0), (b, 1.0)):  # a fixed table that differs per model (a FoX "fixed" gate's, say)
        model.register_buffer("table", torch.full((2,), value))
    with pytest.raises(UserError, match="buffer"):
        StackedModel([a, b], LOSS)
    with pytest.raises(UserError, match="but the learning rate"):
        train_stack([a, a], [iter(()), iter(())], [TrainConfig(lr=1e-3), TrainConfig(lr=1e-3, grad_clip=None)])


# ------------------------------------------------------------------------------------------------ MQAR


SWEEP = dict(models=["transformer-llama"], d_models=[32], seq_lens=[16], num_kv_pairs=[2], lrs=[1e-4, 1e-2],
             seeds=[1, 2], num_layers=2, head_dim=16, vocab_size=32, num_train=256, num_test=64, batch_size=32,
             eval_batch_size=64, max_steps=50, warmup_steps=5, eval_every=10, early_stop=0.42, tie_head=True,
             cpu_threads=1)  # fmt: skip


def _records(path) -> dict[str, dict]:
    return {r["key"]: r for r in map(json.loads, (path / "records.jsonl").read_text().splitlines())}


def test_stacked_sweep_writes_the_records_of_cells_alone(tmp_path):
    """Four cells (two rates x two seeds) of one model: stacked, they write the records they write alone (same keys
    and fields, close values); the cell at lr 1e-2, seed 1 stops early at step 30 while the others train on."""
    sweep = MQARSweep(**SWEEP)
    run_mqar(sweep, tmp_path / "alone", device="cpu", progress=False)
    out = run_mqar(sweep, tmp_path / "stacked", device="cpu", progress=False, stack=True)
    assert out["summary"]["cells"]["finished"] == 4 and not out["summary"]["errors"]
    alone, stacked = _records(tmp_path / "alone"), _records(tmp_path / "stacked")
    assert alone.keys() == stacked.keys()
    for key, a in alone.items():
        s = stacked[key]
        assert set(a) == set(s) and set(a["provenance"]) == set(s["provenance"]) - {"stack"}
        assert s["provenance"]["stack"] == 4 and a["config"] == s["config"]
        assert (a["steps"], a["stopped_early"], a["value"]) == (s["steps"], s["stopped_early"], s["value"])
        assert s["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)
        assert [h["step"] for h in a["history"]] == [h["step"] for h in s["history"]]
        assert [h["loss"] for h in s["history"]] == pytest.approx([h["loss"] for h in a["history"]], rel=1e-4)
    assert sorted((r["lr"], r["seed"], r["steps"]) for r in alone.values() if r["stopped_early"]) == [(1e-2, 1, 30)]


def test_stack_groups_and_units():
    """Cells stack by everything but learning rate and seed, at most ``size`` a stack; a stack cut short resumes
    with the cells its snapshot holds, those that wrote their records since retrained unreported."""
    sweep = MQARSweep(**{**SWEEP, "d_models": [16, 32], "variants": {"fp32": {"amp": "none"}}})
    cells = sweep_cells(sweep)
    configs = [cell_config(sweep, c) for c in cells]
    groups = stack_groups(configs, 3)
    assert sorted(map(len, groups)) == [1, 1, 1, 1, 3, 3, 3, 3]  # 4 (width, variant) pairs x 4 (lr, seed) cells
    for group in groups:
        assert len({(cells[i].d_model, cells[i].variant) for i in group}) == 1
    hashes = [config_hash(c) for c in configs]
    units = plan_units(sweep, cells, hashes, set(range(len(cells))), 3, None)
    assert [members for members, _ in units] == [tuple(g) for g in groups]
    assert plan_units(sweep, cells, hashes, {0, 1}, 1, None) == [((0,), Unit((cells[0],), (True,))),
                                                                  ((1,), Unit((cells[1],), (True,)))]  # fmt: skip


def test_a_stack_cut_short_resumes_from_its_snapshot(tmp_path):
    """A stack snapshots itself (here at every log step) under ``<run>/partial/stack-<hash>.pt``; cut short, the
    rerun's units take the snapshot's cells (one of them recorded meanwhile: retrained, not reported) and end with
    the uninterrupted stack's records; the snapshot goes."""
    sweep = MQARSweep(**{**SWEEP, "max_steps": 20, "early_stop": None, "seeds": None})
    cells = sweep_cells(sweep)
    hashes = [config_hash(cell_config(sweep, c)) for c in cells]
    partial = tmp_path / "partial"
    unit = Unit(tuple(cells), (True, True), snapshot_name(hashes))
    want = []
    unit_handler(sweep.to_dict(), "cpu", "auto")(unit, lambda r: isinstance(r, dict) and want.append(r))
    want.sort(key=lambda r: hashes.index(r["key"]))
    handler = unit_handler(sweep.to_dict(), "cpu", "auto", snapshot_dir=str(partial), snapshot_every_s=0.0)
    steps = []

    def cut_at_20(n):  # before the last step's log: the snapshot is the one of step 10's evaluation
        steps.append(n)
        if sum(steps) == 20 * len(cells):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        handler(unit, cut_at_20)
    assert sorted(p.name for p in partial.iterdir()) == [unit.snapshot.replace(".pt", ".json"), unit.snapshot]
    [(members, resumed)] = plan_units(sweep, cells, hashes, {1}, 8, partial)  # cell 0 recorded since
    assert members == (0, 1) and resumed.emit == (False, True)
    got = []
    assert handler(resumed, lambda r: isinstance(r, dict) and got.append(r)) == []
    [got] = got
    assert not list(partial.iterdir()) and got["key"] == want[1]["key"]
    assert [h["loss"] for h in got["history"]] == [h["loss"] for h in want[1]["history"]]
    assert got["value"] == want[1]["value"]


def test_cli_stack(tmp_path, run_cli):
    sizes = ["num_train=64", "num_test=16", "batch_size=16", "eval_batch_size=16", "check_accuracy=null"]
    args = ["mqar", "--preset", "ci", "--models", "transformer-llama", "--d-model", "16", "--seq-len", "16",
            "--kv-pairs", "2", "--lr", "1e-3,1e-2", "--layers", "1", "--max-steps", "2", "--device", "cpu", "--stack",
            "--out", tmp_path / "run", "--no-report", *(a for s in sizes for a in ("--set", s))]  # fmt: skip
    code, out, err = run_cli(args, tmp_path)
    assert code == 0, err
    records = _records(tmp_path / "run")
    assert len(records) == 2 and {r["provenance"]["stack"] for r in records.values()} == {2}
