"""One cell of the generation benchmark (:mod:`evalsuite.bench.generate`): loading a model, putting it on a decode
path, timing its generate calls, and the bytes a decode step must read (the bandwidth bound)."""

from __future__ import annotations

import os
import statistics
from dataclasses import replace

import torch

from evalsuite.bench.common import wall_seconds
from evalsuite.generation.engine import StepTimer, bytes_per_prompt, free_device_bytes, prompt_bytes
from evalsuite.generation.types import GenerationConfig

COPY_MIB = {"cuda": 1024, "cpu": 256}  # the bandwidth copy: well beyond every cache
REPEATS = 3  # timed repeats of each call per cell (medians)
# a cell's sampling: the argmax, or a seeded draw after common cuts (each cut costs the sampler a pass: top-p a sort)
SAMPLERS = {"greedy": {}, "sampled": {"temperature": 0.8, "top_k": 50, "top_p": 0.9}}


def measure_copy_bandwidth(device, mib: int | None = None, reps: int = 5) -> dict:
    """Memory bandwidth from a device-to-device copy of ``mib`` MiB: (bytes read + bytes written) / median time
    of ``reps`` copies, after one warm-up copy."""
    device = torch.device(device)
    mib = mib or COPY_MIB.get(device.type, 256)
    src = torch.ones(mib * 2**20, dtype=torch.uint8, device=device)  # written first: no zero-page reads on a CPU
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = sorted(wall_seconds(lambda: dst.copy_(src), device) for _ in range(reps))
    seconds = times[len(times) // 2]
    return {"copy_mib": mib, "seconds": seconds, "bytes_per_s": 2 * src.numel() / seconds}


def load_model(spec: str, device: str, dtype: str, weights: str):
    """The adapter of ``spec``: a card (``weights="random"``: its shapes with random weights, seed 0) or ``hf:DIR``."""
    from evalsuite.adapters.registry import AdapterOptions, load_adapter, split_spec

    kind, name = split_spec(spec)
    if kind != "native":
        return load_adapter(spec, AdapterOptions(device=device, dtype=dtype))
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card

    card = load_card(name)
    if weights == "random":
        card = replace(card, weights={"source": "random", "seed": 0})
    return NativeAdapter(card, device=device, dtype=dtype)


def _native(adapter) -> bool:
    from evalsuite.adapters.native import NativeAdapter

    return isinstance(adapter, NativeAdapter)


def set_path(adapter, path: str) -> str | None:
    """Put ``adapter`` on decode ``path``; returns why it cannot run here, or None."""
    from evalsuite.adapters.hf import HFAdapter
    from evalsuite.generation.engine import compiled_support, static_support

    cuda = adapter.device.type == "cuda"
    if _native(adapter):
        if path in ("graph", "compiled") and not cuda:
            return "needs CUDA"
        with adapter._autocast():  # graph safety may depend on the cache dtype
            support = static_support(adapter.model) if path != "eager" else None
            compiles = path == "compiled" and compiled_support(adapter.model)
        if path != "eager" and support is None:
            return f"{type(adapter.model).__name__} offers no static decoder"
        if path in ("graph", "compiled") and support != "graph":
            return f"{type(adapter.model).__name__}'s static step is not graph-safe here"
        if path == "compiled" and not compiles:
            return f"{type(adapter.model).__name__} offers no compiled step"
        adapter.decode_path = path
        return None
    if isinstance(adapter, HFAdapter):
        if path != "eager" and not cuda:
            return "needs CUDA"
        if path == "compiled":
            return "its graph path is the compiled one (static cache + torch.compile)"
        adapter.cache, adapter.compile = ("dynamic", False) if path == "eager" else ("static", path == "graph")
        return None
    return f"{type(adapter).__name__} has no decode paths" if path != "eager" else None


def step_weight_bytes(adapter) -> int:
    """Weight bytes one decode step reads: every parameter as stored, less the input embedding (a step gathers B
    rows of it) unless the LM head is the embedding."""
    model = adapter.model
    if _native(adapter):
        emb, tied = model.input_embedding.weight, bool(getattr(model.config, "tie_word_embeddings", False))
    else:
        emb, head = model.get_input_embeddings().weight, model.get_output_embeddings()
        tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - (0 if tied else emb.numel() * emb.element_size())


def _hf_kv_bytes(config, length: int, dtype: torch.dtype) -> int | None:
    """K and V of every layer at ``length`` for one sequence of a standard HF decoder; None if the config lacks the
    fields (not a plain attention model)."""
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * length * torch.empty((), dtype=dtype).element_size()


def state_bytes(adapter, length: int) -> int | None:
    """Decode-state bytes of one sequence after ``length`` tokens (None: unknown)."""
    if _native(adapter):
        return int(adapter.model.decode_state_size(length, adapter.dtype)["bytes"])
    return _hf_kv_bytes(adapter.config, length, adapter.dtype)


def cell_bytes(adapter, length: int, batch: int, new_tokens: int) -> int | None:
    """Estimated device bytes of a generate call (state at capacity, prefill activations, logits); None: unknown."""
    if _native(adapter):
        return batch * bytes_per_prompt(adapter.model, length, new_tokens, adapter.dtype)
    kv = _hf_kv_bytes(adapter.config, length + new_tokens, adapter.dtype)
    if kv is None:
        return None
    return batch * prompt_bytes(kv, length, adapter.config.hidden_size, adapter.vocab)


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device``: CUDA's, or the host's available physical memory on a CPU (None: unknown)."""
    if device.type == "cuda":
        return free_device_bytes(device)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def two_call_rates(t1: float, tm: float, tn: float, m: int, n: int, batch: int) -> dict:
    """Decode rate from the difference of the ``m``- and ``n``-token calls (``tm``, ``tn`` seconds; ``t1``: the
    1-token call): ``decode_tokens_per_s``, ``ms_per_step``, ``call_overhead_s``. When the longer call was not slower
    the difference resolves no step time (noise on a busy machine, or steps too short to see): no rate, but
    ``decode_unresolved`` says why, rather than a rate from a clamped near-zero time."""
    if tn <= tm:
        return {"decode_unresolved": f"the {n}-token call ({tn:.4g} s) was not slower than the {m}-token call"}
    step_s = (tn - tm) / (n - m)
    overhead = tm - t1 - (m - 1) * step_s
    return {"decode_tokens_per_s": batch / step_s, "ms_per_step": step_s * 1e3, "call_overhead_s": overhead}


def measure_cell(adapter, length: int, batch: int, new_tokens: int, *, sampling: str = "greedy", warmup: bool = True,
                 seed: int = 0, repeats: int = REPEATS, calls: tuple[int, ...] = ()) -> dict:  # fmt: skip
    """Time one (length, batch) cell on the adapter's current path under ``sampling`` (a key of :data:`SAMPLERS`; see
    :mod:`evalsuite.bench.generate`): the three calls, and one more of each token count in ``calls`` (none above
    ``new_tokens``), ``repeats`` times over, each call's time the median of its repeats (one slow prefill or capture
    does not move the two-call rate)."""
    device = adapter.device
    gen = torch.Generator().manual_seed(seed + 7919 * length + batch)
    prompts = torch.randint(0, adapter.tokenizer.vocab_size, (batch, length), generator=gen).tolist()
    half = max(1, new_tokens // 2)
    counts = sorted({1, half, new_tokens, *calls})
    configs = {k: GenerationConfig(max_new_tokens=k, stop_at_eos=False, seed=seed, **SAMPLERS[sampling])
               for k in counts}  # fmt: skip
    if warmup:  # kernels compiled and autotuned, static caches compiled, for these shapes, outside the timings
        for k in counts[1:]:
            adapter.generate(prompts, configs[k])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: dict[int, list[float]] = {k: [] for k in counts}  # per call, one wall time per repeat
    timers: dict[int, StepTimer | None] = dict.fromkeys(counts)  # the last repeat's, for our own models
    in_call, made = [], []

    for _ in range(repeats):
        for k in counts:
            if hasattr(adapter, "step_timer"):
                adapter.step_timer = timers[k] = StepTimer()
            try:
                call = lambda config=configs[k]: made.append(adapter.generate(prompts, config))  # noqa: E731
                times[k].append(wall_seconds(call, device))
            finally:
                if hasattr(adapter, "step_timer"):
                    adapter.step_timer = None
            if k == new_tokens and timers[k] is not None and timers[k].ms_per_step is not None:
                in_call.append(timers[k].ms_per_step)
    t1, tm, tn = (statistics.median(times[k]) for k in (1, half, new_tokens))
    rec = {"prefill_s": t1, "half_s": tm, "total_s": tn, "prefill_tokens_per_s": batch * length / t1}
    rec.update(two_call_rates(t1, tm, tn, half, new_tokens, batch))
    rec.update(repeats=repeats, call_times_s={str(k): t for k, t in times.items()})
    if in_call:  # the same steps timed inside the N-token calls (StepTimer), median over the repeats
        rec.update(ms_per_step_in_call=statistics.median(in_call), steps_in_call=timers[new_tokens].steps)
    if timers[1] is not None:  # where each call's time went: what differs between the calls the rate is taken from
        rec["phases_s"] = {str(k): t.phases for k, t in timers.items()}
    rec["tokens_made"] = sum(len(g.token_ids) for g in made[-1])  # the last call: new_tokens, the most
    if device.type == "cuda":
        rec["peak_mem_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return rec


def add_bound(rec: dict, weight_bytes: int, seq_state_bytes: int | None, bandwidth: float) -> None:
    """``bound_tokens_per_s`` and ``fraction_of_bound`` of a timed record (see the module docstring)."""
    rec.update(weight_bytes=weight_bytes, state_bytes=seq_state_bytes, copy_bytes_per_s=bandwidth)
    if seq_state_bytes is None:
        return
    step_s = (weight_bytes + rec["batch"] * seq_state_bytes) / bandwidth
    rec["bound_tokens_per_s"] = rec["batch"] / step_s
    if "decode_tokens_per_s" in rec:
        rec["fraction_of_bound"] = rec["decode_tokens_per_s"] / rec["bound_tokens_per_s"]
    if "ms_per_step_in_call" in rec:  # the steady step alone (the two-call difference carries one-off costs)
        rec["fraction_of_bound_in_call"] = rec["batch"] * 1e3 / rec["ms_per_step_in_call"] / rec["bound_tokens_per_s"]
