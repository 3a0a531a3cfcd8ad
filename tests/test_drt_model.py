"""The DRT family (arXiv:2410.01651): landmarks, sliding-window attention, retrieval and its causality, Gumbel top-k,
gradients into the retriever, the chunk memory (prefill in pieces, offloading, sizes), segments, the released layout.
The family-wide contracts (tests/test_contracts.py) run on top of these."""

import json

import pytest
import torch
import torch.nn.functional as F

from evalsuite.errors import UserError
from evalsuite.models.checkpoint import load_checkpoint, weight_files
from evalsuite.models.drt import FAMILY, DRTConfig, sliding_window_attention, sliding_window_attention_dense
from evalsuite.models.drt.layers import drt_alibi_slopes

TINY = FAMILY.tiny  # chunks of 4 tokens + landmark, window 12, top-2, 4 layers


def build(arch="drt", seed=1, **over):
    model = FAMILY.build(FAMILY.make_config(arch, {**TINY, **over}))
    model.init_weights(seed)
    with torch.no_grad():  # non-trivial norm gains, so every norm matters
        for i, p in enumerate(model.parameters()):
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.3)
    return model.eval()


def ids_of(shape, seed=0, vocab=97):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def model():
    return build()


@pytest.fixture(scope="module")
def model_x2():
    return build("drt-x2")


def _record_retrievals(monkeypatch, model):
    calls = []
    original = model._retrieve

    def spy(g, h, c0, bank):
        r = original(g, h, c0, bank)
        calls.append((g, c0, r))
        return r

    monkeypatch.setattr(model, "_retrieve", spy)
    return calls


# -- landmarks -------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_landmarks_are_inserted_and_removed(model, monkeypatch):
    seen = []
    monkeypatch.setattr(model.embed, "forward", lambda ids: (seen.append(ids), F.embedding(ids, model.embed.weight))[1])
    lmk = model.config.landmark_id
    for T in (1, 3, 4, 5, 8, 23):
        seen.clear()
        ids = ids_of((2, T), T) % lmk  # no landmark among the inputs, so the inserted ones are easy to find
        out = model(ids)
        assert out.shape == (2, T, 32)
        (expanded,) = seen
        assert expanded.shape[1] == T + T // 4  # one landmark after every 4 tokens, none after a partial chunk
        is_lmk = expanded[0] == lmk
        assert is_lmk.nonzero().flatten().tolist() == [5 * c + 4 for c in range(T // 4)]
        assert torch.equal(expanded[:, ~is_lmk], ids)
        # the returned states are the text positions' states of the expanded run
        full = model._run(expanded, None)
        torch.testing.assert_close(out, full[:, ~is_lmk], rtol=0, atol=0)


@torch.no_grad()
def test_landmark_id_as_input_is_an_ordinary_token(model):
    ids = ids_of((1, 13), 2)
    ids[0, [2, 4, 9]] = model.config.landmark_id
    state = model.new_state(1, 13)
    steps = torch.cat([model(ids[:, t : t + 1], state=state) for t in range(13)], 1)
    torch.testing.assert_close(steps, model(ids), rtol=1e-5, atol=1e-5)


# -- sliding-window attention ----------------------------------------------------------------------------------


# (blocks at once: no past, window <= block < T; (8, 8, 0) with a partial last block) and (blocks in turn)
@pytest.mark.parametrize("window,block,past", [(3, 4, 0), (8, 8, 0), (5, 2, 7), (12, 16, 3), (40, None, 0), (1, 1, 2),
                                               (6, 4, 0)])  # fmt: skip
def test_sliding_window_matches_dense(window, block, past):
    g = torch.Generator().manual_seed(window)
    B, Tq, H, hd = 2, 19, 3, 8
    q = torch.randn(B, Tq, H, hd, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, Tq + past, H, hd, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    slopes = drt_alibi_slopes(H)
    out = sliding_window_attention(q, k, v, slopes, window, block)
    dense = sliding_window_attention_dense(q, k, v, slopes, window)
    torch.testing.assert_close(out, dense, rtol=1e-10, atol=1e-10)
    weights = torch.randn(out.shape, generator=g, dtype=torch.float64)  # the blocks' split pieces get every gradient
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
    for got, want in zip(grads, torch.autograd.grad((dense * weights).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    out, q, k, v = out.detach(), q.detach(), k.detach(), v.detach()
    # the dense form by hand: query i (position past + i) sees keys i + past - window .. i + past
    i, j = past + 4, torch.arange(Tq + past)
    bias = -slopes[0].double() * (i - j)
    bias[(i - j < 0) | (i - j > window)] = float("-inf")
    p = torch.softmax(q[0, 4, 0] @ k[0, :, 0].T / hd**0.5 + bias, -1)
    torch.testing.assert_close(out[0, 4, 0], p @ v[0, :, 0])


def test_alibi_slopes_follow_the_released_formula():
    assert drt_alibi_slopes(12).tolist() == pytest.approx([2 ** (-8 * (h + 1) / 12) for h in range(12)])


# -- retrieval -------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_later_chunks_never_change_earlier_outputs(model):
    ids = ids_of((1, 40), 5)
    base = model(ids)
    for p in (9, 17, 30):  # change token p: chunk p // 4
        other = ids.clone()
        other[0, p] = (other[0, p] + 1) % 97
        out = model(other)
        torch.testing.assert_close(out[:, :p], base[:, :p], rtol=0, atol=1e-6)
        assert (out[:, p] - base[:, p]).abs().max() > 1e-4


@torch.no_grad()
def test_retrieval_sees_only_past_chunks_and_reaches_chunks_from_two_on(model, monkeypatch):
    calls = _record_retrievals(monkeypatch, model)
    ids = ids_of((2, 40), 6)
    out = model(ids)
    ((g, c0, r),) = calls
    assert g == 0 and c0 == 0 and r.indices.shape == (2, 10, 2)
    for t in range(10):
        valid = r.weights[:, t] > 0
        assert (r.indices[:, t][valid] < t).all()
        assert int(valid[0].sum()) == min(2, t)  # top-min(k, t): chunk 0 sees nothing, chunk 1 one chunk
        assert len(set(r.indices[0, t][valid[0]].tolist())) == int(valid[0].sum())
        if t:
            torch.testing.assert_close(r.weights[:, t].sum(-1), torch.ones(2))
    # GCA output: zero for chunks 0 and 1 (tokens 0..7), present from chunk 2 on
    monkeypatch.setattr(model, "_plan", lambda *a, **k: None)
    no_gca = model(ids)
    assert torch.equal(out[:, :8], no_gca[:, :8]) and (out[:, 8:] - no_gca[:, 8:]).abs().amax(-1).min() > 0


@torch.no_grad()
def test_top_k_beyond_the_visible_chunks():
    """With top_k at least the number of past chunks every chunk takes all of them, whatever top_k is."""
    ids = ids_of((2, 36), 7)  # 9 chunks: at most 8 visible
    outs = [build(top_k=k)(ids) for k in (8, 9, 50)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-6)
    torch.testing.assert_close(outs[0], outs[2], rtol=0, atol=1e-6)
    assert (build(top_k=1)(ids) - outs[0]).abs().max() > 1e-4


@torch.no_grad()
def test_x2_groups_retrieve_with_their_own_queries(model_x2, monkeypatch):
    calls = _record_retrievals(monkeypatch, model_x2)
    model_x2(ids_of((1, 40), 8))
    assert [g for g, _, _ in calls] == [0, 1]
    assert not torch.equal(calls[0][2].weights, calls[1][2].weights)


# -- training: Gumbel top-k and gradients ------------------------------------------------------------------------


def test_gumbel_noise_only_in_training():
    model = build(top_k=1)
    ids = ids_of((2, 40), 9)
    with torch.no_grad():
        a, b = model(ids), model(ids)
        assert torch.equal(a, b)
        model.train()
        outs = []
        for seed in (0, 1, 0):
            model.gumbel_generator = torch.Generator().manual_seed(seed)
            outs.append(model(ids))
        assert torch.equal(outs[0], outs[2]) and not torch.equal(outs[0], outs[1])
        assert not torch.equal(outs[0], a)
        model.config.gumbel_noise = False
        torch.testing.assert_close(model(ids), a, rtol=0, atol=0)
    model.config.gumbel_noise = True
    model.gumbel_generator = None
    model.eval()


@pytest.mark.parametrize("arch", ["drt", "drt-x2"])
def test_gradients_reach_the_retriever(arch):
    model = build(arch).train()
    ids = ids_of((2, 41), 10)
    logits = model.logits(model(ids[:, :-1]))
    F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
    for g in range(model.config.retrieval_groups):
        assert model.lmk_norms[g].weight.grad.abs().max() > 0  # only through the fusion weights
    for p in [model.chunk_k_proj.weight, model.enc_prenorm.weight, *model.encoder.parameters()]:
        assert p.grad is not None and p.grad.abs().max() > 0


# -- the chunk memory --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("arch", ["drt", "drt-x2"])
@torch.no_grad()
def test_prefill_in_pieces_and_steps_equal_the_full_forward(arch, offload, model, model_x2):
    m = model if arch == "drt" else model_x2
    ids = ids_of((3, 47), 11)
    full = m(ids)
    state = m.new_state(3, 47, offload=offload)
    outs, t = [], 0
    for n in (3, 6, 1, 9, 2, 1, 1, 11, 5):  # pieces crossing chunk boundaries at every phase, then single steps
        outs.append(m(ids[:, t : t + n], state=state))
        t += n
    outs += [m(ids[:, s : s + 1], state=state) for s in range(t, 47)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    memory = state.groups[0].memory
    assert state.length == 47 and memory.num_chunks == 11 and memory.store.offload is offload
    assert state.nbytes() == state.device_nbytes() + state.host_nbytes()
    assert state.host_nbytes() == (memory.store.nbytes() if offload else 0) and memory.store.nbytes() > 0
    assert memory.store.k.device.type == "cpu" and memory.landmarks.device == m.embed.weight.device


@torch.no_grad()
def test_state_grows_with_chunks_while_the_window_stays_bounded(model):
    cfg = model.config
    ids = ids_of((2, 40), 12)
    state = model.new_state(2, 8)  # smaller than needed: the store grows
    sizes = []
    for t in range(40):
        model(ids[:, t : t + 1], state=state)
        memory = state.groups[0].memory
        assert all(k.shape[1] <= cfg.window for k, _ in memory.window)
        assert state.nbytes() == 2 * model.decode_state_size(t + 1, torch.float32)["bytes"]
        sizes.append(state.nbytes())
    assert memory.num_chunks == 10 and memory.positions == 50
    assert all(k.shape[1] == cfg.window for k, _ in memory.window)
    assert sizes[-1] > sizes[20] > sizes[5]
    per_chunk = (
        2 * model.decode_state_size(4 * 9, torch.float32)["bytes"]
        - 2 * model.decode_state_size(4 * 8, torch.float32)["bytes"]
    )
    assert per_chunk == 2 * 4 * (2 * 5 * 32 + 32)  # once the window is full: one chunk's k, v and landmark


@torch.no_grad()
def test_offloaded_state_keeps_only_the_store_off_device(model):
    ids = ids_of((1, 30), 13)
    on, off = model.new_state(1, 30), model.new_state(1, 30, offload=True)
    model(ids, state=on)
    model(ids, state=off)
    assert on.nbytes() == off.nbytes() and on.host_nbytes() == 0
    assert off.device_nbytes() == on.device_nbytes() - off.host_nbytes() and off.host_nbytes() > 0
    model.config.offload_chunk_memory = True
    try:
        assert model.new_state(1, 30).offload
    finally:
        model.config.offload_chunk_memory = False


@torch.no_grad()
def test_the_base_lm_is_window_layers_over_the_tokens_alone():
    """lower_layers = num_layers: the GCA paper's Base LM (Table 3), sliding-window ALiBi layers over the text tokens
    (no landmark, no chunk encoder, nothing retrieved); its decode state holds the window caches alone, and decoding
    (eager or static) equals the full forward."""
    base = build(lower_layers=TINY["num_layers"])
    assert not base.config.retrieves and len(base.upper_layers) == 0
    assert {name.split(".")[0] for name, _ in base.named_parameters()} == {"embed", "lower_layers", "norm"}
    ids = ids_of((2, 40), 14)
    full = base(ids)
    h = base.embed(ids)
    for layer in base.lower_layers:
        h, _ = layer(h, None, base.config.window)
    torch.testing.assert_close(full, base.norm(h))
    state = base.new_state(2, 40)
    outs = [base(ids[:, :17], state=state)] + [base(ids[:, t : t + 1], state=state) for t in range(17, 40)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)
    memory = state.groups[0].memory
    assert (memory.positions, memory.num_chunks, memory.partial) == (40, 0, None)
    window = 2 * TINY["num_layers"] * TINY["window"] * TINY["hidden_size"] * 4  # k and v of 12 positions, fp32
    assert state.nbytes() == 2 * base.decode_state_size(40, torch.float32)["bytes"] == 2 * window
    decoder = base.static_decoder(2, 40)
    decoder.prefill(ids[:, :17])
    steps = torch.stack([decoder.step(ids[:, t : t + 1]) for t in range(17, 40)], 1)
    torch.testing.assert_close(steps, full[:, 17:], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_long_inputs_in_segments(model):
    ids = ids_of((2, 45), 14)
    whole = model(ids)
    model.segment_length = 7
    try:
        torch.testing.assert_close(model(ids), whole, rtol=1e-5, atol=1e-5)
        state = model.new_state(2, 46, offload=True)
        prefill = model(ids[:, :44], state=state)  # a long prefill, segment by segment into the state
        stepped = torch.cat([prefill, model(ids[:, 44:], state=state)], 1)
        torch.testing.assert_close(stepped, whole, rtol=1e-5, atol=1e-5)
        with torch.enable_grad():  # training-style forwards never segment
            assert model(ids).requires_grad
    finally:
        model.segment_length = 16384


@torch.no_grad()
def test_rows_with_different_padding(model):
    seqs = [ids_of((1, n), 20 + n) for n in (33, 26, 33, 19)]
    starts = [0, 7, 0, 14]
    batch = torch.cat([torch.cat([torch.full((1, s), 3), x], 1) for s, x in zip(starts, seqs, strict=True)])
    start = torch.tensor(starts)
    out = model(batch, start=start)
    state = model.new_state(4, 40, start)
    stepped = torch.cat([model(batch[:, :20], state=state), model(batch[:, 20:], state=state)], 1)
    nxt = ids_of((4, 1), 30)
    last = model(nxt, state=state)
    assert len(state.groups) == 3
    for b, (s, x) in enumerate(zip(starts, seqs, strict=True)):
        alone = model(torch.cat([x, nxt[b : b + 1]], 1))
        torch.testing.assert_close(out[b, s:], alone[0, :-1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(stepped[b, s:], alone[0, :-1], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(last[b, 0], alone[0, -1], rtol=1e-5, atol=1e-5)


# -- config ------------------------------------------------------------------------------------------------------


def test_config_defaults_and_validation():
    cfg = DRTConfig()
    assert (cfg.landmark_id, cfg.lower_layers, cfg.upper_layers, cfg.chunk_kv_rows) == (50264, 6, 6, 64)
    assert FAMILY.make_config("drt-x2").retrieval_groups == 2
    mqar = FAMILY.make_config("drt-x2", dict(vocab_size=64, hidden_size=64, num_layers=4, num_heads=1,
                                             use_mlp=False, tie_word_embeddings=False))  # fmt: skip
    assert mqar.landmark_id == 63
    model = FAMILY.build(mqar)
    model.init_weights(0)
    assert model(ids_of((1, 20), 1, 64)).shape == (1, 20, 64)
    for bad, message in [
        (dict(num_layers=2), "do not split evenly"),
        (dict(landmark_id=97), "outside the vocabulary"),
        (dict(hidden_size=30, num_heads=4), "not divisible"),
        (dict(chunk_size=1), "chunk_size"),
    ]:
        with pytest.raises(UserError, match=message):
            FAMILY.make_config("drt-x2", {**TINY, **bad})


# -- the released layout -----------------------------------------------------------------------------------------


def _released_files(model, path, ddp=False):
    """``model`` saved the way the authors' trainer saves it: ``model.bin`` (a state dict under their names, the tied
    head included) and their json config."""
    cfg = model.config
    names = {"embed.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}
    state = {names.get(k, "model." + k): v for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = model.embed.weight.detach()
    if ddp:
        state = {"module." + k: v for k, v in state.items()}
    path.mkdir()
    torch.save(state, path / "model.bin")
    groups = [cfg.upper_layers // cfg.retrieval_groups] * cfg.retrieval_groups
    config = dict(model_type="llama", hidden_size=cfg.hidden_size, num_attention_heads=cfg.num_heads,
                  num_key_value_heads=cfg.num_heads, intermediate_size=cfg.intermediate_size,
                  vocab_size=cfg.vocab_size, decoder_layers=[cfg.lower_layers, *groups],
                  encoder_layers=cfg.encoder_layers, chunk_topk=cfg.top_k, slide_window=cfg.window,
                  enc_chunk_size=cfg.chunk_size - 1, enable_softmax_one=cfg.softmax_one, _triton_gca=True,
                  rms_norm_eps=cfg.rms_norm_eps, chunk_id=cfg.landmark_id, tie_word_embeddings=cfg.tie_word_embeddings,
                  enable_alibi=True, max_position_embeddings=-1, num_hidden_layers=-1, pad_id=50257)  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "arch,chunk,tied,ddp", [("drt", 64, True, False), ("drt-x2", 65, False, True), ("drt", 64, True, True)]
)
@torch.no_grad()
def test_released_layout_loads(arch, chunk, tied, ddp, tmp_path):
    # the released code zeroes the landmark's key/value row in 64-position chunks and drops it in 65-position ones
    over = dict(chunk_size=chunk, zero_landmark_kv=chunk == 64, window=20, top_k=3, vocab_size=101)
    model = build(arch, tie_word_embeddings=tied, **over)
    _released_files(model, tmp_path / "ckpt", ddp)
    assert weight_files(tmp_path / "ckpt") == [tmp_path / "ckpt" / "model.bin"]
    loaded, layout = load_checkpoint(tmp_path / "ckpt")
    assert layout == "drt-official" and loaded.config == model.config
    ids = ids_of((2, 260), 15, 101)  # 4 chunks and a part: retrieval from chunk 2 on
    torch.testing.assert_close(loaded.logits(loaded(ids)), model.logits(model(ids)), rtol=0, atol=0)


def test_released_config_errors(tmp_path):
    model = build(chunk_size=64)
    _released_files(model, tmp_path / "ckpt")
    config = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    for change, message in [
        (dict(enc_chunk_size=40), "63 or 64"),
        (dict(decoder_layers=[2, 1, 2]), "different sizes"),
        (dict(attention_bias=True), "attention_bias"),
        (dict(slide_window=-1), "full attention"),
    ]:
        (tmp_path / "ckpt" / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UserError, match=message):
            load_checkpoint(tmp_path / "ckpt")
