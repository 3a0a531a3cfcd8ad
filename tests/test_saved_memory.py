"""`bench saved-memory`: the tensors a training step keeps for the backward, counted by storage and attributed to
the module that saved them (evalsuite/bench/saved_memory.py)."""

import json

import torch
from torch import nn

from evalsuite.bench.saved_memory import full_depth_bytes, saved_storages


def test_a_linear_under_autocast_keeps_its_bf16_input_and_weight_copy():
    """nn.Linear under bf16 autocast saves its input cast to bf16 (B·T·d_in·2 bytes) and the bf16 copy of its
    weight; the fp32 parameter itself is held memory and is not counted."""
    model = nn.Sequential(nn.Linear(16, 8))
    x = torch.randn(3, 5, 16, requires_grad=True)

    def run():
        with torch.autocast("cpu", torch.bfloat16):
            model(x).sum()

    found = saved_storages(model, run)
    assert sorted(s["bytes"] for s in found) == sorted([3 * 5 * 16 * 2, 8 * 16 * 2])
    assert {s["module_class"] for s in found} == {"Linear"} and {s["dtype"] for s in found} == {"bfloat16"}
    assert {s["module"] for s in found} == {"0"}


def test_one_storage_saved_twice_or_through_views_counts_once():
    class Square(nn.Module):
        def forward(self, x):
            return (x * x).sum() + (x[:, :2] * x[:, 2:4]).sum()  # x saved twice, then two views of it

    x = torch.randn(4, 6, requires_grad=True)
    model = Square()
    found = saved_storages(model, lambda: model(x).sum())
    assert [s["bytes"] for s in found] == [4 * 6 * 4] and found[0]["module_class"] == "Square"


def test_cli_writes_per_token_bytes_that_scale_with_depth(run_cli, tmp_path):
    args = ["bench", "saved-memory", "--model", "transformer-llama-tiny", "--lengths", "16,32", "--tokens", "1000",
            "--device", "cpu", "--out", "sm"]  # fmt: skip
    code, out, err = run_cli(args, tmp_path)
    assert code == 0, err
    doc = json.loads((tmp_path / "sm" / "saved_memory.json").read_text())
    (result,) = doc["results"]
    assert result["layers"] == 1 and result["card_layers"] == 2 and doc["provenance"]
    per_layer = sum(r["bytes_per_token"] for r in result["rows"] if r["per_layer"])
    once = sum(r["bytes_per_token"] for r in result["rows"] if not r["per_layer"])
    assert per_layer > 0 and full_depth_bytes(result, 1000) == 1000 * (2 * per_layer + once)
    linear = [r for r in result["rows"] if r["group"] == "Linear (bfloat16)" and r["per_layer"]]
    assert linear and linear[0]["bytes_per_token"] > 0
    assert "| **total** |" in (tmp_path / "sm" / "saved_memory.md").read_text()
