"""Interleaved timing (evalsuite/bench/common.py): the providers of one shape take turns in one process, ratios are
taken round by round; the backward pass timed alone on a retained graph; and the Lightning paper's Vanilla."""

import pytest
import torch

from evalsuite.bench import common
from evalsuite.bench.linear import bench_ops
from evalsuite.bench.linear_ops import alibi_slopes, vanilla_lightning
from evalsuite.kernels.lightning import lightning_chunked, lightning_recurrent


class Clock:
    """A clock in seconds that the timed calls advance by their own cost (an input of interleaved_ms, like any
    clock), so every sample is known exactly."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_blocks_alternate_in_order_and_samples_are_per_call():
    clock, order = Clock(), []
    costs = {"a": iter([4e-3] + [2e-3] * 100), "b": iter([1e-3] * 100)}  # a's first (calibration) call is slower

    def call(name):
        def fn():
            order.append(name)
            clock.now += next(costs[name])

        return fn

    samples = common.interleaved_ms({"a": call("a"), "b": call("b")}, rounds=3, block_ms=4.0, warmup_ms=0.0,
                                    device="cpu", clock=clock)  # fmt: skip
    # one calibration call each, then per round a block of a (4 ms / 4 ms = 1 call) and of b (4 ms / 1 ms = 4 calls)
    assert order == ["a", "b"] + (["a"] + ["b"] * 4) * 3
    assert samples["a"] == pytest.approx([2.0] * 3) and samples["b"] == pytest.approx([1.0] * 3)


def test_ratio_is_the_median_of_per_round_ratios_not_the_ratio_of_medians():
    ours, peer = [1.0, 10.0, 100.0], [2.0, 5.0, 200.0]  # medians 10 / 5 = 2.0; the rounds say 0.5, 2, 0.5
    fields = common.ratio_fields("ratio_to_x", ours, peer)
    assert fields["ratio_to_x"] == pytest.approx(0.5) and fields["ratio_to_x_pairs"] == 3
    assert fields["ratio_to_x_p20"] == pytest.approx(0.5) and fields["ratio_to_x_p80"] == pytest.approx(1.4)
    assert common.ratio_text(fields, "ratio_to_x") == "0.50x [0.50-1.40]"
    assert common.ratio_text({}, "ratio_to_x") == "-"


def test_a_known_relative_cost_is_measured_with_the_real_clock():
    def spin(n):
        return lambda: sum(range(n))

    samples = common.interleaved_ms({"double": spin(40_000), "single": spin(20_000)}, rounds=9, block_ms=3.0,
                                    warmup_ms=3.0, device="cpu")  # fmt: skip
    assert [len(s) for s in samples.values()] == [9, 9]
    assert 1.4 < common.ratio_fields("r", samples["double"], samples["single"])["r"] < 2.8


def test_providers_that_fail_are_recorded_and_the_rest_timed():
    def fails(exc):
        def build():
            raise exc

        return build

    x = torch.ones(4, requires_grad=True)
    builders = {
        "ok": lambda: common.Call(lambda: (x * 2).sum().backward(), (x,), {"note": 1}),
        "missing": fails(common.Unavailable("fla not installed")),
        "full": fails(torch.OutOfMemoryError("out of memory")),
        "broken": fails(ValueError("bad shape")),
    }
    fields, samples = common.time_providers(builders, device="cpu", rounds=4, block_ms=1.0, warmup_ms=0.0)
    assert list(samples) == ["ok"] and len(samples["ok"]) == 4
    ok = fields["ok"]
    assert ok["status"] == "ok" and ok["rounds"] == 4 and ok["note"] == 1 and ok["samples_ms"] == samples["ok"]
    assert ok["ms_p20"] <= ok["ms"] <= ok["ms_p80"]
    assert fields["missing"] == {"status": "unavailable: fla not installed"}
    assert fields["full"] == {"status": "oom"}
    assert fields["broken"] == {"status": "error: ValueError: bad shape"}


def _qkv(T, B=2, H=3, D=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    return q, k, v, alibi_slopes(H).double() * 4  # steeper decays than a model's: the mask matters at T = 37


def test_vanilla_left_product_equals_the_lightning_recurrence_with_its_gradients():
    q, k, v, slope = _qkv(37)
    do = torch.randn(2, 37, 3, 8, dtype=torch.float64)
    grads = []
    for op in (vanilla_lightning, lambda *a: lightning_recurrent(*a)[0]):
        out = op(q, k, v, slope)
        grads.append((out.detach(), *torch.autograd.grad(out, (q, k, v), do)))
    for ours, ref in zip(*grads, strict=True):
        torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-10)


def test_backward_call_repeats_the_backward_of_one_forward():
    q, k, v, slope = _qkv(40)
    do = torch.randn(2, 40, 3, 8, dtype=torch.float64)
    call = common.backward_call(lambda: lightning_chunked(q, k, v, slope)[0], (q, k, v), do, "cpu")
    first, again = call.fn(), call.fn()  # the graph is retained: a second backward runs on the same saved tensors
    fresh = torch.autograd.grad(lightning_recurrent(q, k, v, slope)[0], (q, k, v), do)
    for a, b, c in zip(first, again, fresh, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, c, rtol=1e-10, atol=1e-10)
    assert q.grad is None and call.fields == {}  # nothing accumulated; memory is recorded on CUDA only


def test_bwd_mode_times_each_provider_interleaved():
    runs = [("lightning", "lightning_chunked"), ("sdpa", "sdpa_flash"), ("lightning", "lightning_vanilla")]
    records = bench_ops(runs, "bwd", 64, n_heads=2, head_dim=16, batch=3, dtype=torch.float32, device="cpu",
                        rounds=3, block_ms=1.0, warmup=0)  # fmt: skip
    assert [(r["provider"], r["status"], r["B"], r["rounds"]) for r in records] == [
        (p, "ok", 3, 3) for _, p in runs
    ]  # fmt: skip
    assert all(r["ms"] > 0 and r["tokens_per_s"] == pytest.approx(3 * 64 / (r["ms"] * 1e-3)) for r in records)


def test_attention_group_interleaves_our_kernel_with_sdpa(monkeypatch):
    """Our FoX kernel (interpreted on a CPU) against SDPA at one tiny shape: both timed in the same rounds, ratios per
    round, fla recorded as unavailable where it does not import."""
    pytest.importorskip("triton")
    from evalsuite.bench import attention

    monkeypatch.setattr(attention, "fla_op", lambda name: None)  # as on a machine without fla
    providers = ("fox_triton", "sdpa_causal", "fla_forgetting")
    records = attention.bench_group(providers, 32, 16, "fwd", n_heads=2, tokens_per_call=64, dtype=torch.bfloat16,
                                    rounds=2, block_ms=1.0, device="cpu")  # fmt: skip
    fox, sdpa, fla = records
    assert (fox["status"], sdpa["status"], fla["status"]) == ("ok", "ok", "unavailable")
    assert fox["B"] == 2 and fox["rounds"] == sdpa["rounds"] == fox["ratio_to_sdpa_pairs"] == 2
    assert fox["ratio_to_sdpa_p20"] <= fox["ratio_to_sdpa"] <= fox["ratio_to_sdpa_p80"] and "ratio_to_fla" not in fox
    assert sdpa["ratio_to_sdpa"] == 1.0
    table = attention.format_table(records)
    assert f"({fox['ratio_to_sdpa']:.2f}x [" in table and "unavailable" in table
