"""What makes a long loss window fast, on CPU: the padded LM head of many-row logits, token NLL without the argmax,
the adapters' compiled forward and loss (``--compile``), and ``evalsuite bench loss-window``."""

import dataclasses
import json

import pytest
import torch
from conftest import assert_one_line_error

from evalsuite.adapters.native import NativeAdapter
from evalsuite.bench.loss_window import bench_loss_window, kernel_group, parse_model, window_flops
from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.models.base import HEAD_ROWS_MULTIPLE

IDS = torch.randint(0, 50257, (2, 97), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("card", ["fox-pro-tiny", "tnl-tiny"])  # an untied head and a tied one
def test_padded_head_gives_the_unpadded_logits(card):
    adapter = NativeAdapter(load_card(card), device="cpu", dtype="bfloat16")
    model = adapter.model
    vocab, padded = model.vocab_size, model.head_padded
    assert padded.shape[0] % HEAD_ROWS_MULTIPLE == 0 and padded.shape[0] - vocab < HEAD_ROWS_MULTIPLE
    assert not padded[vocab:].any()
    head = model.head_cast if model.cfg.tie_word_embeddings else model.lm_head.weight
    assert head.data_ptr() == padded.data_ptr() and head.shape[0] == vocab  # the head is the storage's first rows
    with torch.no_grad(), adapter._autocast():
        hidden = model(IDS)
        chunks = list(model.chunked_logits(hidden, budget=3 * 2 * padded.shape[0]))  # chunks of 3 positions
        whole = model.logits(hidden)
    assert [s for s, _ in chunks] == list(range(0, 97, 3))
    logits = torch.cat([lg for _, lg in chunks], 1)
    assert logits.shape == (2, 97, vocab)
    torch.testing.assert_close(logits.float(), whole.float(), rtol=0, atol=1e-2)


def test_a_head_already_aligned_is_not_copied():
    card = load_card("fox-pro-tiny")
    card = dataclasses.replace(card, config={**card.config, "vocab_size": 393 * HEAD_ROWS_MULTIPLE})  # >= GPT-2's
    adapter = NativeAdapter(card, device="cpu", dtype="bfloat16")
    assert adapter.model.head_padded is None and adapter.model.head_cast is None


def test_token_nll_skips_the_argmax_and_equals_token_scores():
    adapter = NativeAdapter(load_card("fox-pro-tiny"), device="cpu")
    nll, none = adapter.token_scores(IDS[:, :-1], IDS[:, 1:], argmax=False)
    assert none is None
    full, argmax = adapter.token_scores(IDS[:, :-1], IDS[:, 1:])
    assert torch.equal(nll, full) and torch.equal(adapter.token_nll(IDS[:, :-1], IDS[:, 1:]), nll)
    assert argmax.shape == (2, 96) and torch.equal(adapter.token_argmax(IDS[:, :-1]), argmax)


def test_loss_with_compile_matches_eager(tmp_path, run_cli):
    """``evalsuite loss --compile`` (the forward and each chunk's loss through torch.compile) gives the eager run's
    curve up to float rounding, and says so in its provenance."""
    runs = {}
    for flag in ("--no-compile", "--compile"):
        args = ["loss", "--model", "fox-pro-tiny", "--device", "cpu", "--length", "64", "--max-docs", "1", "--out"]
        code, _, err = run_cli([*args, flag.strip("-"), flag, "--no-plot"], tmp_path)
        assert code == 0, err
        runs[flag] = json.loads((tmp_path / flag.strip("-") / "results.json").read_text())
    assert runs["--compile"]["provenance"]["compile"] is True
    assert runs["--no-compile"]["provenance"]["compile"] is False
    for a, b in zip(runs["--compile"]["records"], runs["--no-compile"]["records"], strict=True):
        assert a["metric"] == b["metric"] and a["value"] == pytest.approx(b["value"], rel=1e-4)


def test_model_specs_groups_and_flops():
    assert parse_model("fox-pro") == ("fox-pro", "auto") and parse_model("transformer-pro:sdpa")[1] == "sdpa"
    with pytest.raises(UserError):
        parse_model(":sdpa")
    assert kernel_group("_fwd_kernel") == kernel_group("pytorch_flash::flash_fwd_kernel") == "attention"
    assert kernel_group("nvjet_sm90_tst_192x192_64x4_2x1_v_bz_coopB_TNN") == kernel_group("aten::mm") == "gemm"
    assert kernel_group("triton_poi_fused_mul_silu_8") == "other"
    model = load_card("fox-pro-tiny").build_module()
    cfg = model.cfg
    linear, attention = window_flops(model, batch=2, length=100)
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linear == 2.0 * weights * 200 and attention == 2.0 * 2 * 100**2 * cfg.hidden_size * cfg.num_layers
    assert window_flops(load_card("tnl-tiny").build_module(), 1, 100)[1] is None


def test_bench_loss_window_on_cpu(tmp_path):
    records = bench_loss_window(tmp_path, ["fox-pro-tiny", "fox-pro-tiny:dense", "tnl-tiny"], length=64, rounds=2,
                                device="cpu")  # fmt: skip
    assert [(r["model"], r["backend"], r["compile"]) for r in records] == [
        ("fox-pro-tiny", "auto", False), ("fox-pro-tiny", "dense", False), ("tnl-tiny", "auto", False)]  # fmt: skip
    for r in records:
        assert len(r["seconds"]) == 2 and r["seconds_min"] <= r["seconds_median"] <= r["seconds_max"]
        groups, device_ms = r["profile"]["group_ms"], r["profile"]["device_ms"]
        assert sum(groups.values()) == pytest.approx(device_ms) and groups["gemm"] > 0
        assert r["tokens_per_s"] == pytest.approx(64 / r["seconds_median"]) and r["git_commit"] is not None
    assert records[2]["attention_tflop"] is None and records[0]["attention_tflop"] > 0
    saved = json.loads((tmp_path / "loss_window.json").read_text())
    assert [r["seconds"] for r in saved] == [r["seconds"] for r in records]
    table = (tmp_path / "loss_window.md").read_text()
    assert table.count("| fox-pro-tiny |") == 2 and "## tnl-tiny (auto)" in table


@pytest.mark.parametrize(
    "args, message",
    [
        (["--compile", "sometimes"], "--compile takes off, on, both"),
        (["--models", "fox-pro-tiny:flash"], "attention backend 'flash' is not offered"),
        (["--length", "100000"], "100000"),
    ],
)
def test_bench_loss_window_errors(tmp_path, run_cli, args, message):
    base = ["bench", "loss-window", "--device", "cpu", "--length", "32", "--models", "fox-pro-tiny", "--out", "o"]
    code, _, err = run_cli([*base, *args], tmp_path)
    assert_one_line_error(code, err, message)
