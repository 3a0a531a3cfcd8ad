"""Linear-time attention benchmark: our Gated Slot Attention and Lightning Attention against fla.

Fixed tokens per call (``B * T = tokens_per_call``, B = tokens_per_call // T), as in :mod:`.attention`: a
linear-time op should then cost the same at every T. Four modes:

* ``fwd`` / ``fwdbwd`` (:func:`bench_op`): median / 20% / 80% ms (``triton.testing.do_bench`` on CUDA, a
  ``perf_counter`` loop elsewhere), tokens/s, peak extra memory (CUDA) and the ratio to fla's op of the same kind.
  Providers, each fed in its own layout outside the timed region:

  - ``gsa_triton`` / ``gsa_chunked``: :func:`~evalsuite.kernels.gated_slot.gated_slot_attention` (backend
    "triton" / "chunked"), m = 64 slots, scale 1.0, ``log_alpha = logsigmoid(randn) / 8``; gradients to q, k, v
    and log_alpha.
  - ``fla_chunk_gsa``: fla's ``chunk_gsa(q, k, v, s, g)`` with ``g = log_alpha`` and ``s = 1 - exp(g)`` computed
    outside the timed call (a separate leaf in fwdbwd: fla is not charged for the chain rule through s).
  - ``lightning_triton`` / ``lightning_chunked``: :func:`~evalsuite.kernels.lightning.lightning_attention`, the
    ALiBi slopes ``2^(-8 h / H)``, h = 1..H.
  - ``fla_simple_gla``: fla's ``chunk_simple_gla(q, k, v, g_gamma=-slope, scale=1.0)`` (the Lightning schedule).
  - ``sdpa_causal``: softmax attention, for scale.

* ``decode`` (:func:`evalsuite.bench.decode.bench_decode`): one-token step latency with a state, per batch.
* ``memory`` (:func:`evalsuite.bench.decode.bench_state_memory`): decode-state bytes vs context, model level.

Providers whose package (fla) or device (Triton needs CUDA) is missing are recorded as "unavailable". The run
writes ``linear_bench.json`` (provenance, parameters, records), ``linear_bench.png`` and ``linear_bench.md`` (the
summary of :mod:`.linear_report`: ours <= 1.0x fla at T = 16384? Lightning tokens/s at the longest T within 15% of
the shortest? decode state flat in context?) and returns the records. On a GPU machine:

    python -m evalsuite.bench.linear --out results/bench/linear
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from evalsuite.bench.attention import QUANTILES, env_info, peak_memory_mib, rel_error, timed_median

OPS = ("gsa", "lightning")
OP_PROVIDERS = {
    "gsa": ("gsa_triton", "gsa_chunked", "fla_chunk_gsa"),
    "lightning": ("lightning_triton", "lightning_chunked", "fla_simple_gla"),
}
DECODE_PROVIDERS = {
    "gsa": ("gsa_triton", "gsa_chunked", "fla_recurrent_gsa"),
    "lightning": ("lightning_triton", "lightning_chunked", "fla_recurrent_simple_gla"),
}
SDPA = "sdpa_causal"
PEERS = {"gsa": "fla_chunk_gsa", "lightning": "fla_simple_gla"}
PROVIDERS = tuple(dict.fromkeys([*OP_PROVIDERS["gsa"], *OP_PROVIDERS["lightning"], SDPA,
                                 *DECODE_PROVIDERS["gsa"], *DECODE_PROVIDERS["lightning"]]))  # fmt: skip
CUDA_PROVIDERS = ("gsa_triton", "fla_chunk_gsa", "lightning_triton", "fla_simple_gla", SDPA,
                  "fla_recurrent_gsa", "fla_recurrent_simple_gla")  # fmt: skip
CPU_PROVIDERS = ("gsa_chunked", "lightning_chunked", SDPA)
MODES = ("fwd", "fwdbwd", "decode", "memory")
DEFAULT_SEQ_LENS = tuple(2**i for i in range(10, 17))  # 1024 .. 65536
JSON_NAME = "linear_bench.json"
PNG_NAME = "linear_bench.png"


def default_providers(device=None) -> tuple[str, ...]:
    """Ours on Triton plus the fla peers and SDPA on CUDA; the chunked PyTorch twins and SDPA elsewhere."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return CUDA_PROVIDERS if device.type == "cuda" else CPU_PROVIDERS


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Lightning's per-head decay rates (TNL's code schedule at layer 0, without the layer factor), float32 ``[H]``."""
    from evalsuite.models.tnl.model import alibi_slopes as slopes

    return torch.tensor(slopes(n_heads), dtype=torch.float32)


def fla_version() -> str | None:
    try:
        import fla
    except Exception:  # noqa: BLE001 -- any import failure means fla is not usable here
        return None
    return getattr(fla, "__version__", "unknown")


def _fla(name: str):
    """``fla.ops.<module>.<fn>`` for ``name = "module.fn"``, or None when fla does not import."""
    module, fn = name.split(".")
    try:
        mod = __import__(f"fla.ops.{module}", fromlist=[fn])
    except Exception:  # noqa: BLE001 -- missing package, CUDA/triton mismatch: skip the provider
        return None
    return getattr(mod, fn, None)


class Unavailable(Exception):
    """A provider that cannot run here (missing package or device); recorded, not raised."""


def time_ms(fn, leaves=(), device="cuda", warmup=25, rep=100, max_calls=100) -> tuple[float, float, float]:
    """(median, p20, p80) ms of ``fn()``; the grads of ``leaves`` are reset between calls.

    CUDA: :func:`triton.testing.do_bench` (``warmup`` / ``rep`` in ms). Elsewhere: a ``perf_counter`` loop of at
    least 3 calls, more while ``rep`` ms last (at most ``max_calls``). ``fn`` should have run once already.
    """
    leaves = list(leaves)
    if torch.device(device).type == "cuda":
        return timed_median(fn, leaves, warmup, rep)
    times, stop = [], time.perf_counter() + rep / 1e3
    while len(times) < 3 or (time.perf_counter() < stop and len(times) < max_calls):
        for t in leaves:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    ms, lo, hi = np.quantile(times, QUANTILES)
    return float(ms), float(lo), float(hi)


def make_inputs(op, B, T, H, D, n_slots=64, dtype=torch.bfloat16, device="cpu", seed=0, grad=False) -> dict:
    """Random inputs of ``op`` in the ``[B, T, H, .]`` layout: q, k ~ N(0, 1/sqrt(D)) (unit-variance q.k), v ~ N(0,
    1), an output gradient ``do``; GSA: ``log_alpha = logsigmoid(randn) / 8`` float32 ``[B, T, H, m]``; Lightning:
    ``slope`` (ALiBi, ``[H]``). Leaves (``requires_grad`` when ``grad``) are listed under ``"leaves"``."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dt).requires_grad_(grad)

    x = dict(q=randn(B, T, H, D, scale=D**-0.25), k=randn(B, T, H, D, scale=D**-0.25), v=randn(B, T, H, D))
    if op == "gsa":
        g = torch.randn(B, T, H, n_slots, device=device, generator=gen)
        x["log_alpha"] = (torch.nn.functional.logsigmoid(g) / 8).requires_grad_(grad)
    elif op == "lightning":
        x["slope"] = alibi_slopes(H).to(device)
    else:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    x["do"] = torch.randn(B, T, H, D, device=device, generator=gen).to(dtype)
    x["leaves"] = [x[n] for n in ("q", "k", "v", "log_alpha") if n in x and grad]
    return x


def op_call(provider: str, x: dict, grad: bool = False):
    """(call, leaves): ``call()`` runs ``provider`` forward on the inputs ``x`` of :func:`make_inputs` and returns
    the output ``[B, T, H, D]``; leaves are the tensors that get gradients. Raises :class:`Unavailable`."""
    q, k, v = x["q"], x["k"], x["v"]
    leaves = list(x["leaves"])
    if provider in ("gsa_triton", "gsa_chunked", "lightning_triton", "lightning_chunked"):
        backend = provider.split("_")[1]
        if backend == "triton" and not q.is_cuda:
            raise Unavailable("needs CUDA")
        if provider.startswith("gsa"):
            from evalsuite.kernels.gated_slot import gated_slot_attention

            g = x["log_alpha"]
            return (lambda: gated_slot_attention(q, k, v, g, scale=1.0, backend=backend)[0]), leaves
        from evalsuite.kernels.lightning import lightning_attention

        slope = x["slope"]
        return (lambda: lightning_attention(q, k, v, slope, backend=backend)[0]), leaves
    if provider == "fla_chunk_gsa":
        fn = _fla("gsa.chunk_gsa")
        if fn is None:
            raise Unavailable("fla not installed")
        g = x["log_alpha"]
        s = (-torch.expm1(g.detach())).to(q.dtype).requires_grad_(grad)  # fla's GSA layer: s = 1 - exp(g)
        x["fla_s"] = s
        return (lambda: fn(q, k, v, s, g, scale=1.0, output_final_state=False)[0]), leaves + ([s] if grad else [])
    if provider == "fla_simple_gla":
        fn = _fla("simple_gla.chunk_simple_gla")
        if fn is None:
            raise Unavailable("fla not installed")
        g_gamma = -x["slope"]
        return (lambda: fn(q, k, v, g_gamma=g_gamma, scale=1.0)[0]), leaves
    if provider == SDPA:
        qh, kh, vh = (t.detach().transpose(1, 2).contiguous().requires_grad_(grad) for t in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return (lambda: sdpa(qh, kh, vh, is_causal=True).transpose(1, 2)), [qh, kh, vh] if grad else []
    raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")


def bench_op(op, provider, mode, T, *, n_heads=16, head_dim=64, n_slots=64, tokens_per_call=65536,
             dtype=torch.bfloat16, device=None, warmup=25, rep=100) -> dict:  # fmt: skip
    """Time one (op, provider, mode, T); returns a record (``status``: "ok", "oom", "unavailable: ..." or the error)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    B = max(1, tokens_per_call // T)
    rec = {"kind": "op", "op": op, "provider": provider, "mode": mode, "T": T, "B": B, "H": n_heads, "D": head_dim}
    rec.update(m=n_slots if op == "gsa" else None, dtype=str(dtype).removeprefix("torch."), device_type=device.type)
    grad = mode == "fwdbwd"
    fn = x = None
    try:
        x = make_inputs(op if provider != SDPA else "lightning", B, T, n_heads, head_dim, n_slots, dtype, device,
                        grad=grad)  # fmt: skip
        call, leaves = op_call(provider, x, grad)
        do = x["do"]

        def fn():
            if grad:
                call().backward(do)
            else:
                with torch.no_grad():
                    call()

        fn()  # compile / warm up outside the timing
        if device.type == "cuda":
            rec["peak_mem_mib"] = peak_memory_mib(fn, leaves)
        ms, lo, hi = time_ms(fn, leaves, device, warmup, rep)
        rec.update(status="ok", ms=ms, ms_p20=lo, ms_p80=hi, tokens_per_s=B * T / (ms * 1e-3))
    except Unavailable as exc:
        rec["status"] = f"unavailable: {exc}"
    except torch.OutOfMemoryError:
        rec["status"] = "oom"
    except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop the sweep
        rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
    finally:
        del fn, x
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rec


def add_ratios(records) -> None:
    """``ratio_to_fla`` = ms / ms of the op's fla peer at the same (mode, T), on every timed op record of that op."""
    peer = {(r["op"], r["mode"], r["T"]): r["ms"] for r in records
            if r.get("kind") == "op" and r["provider"] == PEERS.get(r["op"]) and "ms" in r}  # fmt: skip
    for r in records:
        if r.get("kind") == "op" and "ms" in r and (r["op"], r["mode"], r["T"]) in peer:
            r["ratio_to_fla"] = r["ms"] / peer[(r["op"], r["mode"], r["T"])]


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


def bench_linear(
    out,
    *,
    ops=OPS,
    providers=None,
    modes=MODES,
    seq_lens=DEFAULT_SEQ_LENS,
    n_heads: int = 16,
    head_dim: int = 64,
    n_slots: int = 64,
    tokens_per_call: int = 65536,
    dtype: str = "bfloat16",
    decode_batches=(1, 8, 32),
    archs=None,
    contexts=None,
    model_overrides="small",
    parity_T: int | None = 4096,
    ref_T: int = 16384,
    device=None,
    warmup: float = 25,
    rep: float = 100,
    verbose: bool = True,
) -> list[dict]:
    """The whole run; writes ``linear_bench.json`` and ``linear_bench.png`` under ``out``; returns the records.

    Args:
        ops: subset of :data:`OPS`. providers: subset of :data:`PROVIDERS` (default: :func:`default_providers`);
            each mode runs the chosen providers that implement it. modes: subset of :data:`MODES`.
        seq_lens, tokens_per_call: the fwd / fwdbwd grid, B = tokens_per_call // T.
        decode_batches: batches of the decode-latency mode. archs, contexts, model_overrides: the memory mode
            (see :func:`evalsuite.bench.decode.bench_state_memory`).
        parity_T: T of the parity check of ours vs fla (B = 1; None: skip). ref_T: T of the ratio targets.
        device: default CUDA when present, else CPU (then use the ``*_chunked`` providers).
    """
    from evalsuite.bench import decode as dec
    from evalsuite.bench import linear_report as report

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    providers = tuple(providers or default_providers(device))
    bad = [p for p in providers if p not in PROVIDERS] + [o for o in ops if o not in OPS]
    bad += [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown provider/op/mode {', '.join(bad)}")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(ops=list(ops), providers=list(providers), modes=list(modes), seq_lens=list(seq_lens),
                  n_heads=n_heads, head_dim=head_dim, n_slots=n_slots, tokens_per_call=tokens_per_call,
                  dtype=str(torch_dtype).removeprefix("torch."), decode_batches=list(decode_batches),
                  archs=list(archs or dec.DEFAULT_ARCHS), contexts=list(contexts or dec.DEFAULT_CONTEXTS),
                  model_overrides=model_overrides, parity_T=parity_T, ref_T=ref_T, device=str(device))  # fmt: skip
    env = {**env_info(), "fla": fla_version()}
    records: list[dict] = []

    def save():
        add_ratios(records)
        for r in records:
            r.setdefault("device", env["device"])
        doc = {"env": env, "params": params, "records": records}
        (out / JSON_NAME).write_text(json.dumps(doc, indent=1, default=str))  # rewritten as it goes

    shape = dict(n_heads=n_heads, head_dim=head_dim, n_slots=n_slots, dtype=torch_dtype, device=device)
    for mode in [m for m in modes if m in ("fwd", "fwdbwd")]:
        for T in seq_lens:
            for op in ops:
                for provider in [p for p in OP_PROVIDERS[op] if p in providers]:
                    records.append(bench_op(op, provider, mode, T, tokens_per_call=tokens_per_call, warmup=warmup,
                                            rep=rep, **shape))  # fmt: skip
                    _log(verbose, records[-1])
            if SDPA in providers:
                records.append(bench_op("sdpa", SDPA, mode, T, tokens_per_call=tokens_per_call, warmup=warmup,
                                        rep=rep, **shape))  # fmt: skip
                _log(verbose, records[-1])
            save()
    if parity_T and any(m in modes for m in ("fwd", "fwdbwd")):
        for op in ops:
            ours = next((p for p in OP_PROVIDERS[op][:2] if p in providers), None)
            if ours is not None:
                records.append(check_parity(op, ours, T=parity_T, **shape))
                _log(verbose, records[-1])
        save()
    if "decode" in modes:
        chosen = [p for op in ops for p in DECODE_PROVIDERS[op] if p in providers]
        for rec in dec.bench_decode(chosen, batches=decode_batches, warmup=warmup, rep=rep, **shape):
            records.append(rec)
            _log(verbose, rec)
        save()
    if "memory" in modes:
        for rec in dec.bench_state_memory(archs or dec.DEFAULT_ARCHS, contexts or dec.DEFAULT_CONTEXTS,
                                          model_overrides, dtype=torch_dtype, device=device):  # fmt: skip
            records.append(rec)
            _log(verbose, rec)
        save()
    save()
    report.plot_linear_bench(records, out / PNG_NAME, env)
    summary = report.format_summary(records, ref_T=ref_T)
    (out / "linear_bench.md").write_text(summary + "\n")
    if verbose:
        print(summary)
    return records


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
        where = f"T={r['T']:<6d}" if kind == "op" else f"B={r['batch']:<4d}"
        print(f"{r.get('mode', 'decode'):7s} {r['op']:9s} {where} {r['provider']:24s} {what}", flush=True)


def main(argv=None) -> None:
    """``python -m evalsuite.bench.linear``: the same run without the CLI's dependencies (GPU machines)."""
    from evalsuite.bench.decode import DEFAULT_ARCHS, DEFAULT_CONTEXTS

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder for the JSON, PNG and markdown summary")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=OPS)
    parser.add_argument("--providers", nargs="+", default=None, choices=PROVIDERS,
                        help="default: Triton + fla + SDPA on CUDA, the chunked twins + SDPA on CPU")  # fmt: skip
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(DEFAULT_SEQ_LENS))
    parser.add_argument("--n-heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--n-slots", type=int, default=64)
    parser.add_argument("--tokens-per-call", type=int, default=65536)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--decode-batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--archs", nargs="+", default=list(DEFAULT_ARCHS), help="architectures of the memory mode")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(DEFAULT_CONTEXTS))
    parser.add_argument("--model-size", default="small", choices=("small", "tiny", "full"),
                        help="memory mode: hidden 1024 x 4 layers, the family's tiny model, or the preset")  # fmt: skip
    parser.add_argument("--parity-T", type=int, default=4096, help="T of the parity check (0: skip)")
    parser.add_argument("--ref-T", type=int, default=16384, help="T of the ratio targets")
    args = parser.parse_args(argv)
    bench_linear(
        args.out, ops=args.ops, providers=args.providers, modes=args.modes, seq_lens=args.seq_lens,
        n_heads=args.n_heads, head_dim=args.head_dim, n_slots=args.n_slots, tokens_per_call=args.tokens_per_call,
        dtype=args.dtype, decode_batches=args.decode_batches, archs=args.archs, contexts=args.contexts,
        model_overrides=None if args.model_size == "full" else args.model_size, parity_T=args.parity_T or None,
        ref_T=args.ref_T,
    )  # fmt: skip


if __name__ == "__main__":
    main()
