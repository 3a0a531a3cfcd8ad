"""Decoding costs of the linear-time ops, for :mod:`evalsuite.bench.linear` (modes ``decode`` and ``memory``).

* :func:`bench_decode`: the one-token step of each op with a float32 state, under ``no_grad`` -- ours through
  the dispatchers (``T == 1`` with a state: the Triton decode kernel for ``*_triton``) and fla's fused recurrent
  ops (``fused_recurrent_gsa``, ``fused_recurrent_simple_gla``) with an initial state and ``output_final_state``.
  The state does not grow with context, so there is one number per batch.
* :func:`bench_state_memory`: decode-state size vs context length at the model level, through the generic model
  protocol only (``resolve_architecture`` -> ``make_config`` -> ``build`` -> ``new_state`` -> prefill -> one step),
  so it works for any registered family: a KV cache grows with context, a recurrent state stays flat.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import fields

import torch

from evalsuite.bench.common import Unavailable, fla_op, time_ms
from evalsuite.bench.linear_ops import DECODE_PROVIDERS, alibi_slopes
from evalsuite.models.base import skip_random_init

DEFAULT_ARCHS = ("gsa", "tnl", "fox-pro")
DEFAULT_CONTEXTS = (1024, 4096, 16384, 65536)
SMALL_MODEL = {"hidden_size": 1024, "num_layers": 4}  # + num_heads = hidden / 64 where the preset's does not divide


def _op_of(provider: str) -> str:
    return next(op for op, names in DECODE_PROVIDERS.items() if provider in names)


def decode_call(provider, batch, n_heads=16, head_dim=64, n_slots=64, dtype=torch.bfloat16, device="cpu", seed=0):
    """(call, state_bytes): ``call()`` runs one decoding step of ``batch`` sequences with a random float32 state
    (``[B, H, dk, m]`` + ``[B, H, m, dv]`` for GSA, ``[B, H, dk, dv]`` for Lightning). Raises :class:`Unavailable`."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    B, H, D, m = batch, n_heads, head_dim, n_slots

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dt)

    q, k, v = randn(B, 1, H, D, scale=D**-0.25), randn(B, 1, H, D, scale=D**-0.25), randn(B, 1, H, D)
    op = _op_of(provider)
    backend = provider.split("_")[1] if not provider.startswith("fla") else None
    if backend == "triton" and device.type != "cuda":
        raise Unavailable("needs CUDA")
    if op == "gsa":
        g = torch.nn.functional.logsigmoid(randn(B, 1, H, m, dt=torch.float32)) / 8
        state = (randn(B, H, D, m, scale=0.1, dt=torch.float32), randn(B, H, m, D, scale=0.1, dt=torch.float32))
        if backend:
            from evalsuite.kernels.gated_slot import gated_slot_attention

            def call():
                return gated_slot_attention(q, k, v, g, scale=1.0, initial_state=state, output_final_state=True,
                                            backend=backend)  # fmt: skip

        else:
            fn = fla_op("gsa.fused_recurrent_gsa")
            if fn is None:
                raise Unavailable("fla not installed")
            s = (-torch.expm1(g)).to(dtype)

            def call():
                return fn(q, k, v, s, g, scale=1.0, initial_state=state, output_final_state=True)

    else:
        slope = alibi_slopes(H).to(device)
        state = randn(B, H, D, D, scale=0.1, dt=torch.float32)
        if backend:
            from evalsuite.kernels.lightning import lightning_attention

            def call():
                return lightning_attention(q, k, v, slope, initial_state=state, output_final_state=True,
                                           backend=backend)  # fmt: skip

        else:
            fn = fla_op("simple_gla.fused_recurrent_simple_gla")
            if fn is None:
                raise Unavailable("fla not installed")
            g_gamma = -slope

            def call():
                return fn(q, k, v, g_gamma=g_gamma, scale=1.0, initial_state=state, output_final_state=True)

    parts = state if isinstance(state, tuple) else (state,)
    return call, sum(t.numel() * t.element_size() for t in parts)


def bench_decode(providers, *, batches=(1, 8, 32), n_heads=16, head_dim=64, n_slots=64, dtype=torch.bfloat16,
                 device=None, warmup=25, rep=100) -> list[dict]:  # fmt: skip
    """One record per (decode provider, batch): median / p20 / p80 ms per step, tokens/s, the state's bytes."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    records = []
    for provider in providers:
        op = _op_of(provider)
        for B in batches:
            rec = {"kind": "decode", "op": op, "provider": provider, "batch": B, "H": n_heads, "D": head_dim}
            rec.update(m=n_slots if op == "gsa" else None, dtype=str(dtype).removeprefix("torch."))
            rec["device_type"] = device.type
            try:
                call, rec["state_bytes"] = decode_call(provider, B, n_heads, head_dim, n_slots, dtype, device)

                def fn(call=call):
                    with torch.no_grad():
                        call()

                fn()
                ms, lo, hi = time_ms(fn, (), device, warmup, rep)
                rec.update(status="ok", ms=ms, ms_p20=lo, ms_p80=hi, tokens_per_s=B / (ms * 1e-3))
            except Unavailable as exc:
                rec["status"] = f"unavailable: {exc}"
            except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop the sweep
                rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
            records.append(rec)
    return records


def model_config(name: str, overrides="small"):
    """(family, architecture, config, applied overrides) of architecture ``name``.

    ``overrides``: "small" (:data:`SMALL_MODEL`), "tiny" (the family's CPU-sized model), None (the preset) or a
    dict. Keys the family's config does not have are dropped; if the small width does not divide into the
    preset's heads, ``num_heads = hidden_size // 64``.
    """
    from evalsuite.errors import UserError
    from evalsuite.models.registry import resolve_architecture

    family, arch = resolve_architecture(name)
    if overrides == "tiny":
        wanted = dict(family.tiny)
    elif overrides == "small":
        wanted = dict(SMALL_MODEL)
    else:
        wanted = dict(overrides or {})
    known = {f.name for f in fields(family.config_cls)}
    applied = {k: v for k, v in wanted.items() if k in known}
    try:
        return family, arch, family.make_config(arch, applied), applied
    except UserError:
        if "num_heads" not in known or "num_heads" in applied or "hidden_size" not in applied:
            raise
        applied["num_heads"] = max(1, applied["hidden_size"] // 64)
        return family, arch, family.make_config(arch, applied), applied


def bench_state_memory(
    archs=DEFAULT_ARCHS,
    contexts=DEFAULT_CONTEXTS,
    overrides="small",
    *,
    batch: int = 1,
    prefill_chunk: int = 4096,
    dtype=torch.bfloat16,
    device=None,
    seed: int = 0,
) -> list[dict]:
    """Decode-state memory vs context, one record per (architecture, context).

    Each model (fp32 weights, ``init_weights(seed)``; on CUDA in a low ``dtype`` its linear layers are cast and
    it runs under autocast, as the native adapter does; on CPU float32) prefills ``context`` random tokens in
    chunks of ``prefill_chunk`` into ``new_state(batch, context + 2)``, then decodes one token. Records
    ``state_nbytes`` (``state.nbytes()`` after the step), ``state_kind``, ``state_size`` (the model's
    ``decode_state_size`` per sequence) and on CUDA ``state_alloc_mib`` (allocated by the state and prefill),
    ``decode_step_peak_mib`` (peak during the step beyond what was allocated before it) and ``decode_total_mib``
    (that peak beyond the weights); ``prefill_s`` and ``decode_ms`` (a second step) are wall times.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = device.type == "cuda"
    low = cuda and dtype in (torch.bfloat16, torch.float16)
    records = []
    for name in archs:
        base = {"kind": "state_memory", "arch": name, "batch": batch, "device_type": device.type}
        base["dtype"] = str(dtype if low else torch.float32).removeprefix("torch.")
        try:
            family, arch, cfg, applied = model_config(name, overrides)
            with skip_random_init():
                model = family.build(cfg)
            model.init_weights(seed)
            model.to(device).eval()
            if low:
                for module in model.modules():
                    if isinstance(module, torch.nn.Linear):
                        module.to(dtype)
        except Exception as exc:  # noqa: BLE001 -- e.g. a family that is not registered here
            status = f"error: {type(exc).__name__}: {exc}"[:500]
            records += [{**base, "context": c, "status": status} for c in contexts]
            continue
        base.update(family=family.name, overrides=applied, params=model.num_params(), vocab=model.vocab_size)
        for context in contexts:
            rec = {**base, "context": context}
            try:
                rec.update(_measure(model, context, batch, prefill_chunk, dtype if low else None, device, seed))
                rec["status"] = "ok"
            except torch.OutOfMemoryError:
                rec["status"] = "oom"
            except Exception as exc:  # noqa: BLE001
                rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
            records.append(rec)
            if cuda:
                torch.cuda.empty_cache()
        del model
    return records


def _measure(model, context, batch, prefill_chunk, autocast_dtype, device, seed) -> dict:
    cuda = device.type == "cuda"
    gen = torch.Generator(device=device).manual_seed(seed + context)
    ids = torch.randint(model.vocab_size, (batch, context + 2), device=device, generator=gen)
    amp = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    out = {}
    with torch.no_grad(), amp:
        sync()
        weights = torch.cuda.memory_allocated() if cuda else 0
        state = model.new_state(batch, context + 2)
        t0 = time.perf_counter()
        for s in range(0, context, prefill_chunk):
            model(ids[:, s : min(s + prefill_chunk, context)], state=state)
        sync()
        out["prefill_s"] = time.perf_counter() - t0
        if cuda:
            out["state_alloc_mib"] = (torch.cuda.memory_allocated() - weights) / 2**20
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        model(ids[:, context : context + 1], state=state)  # the measured decode step
        sync()
        if cuda:
            peak = torch.cuda.max_memory_allocated()
            out["decode_step_peak_mib"] = (peak - before) / 2**20
            out["decode_total_mib"] = (peak - weights) / 2**20
        out.update(state_nbytes=state.nbytes(), state_kind=state.kind, state_length=state.length)
        out["state_size"] = model.decode_state_size(state.length, model.state_dtype())
        t0 = time.perf_counter()
        model(ids[:, context + 1 : context + 2], state=state)  # a second step, timed
        sync()
        out["decode_ms"] = (time.perf_counter() - t0) * 1e3
    del state
    return out
