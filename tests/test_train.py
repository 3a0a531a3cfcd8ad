"""The general training loop: schedule, loss, accuracy, early stop, divergence, determinism, model builder."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.cards import ModelCard, architecture_card, load_card
from evalsuite.errors import UserError
from evalsuite.training.train import (
    TrainConfig,
    build_model,
    fixed_batches,
    gathered_cross_entropy,
    lr_at,
    make_optimizer,
    masked_accuracy,
    masked_cross_entropy,
    shuffled_batches,
    train,
)


def tiny_card(arch: str = "transformer-llama") -> ModelCard:
    return architecture_card(arch)


TINY = dict(vocab_size=32, hidden_size=16, num_layers=1, num_heads=2, use_mlp=False)


def test_schedule_warmup_then_cosine_to_floor():
    cfg = TrainConfig(lr=1e-2, max_steps=100, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(100)]
    assert lrs[0] == pytest.approx(1e-3) and lrs[9] == pytest.approx(1e-2)  # linear warmup to the peak
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))  # cosine decays monotonically
    assert lr_at(100, cfg) == pytest.approx(1e-3)  # the floor: lr * min_lr_ratio
    mid = 10 + 45
    assert lr_at(mid, cfg) == pytest.approx(1e-3 + 0.5 * (1e-2 - 1e-3))


def test_schedule_cosine_stepped_per_epoch():
    """Zoology's schedule: CosineAnnealingLR(T_max=64) stepped once per epoch -- constant within an epoch."""
    cfg = TrainConfig(lr=1e-3, max_steps=10_000, schedule="epoch-cosine", steps_per_epoch=100, cosine_epochs=64)
    assert lr_at(0, cfg) == lr_at(99, cfg) == pytest.approx(1e-3)
    assert lr_at(100, cfg) == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi / 64)))
    assert lr_at(32 * 100 + 5, cfg) == pytest.approx(0.5e-3)
    assert lr_at(64 * 100, cfg) == pytest.approx(0.0) and lr_at(9_999, cfg) == pytest.approx(0.0)
    with pytest.raises(UserError, match="steps_per_epoch"):
        TrainConfig(schedule="epoch-cosine")
    assert "schedule" not in TrainConfig().to_dict() and cfg.to_dict()["schedule"] == "epoch-cosine"


@pytest.mark.parametrize("bad", [dict(max_steps=0), dict(warmup_steps=11, max_steps=10), dict(amp="fp8"), dict(lr=0),
                                 dict(schedule="linear"), dict(cosine_epochs=0)])  # fmt: skip
def test_config_errors(bad):
    with pytest.raises(UserError):
        TrainConfig(**bad)


class Lookup(nn.Module):
    """A model whose logits are a fixed table lookup of the input ids (hidden = one-hot)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, ids):  # [B, T] -> [B, T, V]
        return F.one_hot(ids, self.table.shape[0]).float()

    def logits(self, hidden):
        return hidden @ self.table


def test_masked_cross_entropy_matches_full_logits():
    gen = torch.Generator().manual_seed(0)
    model = Lookup(torch.randn(8, 8, generator=gen))
    ids = torch.randint(0, 8, (3, 5), generator=gen)
    labels = torch.full((3, 5), -100)
    labels[0, 1], labels[2, 4], labels[2, 0] = 3, 7, 1
    full = F.cross_entropy(model.logits(model(ids)).reshape(-1, 8), labels.reshape(-1), ignore_index=-100)
    assert masked_cross_entropy(model, ids, labels).item() == pytest.approx(full.item(), rel=1e-6)


def test_gathered_cross_entropy_equals_masked():
    """The capture-safe loss (static shapes, for CUDA graphs) is the masked loss: rows with several, one or no labels,
    labels anywhere in the row; ``labels_per_row`` above the most any row has only pads with ignored positions."""
    gen = torch.Generator().manual_seed(1)
    model = Lookup(torch.randn(8, 8, generator=gen))
    ids = torch.randint(0, 8, (4, 9), generator=gen)
    labels = torch.full((4, 9), -100)
    labels[0, [0, 4, 8]] = torch.tensor([1, 2, 3])
    labels[1, 5] = 6
    labels[3, [2, 3]] = torch.tensor([0, 7])
    masked = masked_cross_entropy(model, ids, labels)
    for k in (3, 5):
        assert gathered_cross_entropy(model, ids, labels, labels_per_row=k).item() == pytest.approx(
            masked.item(), rel=1e-6
        )
    grad = torch.autograd.grad(gathered_cross_entropy(model, ids, labels, 3), model.table)[0]
    assert torch.allclose(grad, torch.autograd.grad(masked_cross_entropy(model, ids, labels), model.table)[0])


def test_masked_accuracy_is_a_mean_over_examples():
    model = Lookup(torch.eye(4))  # predicts the input token itself
    ids = torch.tensor([[0, 1, 2, 3], [0, 1, 2, 3], [3, 3, 3, 3]])
    labels = torch.tensor(
        [
            [0, -100, -100, -100],  # 1 of 1 right
            [1, 1, 2, 3],  # 3 of 4 right (position 0 predicts 0)
            [-100, -100, -100, -100],  # no labels: not counted
        ]
    )
    out = masked_accuracy(model, fixed_batches(ids, labels, 2)())
    assert out["n"] == 2
    assert out["accuracy"] == pytest.approx((1.0 + 0.75) / 2)  # per example, not per token (4/5)


def test_shuffled_batches_cover_each_epoch_once_and_repeat_by_seed():
    x = torch.arange(10)[:, None].repeat(1, 3)

    def first_epoch(seed):
        batches = shuffled_batches(x, x, 2, np.random.default_rng(seed))
        return [next(batches)[0][:, 0].tolist() for _ in range(5)]

    seen = first_epoch(1)
    assert sorted(sum(seen, [])) == list(range(10))
    assert seen == first_epoch(1) and seen != first_epoch(2)
    with pytest.raises(UserError):
        next(shuffled_batches(x, x, 11, np.random.default_rng(0)))


def test_weight_decay_only_on_matrices():
    model = build_model(tiny_card("fox-pro"), TINY, seed=0)
    groups = make_optimizer(model, TrainConfig(weight_decay=0.1)).param_groups
    assert groups[0]["weight_decay"] == 0.1 and all(p.ndim >= 2 for p in groups[0]["params"])
    assert groups[1]["weight_decay"] == 0.0 and all(p.ndim < 2 for p in groups[1]["params"])
    assert len(groups[1]["params"]) > 0  # norms and the forget-gate bias


def test_weight_decay_on_every_parameter():
    model = build_model(tiny_card("fox-pro"), TINY, seed=0)
    (group,) = make_optimizer(model, TrainConfig(weight_decay=0.1, decay_all_params=True)).param_groups
    assert group["weight_decay"] == 0.1 and len(group["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("arch", ["fox-pro", "transformer-llama", "gsa", "tnl"])
def test_tied_head(arch):
    """tie_word_embeddings: no separate head; logits = hidden @ embedding^T; the embedding learns from both ends."""
    model = build_model(tiny_card(arch), {**TINY, "tie_word_embeddings": True}, seed=0)
    assert not hasattr(model, "lm_head")
    hidden = model(torch.randint(0, 32, (2, 5)))
    torch.testing.assert_close(model.logits(hidden), hidden @ model.input_embedding.weight.T)
    model.logits(hidden[:, -1]).sum().backward()
    assert model.input_embedding.weight.grad.abs().sum() > 0
    untied = build_model(tiny_card(arch), {**TINY, "tie_word_embeddings": False}, seed=0)
    assert hasattr(untied, "lm_head")


def test_build_model_uses_card_registry_and_overrides():
    model = build_model(load_card("fox-pro-tiny"), {"vocab_size": 64, "hidden_size": 32, "use_mlp": False}, seed=3)
    assert model.cfg.vocab_size == 64 and model.cfg.hidden_size == 32 and model.cfg.num_layers == 2
    assert model.cfg.fgate_type == "full" and not hasattr(model.blocks[0], "mlp")
    same = build_model(load_card("fox-pro-tiny"), {"vocab_size": 64, "hidden_size": 32, "use_mlp": False}, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters(), strict=True))
    with pytest.raises(UserError, match=r"unknown fox config key\(s\): d_model"):
        build_model(tiny_card(), {"d_model": 32})


def successor_data(n: int, vocab: int, length: int, seed: int):
    """Label at t is (input_t + 1) mod vocab: learnable by the embedding and head alone."""
    ids = torch.from_numpy(np.random.default_rng(seed).integers(0, vocab, (n, length)))
    return ids, (ids + 1) % vocab


def test_train_learns_and_stops_early():
    model = build_model(tiny_card(), TINY, seed=0)
    x, y = successor_data(512, 32, 8, seed=0)
    tx, ty = successor_data(64, 32, 8, seed=1)
    cfg = TrainConfig(lr=3e-2, max_steps=300, warmup_steps=5, eval_every=10, early_stop=0.99, log_every=5)
    result = train(
        model,
        shuffled_batches(x, y, 32, np.random.default_rng(0)),
        cfg,
        evaluate=lambda m: masked_accuracy(m, fixed_batches(tx, ty, 64)()),
    )
    assert result.stopped_early and not result.diverged
    assert result.final_eval["accuracy"] > 0.99 and result.steps < 300 and result.steps % 10 == 0
    assert result.best_eval["accuracy"] == result.final_eval["accuracy"]
    losses = [h["loss"] for h in result.history]
    assert losses[-1] < losses[0] and all("lr" in h and "grad_norm" in h for h in result.history)
    # measured with or without clipping (Zoology's recipe clips nothing; a spike before a collapse must show)
    assert cfg.grad_clip is not None and all(h["grad_norm"] > 0 for h in result.history)
    unclipped = TrainConfig(lr=3e-2, max_steps=10, warmup_steps=5, log_every=5, grad_clip=None)
    history = train(build_model(tiny_card(), TINY, seed=0), shuffled_batches(x, y, 32, np.random.default_rng(0)),
                    unclipped).history  # fmt: skip
    assert len(history) == 2 and all(h["grad_norm"] > 0 for h in history)


def test_train_is_deterministic_on_cpu():
    def run():
        model = build_model(tiny_card("fox-llama"), TINY, seed=1)
        x, y = successor_data(128, 32, 8, seed=0)
        cfg = TrainConfig(lr=1e-2, max_steps=12, eval_every=6, log_every=3, early_stop=None)
        batches = shuffled_batches(x, y, 16, np.random.default_rng(5))
        return train(model, batches, cfg, evaluate=lambda m: masked_accuracy(m, fixed_batches(x, y, 64)()))

    a, b = run(), run()
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
    assert a.final_eval == b.final_eval and a.steps == 12 and not a.stopped_early


def test_compiled_training_follows_eager():
    """``train(compile=True)`` (torch.compile'd forward and loss; Inductor's C++ backend on CPU) trains as eager does:
    the same losses up to fused-kernel rounding."""

    def run(compile: bool):
        model = build_model(tiny_card("fox-pro"), TINY, seed=1)
        x, y = successor_data(128, 32, 8, seed=0)
        cfg = TrainConfig(lr=1e-2, max_steps=6, log_every=1, early_stop=None)
        batches = shuffled_batches(x, y, 16, np.random.default_rng(5))
        return [h["loss"] for h in train(model, batches, cfg, compile=compile).history]

    eager, compiled = run(False), run(True)
    assert compiled == pytest.approx(eager, rel=1e-4) and compiled[-1] < compiled[0]


def test_cuda_graph_needs_a_cuda_model():
    model = build_model(tiny_card(), TINY, seed=0)
    x, y = successor_data(32, 32, 8, seed=0)
    with pytest.raises(UserError, match="CUDA"):
        train(model, shuffled_batches(x, y, 16, np.random.default_rng(0)), TrainConfig(max_steps=1), cuda_graph=True)


def test_train_stops_when_loss_is_not_finite():
    model = build_model(tiny_card(), TINY, seed=0)
    x, y = successor_data(64, 32, 8, seed=0)
    calls = []

    def nan_after_three(m, inputs, labels):
        calls.append(1)
        loss = masked_cross_entropy(m, inputs, labels)
        return loss * math.nan if len(calls) > 3 else loss

    cfg = TrainConfig(lr=1e-3, max_steps=50, eval_every=100, log_every=2)
    result = train(model, shuffled_batches(x, y, 16, np.random.default_rng(0)), cfg, loss_fn=nan_after_three)
    assert result.diverged and not result.stopped_early and result.steps == 4
    assert result.final_eval is None  # no evaluate given


def test_eval_runs_after_the_last_step():
    model = build_model(tiny_card(), TINY, seed=0)
    x, y = successor_data(64, 32, 8, seed=0)
    evals = []

    def evaluate(m):
        evals.append(1)
        return {"accuracy": 0.0}

    cfg = TrainConfig(lr=1e-3, max_steps=7, eval_every=5, log_every=100)
    result = train(model, shuffled_batches(x, y, 16, np.random.default_rng(0)), cfg, evaluate=evaluate)
    assert len(evals) == 2 and result.final_eval["step"] == 7 and [h["step"] for h in result.history] == [5, 7]


def test_a_killed_run_resumes_from_its_snapshot(tmp_path):
    """A run killed after a snapshot resumes from it (model, optimizer, step, history) and ends where an
    uninterrupted run ends, bit for bit on the CPU; the snapshot is deleted when the run finishes."""
    x, y = successor_data(128, 32, 8, seed=0)
    cfg = TrainConfig(lr=1e-2, max_steps=30, warmup_steps=3, eval_every=10, log_every=5, early_stop=None)

    def run(snapshot=None, on_step=None):
        model = build_model(tiny_card("fox-llama"), TINY, seed=1)
        batches = shuffled_batches(x, y, 16, np.random.default_rng(5))
        evaluate = lambda m: masked_accuracy(m, fixed_batches(x, y, 64)())  # noqa: E731
        result = train(model, batches, cfg, evaluate=evaluate, on_step=on_step, snapshot=snapshot, snapshot_every_s=0)
        return model, result

    want_model, want = run()
    snapshot = tmp_path / "partial" / "cell.pt"

    def kill_at_17(step):
        if step == 17:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run(snapshot, kill_at_17)
    saved = torch.load(snapshot, weights_only=True)
    assert saved["result"]["steps"] == 15 and len(saved["result"]["history"]) == 3  # the last log step before 17
    model, got = run(snapshot)
    assert not snapshot.exists() and got.steps == 30 and got.final_eval == want.final_eval

    def trace(result):
        return [(h["step"], h["loss"], h["lr"], h.get("eval_accuracy")) for h in result.history]

    assert trace(got) == trace(want)
    for (name, a), b in zip(model.state_dict().items(), want_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
