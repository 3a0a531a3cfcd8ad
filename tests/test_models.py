"""The four FoX-paper architectures: dense-reference parity, cached decoding, gate variants, sizes."""

import functools
import math

import pytest
import torch

from evalsuite.cards import count_params, load_card
from evalsuite.errors import UserError
from evalsuite.kernels import forgetting
from evalsuite.kernels.forgetting import reference
from evalsuite.models.fox import ARCHITECTURES, ForgettingTransformer, FoxConfig, decay_time_bias

ARCHS = list(ARCHITECTURES)


def tiny(arch: str, perturb: bool = True, **over) -> ForgettingTransformer:
    cfg = FoxConfig.from_dict(
        {**ARCHITECTURES[arch], "vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4, **over}
    )
    model = ForgettingTransformer(cfg)
    model.init_weights(seed=1)
    with torch.no_grad():  # make gates and norms non-trivial so every path matters
        for name, p in model.named_parameters() if perturb else ():
            if name.endswith(("norm.weight", "bias")):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model.eval()


def explicit_attention(q, k, v, log_f):
    """The paper's formula with D_ij = sum_{l=j+1..i} log f_l spelled out term by term (no cumsum)."""
    B, T, H, D = q.shape
    i = torch.arange(T)[:, None, None]
    j = torch.arange(T)[None, :, None]
    l = torch.arange(T)[None, None, :]  # noqa: E741
    between = ((l > j) & (l <= i)).double()  # [T, T, T]
    bias = torch.zeros(B, H, T, T, dtype=torch.float64)
    if log_f is not None:
        bias = torch.einsum("ijl,blh->bhij", between, log_f.double())
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) / math.sqrt(D) + bias
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, -1), v.double())


@pytest.mark.parametrize("gated", [True, False])
def test_dense_reference_matches_explicit_formula(gated):
    g = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 23, 3, 8
    q, k, v = (torch.randn(B, T, H, D, generator=g, dtype=torch.float64) for _ in range(3))
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g, dtype=torch.float64)) if gated else None
    cum = None if log_f is None else log_f.cumsum(1)
    ref = explicit_attention(q, k, v, log_f)
    torch.testing.assert_close(reference.attention_dense(q, k, v, cum, cum), ref, rtol=1e-10, atol=1e-10)
    blocked = reference.attention_blocked(q, k, v, cum, cum, block=4)  # several query blocks
    torch.testing.assert_close(blocked, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("arch", ARCHS)
def test_memory_efficient_model_matches_dense_softmax(arch, monkeypatch):
    """Whole model, fp32: the blocked attention path equals the dense-matrix path to 1e-5."""
    model = tiny(arch)
    ids = torch.randint(0, 97, (2, 70), generator=torch.Generator().manual_seed(2))
    model.set_attention_backend("dense")
    dense = model.logits(model(ids))
    # 16-row query blocks: the attention the model's reference backend calls, with an explicit block
    monkeypatch.setattr(forgetting, "attention_blocked", functools.partial(reference.attention_blocked, block=16))
    model.set_attention_backend("reference")
    blocked = model.logits(model(ids))
    torch.testing.assert_close(blocked, dense, rtol=1e-5, atol=1e-5)


def test_sdpa_backend_is_plain_causal_attention_and_refused_with_a_gate():
    """``"sdpa"``: ungated full-sequence calls through PyTorch's SDPA equal the dense softmax; calls it has no form
    for (cached keys, padding) take the auto backend; a gated model refuses it in one line."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 19, 3, 8, generator=g, dtype=torch.float64) for _ in range(3))
    dense = reference.attention_dense(q, k, v)
    torch.testing.assert_close(forgetting.attention(q, k, v, backend="sdpa"), dense, rtol=1e-10, atol=1e-10)
    tail = forgetting.attention(q[:, -5:], k, v, backend="sdpa")  # cached keys: auto (the blocked reference)
    torch.testing.assert_close(tail, dense[:, -5:], rtol=1e-10, atol=1e-10)

    model = tiny("transformer-llama").double()
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(2))
    want = model.logits(model(ids))
    model.set_attention_backend("sdpa")
    torch.testing.assert_close(model.logits(model(ids)), want, rtol=1e-9, atol=1e-9)
    with pytest.raises(UserError, match="no forget gate"):
        tiny("fox-llama").set_attention_backend("sdpa")


def test_forget_gate_decays_attention_to_the_past():
    """With f -> 0 every query can only see itself; with no gate it sees all of its past."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 6, 1, 4, generator=g) for _ in range(3))
    cum = torch.full((1, 6, 1), -1e4).cumsum(1)
    out = reference.attention_dense(q, k, v, cum, cum)
    torch.testing.assert_close(out, v, rtol=1e-5, atol=1e-5)


def test_decay_time_init_matches_appendix_d():
    """(T_min, T_max) = (2, 128) with 4 heads gives T = (2, 8, 32, 128) and sigmoid(b)^T = 1/e."""
    b = decay_time_bias(4, 2.0, 128.0).double()
    torch.testing.assert_close(
        b, torch.tensor([0.4328, 2.0163, 3.4501, 4.8481], dtype=torch.float64), atol=1e-4, rtol=0
    )
    T = torch.tensor([2.0, 8.0, 32.0, 128.0], dtype=torch.float64)
    torch.testing.assert_close(torch.sigmoid(b) ** T, torch.full((4,), math.exp(-1), dtype=torch.float64))


def test_full_gate_bias_init():
    """The full gate's bias b_f starts at the Appendix D time scales when asked (zero by default, the paper's);
    T_min == T_max gives one constant bias; a model without a gate refuses the option."""
    assert tiny("fox-pro", perturb=False).blocks[0].attn.fgate_proj.bias.abs().max() == 0
    model = tiny("fox-pro", perturb=False, decay_time_min=32.0, decay_time_max=1024.0)
    for block in model.blocks:
        torch.testing.assert_close(block.attn.fgate_proj.bias.detach(), decay_time_bias(4, 32.0, 1024.0))
    x = torch.zeros(1, 3, 32)  # w_f.x = 0: the gate is sigmoid(b_f), so each head forgets 1/e over its T
    T = torch.exp(torch.linspace(math.log(32.0), math.log(1024.0), 4))
    torch.testing.assert_close(model.blocks[0].attn.log_forget(x)[0, 0] * T, torch.full((4,), -1.0))
    const = tiny("fox-llama", perturb=False, decay_time_min=149.0, decay_time_max=149.0)
    assert torch.allclose(const.blocks[1].attn.fgate_proj.bias, const.blocks[1].attn.fgate_proj.bias[0])
    with pytest.raises(ValueError, match="has none"):
        FoxConfig(fgate_type="none", decay_time_min=2.0, decay_time_max=8.0)
    with pytest.raises(ValueError, match="both"):
        FoxConfig(decay_time_min=2.0)


@pytest.mark.parametrize("kind", ["bias_only", "fixed"])
def test_data_independent_gates(kind):
    model = tiny("fox-llama", perturb=False, fgate_type=kind, decay_time_min=2.0, decay_time_max=64.0)
    attn = model.blocks[0].attn
    torch.testing.assert_close(attn.fgate_bias, decay_time_bias(4, 2.0, 64.0))
    learnable = any(n.endswith("fgate_bias") for n, _ in model.named_parameters())
    assert learnable == (kind == "bias_only")  # "fixed" is a buffer: ALiBi-equivalent
    assert "blocks.0.attn.fgate_bias" in model.state_dict()
    x = torch.randn(1, 5, 32)
    log_f = attn.log_forget(x)
    assert log_f.shape == (1, 5, 4) and torch.allclose(log_f[0, 0], log_f[0, 4])  # same every step
    ids = torch.randint(0, 97, (1, 12))
    cache = model.new_state(1, 12)
    steps = torch.cat(
        [model(ids[:, :6], state=cache)] + [model(ids[:, t : t + 1], state=cache) for t in range(6, 12)], 1
    )
    torch.testing.assert_close(steps, model(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name, millions",
    [("fox-pro", 759.44), ("transformer-pro", 757.67), ("fox-llama", 757.63), ("transformer-llama", 756.75)],
)
def test_paper_cards_have_the_paper_sizes(name, millions):
    """Non-embedding parameters of the 760M cards (FoX Table 6, as derived in fox.md)."""
    assert count_params(load_card(name)) / 1e6 == pytest.approx(millions, abs=0.01)


def test_mlp_sizes_follow_the_official_rounding():
    for d, ratio, size in [(1536, 4, 4096), (1536, 3.5, 3584), (1024, 4, 2816), (1024, 3.5, 2560), (768, 3.5, 1792)]:
        assert FoxConfig(hidden_size=d, num_heads=8, hidden_ratio=ratio).mlp_size == size


def test_attention_only_blocks():
    model = tiny("fox-pro", use_mlp=False)
    assert not any("mlp" in name for name in model.state_dict())
    ids = torch.randint(0, 97, (1, 9))
    cache = model.new_state(1, 9)
    steps = torch.cat(
        [model(ids[:, :4], state=cache)] + [model(ids[:, t : t + 1], state=cache) for t in range(4, 9)], 1
    )
    torch.testing.assert_close(steps, model(ids), rtol=1e-5, atol=1e-5)


def test_forgetting_attention_takes_autocast_dtype():
    """Under autocast the attention entry point hands its kernels q, k, v in the autocast dtype, as autocast does for
    a matmul (FoX's Triton kernel takes bf16/fp16 only)."""
    from evalsuite.kernels.forgetting import attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 2, 16, generator=gen) for _ in range(3))
    cum = -torch.rand(1, 8, 2, generator=gen).cumsum(1)
    exact = attention(q, k, v, cum, cum, backend="reference")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = attention(q, k, v, cum, cum, backend="reference")
    assert exact.dtype == torch.float32 and cast.dtype == torch.bfloat16
    assert (cast.float() - exact).abs().max() < 3e-2


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("padded", [False, True])
def test_static_decoder_steps_equal_cached_forward(arch, padded):
    """The graph-safe step (device-side cache length, in-place writes) computes what forward with the
    KV cache computes, position by position, with and without left padding; its state's bytes agree too."""
    model = tiny(arch)
    ids = torch.randint(0, 97, (2, 14), generator=torch.Generator().manual_seed(4))
    start = torch.tensor([0, 3]) if padded else None
    prompt, new = 6, 8
    with torch.no_grad():
        cache = model.new_state(2, prompt + new, start)
        want = [model(ids[:, :prompt], state=cache)[:, -1]]
        want += [model(ids[:, t : t + 1], state=cache)[:, -1] for t in range(prompt, prompt + new)]
        decoder = model.static_decoder(2, prompt + new, start)
        got = [decoder.prefill(ids[:, :prompt])]
        got += [decoder.step(ids[:, t : t + 1]) for t in range(prompt, prompt + new)]
    assert not decoder.graph_safe  # CPU: the reference attention slices the cache on the host
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-6, rtol=1e-6)
    assert int(decoder.length) == decoder.state.length == prompt + new and decoder.state.nbytes() == cache.nbytes()


@pytest.mark.parametrize(
    "name",
    ["fox-pro-tiny", "fox-llama-tiny", "transformer-pro-tiny", "transformer-llama-tiny", "gsa-tiny", "tnl-tiny",
     "drt-tiny", "fox-pro-timescale-init"],
)  # fmt: skip
def test_skipping_torch_default_init_leaves_the_same_weights(name):
    """build_module skips torch's random default init (start-up time); init_weights must fill every tensor itself,
    so the weights equal those of a module built with the default init first."""
    card = load_card(name)
    if name == "fox-pro-timescale-init":  # the 760M shapes: a small width keeps the test fast
        card = card.with_config({"hidden_size": 64, "num_layers": 2, "num_heads": 2})
    fast = card.build_module()
    torch.manual_seed(123)  # the default init draws from the global RNG: any seed must give the same result
    slow = card.family.build(card.model_config())
    fast.init_weights(3)
    slow.init_weights(3)
    slow_state = slow.state_dict()
    for key, tensor in fast.state_dict().items():
        assert torch.equal(tensor, slow_state[key]), key


def test_builds_in_threads_leave_torch_init_intact():
    """skip_random_init patches torch.nn.init process-wide; concurrent builds (MQAR cells in threads) must not
    leave the no-op fillers behind."""
    import threading

    originals = {name: getattr(torch.nn.init, name) for name in ("normal_", "uniform_", "kaiming_uniform_")}
    card = load_card("fox-pro-tiny")
    threads = [threading.Thread(target=card.build_module) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(getattr(torch.nn.init, name) is fn for name, fn in originals.items())
    assert torch.nn.Linear(64, 64).weight.abs().max() > 0  # the default init draws again
