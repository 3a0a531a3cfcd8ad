"""The decode engine (evalsuite/generation/engine.py) against a per-token loop that checks every token on the host:
greedy and sampled outputs equal token for token, with left padding, stop strings and EOS, for every
``sync_every``; the static decoders' eager steps likewise; the CPU never enters the CUDA branch. Then the batch
size from memory and NIAH's ``batch_size: auto``."""

from dataclasses import replace

import pytest
import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.generation import engine
from evalsuite.generation.sampling import draw_uniforms
from evalsuite.generation.types import Generation, GenerationConfig, apply_stop
from evalsuite.models.registry import resolve_architecture
from evalsuite.tokenizers import get_tokenizer

TEXTS = ["The quick brown fox jumps over the lazy dog, twice.", "Hello", "A prompt of middling length here."]


def reference_sample(logits, config, u):
    """The sampling step of the per-token reference loop (temperature, top-k, top-p, the draw of the uniforms ``u
    [B]``; on the CPU)."""
    if config.temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float().cpu() / config.temperature, dim=-1)
    if config.top_k > 0:
        kth = probs.topk(min(config.top_k, probs.shape[-1]), dim=-1).values[..., -1:]
        probs = probs * (probs >= kth)
        probs = probs / probs.sum(-1, keepdim=True)
    if config.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p = sorted_p * (sorted_p.cumsum(-1) - sorted_p < config.top_p)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    # the draw: the first token whose cumulative probability passes the row's uniform (times the row's total)
    cdf = probs.double().cumsum(-1)
    return (cdf <= u[:, None] * cdf[:, -1:]).sum(-1).to(logits.device)


@torch.inference_mode()
def reference_generate(adapter, prompts, config):
    """NativeAdapter.generate as a per-token loop: every token to the host, EOS and stop strings checked per token."""
    model, tok = adapter.model, adapter.tokenizer
    B, longest = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(B, longest, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, longest - len(p) :] = torch.tensor(p)
    start = torch.tensor([longest - len(p) for p in prompts])
    start = start if int(start.max()) > 0 else None
    uniforms = draw_uniforms(config, B, config.max_new_tokens)  # the engine's counter-based draws: [B, steps]
    eos = tok.eos_id if config.stop_at_eos else None
    new = [[] for _ in range(B)]
    results = [None] * B
    with adapter._autocast():
        state = model.new_state(B, longest + config.max_new_tokens, start)
        logits = model.logits(model(ids, state=state)[:, -1])
        for step_index in range(config.max_new_tokens):
            tokens = reference_sample(logits, config, uniforms[:, step_index]).tolist()
            for b, t in enumerate(tokens):
                if results[b] is not None:
                    continue
                if t == eos:
                    results[b] = Generation(tok.decode(new[b]), new[b], "eos")
                    continue
                new[b].append(t)
                if config.stop:
                    text, stopped = apply_stop(tok.decode(new[b]), config.stop)
                    if stopped:
                        results[b] = Generation(text, new[b], "stop")
            if all(r is not None for r in results) or step_index == config.max_new_tokens - 1:
                break
            logits = model.logits(model(torch.tensor(tokens)[:, None], state=state)[:, -1])
    return [r or Generation(tok.decode(new[b]), new[b], "length") for b, r in enumerate(results)]


def _same(a, b):
    return [(g.text, g.token_ids, g.finish_reason) for g in a] == [(g.text, g.token_ids, g.finish_reason) for g in b]


@pytest.fixture(scope="module", params=["fox-pro-tiny", "gsa-tiny", "tnl-tiny", "drt-tiny"])
def adapter(request):
    return NativeAdapter(load_card(request.param), device="cpu")


def test_greedy_equals_the_per_token_loop(adapter):
    """Left-padded mixed lengths. Three endings: none (length), a stop string row 0 makes mid-way together with an
    EOS id row 1 makes (the host checks every token), the EOS alone (the device's done mask). Sync intervals 1 (per
    token), 4 (rows end mid-block) and 16 (the default; one sync); the static decoder's eager steps where the family
    has one, a one-line error where it has none."""
    prompts = [adapter.tokenizer.encode(t) for t in TEXTS]
    n = 8 if adapter.card.name == "drt-tiny" else 12  # DRT's tiny model is the slow one on a CPU
    free = reference_generate(adapter, prompts, GenerationConfig(max_new_tokens=n, stop_at_eos=False))
    assert all(g.finish_reason == "length" for g in free)
    text0 = free[0].text
    stop = next(text0[i : i + 2] for i in range(n // 3, len(text0) - 1) if text0[i : i + 2].strip())
    configs = [GenerationConfig(max_new_tokens=n, stop_at_eos=False), GenerationConfig(max_new_tokens=n, stop=[stop]),
               GenerationConfig(max_new_tokens=n)]  # fmt: skip
    runs = [("eager", 1), ("eager", 4), ("eager", 16)]
    runs += [("static", 4)] if engine.static_support(adapter.model) else []
    saved = adapter.tokenizer.eos_id
    adapter.tokenizer.eos_id = free[1].token_ids[n // 2]
    try:
        for i, config in enumerate(configs):
            want = free if i == 0 else reference_generate(adapter, prompts, config)
            if i == 1:
                assert [g.finish_reason for g in want[:2]] == ["stop", "eos"]
            if i == 2:
                assert want[1].finish_reason == "eos" and want[0].finish_reason == "length"
            for path, every in runs:
                adapter.decode_path, adapter.sync_every = path, every
                assert _same(adapter.generate(prompts, config), want), (path, every, config)
    finally:
        adapter.tokenizer.eos_id = saved
        adapter.decode_path, adapter.sync_every = "auto", engine.SYNC_EVERY
    if not engine.static_support(adapter.model):
        adapter.decode_path = "static"
        with pytest.raises(UserError, match="offers no static decoder"):
            adapter.generate(prompts, configs[0])
        adapter.decode_path = "auto"


def test_sampling_and_bfloat16_equal_the_per_token_loop():
    adapter = NativeAdapter(load_card("fox-pro-tiny"), device="cpu")
    prompts = [adapter.tokenizer.encode(t) for t in TEXTS]
    config = GenerationConfig(max_new_tokens=8, temperature=0.8, top_k=50, top_p=0.9, seed=3, stop=["e"])
    for path in ("eager", "static"):
        adapter.decode_path = path
        assert _same(adapter.generate(prompts, config), reference_generate(adapter, prompts, config))
    half = NativeAdapter(load_card("fox-pro-tiny"), device="cpu", dtype="bfloat16")
    config = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    want = reference_generate(half, prompts, config)
    for path in ("eager", "static"):
        half.decode_path = path
        assert _same(half.generate(prompts, config), want)


def test_the_cpu_never_enters_the_cuda_branch(monkeypatch):
    def cuda_called(*args, **kwargs):
        raise AssertionError("torch.cuda used on a CPU")

    for name in ("CUDAGraph", "graph", "Stream", "stream", "current_stream", "synchronize", "mem_get_info"):
        monkeypatch.setattr(torch.cuda, name, cuda_called)
    adapter = NativeAdapter(load_card("fox-pro-tiny"), device="cpu")
    out = adapter.generate([adapter.tokenizer.encode("Hello")], GenerationConfig(max_new_tokens=20))
    assert len(out[0].token_ids) == 20 or out[0].finish_reason == "eos"
    assert engine.prompts_per_call(adapter, 4096, 64) == engine.FALLBACK_PROMPTS


def test_bad_paths_are_one_line_errors():
    with pytest.raises(UserError, match="unknown decode path 'warp'"):
        NativeAdapter(load_card("fox-pro-tiny"), device="cpu", decode_path="warp")
    adapter = NativeAdapter(load_card("fox-pro-tiny"), device="cpu", decode_path="graph")
    with pytest.raises(UserError, match="'graph' needs a CUDA device"):
        adapter.generate([[1, 2, 3]], GenerationConfig(max_new_tokens=2))
    adapter.decode_path = "compiled"
    with pytest.raises(UserError, match="'compiled' needs a CUDA device"):
        adapter.generate([[1, 2, 3]], GenerationConfig(max_new_tokens=2))


def test_finisher_takes_blocks_like_single_tokens():
    tok = get_tokenizer("bytes")
    ids = [[*b"ab\ncd"], [*b"xyz"], [*b"q"]]
    eos = ids[1][1]  # "y" ends row 1
    one, block = (engine.Finisher(tok, [GenerationConfig(stop=["\n"])] * 3, eos) for _ in range(2))
    for i in range(5):
        one.feed([row[i : i + 1] for row in ids])
    block.feed(ids)
    for f in (one, block):
        g = f.generations()
        assert [(x.text, x.token_ids, x.finish_reason) for x in g] == [
            ("ab", [*b"ab\n"], "stop"),  # text cut before the stop string, ids up to the token that completed it
            ("x", [*b"x"], "eos"),  # EOS not kept; tokens after it ignored
            ("q", [*b"q"], "length"),
        ]
    assert block.all_done() is False and engine.Finisher(tok, [GenerationConfig()], None).all_done() is False


# -- batch size from memory ---------------------------------------------------------------------------------


def test_batch_for_memory_arithmetic():
    assert engine.batch_for_memory(10, 100, headroom=0.85) == 8  # floor(85 / 10)
    assert engine.batch_for_memory(10, 100, headroom=1.0) == 10
    assert engine.batch_for_memory(1000, 100) == 1  # never below one prompt
    assert engine.batch_for_memory(1, 10**12, cap=32) == 32
    with pytest.raises(ValueError):
        engine.batch_for_memory(0, 100)


def test_bytes_per_prompt_of_the_760m_fox():
    """FoX (Pro) 760M (24 layers, d = 1536, 24 heads, V = 50257), bf16 cache: every term written out by hand."""
    family, arch = resolve_architecture("fox-pro")
    with torch.device("meta"):
        model = family.build(family.make_config(arch, {}))
    L, n = 16384, 1024
    cache = 24 * ((2 * (L + n) * 1536 + 2 * 1536) * 2 + (L + n) * 24 * 4)  # k, v, KV-shift rows; fp32 cum
    activations = 36 * 8192 * 1536 * 4  # ACTIVATION_FACTOR (measured on an H100) x the 8K-token prefill passes
    logits = 3 * 50257 * 4
    per = engine.bytes_per_prompt(model, L, n, torch.bfloat16)
    assert per == cache + activations + logits
    free = 70 * 2**30  # an H100 with the weights loaded
    assert engine.batch_for_memory(per, free) == int(0.85 * free) // per == 14  # 10 with one 16K-token pass
    assert engine.batch_for_memory(engine.bytes_per_prompt(model, 65536, n, torch.bfloat16), free) == 5
    L = 4096  # shorter than a pass: every prompt token's activations are live at once
    cache = 24 * ((2 * (L + n) * 1536 + 2 * 1536) * 2 + (L + n) * 24 * 4)
    assert engine.bytes_per_prompt(model, L, n, torch.bfloat16) == cache + 36 * L * 1536 * 4 + logits


@pytest.mark.parametrize("card", ["fox-pro-tiny", "transformer-llama-tiny", "gsa-tiny"])
def test_prefill_in_passes_equals_one_pass(card, monkeypatch):
    """``CausalLM.prefill`` in passes of ``prefill_chunk`` tokens (each continuing the state) fills the same state and
    gives the same last hidden state as one pass, with left padding, on the eager and static decoders."""
    from evalsuite.training.train import build_model

    model = build_model(load_card(card), seed=0).eval()
    ids = torch.randint(0, model.vocab_size, (2, 45), generator=torch.Generator().manual_seed(0))
    start = torch.tensor([0, 7])  # row 1 left-padded
    out = {}
    for chunk in (None, 16):
        monkeypatch.setattr(type(model), "prefill_chunk", chunk)
        with torch.inference_mode():
            for kind in ("eager", "static"):
                dec = engine._decoder(model, kind, torch.device("cpu"), 2, 50, start)[0]
                hidden = dec.prefill(ids)
                nxt = model.logits(hidden).argmax(-1)
                out[chunk, kind] = (hidden, dec.step(nxt[:, None]))
    for kind in ("eager", "static"):
        for a, b in zip(out[None, kind], out[16, kind], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_niah_batch_size_auto(tmp_path):
    from evalsuite.tasks.niah import NiahConfig, cells_by_length, resolve_config, run_niah

    assert resolve_config(NiahConfig(batch_size="auto")).batch_size == "auto"
    for bad in ("many", 0, 2.5):
        with pytest.raises(UserError, match="--batch-size must be a positive integer or 'auto'"):
            resolve_config(NiahConfig(batch_size=bad))
    cells = [type("C", (), {"length": n})() for n in (5, 5, 5, 7, 7)]
    assert [len(b) for b in cells_by_length(cells, lambda n: n - 3)] == [2, 1, 2]
    adapter = NativeAdapter(load_card("fox-pro-tiny"), device="cpu")
    config = NiahConfig(mode="easy", lengths=[300], depths=[0, 50], max_new_tokens=2, batch_size="auto")
    results = run_niah(adapter, config, tmp_path / "run", progress=False)
    assert {r["length"] for r in results["records"]} == {300}
    fixed = run_niah(adapter, replace(config, batch_size=4), tmp_path / "run4", progress=False)
    assert results["config_hash"] == fixed["config_hash"]  # the batch size is not part of the configuration


def test_compiled_fox_step_equals_the_static_step():
    """The ``compiled`` path's step (torch.compile of FoxStaticDecoder's device part; on CUDA it is then captured as
    a CUDA graph) gives the static step's hidden states on the CPU, with left padding, across two cache sizes (the
    second compiles with a dynamic cache length) and keeps the host-side length count."""
    torch.manual_seed(0)
    model = load_card("fox-pro-tiny").build_module()
    model.init_weights(0)
    model.eval()
    for T, capacity in ((5, 12), (9, 20)):
        ids = torch.randint(0, 100, (2, T))
        start = torch.tensor([0, 2])
        plain, compiled = model.static_decoder(2, capacity, start), model.static_decoder(2, capacity, start)
        assert compiled.compile_step()
        with torch.inference_mode():
            torch.testing.assert_close(compiled.prefill(ids), plain.prefill(ids))
            tok = ids[:, -1:]
            for _ in range(4):
                want = plain.step(tok)
                torch.testing.assert_close(compiled.step(tok), want, atol=1e-5, rtol=1e-5)
                tok = model.logits(want).argmax(-1)[:, None]
        assert compiled.state.length == plain.state.length == T + 4
        assert int(compiled.length) == T + 4


@pytest.mark.parametrize("card", ["gsa-tiny", "tnl-tiny"])
def test_compiled_recurrent_step_equals_the_static_step(card):
    """The recurrent families' ``compiled`` step (torch.compile of RecurrentStaticDecoder's device part) gives the
    static step's hidden states on the CPU, with left padding, and counts positions on the host and the device
    once a step, without recompiling at every position."""
    import torch._dynamo

    torch.manual_seed(0)
    model = load_card(card).build_module()
    model.init_weights(0)
    model.eval()
    ids = torch.randint(0, 100, (2, 7))
    start = torch.tensor([0, 3])
    plain, compiled = model.static_decoder(2, 0, start), model.static_decoder(2, 0, start)
    assert compiled.compile_step()
    graphs = []  # compiled graphs so far, after each step (the CPU reference breaks the step into several)
    with torch.inference_mode():
        torch.testing.assert_close(compiled.prefill(ids), plain.prefill(ids))
        tok = ids[:, -1:].clone()  # an inference tensor, as the later tokens (else one recompile for the dispatch key)
        for _ in range(5):
            want = plain.step(tok)
            torch.testing.assert_close(compiled.step(tok), want, atol=1e-5, rtol=1e-5)
            graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
            tok = model.logits(want).argmax(-1)[:, None]
    assert compiled.state.length == plain.state.length == 7 + 5
    assert int(compiled.state.position) == int(plain.state.position) == 7 + 5
    assert graphs[0] > 0 and len(set(graphs)) == 1  # compiled once, not again at each position


_APPEND_STEP_SCRIPT = """
import torch
import evalsuite.kernels.forgetting as fa
from evalsuite.cards import load_card
reference_only, kernel = fa.cached_attention_graph_safe, fa.forgetting_append_decode
appended = []  # one per call of the appending kernel's operator


def counted(*args):
    appended.append(True)
    return kernel(*args)


fa.forgetting_append_decode = counted
torch.manual_seed(0)  # fixed token ids: some unseeded draws put one bf16 output 0.023 off
for card in ("fox-pro-tiny", "transformer-llama-tiny"):  # gated; ungated (its cache carries the padding biases)
    model = load_card(card).build_module()
    model.init_weights(0)
    model = model.to(torch.bfloat16).eval()
    ids, start = torch.randint(0, 100, (2, 7)), torch.tensor([0, 3])
    with torch.inference_mode():
        decoders = []
        for use_kernel in (False, True):
            fa.cached_attention_graph_safe = (lambda q, backend: True) if use_kernel else reference_only
            dec = model.static_decoder(2, 16, start)
            dec.prefill(ids)
            decoders.append(dec)
        tok = ids[:, -1:]
        for _ in range(4):
            fa.cached_attention_graph_safe = reference_only
            want = decoders[0].step(tok)
            fa.cached_attention_graph_safe = lambda q, backend: True
            got = decoders[1].step(tok)
            torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
            tok = model.logits(want).argmax(-1)[:, None]
        n = int(decoders[0].length)
        for a, b in zip(decoders[0].state.layers, decoders[1].state.layers):  # deeper layers: inputs differ by
            for name in ("k", "v", "cum"):  # the two attentions' bf16 rounding
                if getattr(a, name) is not None:
                    torch.testing.assert_close(getattr(b, name)[:, :n], getattr(a, name)[:, :n], atol=2e-2, rtol=2e-2)
    assert len(appended) == 4 * model.cfg.num_layers
    appended.clear()
    print(card, "ok")
"""


def test_fox_step_through_the_appending_decode_kernel():
    """The FoX step with the Triton decode kernel appending the new row (the interpreter on CPU, bf16, left padding):
    the same hidden states and caches as the reference twin's ``index_copy_`` and attention, gated and ungated."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent), "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", _APPEND_STEP_SCRIPT], capture_output=True, text=True, timeout=600,
                          env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["fox-pro-tiny", "ok", "transformer-llama-tiny", "ok"]


def test_static_decoders_free_their_cache_without_the_cycle_collector():
    """A decoder's KV cache goes as soon as the decoder does (on an H100, a decoder that references itself leaves each
    cache to the cyclic GC, and a 121-cell NIAH grid runs out of device memory)."""
    import gc
    import weakref

    model = load_card("fox-pro-tiny").build_module()
    model.init_weights(0)
    model.static_decoder(1, 8).compile_step()  # the first compile may keep its caller's frame alive: not this test's
    gc.collect()
    gc.disable()
    try:
        for compiled in (False, True):
            decoder = model.static_decoder(1, 8)
            if compiled:
                assert decoder.compile_step()
            cache = weakref.ref(decoder.state)
            del decoder
            assert cache() is None, f"compiled={compiled}"
    finally:
        gc.enable()


def test_compile_breaks_on_cpu_find_the_reference_cache_slice():
    """The GPU test's compile check (tests/gpu/test_compile.py) on a CPU: the reference attention slices the cache at
    ``int(key_length)``, a host sync, so torch.compile must report breaks there (on CUDA the Triton kernel reads the
    length itself)."""
    from gpu.compile_check import decode_step_breaks

    report = decode_step_breaks("fox-pro-tiny", "cpu", "float32", prompt=16)
    assert report["graph_breaks"] >= 1 and report["graphs"] == report["graph_breaks"] + 1
    assert all("cached_attention" in "".join(b["user_stack"]) for b in report["breaks"])


def test_profile_decode_reports_the_step(tmp_path):
    """``bench profile-decode`` on a CPU (static path, fox-pro-tiny): the step's ops add up to its device time."""
    import json

    from evalsuite.bench.profile_decode import profile_decode

    run = dict(card="fox-pro-tiny", device="cpu", path="static", length=32, steps=3)
    report = profile_decode(tmp_path, **run)
    assert report == json.loads((tmp_path / "profile_static_32_b1.json").read_text())
    assert report["path"] == "static" and report["ms_per_step"] > 0 and report["device_ms_per_step"] > 0
    assert report["packed"] is True  # the FoX static decoder stacks its step's GEMVs
    profile_decode(tmp_path, other_capacity=True, **run)
    assert json.loads((tmp_path / "profile_static_32_b1_other_capacity.json").read_text())["other_capacity"] is True
    assert sum(t["us_per_step"] for t in report["top"]) <= report["device_ms_per_step"] * 1e3 * 1.0001
    assert any(t["kernel"] == "aten::mm" for t in report["top"])  # the projections
    assert "ms of device kernels per step" in (tmp_path / "profile_static_32_b1.txt").read_text()


def test_tune_decode_checks_every_split_against_the_reference(tmp_path, run_cli):
    """``bench tune forgetting-decode`` under the Triton interpreter (tiny shapes, the interpreter's config): every
    split count's output agrees with the PyTorch reference."""
    import json

    code, _, err = run_cli(["bench", "tune", "forgetting-decode", "--out", tmp_path], tmp_path)
    assert code == 0, err
    rows = json.loads((tmp_path / "tune_forgetting_decode.json").read_text())["records"]
    assert len({r["splits"] for r in rows}) >= 3 and all(r["max_error"] < 2e-2 for r in rows)
