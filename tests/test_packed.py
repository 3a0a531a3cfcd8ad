"""evalsuite/models/packed.py: several linear maps of one input as one GEMM over rows of a shared buffer,
and the FoX step that uses it: same outputs, no copied weights, and a model that still trains and saves."""

import pytest
import torch
from torch import nn

from evalsuite.cards import load_card
from evalsuite.models.checkpoint import load_checkpoint, save_checkpoint
from evalsuite.models.packed import PackedLinears
from evalsuite.training.train import build_model


def _linears():
    torch.manual_seed(0)
    return {"a": nn.Linear(8, 5, bias=False), "b": nn.Linear(8, 3, bias=True), "c": nn.Linear(8, 2, bias=False)}


def test_one_gemm_gives_each_maps_output_without_copying_weights():
    maps = _linears()
    x = torch.randn(2, 4, 8)
    expected = {name: lin(x) for name, lin in maps.items()}
    before = {name: (lin.weight.detach().clone(), lin.weight) for name, lin in maps.items()}
    packed = PackedLinears(maps)
    got = packed(x)
    assert list(got) == ["a", "b", "c"]
    for name in maps:
        torch.testing.assert_close(got[name], expected[name])
        value, param = before[name]
        assert maps[name].weight is param and torch.equal(param, value)  # the same Parameter, the same values
    assert packed.weight.shape == (10, 8) and packed.intact()
    assert maps["b"].weight.data_ptr() == packed.weight[5].data_ptr()  # rows of the buffer, not a copy
    assert maps["b"].bias.data_ptr() == packed.bias[5].data_ptr() and torch.equal(packed.bias[:5], torch.zeros(5))


def test_new_storage_is_noticed_and_stacked_again():
    maps = _linears()
    packed = PackedLinears(maps)
    module = nn.ModuleDict(maps).to(torch.float64)  # .to() gives every parameter storage of its own
    assert not packed.intact()
    packed.ensure()
    x = torch.randn(3, 8, dtype=torch.float64)
    assert packed.intact() and packed.weight.dtype == torch.float64
    for name, out in packed(x).items():
        torch.testing.assert_close(out, module[name](x))


def test_packed_in_inference_mode_the_model_still_trains():
    maps = _linears()
    module = nn.ModuleDict(maps)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    with torch.inference_mode():
        packed = PackedLinears(maps)
    x = torch.randn(4, 8)
    loss = sum(lin(x).square().sum() for lin in maps.values())
    loss.backward()  # the parameters are not inference tensors
    opt.step()  # the optimizer's Parameters are the modules' own: the update lands in the stacked buffer
    assert packed.intact()
    for name, out in packed(x).items():
        torch.testing.assert_close(out, maps[name](x))


def test_fox_pro_step_packed_equals_unpacked_and_saves(tmp_path):
    card = load_card("fox-pro-tiny")
    model = build_model(card, seed=0).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))

    def greedy(decoder_model):
        dec = decoder_model.static_decoder(2, 20)
        tok = decoder_model.logits(dec.prefill(ids)).argmax(-1)
        logits = []
        for _ in range(5):
            out = decoder_model.logits(dec.step(tok[:, None]))
            logits.append(out)
            tok = out.argmax(-1)
        return torch.stack(logits)

    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        packed_logits = greedy(model)  # the static decoder packs the model
    attn = model.blocks[0].attn
    assert attn.step_pack is not None and attn.step_pack.intact() and model.blocks[0].mlp.step_pack.intact()
    assert set(attn.step_pack.linears) == {"q", "k", "k_shift", "v", "v_shift", "fgate", "ogate"}
    for block in model.blocks:  # unpacked: the step maps x with each module on its own
        block.attn.step_pack = block.mlp.step_pack = None
    model.pack_step = lambda: None
    with torch.inference_mode():
        plain_logits = greedy(model)
    torch.testing.assert_close(packed_logits, plain_logits, rtol=1e-5, atol=1e-5)
    save_checkpoint(model, tmp_path / "ckpt")  # parameters still rows of shared buffers: saved as copies
    loaded = load_checkpoint(tmp_path / "ckpt")[0]
    for key, value in state.items():
        assert torch.equal(loaded.state_dict()[key], value)


def _greedy_logits(model, ids, steps=5):
    """The static decoder's logits over ``steps`` greedy steps after a prefill of ``ids``."""
    dec = model.static_decoder(ids.shape[0], ids.shape[1] + steps + 2)
    tok = model.logits(dec.prefill(ids)).argmax(-1)
    logits = []
    for _ in range(steps):
        out = model.logits(dec.step(tok[:, None]))
        logits.append(out)
        tok = out.argmax(-1)
    return torch.stack(logits)


@pytest.mark.parametrize("card,packs", [
    ("gsa-tiny", lambda block: [block.attn.step_pack, block.mlp.step_pack]),
    ("tnl-tiny", lambda block: [block.channel_mixer.step_pack]),
])  # fmt: skip
def test_recurrent_step_packed_equals_unpacked_and_still_trains(card, packs):
    """GSA's and TNL's static decoders stack each layer's maps of one input (GSA: q, k, v, slot and output gates,
    gate and up; TNL: l1 and l2): the steps' logits equal those of the maps on their own. A one-token forward with
    gradients afterwards does not take the stack (it is not a Parameter), so every map still gets its gradient."""
    model = build_model(load_card(card), seed=0).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        packed_logits = _greedy_logits(model, ids)
    assert all(p is not None and p.intact() for block in model.blocks for p in packs(block))
    saved_pack = model.pack_step
    model.pack_step = lambda: None
    for block in model.blocks:
        for module in block.modules():
            if hasattr(module, "step_pack"):
                module.step_pack = None
    with torch.inference_mode():
        plain_logits = _greedy_logits(model, ids)
    torch.testing.assert_close(packed_logits, plain_logits, rtol=1e-5, atol=1e-5)
    saved_pack()  # packed again, then a training step of one token
    model.train()
    model.logits(model(ids[:, :1])).sum().backward()
    grads = [p.grad for block in model.blocks for pack in packs(block) for lin in pack.linears.values()
             for p in lin.parameters()]  # fmt: skip
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("card", ["fox-pro-tiny", "gsa-tiny", "tnl-tiny"])
def test_decode_steps_route_every_linear_map_through_the_gemv_dispatcher(card, monkeypatch):
    """A decode step's linear maps all go through the few-row GEMV dispatcher (kernels/gemv: the Triton kernel on
    CUDA where it is faster): the stacked maps, the other maps of the layers and the LM head; the prefill's maps
    (many rows) and a training forward take the modules themselves."""
    import evalsuite.models.base as base
    import evalsuite.models.packed as packed

    calls = []

    def counting(x, weight, bias=None):
        calls.append(x.shape[:-1].numel())
        return torch.nn.functional.linear(x, weight, bias)

    monkeypatch.setattr(packed, "few_row_linear", counting)
    monkeypatch.setattr(base, "few_row_linear", counting)
    model = build_model(load_card(card), seed=0).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        dec = model.static_decoder(2, 16)
        model.logits(dec.prefill(ids))
        prefill_calls = list(calls)
        calls.clear()
        model.logits(dec.step(ids[:, :1]))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    packed_away = sum(len(p.linears) - 1 for m in model.modules() if (p := getattr(m, "step_pack", None)) is not None)
    assert prefill_calls == [2]  # the head over the last positions only
    assert calls == [2] * (linears - packed_away + (1 if model.cfg.tie_word_embeddings else 0))
    calls.clear()
    model.train()
    model.logits(model(ids[:, :1])).sum().backward()  # one token with gradients: the layers' modules themselves;
    assert calls == [2]  # the head asks the dispatcher, which leaves a gradient to F.linear
