"""Linear-time attention benchmark: our Gated Slot Attention and Lightning Attention against fla
(``evalsuite bench linear``).

Fixed tokens per call (``B * T = tokens_per_call``, B = tokens_per_call // T), as in :mod:`.attention`: a
linear-time op should then cost the same at every T (``batch`` fixes B instead: the Lightning paper's Figure 4,
where a linear op's time grows with T and a quadratic one's with T^2). Five modes:

* ``fwd`` / ``fwdbwd`` / ``bwd`` (:func:`bench_ops`): the providers of :mod:`.linear_ops` at one (mode, T) timed in
  turns in one process (:func:`~evalsuite.bench.common.time_providers`, ``rounds`` rounds), each fed in its own
  layout outside the timed region: median / 20% / 80% ms, tokens/s, peak extra memory (CUDA) and the median of the
  per-round ratios to fla's op of the same kind with its p20 / p80. ``bwd`` times the backward alone, re-run on one
  retained forward graph (:func:`~evalsuite.bench.common.backward_call`).
* ``decode`` (:func:`evalsuite.bench.decode.bench_decode`): one-token step latency with a state, per batch.
* ``memory`` (:func:`evalsuite.bench.decode.bench_state_memory`): decode-state bytes vs context, model level.

Providers whose package (fla) or device (Triton needs CUDA) is missing are recorded as "unavailable". The run
writes ``linear_bench.json`` (provenance, parameters, records), ``linear_bench.png`` and ``linear_bench.md`` (the
summary of :mod:`.linear_report`: ours <= 1.0x fla at T = 16384? tokens/s at the longest T within 15% of the
shortest? decode state flat in context?) and returns the records. fla autotunes its kernels on first use, for
minutes at some shapes: ``evalsuite bench tune fla`` runs every peer once beforehand (the winners are cached under
``$TRITON_CACHE_DIR``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalsuite.bench import decode as dec
from evalsuite.bench import linear_report as report
from evalsuite.bench.common import (
    Call,
    Unavailable,
    backward_call,
    env_info,
    fla_version,
    ratio_fields,
    ratio_text,
    rel_error,
    time_providers,
)
from evalsuite.bench.linear_ops import (
    DECODE_PROVIDERS,
    OP_PROVIDERS,
    OPS,
    PEERS,
    PROVIDERS,
    SDPA_PROVIDERS,
    VANILLA,
    default_providers,
    make_inputs,
    op_call,
)

MODES = ("fwd", "fwdbwd", "bwd", "decode", "memory")
TIMED_MODES = ("fwd", "fwdbwd", "bwd")
DEFAULT_SEQ_LENS = tuple(2**i for i in range(10, 17))  # 1024 .. 65536
JSON_NAME = "linear_bench.json"
PNG_NAME = "linear_bench.png"


def op_builder(op, provider, mode, x_args, device):
    """A builder of one provider's :class:`Call` for :func:`time_providers`: inputs made fresh, then ``fwd`` (no
    grad), ``fwdbwd`` (forward and backward) or ``bwd`` (:func:`backward_call`: the backward alone, re-run on one
    retained forward)."""

    def build() -> Call:
        x = make_inputs("lightning" if provider in SDPA_PROVIDERS else op, *x_args, device, grad=mode != "fwd")
        call, leaves = op_call(provider, x, mode != "fwd")
        do = x["do"]
        if mode == "bwd":
            return backward_call(call, leaves, do, device)
        if mode == "fwdbwd":
            return Call(lambda: call().backward(do), tuple(leaves))

        def forward():
            with torch.no_grad():
                call()

        return Call(forward)

    return build


def bench_ops(runs, mode, T, *, n_heads=16, head_dim=64, n_slots=64, tokens_per_call=65536, batch=None,
              dtype=torch.bfloat16, device=None, rounds=10, block_ms=10.0, warmup=25.0) -> list[dict]:  # fmt: skip
    """Time the ``(op, provider)`` pairs ``runs`` at one (mode, T), interleaved in one process
    (:func:`time_providers`): one record each, ``status`` "ok", "oom", "unavailable: ..." or the error.

    B = ``batch``, or ``tokens_per_call // T`` when None. An ok record holds the median / p20 / p80 ms over the
    rounds, the samples, tokens/s, the peak extra memory (CUDA; in ``bwd`` also ``saved_mib``) and, where the op's
    fla peer ran, ``ratio_to_fla`` with its p20 / p80 and pair count: the median of the per-round ratios.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    B = batch or max(1, tokens_per_call // T)
    x_args = (B, T, n_heads, head_dim, n_slots, dtype)
    builders = {provider: op_builder(op, provider, mode, x_args, device) for op, provider in runs}
    fields, samples = time_providers(builders, device=device, rounds=rounds, block_ms=block_ms, warmup_ms=warmup)
    records = []
    for op, provider in runs:
        rec = {"kind": "op", "op": op, "provider": provider, "mode": mode, "T": T, "B": B, "H": n_heads,
               "D": head_dim, "m": n_slots if op == "gsa" else None, "dtype": str(dtype).removeprefix("torch."),
               "device_type": device.type, **fields[provider]}  # fmt: skip
        if "ms" in rec:
            rec["tokens_per_s"] = B * T / (rec["ms"] * 1e-3)
        peer = PEERS.get(op)
        if provider in samples and peer in samples:
            rec.update(ratio_fields("ratio_to_fla", samples[provider], samples[peer]))
        records.append(rec)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


def check_parity(op, ours, peer=None, T=4096, *, batch=1, n_heads=16, head_dim=64, n_slots=64,
                 dtype=torch.bfloat16, device=None) -> dict:  # fmt: skip
    """Our provider vs the fla peer on the same inputs: relative errors ``|a - b| / |b|`` of the output and of the
    gradients (q, k, v and, for GSA, log_alpha: fla's ``dg + ds * d s/d g``); ``max_rel_err`` is their max."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    peer = peer or PEERS[op]
    rec = {"kind": "parity", "op": op, "provider": ours, "peer": peer, "T": T, "B": batch, "H": n_heads}
    rec.update(D=head_dim, m=n_slots if op == "gsa" else None, dtype=str(dtype).removeprefix("torch."))
    try:
        outs = []
        for provider in (peer, ours):  # the peer first: a missing fla stops before our kernel runs
            x = make_inputs(op, batch, T, n_heads, head_dim, n_slots, dtype, device, seed=1, grad=True)
            call, _ = op_call(provider, x, grad=True)
            o = call()
            o.backward(x["do"])
            grads = {n: x[n].grad for n in ("q", "k", "v", "log_alpha") if n in x}
            if "fla_s" in x:  # chain rule through s = 1 - exp(g), which fla takes as a separate input
                grads["log_alpha"] = grads["log_alpha"] + x["fla_s"].grad.float() * -x["log_alpha"].detach().exp()
            outs.append({"o": o.detach(), **{f"d{n}": g for n, g in grads.items()}})
        errs = {name: rel_error(outs[1][name], outs[0][name]) for name in outs[0]}
        rec.update({f"rel_err_{n}": e for n, e in errs.items()}, max_rel_err=max(errs.values()), status="ok")
    except Unavailable as exc:
        rec["status"] = f"unavailable: {exc}"
    except Exception as exc:  # noqa: BLE001
        rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
    return rec


def bench_linear(out, *, ops=OPS, providers=None, modes=MODES, seq_lens=DEFAULT_SEQ_LENS, n_heads: int = 16,
                 head_dim: int = 64, n_slots: int = 64, tokens_per_call: int = 65536, dtype: str = "bfloat16",
                 decode_batches=(1, 8, 32), archs=None, contexts=None, model_overrides="small",
                 parity_T: int | None = 4096, ref_T: int = 16384, device=None, warmup: float = 25, rep: float = 100,
                 rounds: int = 10, block_ms: float = 10.0, batch: int | None = None,
                 verbose: bool = True) -> list[dict]:  # fmt: skip
    """The whole run; writes ``linear_bench.json``, ``.png`` and ``.md`` under ``out``; returns the records.

    Args:
        ops: subset of :data:`OPS`. providers: subset of :data:`PROVIDERS` (default: :func:`default_providers`);
            each mode runs the chosen providers that implement it. modes: subset of :data:`MODES`.
        seq_lens, tokens_per_call: the fwd / fwdbwd / bwd grid, B = tokens_per_call // T; ``batch`` fixes B.
        rounds, block_ms, warmup: the interleaved timing (:func:`~evalsuite.bench.common.interleaved_ms`); warmup,
            rep: the decode mode's (:func:`~evalsuite.bench.common.time_ms`).
        decode_batches: batches of the decode-latency mode. archs, contexts, model_overrides: the memory mode
            (see :func:`evalsuite.bench.decode.bench_state_memory`).
        parity_T: T of the parity check of ours vs fla (B = 1; None: skip). ref_T: T of the ratio targets.
        device: default CUDA when present, else CPU (then use the ``*_chunked`` providers).
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    providers = tuple(providers or default_providers(device))
    bad = [p for p in providers if p not in PROVIDERS] + [o for o in ops if o not in OPS]
    bad += [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown provider/op/mode {', '.join(bad)}")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    archs, contexts = list(archs or dec.DEFAULT_ARCHS), list(contexts or dec.DEFAULT_CONTEXTS)
    params = dict(ops=list(ops), providers=list(providers), modes=list(modes), seq_lens=list(seq_lens),
                  n_heads=n_heads, head_dim=head_dim, n_slots=n_slots, tokens_per_call=tokens_per_call, batch=batch,
                  rounds=rounds, block_ms=block_ms,
                  dtype=str(torch_dtype).removeprefix("torch."), decode_batches=list(decode_batches),
                  archs=archs, contexts=contexts, model_overrides=model_overrides, parity_T=parity_T, ref_T=ref_T,
                  device=str(device))  # fmt: skip
    env = {**env_info(), "fla": fla_version()}
    records: list[dict] = []

    def add(new):
        for rec in new:
            records.append(rec)
            _log(verbose, rec)

    def save():
        for r in records:
            r.setdefault("device", env["device"])
        doc = {"env": env, "params": params, "records": records}
        (out / JSON_NAME).write_text(json.dumps(doc, indent=1, default=str))  # rewritten as it goes

    shape = dict(n_heads=n_heads, head_dim=head_dim, n_slots=n_slots, dtype=torch_dtype, device=device)
    timing = dict(
        tokens_per_call=tokens_per_call, batch=batch, rounds=rounds, block_ms=block_ms, warmup=warmup, **shape
    )
    for mode in [m for m in modes if m in TIMED_MODES]:
        for T in seq_lens:
            add(bench_ops(_op_runs(ops, providers), mode, T, **timing))
            save()
    if parity_T and any(m in modes for m in TIMED_MODES):
        ours = {op: next((p for p in OP_PROVIDERS[op][:2] if p in providers), None) for op in ops}
        add([check_parity(op, p, T=parity_T, **shape) for op, p in ours.items() if p is not None])
        save()
    if "decode" in modes:
        chosen = [p for op in ops for p in DECODE_PROVIDERS[op] if p in providers]
        add(dec.bench_decode(chosen, batches=decode_batches, warmup=warmup, rep=rep, **shape))
        save()
    if "memory" in modes:
        add(dec.bench_state_memory(archs, contexts, model_overrides, dtype=torch_dtype, device=device))
    save()
    report.plot_linear_bench(records, out / PNG_NAME, env)
    summary = report.format_summary(records, ref_T=ref_T)
    (out / "linear_bench.md").write_text(summary + "\n")
    if verbose:
        print(summary)
    return records


def _op_runs(ops, providers) -> list[tuple[str, str]]:
    """The (op, provider) pairs of one (mode, T) of the timed grid: every chosen provider of every op, then SDPA (op
    "sdpa"), Vanilla last (its O(T^2) memory would leave no room for a provider built after it)."""
    runs = [(op, p) for op in ops for p in OP_PROVIDERS[op] if p in providers]
    runs += [("sdpa", p) for p in SDPA_PROVIDERS if p in providers]
    return sorted(runs, key=lambda run: run[1] == VANILLA)


def _log(verbose, r) -> None:
    if not verbose:
        return
    kind = r["kind"]
    if kind == "parity":
        what = f"max rel err {r['max_rel_err']:.2e}" if "max_rel_err" in r else r["status"]
        print(f"parity  {r['op']:9s} T={r['T']:<6d} {r['provider']} vs {r['peer']}: {what}", flush=True)
    elif kind == "state_memory":
        what = f"{r['state_nbytes'] / 2**20:10.2f} MiB ({r['state_kind']})" if "state_nbytes" in r else r["status"]
        print(f"memory  {r['arch']:18s} ctx={r['context']:<6d} {what}", flush=True)
    else:
        what = f"{r['ms']:9.3f} ms" if "ms" in r else r["status"]
        if "ratio_to_fla" in r:
            what += f"  {ratio_text(r, 'ratio_to_fla')} fla"
        where = f"T={r['T']:<6d}" if kind == "op" else f"B={r['batch']:<4d}"
        print(f"{r.get('mode', 'decode'):7s} {r['op']:9s} {where} {r['provider']:24s} {what}", flush=True)
