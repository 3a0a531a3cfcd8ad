"""Attention kernel benchmark: our Triton Forgetting Attention against SDPA causal and fla.

Fixed tokens per call (``B * T = tokens_per_call``), so every T costs the same number of tokens and the
quadratic term shows. For each (mode, D, T, provider) the record holds the median / 20% / 80% times from
``triton.testing.do_bench``, the peak extra memory of one call, achieved TFLOP/s and the ratio to SDPA.

Providers (each gets its inputs in the layout it wants, prepared outside the timed region):
* ``fox_triton``: :func:`forgetting_attention_triton` on ``[B, T, H, D]``; the timed call includes the
  caller's cumsum of the log forget gates (:func:`cumsum_over_time`, as a model should run it), and gradients
  flow to ``log f``.
* ``triton_causal``: the same kernel without a gate (``cum=None``): the cost of the bias, by difference.
* ``sdpa_causal``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on ``[B, H, T, D]``.
* ``fla_forgetting``: fla's ``parallel_forgetting_attn`` (``[B, T, H, D]``, log f), when ``fla`` imports.

Also :func:`check_parity_gpu` (kernel vs a float32 blocked reference at long T) and :func:`tune_configs`
(sweeps the kernels' block configurations). Run on a GPU machine:

    python -m evalsuite.bench.attention --out DIR [--seq-lens 1024 2048 ...] [--tune]
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch

PROVIDERS = ("fox_triton", "triton_causal", "sdpa_causal", "fla_forgetting")
DEFAULT_PROVIDERS = ("fox_triton", "sdpa_causal", "fla_forgetting")
MODES = ("fwd", "fwdbwd")
DEFAULT_SEQ_LENS = tuple(2**i for i in range(10, 17))  # 1024 .. 65536
BASELINE = "sdpa_causal"
JSON_NAME = "attention_bench.json"
PNG_NAME = "attention_bench.png"
QUANTILES = [0.5, 0.2, 0.8]


def env_info() -> dict:
    """Device, software versions and git commit (the suite's provenance), stored in every record."""
    from evalsuite.runs.provenance import git_commit, versions

    info = {**versions(), "git_commit": git_commit(), "cuda": torch.version.cuda}
    info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return info


def attention_flops(B: int, T: int, H: int, D: int, mode: str) -> float:
    """Matmul FLOPs of causal attention: two T x T x D products, half of them masked; backward is 2.5x."""
    fwd = 4.0 * B * H * T * T * D / 2
    return fwd if mode == "fwd" else 3.5 * fwd


def _log_forget_gates(B, T, H, device, generator=None):
    """log f = logsigmoid(x) with per-head biases spanning weak to strong decay ([B, T, H] float32)."""
    bias = torch.linspace(5.0, -1.0, H, device=device)  # sigma(5) ~ 0.993 ... sigma(-1) ~ 0.27
    x = torch.randn(B, T, H, device=device, generator=generator) + bias
    return torch.nn.functional.logsigmoid(x)


def _fla_forgetting():
    try:
        from fla.ops.forgetting_attn import parallel_forgetting_attn
    except Exception:  # noqa: BLE001 -- any import failure (missing package, CUDA/triton mismatch) means skip
        return None
    return parallel_forgetting_attn


def _build_call(provider, B, T, H, D, dtype, mode, device):
    """Inputs in the provider's layout and a closure running one call (forward, or forward + backward).

    Returns (fn, leaves): leaves are the tensors whose .grad the benchmark resets between calls.
    """
    grad = mode == "fwdbwd"
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen).requires_grad_(grad)

    if provider == "sdpa_causal":
        q, k, v = randn(B, H, T, D), randn(B, H, T, D), randn(B, H, T, D)
        do = torch.randn(B, H, T, D, device=device, dtype=dtype, generator=gen)
        leaves = [q, k, v]

        def call():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    elif provider in ("fox_triton", "triton_causal", "fla_forgetting"):
        q, k, v = randn(B, T, H, D), randn(B, T, H, D), randn(B, T, H, D)
        do = torch.randn(B, T, H, D, device=device, dtype=dtype, generator=gen)
        logf = _log_forget_gates(B, T, H, device, gen).requires_grad_(grad)
        leaves = [q, k, v, logf]
        if provider == "fla_forgetting":
            fla_fn = _fla_forgetting()
            if fla_fn is None:
                return None, None

            def call():
                return fla_fn(q, k, v, logf)

        else:
            from evalsuite.kernels.forgetting import cumsum_over_time
            from evalsuite.kernels.forgetting.forward import forgetting_attention_triton

            if provider == "triton_causal":
                leaves = [q, k, v]

                def call():
                    return forgetting_attention_triton(q, k, v)

            else:

                def call():
                    return forgetting_attention_triton(q, k, v, cumsum_over_time(logf))

    else:
        raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")

    if grad:

        def fn():
            call().backward(do)

    else:

        def fn():
            with torch.no_grad():
                call()

    return fn, leaves


def peak_memory_mib(fn, leaves) -> float:
    """Peak memory one call allocates beyond its inputs (MiB); gradients of the inputs count."""
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for t in leaves:
        t.grad = None
    return peak / 2**20


def timed_median(fn, leaves, warmup=25, rep=100) -> tuple[float, float, float]:
    """(median, p20, p80) ms of ``fn`` from ``triton.testing.do_bench`` (CUDA), the grads of ``leaves`` reset
    between calls; ``warmup`` / ``rep`` (ms) are raised for slow calls to at least 3 / 15 calls."""
    import triton.testing

    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    torch.cuda.synchronize()
    one = start.elapsed_time(stop)
    warmup, rep = max(warmup, 3 * one), max(rep, 15 * one)
    ms, lo, hi = triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=leaves, quantiles=QUANTILES)
    return ms, lo, hi


def bench_one(provider, T, D, mode, n_heads=16, tokens_per_call=65536, dtype=torch.bfloat16, warmup=25, rep=100):
    """Time one configuration; returns a record dict (``status`` says "ok", "oom", "unavailable" or the error).

    ``warmup`` / ``rep`` are milliseconds (do_bench's meaning), raised for slow calls to at least 3 / 15 calls.
    """
    B = max(1, tokens_per_call // T)
    rec = {"kind": "timing", "provider": provider, "mode": mode, "T": T, "B": B, "H": n_heads, "D": D}
    rec["dtype"] = str(dtype).replace("torch.", "")
    fn = None
    try:
        fn, leaves = _build_call(provider, B, T, n_heads, D, dtype, mode, torch.device("cuda"))
        if fn is None:
            return {**rec, "status": "unavailable"}
        fn()  # compile / warm up outside the timing
        peak = peak_memory_mib(fn, leaves)
        ms, lo, hi = timed_median(fn, leaves, warmup, rep)
        rec.update(status="ok", ms=ms, ms_p20=lo, ms_p80=hi, peak_mem_mib=peak)
        rec["tflops"] = attention_flops(B, T, n_heads, D, mode) / (ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError:
        rec["status"] = "oom"
    except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop the sweep
        rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
    finally:
        del fn
        torch.cuda.empty_cache()
    return rec


def _add_ratios(records):
    """ratio_to_sdpa = ms / ms of sdpa_causal at the same (mode, D, T)."""
    base = {(r["mode"], r["D"], r["T"]): r["ms"] for r in records if r.get("provider") == BASELINE and "ms" in r}
    for r in records:
        key = (r.get("mode"), r.get("D"), r.get("T"))
        if r.get("kind") == "timing" and "ms" in r and key in base:
            r["ratio_to_sdpa"] = r["ms"] / base[key]


def run_attention_bench(
    out_dir,
    seq_lens=DEFAULT_SEQ_LENS,
    head_dims=(64, 128),
    modes=MODES,
    n_heads=16,
    tokens_per_call=65536,
    dtype=torch.bfloat16,
    providers=DEFAULT_PROVIDERS,
    parity_seq_lens=None,
    verbose=True,
) -> list[dict]:
    """Benchmark every (mode, D, T, provider); write ``attention_bench.json`` and ``attention_bench.png``.

    Args:
        out_dir: folder for the JSON (list of records) and the plot.
        seq_lens, head_dims, modes: the grid; B = tokens_per_call // T.
        providers: subset of :data:`PROVIDERS`; fla is skipped (status "unavailable") when it does not import.
        parity_seq_lens: when given, :func:`check_parity_gpu` (and the decode check) run after the timings and
            their records join the JSON.
    Returns:
        the records (timing records, plus parity records when asked).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the attention benchmark needs a CUDA device")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = env_info()
    records = [{"kind": "configs", **_kernel_configs(), **info}]
    json_path = out_dir / JSON_NAME
    for mode in modes:
        for D in head_dims:
            for T in seq_lens:
                for provider in providers:
                    rec = {**bench_one(provider, T, D, mode, n_heads, tokens_per_call, dtype), **info}
                    records.append(rec)
                    if verbose:
                        ms = f"{rec['ms']:9.3f} ms  {rec['peak_mem_mib']:9.1f} MiB" if "ms" in rec else rec["status"]
                        print(f"{mode:7s} D={D:<4d} T={T:<6d} {provider:15s} {ms}", flush=True)
                    _add_ratios(records)
                    json_path.write_text(json.dumps(records, indent=1))  # rewritten as it goes: a cut run keeps data
    if parity_seq_lens:
        for D in head_dims:
            records += check_parity_gpu(parity_seq_lens, head_dim=D, verbose=verbose)
        records += check_decode_parity_gpu(head_dims=head_dims, verbose=verbose)
    json_path.write_text(json.dumps(records, indent=1))
    plot_attention_bench(records, out_dir / PNG_NAME)
    if verbose:
        print(format_table(records))
    return records


def _kernel_configs() -> dict:
    """The block configurations the kernels will use (they may have been tuned in this process)."""
    from evalsuite.kernels.forgetting import common

    return {
        "fwd_configs": {str(d): list(c) for d, c in common.FWD_CONFIGS.items()},
        "bwd_dkdv_configs": {str(d): list(c) for d, c in common.BWD_DKDV_CONFIGS.items()},
        "bwd_dq_configs": {str(d): list(c) for d, c in common.BWD_DQ_CONFIGS.items()},
        "fwd_tma": {str(d): bool(x) for d, x in common.FWD_TMA.items()},
    }


def format_table(records) -> str:
    """A text table: median ms (ratio to SDPA) per (mode, D, T) row, one column per provider."""
    timing = [r for r in records if r.get("kind") == "timing"]
    providers = list(dict.fromkeys(r["provider"] for r in timing))
    lines = [f"{'mode':7s} {'D':>4s} {'T':>6s} " + " ".join(f"{p:>22s}" for p in providers)]
    keys = list(dict.fromkeys((r["mode"], r["D"], r["T"]) for r in timing))
    for mode, D, T in keys:
        cells = []
        for p in providers:
            r = next((r for r in timing if (r["mode"], r["D"], r["T"], r["provider"]) == (mode, D, T, p)), None)
            if r is None or "ms" not in r:
                cells.append(f"{(r or {}).get('status', '-')[:22]:>22s}")
            else:
                ratio = f" ({r['ratio_to_sdpa']:.2f}x)" if "ratio_to_sdpa" in r else ""
                cells.append(f"{r['ms']:.3f}{ratio}".rjust(22))
        lines.append(f"{mode:7s} {D:4d} {T:6d} " + " ".join(cells))
    return "\n".join(lines)


def plot_attention_bench(records, path) -> None:
    """Time vs T (log-log, one line per provider) per mode x D panel, with the ratio to SDPA underneath."""
    from matplotlib.figure import Figure

    timing = [r for r in records if r.get("kind") == "timing" and "ms" in r]
    panels = list(dict.fromkeys((r["mode"], r["D"]) for r in timing))
    if not panels:
        return
    providers = list(dict.fromkeys(r["provider"] for r in timing))
    fig = Figure(figsize=(4.2 * len(panels), 7.0))
    axes = fig.subplots(2, len(panels), squeeze=False, sharex=True)
    for col, (mode, D) in enumerate(panels):
        ax_t, ax_r = axes[0][col], axes[1][col]
        for i, p in enumerate(providers):
            rs = sorted((r for r in timing if (r["mode"], r["D"], r["provider"]) == (mode, D, p)), key=lambda r: r["T"])
            if not rs:
                continue
            Ts = [r["T"] for r in rs]
            ax_t.plot(Ts, [r["ms"] for r in rs], marker="o", color=f"C{i}", label=p)
            ratio = [r for r in rs if "ratio_to_sdpa" in r]
            if ratio:
                ax_r.plot([r["T"] for r in ratio], [r["ratio_to_sdpa"] for r in ratio], marker="o", color=f"C{i}")
        ax_t.set_xscale("log", base=2)
        ax_t.set_yscale("log")
        ax_t.set_title(f"{mode}, D={D}")
        ax_t.set_ylabel("median time (ms)")
        ax_t.grid(True, which="both", alpha=0.3)
        ax_r.axhline(1.0, color="black", lw=0.8)
        ax_r.set_xlabel("sequence length T (B*T fixed)")
        ax_r.set_ylabel("time / SDPA causal")
        ax_r.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    info = next(iter(timing))
    fig.suptitle(f"{info.get('device', '')}  torch {info.get('torch', '')}  triton {info.get('triton', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def check_parity_gpu(seq_lens=(1024, 2048, 4096, 8192, 16384), head_dim=64, n_heads=2, dtype=torch.bfloat16,
                     verbose=True, device="cuda") -> list[dict]:  # fmt: skip
    """Kernel forward and gradients vs ``reference.attention_blocked`` on float32 upcasts, at long T.

    B = 1 and a few heads keep the reference affordable. Gates: "mixed" (head h gets a bias from weak to
    strong decay, so |c| reaches ~1e4 at 16k) and "none". Returns one record per (T, gate) with relative errors
    ``|out - ref| / |ref|`` of o, dq, dk, dv and d(log f), and their max.
    """
    from evalsuite.kernels.forgetting.forward import forgetting_attention_triton
    from evalsuite.kernels.forgetting.reference import attention_blocked

    dev = torch.device(device)
    old_tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # a true float32 reference
    info = env_info()
    records = []
    try:
        for T in seq_lens:
            for gate in ("mixed", "none"):
                gen = torch.Generator(device=dev).manual_seed(T)
                q, k, v, do = (
                    torch.randn(1, T, n_heads, head_dim, device=dev, generator=gen).to(dtype) for _ in range(4)
                )
                logf = _log_forget_gates(1, T, n_heads, dev, gen) if gate == "mixed" else None
                t0 = time.perf_counter()
                leaves = [x.clone().requires_grad_() for x in (q, k, v)] + (
                    [] if logf is None else [logf.clone().requires_grad_()]
                )
                cum = None if logf is None else leaves[3].cumsum(1)
                o = forgetting_attention_triton(*leaves[:3], cum)
                grads = torch.autograd.grad(o, leaves, do)
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                t_kernel = time.perf_counter() - t0
                ref_leaves = [x.float().requires_grad_() for x in (q, k, v)] + (
                    [] if logf is None else [logf.clone().requires_grad_()]
                )
                ref_cum = None if logf is None else ref_leaves[3].cumsum(1)
                o_ref = attention_blocked(*ref_leaves[:3], ref_cum, ref_cum)
                ref_grads = torch.autograd.grad(o_ref, ref_leaves, do.float())
                errs = {"o": rel_error(o, o_ref)}
                for name, g, r in zip(("dq", "dk", "dv", "dlogf"), grads, ref_grads, strict=False):
                    errs[name] = rel_error(g, r)
                rec = {"kind": "parity", "T": T, "D": head_dim, "H": n_heads, "gate": gate, "dtype": str(dtype)[6:]}
                rec.update({f"rel_err_{k}": e for k, e in errs.items()}, max_rel_err=max(errs.values()))
                rec.update(kernel_s=t_kernel, cum_min=float(cum.detach().min()) if cum is not None else 0.0, **info)
                records.append(rec)
                if verbose:
                    print("parity", T, gate, " ".join(f"{k}={e:.2e}" for k, e in errs.items()), flush=True)
                del o_ref, ref_grads, ref_leaves, grads, leaves, o
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_tf32
    return records


def check_decode_parity_gpu(cache_lens=(1000, 5000, 33000), n_queries=(1, 4, 16), head_dims=(64, 128),
                            dtype=torch.bfloat16, verbose=True, device="cuda") -> list[dict]:  # fmt: skip
    """Decode kernel vs ``reference.attention_blocked`` (float32): B = 2, second sequence left-padded by Tk/3."""
    from evalsuite.kernels.forgetting.decode import forgetting_attention_decode_triton
    from evalsuite.kernels.forgetting.reference import attention_blocked

    dev = torch.device(device)
    info = env_info()
    records = []
    for D in head_dims:
        for Tk in cache_lens:
            for Tq in n_queries:
                gen = torch.Generator(device=dev).manual_seed(Tk + Tq)
                B, H = 2, 4
                q = torch.randn(B, Tq, H, D, device=dev, generator=gen).to(dtype)
                k, v = (torch.randn(B, Tk, H, D, device=dev, generator=gen).to(dtype) for _ in range(2))
                cum_k = _log_forget_gates(B, Tk, H, dev, gen).cumsum(1)
                cum_q = cum_k[:, Tk - Tq :]
                key_start = torch.tensor([0, Tk // 3], device=dev)
                o = forgetting_attention_decode_triton(q, k, v, cum_q, cum_k, key_start=key_start)
                o_ref = attention_blocked(q.float(), k.float(), v.float(), cum_q, cum_k, key_start=key_start)
                o_nogate = forgetting_attention_decode_triton(q, k, v)
                o_nogate_ref = attention_blocked(q.float(), k.float(), v.float())
                rec = {"kind": "parity_decode", "Tk": Tk, "Tq": Tq, "D": D, "dtype": str(dtype)[6:]}
                rec.update(rel_err_o=rel_error(o, o_ref), rel_err_o_nogate=rel_error(o_nogate, o_nogate_ref), **info)
                records.append(rec)
                if verbose:
                    print("parity_decode", D, Tk, Tq, f"{rec['rel_err_o']:.2e} {rec['rel_err_o_nogate']:.2e}")
    return records


def rel_error(out, ref) -> float:
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return math.inf
    den = ref.norm()
    return float((out - ref).norm() / den) if den > 0 else float((out - ref).norm())


# Candidate block configurations (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim for tune_configs, narrowed
# after two wider sweeps on an H100 (other head dims use the D=64 list). Worth widening again on other GPUs.
TUNE_FWD = {
    64: [(256, 64, 8, 3), (256, 64, 8, 4), (256, 32, 8, 4), (128, 64, 4, 4)],
    128: [(128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 4, 3)],
}
TUNE_DKDV = {64: [(32, 64, 4, 4), (32, 64, 4, 3), (32, 128, 8, 3)], 128: [(32, 128, 8, 3), (32, 64, 4, 4)]}
TUNE_DQ = {64: [(128, 32, 4, 4), (64, 64, 4, 4), (128, 64, 8, 3)], 128: [(128, 64, 8, 4), (128, 64, 8, 3)]}
_TUNE_TABLES = {"fwd": "FWD_CONFIGS", "bwd_dkdv": "BWD_DKDV_CONFIGS", "bwd_dq": "BWD_DQ_CONFIGS"}


def tune_configs(T=16384, head_dims=(64, 128), n_heads=16, tokens_per_call=65536, dtype=torch.bfloat16,
                 verbose=True) -> list[dict]:  # fmt: skip
    """Time each candidate block config of the forward, dK/dV and dQ kernels (one kernel varied at a time).

    Also times variants of the best configs (``kind == "tune_variant"``): pointer loads, time-major c, no gate.
    """
    records = []
    for D in head_dims:
        records += _tune_head_dim(T, D, n_heads, tokens_per_call, dtype, verbose)
        torch.cuda.empty_cache()
    if verbose:
        for name, D, cfg, ms in best_configs(records):
            print(f"best {name} D={D}: {cfg} {ms:.3f} ms")
    return records


def best_configs(records):
    """[(kernel, D, config, ms)] of the fastest config per kernel and head dim in tune records."""
    best = {}
    for r in records:
        if r.get("kind") == "tune" and "ms" in r:
            key = (r["kernel"], r["D"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    return [(name, D, tuple(r["config"]), r["ms"]) for (name, D), r in sorted(best.items())]


def apply_configs(records) -> dict:
    """Install the fastest tuned configs into the kernels' tables (:mod:`evalsuite.kernels.forgetting.common`,
    which the launchers read at every launch; this process only).

    TMA loads stay on for a head dim unless pointer loads beat the best forward by more than 1%.
    """
    from evalsuite.kernels.forgetting import common

    applied = {}
    for name, D, cfg, ms in best_configs(records):
        getattr(common, _TUNE_TABLES[name])[D] = cfg
        applied[f"{name}_D{D}"] = list(cfg)
        if name == "fwd":
            ptr = [r for r in records if r.get("variant") == "pointer_loads" and r["D"] == D and "ms" in r]
            common.FWD_TMA[D] = common.FWD_TMA.get(D, False) and not (ptr and ptr[0]["ms"] < 0.99 * ms)
            applied[f"fwd_tma_D{D}"] = common.FWD_TMA[D]
    return applied


def _tune_head_dim(T, D, n_heads, tokens_per_call, dtype, verbose, device="cuda") -> list[dict]:
    import triton.testing

    from evalsuite.kernels.forgetting.backward import _bwd
    from evalsuite.kernels.forgetting.forward import _fwd

    dev = torch.device(device)
    B = max(1, tokens_per_call // T)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(B, T, n_heads, D, device=dev, dtype=dtype, generator=gen) for _ in range(4))
    cum = _log_forget_gates(B, T, n_heads, dev, gen).cumsum(1)
    cum_tmajor = cum.transpose(1, 2).contiguous().transpose(1, 2)  # same values, time-contiguous storage
    o, lse = _fwd(q, k, v, cum, None)
    records = []

    def timed(rec, fn):
        try:
            fn()
            ms = triton.testing.do_bench(fn, warmup=10, rep=80, quantiles=[0.5])
            rec["ms"] = ms[0] if isinstance(ms, list) else ms
        except Exception as exc:  # noqa: BLE001 -- e.g. out of shared memory for a big config
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        records.append(rec)
        if verbose:
            label = " ".join(str(rec.get(k, "")) for k in ("kernel", "D", "config", "variant"))
            print("tune", label, f"{rec['ms']:.3f} ms" if "ms" in rec else rec["error"][:100], flush=True)

    cands = [("fwd", cfg) for cfg in TUNE_FWD.get(D, TUNE_FWD[64])]
    cands += [("bwd_dkdv", cfg) for cfg in TUNE_DKDV.get(D, TUNE_DKDV[64])]
    cands += [("bwd_dq", cfg) for cfg in TUNE_DQ.get(D, TUNE_DQ[64])]
    for name, cfg in cands:
        if name == "fwd":

            def fn(cfg=cfg):
                _fwd(q, k, v, cum, None, config=cfg)

        else:
            kw = {"dkdv_config" if name == "bwd_dkdv" else "dq_config": cfg}

            def fn(kw=kw):
                _bwd(do, q, k, v, cum, o, lse, None, **kw)

        timed({"kind": "tune", "kernel": name, "D": D, "T": T, "config": list(cfg)}, fn)

    # variants of the best configs: pointer loads in the forward, time-major c, and no gate (the bias's cost)
    best = {name: cfg for name, d, cfg, _ in best_configs(records) if d == D}
    fwd_cfg, dkdv_cfg = best.get("fwd"), best.get("bwd_dkdv")
    if fwd_cfg is None or dkdv_cfg is None:
        return records
    variants = [
        ("fwd", "pointer_loads", lambda: _fwd(q, k, v, cum, None, config=fwd_cfg, tma=False)),
        ("fwd", "c_time_major", lambda: _fwd(q, k, v, cum_tmajor, None, config=fwd_cfg)),
        ("fwd", "no_gate", lambda: _fwd(q, k, v, None, None, config=fwd_cfg)),
        ("bwd", "gate", lambda: _bwd(do, q, k, v, cum, o, lse, None)),
        ("bwd", "no_gate", lambda: _bwd(do, q, k, v, None, o, lse, None)),
    ]
    for name, variant, fn in variants:
        cfg = fwd_cfg if name == "fwd" else dkdv_cfg
        timed({"kind": "tune_variant", "kernel": name, "D": D, "T": T, "config": list(cfg), "variant": variant}, fn)
    return records


def bench_attention(
    out: Path,
    *,
    seq_lens=DEFAULT_SEQ_LENS,
    head_dims=(64, 128),
    modes=MODES,
    providers=DEFAULT_PROVIDERS,
    n_heads: int = 16,
    tokens_per_call: int = 65536,
    dtype: str = "bfloat16",
    parity_seq_lens=(1024, 2048, 4096, 8192, 16384),
    tune: bool = False,
    tune_only: bool = False,
) -> list[dict]:
    """The whole benchmark run (optional config sweep, timings, parity); writes JSON and PNG under ``out``."""
    if not torch.cuda.is_available():
        from evalsuite.errors import UserError

        raise UserError("the attention benchmark needs a CUDA GPU")
    torch_dtype = getattr(torch, dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if tune or tune_only:
        tuned = tune_configs(head_dims=head_dims, n_heads=n_heads, tokens_per_call=tokens_per_call, dtype=torch_dtype)
        (out / "tune.json").write_text(json.dumps(tuned, indent=1))
        if tune_only:
            return tuned
        print("using tuned configs:", apply_configs(tuned), flush=True)
    return run_attention_bench(
        out, seq_lens=seq_lens, head_dims=head_dims, modes=modes, n_heads=n_heads,
        tokens_per_call=tokens_per_call, dtype=torch_dtype, providers=providers, parity_seq_lens=parity_seq_lens,
    )  # fmt: skip


def main(argv=None) -> None:
    """``python -m evalsuite.bench.attention``: the same run without the CLI's dependencies (GPU machines)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder for the JSON and PNG")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(DEFAULT_SEQ_LENS))
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--providers", nargs="+", default=list(DEFAULT_PROVIDERS), choices=PROVIDERS)
    parser.add_argument("--n-heads", type=int, default=16)
    parser.add_argument("--tokens-per-call", type=int, default=65536)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--parity-seq-lens", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384],
                        help="sequence lengths of the parity check (none: skip it)")  # fmt: skip
    parser.add_argument("--tune", action="store_true", help="sweep block configs first (tune.json)")
    parser.add_argument("--tune-only", action="store_true", help="only sweep block configs")
    args = parser.parse_args(argv)
    bench_attention(
        Path(args.out), seq_lens=args.seq_lens, head_dims=args.head_dims, modes=args.modes, providers=args.providers,
        n_heads=args.n_heads, tokens_per_call=args.tokens_per_call, dtype=args.dtype,
        parity_seq_lens=args.parity_seq_lens, tune=args.tune, tune_only=args.tune_only,
    )  # fmt: skip


if __name__ == "__main__":
    main()
