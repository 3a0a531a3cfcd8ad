"""The GSA and TNL families: reference twins agree with each other (and the spec's formulas), released checkpoint
layouts load (and fail with one line naming what is missing), decay schedules and LRPE behave as specified.

The Triton kernels are tested against these references in test_gated_slot_kernels.py / test_lightning_kernels.py;
every family contract (cached decoding, padding, state size, backends) runs in test_contracts.py.
"""

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from evalsuite.errors import UserError
from evalsuite.kernels.gated_slot import gsa_chunked, gsa_parallel, gsa_recurrent
from evalsuite.kernels.lightning import lightning_chunked, lightning_parallel, lightning_recurrent
from evalsuite.models.checkpoint import load_checkpoint
from evalsuite.models.gsa import GSAConfig, GSAForCausalLM
from evalsuite.models.tnl import TNLConfig, TransNormerLLM, alibi_slopes, decay_slopes


def _gsa_inputs(T=45, B=2, H=2, dk=8, dv=6, m=5, gate_scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=g, dtype=torch.float64) for d in (dk, dk, dv))
    log_alpha = torch.nn.functional.logsigmoid(torch.randn(B, T, H, m, generator=g, dtype=torch.float64) * gate_scale)
    return q, k, v, log_alpha


# -- reference twins -----------------------------------------------------------------------------------------------


def test_gsa_references_agree_and_carry_state():
    q, k, v, la = _gsa_inputs()
    rec, (hk, hv) = gsa_recurrent(q, k, v, la, 0.5, output_final_state=True)
    chunked, (hk2, hv2) = gsa_chunked(q, k, v, la, 0.5, output_final_state=True, chunk=16)
    torch.testing.assert_close(chunked.double(), rec.double())
    torch.testing.assert_close(gsa_parallel(q, k, v, la, 0.5), rec.double(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close((hk2, hv2), (hk, hv))
    # a split run continues from the state: prefix (chunked) + suffix (recurrent) == whole
    a, state = gsa_chunked(q[:, :20], k[:, :20], v[:, :20], la[:, :20], 0.5, output_final_state=True, chunk=16)
    b, _ = gsa_recurrent(q[:, 20:], k[:, 20:], v[:, 20:], la[:, 20:], 0.5, initial_state=state)
    torch.testing.assert_close(torch.cat([a, b], 1).double(), rec.double())


def test_gsa_chunked_gradients_match_the_token_loop():
    leaves = [t.requires_grad_() for t in _gsa_inputs(T=21)]
    grads = []
    for fn in (gsa_recurrent, lambda *a: gsa_chunked(*a, chunk=8)):
        out, _ = fn(*leaves, 0.7)
        grads.append(torch.autograd.grad((out * torch.linspace(-1, 1, out.shape[-1])).sum(), leaves))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gsa_strong_gates_are_exact(dtype):
    """Chunks whose gates decay past e^-60 take the pairwise path (exp(-b) would overflow); others factor."""
    q, k, v, la = (t.to(dtype) for t in _gsa_inputs(T=48, gate_scale=1.0))
    la = la.clone()
    la[:, 16:32] -= 30.0  # the middle chunk of 16: alpha ~ e^-30 per token
    out, _ = gsa_chunked(q, k, v, la, 1.0, chunk=16)
    ref, _ = gsa_recurrent(q, k, v, la, 1.0)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_gsa_chunked_saturated_gates_in_float32():
    """log alpha down to -1000 in float32 (a trained gate's saturated slots): output and gradients within 2e-5 of the
    float64 token loop. Without the clamp at -20 the decays after the saturated rows are differences of cumsums near
    -16000 (rounding 1e-3): 6e-5 on the output, 5e-4 on the log-gate gradient."""
    q, k, v, la = (t.float() for t in _gsa_inputs(T=70, dk=16, dv=32, m=16))
    la[:, 3:12] = -1000.0
    la[:, 40:] = torch.where(
        torch.rand(la[:, 40:].shape, generator=torch.Generator().manual_seed(1)) < 0.3, -40.0, la[:, 40:]
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v, la)]
    out, _ = gsa_chunked(*leaves, 0.5)
    weights = torch.linspace(-1, 1, out.shape[-1])
    got = torch.autograd.grad((out * weights).sum(), leaves)
    ref_leaves = [t.double().requires_grad_() for t in (q, k, v, la)]
    ref, _ = gsa_recurrent(*ref_leaves, 0.5)
    want = torch.autograd.grad((ref * weights.double()).sum(), ref_leaves)
    for a, b in zip((out, *got), (ref, *want), strict=True):
        assert torch.isfinite(a).all()
        assert ((a.double() - b).norm() / b.norm()).item() < 2e-5


def test_lightning_references_agree_and_carry_state():
    q, k, v, _ = _gsa_inputs(T=70)
    slope = torch.tensor([0.0, 3.0])  # no decay, strong decay
    rec, kv = lightning_recurrent(q, k, v, slope, output_final_state=True)
    chunked, kv2 = lightning_chunked(q, k, v, slope, output_final_state=True, block=16)
    torch.testing.assert_close(chunked.double(), rec.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lightning_parallel(q, k, v, slope), rec.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kv2, kv, rtol=1e-5, atol=1e-5)
    a, state = lightning_chunked(q[:, :33], k[:, :33], v[:, :33], slope, output_final_state=True, block=16)
    b, _ = lightning_recurrent(q[:, 33:], k[:, 33:], v[:, 33:], slope, initial_state=state)
    torch.testing.assert_close(torch.cat([a, b], 1).double(), rec.double(), rtol=1e-5, atol=1e-5)


# -- TNL decay schedules and LRPE ----------------------------------------------------------------------------------


def test_decay_schedules_match_the_spec_table():
    """H = 32, L = 30 (TransNormerLLM-7B's shape): the code schedule's lambda for head 1/32 at layer 0 is
    0.4313/0.99610 and ~1 at the last layer; eq. 10 read literally gives 0.779 and 3.4e-4 at layer 0."""
    code = TNLConfig(num_heads=32, num_layers=30, hidden_size=2048)
    lam = torch.exp(-decay_slopes(code, 0))
    assert lam[0].item() == pytest.approx(0.4313, abs=1e-4) and lam[-1].item() == pytest.approx(0.99610, abs=1e-5)
    assert torch.exp(-decay_slopes(code, 29)).min().item() > 1 - 1e-5
    paper = TNLConfig(num_heads=32, num_layers=30, hidden_size=2048, decay_schedule="paper")
    lam = torch.exp(-decay_slopes(paper, 0))
    assert lam[0].item() == pytest.approx(0.779, abs=1e-3) and lam[-1].item() == pytest.approx(3.4e-4, rel=0.02)
    assert alibi_slopes(8) == [2 ** (-(i + 1)) for i in range(8)]
    assert len(alibi_slopes(12)) == 12 and alibi_slopes(12)[:8] == alibi_slopes(8)


@torch.no_grad()
def test_lrpe_sees_only_relative_positions():
    """LRPE's score q_n.k_m depends on n - m (eq. 9): shifting every position by a constant changes nothing."""
    model = TransNormerLLM(TNLConfig(vocab_size=50, hidden_size=32, num_layers=1, num_heads=4, glu_dim=32))
    model.init_weights(3)
    mixer = model.blocks[0].token_mixer
    assert mixer.use_lrpe
    x = torch.randn(2, 19, 32)
    pos = torch.arange(19)[None].expand(2, 19)
    out, _ = mixer(x, pos)
    shifted, _ = mixer(x, pos + 1000)
    torch.testing.assert_close(shifted, out, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        mixer.lrpe_theta.mul_(3.0)  # a different theta does change the output: the test can fail
    assert not torch.allclose(mixer(x, pos)[0], out, atol=1e-4)


# -- released checkpoint layouts -----------------------------------------------------------------------------------


def _write(dirpath, config, state):
    dirpath.mkdir(parents=True)
    (dirpath / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in state.items()}, str(dirpath / "model.safetensors"))
    return dirpath


def _gsa_release(model: GSAForCausalLM, legacy: bool) -> tuple[dict, dict]:
    """``model`` in fla's tensor names (legacy: norms inside attn/mlp and a fused gate/up projection)."""
    cfg = model.cfg
    config = {
        "model_type": "gsa",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_heads": cfg.num_heads,
        "num_slots": cfg.num_slots,
        "gate_logit_normalizer": cfg.gate_logit_normalizer,
        "vocab_size": cfg.vocab_size,
        "norm_eps": cfg.norm_eps,
        "expand_k": 1,
        "expand_v": 1,
        "hidden_ratio": 4,
        "feature_map": "swish",
        "use_output_gate": False,
        "use_norm": True,
        "tie_word_embeddings": False,
        "use_short_conv": False,
        "norm_first": legacy,
    }
    ours = model.state_dict()
    state = {
        "model.embeddings.weight": ours["embed.weight"],
        "model.norm.weight": ours["norm.weight"],
        "lm_head.weight": ours["lm_head.weight"],
    }
    for i in range(cfg.num_layers):
        src, dst = f"blocks.{i}.", f"model.layers.{i}."
        state[dst + ("attn.norm.weight" if legacy else "attn_norm.weight")] = ours[src + "attn_norm.weight"]
        state[dst + ("mlp.norm.weight" if legacy else "mlp_norm.weight")] = ours[src + "mlp_norm.weight"]
        for name in ("q_proj", "k_proj", "v_proj", "f_proj", "o_proj", "g_norm"):
            state[f"{dst}attn.{name}.weight"] = ours[f"{src}attn.{name}.weight"]
        gate, up = ours[src + "mlp.gate_proj.weight"], ours[src + "mlp.up_proj.weight"]
        if legacy:
            state[dst + "mlp.gate_proj.weight"] = torch.cat([gate, up])
        else:
            state[dst + "mlp.gate_proj.weight"], state[dst + "mlp.up_proj.weight"] = gate, up
        state[dst + "mlp.down_proj.weight"] = ours[src + "mlp.down_proj.weight"]
    return config, state


def _perturbed(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model.eval()


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy", "current"])
def test_fla_gsa_layouts_load(tmp_path, legacy):
    model = GSAForCausalLM(GSAConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=2, num_slots=8))
    model.init_weights(5)
    model = _perturbed(model)
    config, state = _gsa_release(model, legacy)
    loaded, layout = load_checkpoint(_write(tmp_path / "gsa", config, state))
    assert layout == "fla-gsa" and loaded.cfg.scale == 1.0 and loaded.cfg.intermediate_size == model.cfg.mlp_size
    ids = torch.randint(0, 61, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.logits(loaded(ids)), model.logits(model(ids)), rtol=0, atol=0)


def test_partial_fla_gsa_layout_names_the_missing_keys(tmp_path):
    model = GSAForCausalLM(GSAConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=2, num_slots=8))
    config, state = _gsa_release(model, legacy=False)
    del state["model.layers.1.attn.f_proj.weight"], state["model.layers.0.mlp.up_proj.weight"]
    with pytest.raises(
        UserError,
        match=r"missing tensor\(s\) model\.layers\.0\.mlp\.up_proj\.weight, "
        r"model\.layers\.1\.attn\.f_proj\.weight",
    ):
        load_checkpoint(_write(tmp_path / "gsa", config, state))
    config["use_short_conv"] = True
    with pytest.raises(UserError, match="use_short_conv"):
        load_checkpoint(_write(tmp_path / "gsa-conv", config, state))


def _tnl_release(model: TransNormerLLM, with_theta: bool) -> tuple[dict, dict]:
    cfg = model.cfg
    config = {
        "model_type": "transnormer",
        "architectures": ["TransnormerForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "decoder_embed_dim": cfg.hidden_size,
        "decoder_layers": cfg.num_layers,
        "decoder_attention_heads": cfg.num_heads,
        "hidden_dim": cfg.inner_dim,
        "glu_dim": cfg.glu_dim,
        "linear_use_lrpe_list": [int(i in cfg.lrpe_layers) for i in range(cfg.num_layers)],
        "linear_act_fun": "swish",
        "no_scale_embedding": False,
        "norm_type": "simplermsnorm",
        "bias": False,
    }
    ours = model.state_dict()
    state = {
        "model.embed_tokens.weight": ours["embed.weight"],
        "lm_head.weight": ours["embed.weight"].clone(),
    }  # HF ties it: the file copy is ignored
    for i in range(cfg.num_layers):
        for part in (
            "token_mixer.qkvu_proj",
            "token_mixer.out_proj",
            "channel_mixer.l1",
            "channel_mixer.l2",
            "channel_mixer.l3",
        ):
            state[f"model.layers.{i}.{part}.weight"] = ours[f"blocks.{i}.{part}.weight"]
        if with_theta and i in cfg.lrpe_layers:
            state[f"model.layers.{i}.token_mixer.lrpe.theta"] = ours[f"blocks.{i}.token_mixer.lrpe_theta"]
    return config, state


@pytest.mark.parametrize("with_theta", [True, False], ids=["theta-param", "theta-init"])
def test_transnormer_layout_loads(tmp_path, with_theta):
    model = TransNormerLLM(TNLConfig(vocab_size=61, hidden_size=32, num_layers=3, num_heads=4, glu_dim=48))
    model.init_weights(2)
    if with_theta:  # a trained theta differs from its init, and must be the one used
        with torch.no_grad():
            model.blocks[0].token_mixer.lrpe_theta.mul_(1.5)
    config, state = _tnl_release(model, with_theta)
    loaded, layout = load_checkpoint(_write(tmp_path / "tnl", config, state))
    assert layout == "transnormer" and loaded.cfg.lrpe_layers == [0] and loaded.cfg.decay_schedule == "code"
    ids = torch.randint(0, 61, (2, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded.logits(loaded(ids)), model.logits(model(ids)), rtol=0, atol=0)


def test_partial_transnormer_layout_names_the_missing_keys(tmp_path):
    model = TransNormerLLM(TNLConfig(vocab_size=61, hidden_size=32, num_layers=2, num_heads=4, glu_dim=48))
    config, state = _tnl_release(model, with_theta=False)
    del state["model.layers.1.channel_mixer.l2.weight"]
    with pytest.raises(UserError, match=r"missing tensor\(s\) model\.layers\.1\.channel_mixer\.l2\.weight$"):
        load_checkpoint(_write(tmp_path / "tnl", config, state))
    config["gate_dim"] = 16
    with pytest.raises(UserError, match="gate_dim"):
        load_checkpoint(_write(tmp_path / "tnl3", config, state))


def test_recurrent_state_is_flat_in_context_length():
    """The state is constant in context length: bytes at 1K and 64K are equal, and equal the spec's 2 m d per
    layer for GSA (128 L d at m = 64: arXiv:2409.07146 App. C) in float32."""
    gsa = GSAForCausalLM(GSAConfig(hidden_size=2048, num_layers=24, num_heads=4, num_slots=64, vocab_size=10))
    sizes = [gsa.decode_state_size(n, torch.bfloat16) for n in (1024, 65536)]
    assert sizes[0] == sizes[1] and sizes[0]["elements"] == 128 * 24 * 2048 and sizes[0]["kind"] == "recurrent"
    tnl = TransNormerLLM(TNLConfig(vocab_size=10, num_layers=4))
    sizes = [tnl.decode_state_size(n, torch.bfloat16) for n in (1024, 65536)]
    hd = tnl.cfg.head_dim
    assert sizes[0] == sizes[1] and sizes[0]["elements"] == tnl.cfg.num_heads * hd * hd * (4 + 1)  # LRPE doubles dk
    assert math.isclose(sizes[0]["bytes"], 4 * sizes[0]["elements"])


def test_release_card_uses_the_checkpoints_own_tokenizer(tmp_path, monkeypatch):
    """``tokenizer: checkpoint`` (the gsa-1.3b-fla card): the tokenizer.json beside the weights is used."""
    tokenizers = pytest.importorskip("tokenizers")
    from evalsuite.adapters.registry import AdapterOptions, load_adapter
    from evalsuite.generation.types import GenerationConfig

    words = ["<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(58)]
    model = GSAForCausalLM(GSAConfig(vocab_size=len(words), hidden_size=32, num_layers=2, num_heads=2, num_slots=8))
    model.init_weights(1)
    ckpt = _write(tmp_path / "gsa-release", *_gsa_release(model, legacy=True))
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.save(str(ckpt / "tokenizer.json"))
    adapter = load_adapter("native:gsa-1.3b-fla", AdapterOptions(device="cpu", checkpoint=ckpt))
    assert adapter.info.tokenizer == f"hf:{(ckpt / 'tokenizer.json').resolve()}"
    assert adapter.tokenizer.encode("w3 w5", add_bos=False) == [6, 8]
    gen = adapter.generate_until(["w1 w2 w3"], GenerationConfig(max_new_tokens=4))[0]
    assert gen.finish_reason == "length" and len(gen.text.split()) == 4
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="weights not found locally"):
        load_adapter("native:gsa-1.3b-fla", AdapterOptions(device="cpu"))


@pytest.mark.parametrize("card", ["gsa-tiny", "tnl-tiny"])
@pytest.mark.parametrize("padded", [False, True])
def test_static_decoder_steps_equal_forward_with_a_state(card, padded):
    """The recurrent static decoder (buffers allocated once, positions from the state's device counter)
    computes what forward with a state computes, step by step, with and without left padding; the state it
    leaves equals forward's."""
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card

    model = NativeAdapter(load_card(card), device="cpu").model
    ids = torch.randint(0, model.vocab_size, (2, 13), generator=torch.Generator().manual_seed(5))
    start = torch.tensor([4, 0]) if padded else None
    with torch.no_grad():
        state = model.new_state(2, 13, start)
        want = [model(ids[:, :5], state=state)[:, -1]] + [
            model(ids[:, t : t + 1], state=state)[:, -1] for t in range(5, 13)
        ]
        decoder = model.static_decoder(2, 13, start)
        got = [decoder.prefill(ids[:, :5])] + [decoder.step(ids[:, t : t + 1]) for t in range(5, 13)]
    assert not decoder.graph_safe  # CPU: the chunked reference
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=1e-6, rtol=1e-6)
    for a, b in zip(decoder.state.layers, state.layers, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert int(decoder.state.position) == decoder.state.length == 13
