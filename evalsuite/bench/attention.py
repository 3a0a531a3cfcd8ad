"""Attention kernel benchmark (``evalsuite bench attention``): our Triton Forgetting Attention against SDPA causal
and fla.

Fixed tokens per call (``B * T = tokens_per_call``), so every T costs the same number of tokens and the
quadratic term shows. The providers of one (mode, D, T) are timed in turns in one process
(:func:`~evalsuite.bench.common.time_providers`: ``rounds`` rounds of A B C A B C ...), so their ratios are taken
round by round. For each (mode, D, T, provider) the record holds the median / 20% / 80% of its per-round times, the
samples, the peak extra memory of one call, achieved TFLOP/s, and the median of the per-round ratios to SDPA
(``ratio_to_sdpa``, with ``_p20`` / ``_p80`` / ``_pairs``) and, for our kernel where fla ran, to fla
(``ratio_to_fla``).

Providers (each gets its inputs in the layout it wants, prepared outside the timed region):
* ``fox_triton``: :func:`forgetting_attention_triton` on ``[B, T, H, D]``; the timed call includes the
  caller's cumsum of the log forget gates (:func:`cumsum_over_time`, as a model should run it), and gradients
  flow to ``log f``.
* ``triton_causal``: the same kernel without a gate (``cum=None``): the cost of the bias, by difference.
* ``sdpa_causal``: ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)`` on ``[B, H, T, D]``.
* ``fla_forgetting``: fla's ``parallel_forgetting_attn`` (``[B, T, H, D]``, log f), when ``fla`` imports.

The parity records come from :mod:`.attention_parity`; the block-config sweep (``--tune``) from
:mod:`evalsuite.bench.tune.forgetting`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from evalsuite.bench.attention_parity import check_decode_parity_gpu, check_parity_gpu, log_forget_gates
from evalsuite.bench.common import Call, Unavailable, env_info, fla_op, ratio_fields, ratio_text, time_providers

PROVIDERS = ("fox_triton", "triton_causal", "sdpa_causal", "fla_forgetting")
DEFAULT_PROVIDERS = ("fox_triton", "sdpa_causal", "fla_forgetting")
MODES = ("fwd", "fwdbwd")
DEFAULT_SEQ_LENS = tuple(2**i for i in range(10, 17))  # 1024 .. 65536
BASELINE = "sdpa_causal"
FLA = "fla_forgetting"
JSON_NAME = "attention_bench.json"
PNG_NAME = "attention_bench.png"


def attention_flops(B: int, T: int, H: int, D: int, mode: str) -> float:
    """Matmul FLOPs of causal attention: two T x T x D products, half of them masked; backward is 2.5x."""
    fwd = 4.0 * B * H * T * T * D / 2
    return fwd if mode == "fwd" else 3.5 * fwd


def _build_call(provider, B, T, H, D, dtype, mode, device, config=None):
    """Inputs in the provider's layout and a closure running one call (forward, or forward + backward); ``config``:
    our kernel's launch settings (default the shipped ones).

    Returns a :class:`Call` (its leaves: the tensors whose .grad the benchmark resets between calls); raises
    :class:`Unavailable` for a provider that does not import here.
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
        logf = log_forget_gates(B, T, H, device, gen).requires_grad_(grad)
        leaves = [q, k, v, logf]
        if provider == "fla_forgetting":
            fla_fn = fla_op("forgetting_attn.parallel_forgetting_attn")
            if fla_fn is None:
                raise Unavailable()

            def call():
                return fla_fn(q, k, v, logf)

        else:
            from evalsuite.kernels.forgetting import cumsum_over_time
            from evalsuite.kernels.forgetting.forward import forgetting_attention_triton

            if provider == "triton_causal":
                leaves = [q, k, v]

                def call():
                    return forgetting_attention_triton(q, k, v, config=config)

            else:

                def call():
                    return forgetting_attention_triton(q, k, v, cumsum_over_time(logf), config=config)

    else:
        raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")

    if grad:

        def fn():
            call().backward(do)

    else:

        def fn():
            with torch.no_grad():
                call()

    return Call(fn, tuple(leaves))


def bench_group(providers, T, D, mode, n_heads=16, tokens_per_call=65536, dtype=torch.bfloat16, config=None,
                rounds=10, block_ms=10.0, device="cuda") -> list[dict]:  # fmt: skip
    """Time ``providers`` at one (mode, D, T), interleaved in one process; one record each (``status`` "ok", "oom",
    "unavailable" or the error). ``config``: our kernel's launch settings at head dim D (default the shipped ones).
    ``device``: CUDA for measurements; a CPU runs our kernel under ``TRITON_INTERPRET=1`` (the tests)."""
    B = max(1, tokens_per_call // T)
    device = torch.device(device)
    builders = {p: (lambda p=p: _build_call(p, B, T, n_heads, D, dtype, mode, device, config)) for p in providers}
    fields, samples = time_providers(builders, device=device, rounds=rounds, block_ms=block_ms)
    records = []
    for provider in providers:
        rec = {"kind": "timing", "provider": provider, "mode": mode, "T": T, "B": B, "H": n_heads, "D": D,
               "dtype": str(dtype).replace("torch.", ""), **fields[provider]}  # fmt: skip
        if "ms" in rec:
            rec["tflops"] = attention_flops(B, T, n_heads, D, mode) / (rec["ms"] * 1e-3) / 1e12
        if provider in samples and BASELINE in samples:
            rec.update(ratio_fields("ratio_to_sdpa", samples[provider], samples[BASELINE]))
        if provider in samples and FLA in samples and provider != FLA:
            rec.update(ratio_fields("ratio_to_fla", samples[provider], samples[FLA]))
        records.append(rec)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return records


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
    configs=None,
    rounds=10,
    block_ms=10.0,
) -> list[dict]:
    """Benchmark every (mode, D, T), its providers interleaved; write ``attention_bench.json`` and
    ``attention_bench.png``.

    Args:
        out_dir: folder for the JSON (list of records) and the plot.
        seq_lens, head_dims, modes: the grid; B = tokens_per_call // T.
        providers: subset of :data:`PROVIDERS`; fla is skipped (status "unavailable") when it does not import.
        parity_seq_lens: when given, :func:`check_parity_gpu` (and the decode check) run after the timings and
            their records join the JSON.
        configs: ``{head dim: BlockConfig}`` our kernel launches with (a tuner's choice); others take the shipped.
        rounds, block_ms: the interleaved timing (:func:`~evalsuite.bench.common.interleaved_ms`): rounds of one
            block of about ``block_ms`` of calls per provider.
    Returns:
        the records (timing records, plus parity records when asked).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("the attention benchmark needs a CUDA device")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    info = env_info()
    from evalsuite.kernels.forgetting.common import block_config

    configs = {D: (configs or {}).get(D) or block_config(D) for D in head_dims}
    records = [{"kind": "configs", **_kernel_configs(configs), **info}]
    json_path = out_dir / JSON_NAME
    for mode in modes:
        for D in head_dims:
            for T in seq_lens:
                for rec in bench_group(providers, T, D, mode, n_heads, tokens_per_call, dtype, configs[D], rounds,
                                       block_ms):  # fmt: skip
                    rec.update(info)
                    records.append(rec)
                    if verbose:
                        ms = f"{rec['ms']:9.3f} ms  {rec['peak_mem_mib']:9.1f} MiB" if "ms" in rec else rec["status"]
                        ratio = f"  {ratio_text(rec, 'ratio_to_sdpa')} sdpa" if "ratio_to_sdpa" in rec else ""
                        print(f"{mode:7s} D={D:<4d} T={T:<6d} {rec['provider']:15s} {ms}{ratio}", flush=True)
                json_path.write_text(json.dumps(records, indent=1))  # rewritten as it goes: a cut run keeps data
    if parity_seq_lens:
        for D in head_dims:
            records += check_parity_gpu(parity_seq_lens, head_dim=D, verbose=verbose, config=configs[D])
        records += check_decode_parity_gpu(head_dims=head_dims, verbose=verbose)
    json_path.write_text(json.dumps(records, indent=1))
    plot_attention_bench(records, out_dir / PNG_NAME)
    if verbose:
        print(format_table(records))
    return records


def _kernel_configs(configs) -> dict:
    """The block configurations the kernels launch with, per head dim (``{D: BlockConfig}``), and from which T the
    forward reads the key cumsums, and the backward without the gate its tiles, through TMA, and the forward and the
    backward add the gate's bias through the tensor cores (bf16; the backward's tiles then through TMA)."""
    from evalsuite.kernels.forgetting.common import (
        BWD_GATE_MMA_MIN_T,
        BWD_GATE_MMA_TMA_MIN_T,
        BWD_TMA_MIN_T,
        C_TMA_MIN_T,
        GATE_MMA_MIN_T,
    )

    return {
        "fwd_configs": {str(d): list(c.fwd) for d, c in configs.items()},
        "bwd_dkdv_configs": {str(d): list(c.dkdv) for d, c in configs.items()},
        "bwd_dq_configs": {str(d): list(c.dq) for d, c in configs.items()},
        "fwd_tma": {str(d): c.tma for d, c in configs.items()},
        "fwd_key_cumsums_tma_from_t": C_TMA_MIN_T,
        "fwd_gate_mma_from_t": {str(d): t for d, t in GATE_MMA_MIN_T.items()},
        "bwd_no_gate_tma_from_t": {str(d): t for d, t in BWD_TMA_MIN_T.items()},
        "bwd_gate_mma_from_t": {str(d): t for d, t in BWD_GATE_MMA_MIN_T.items()},
        "bwd_gate_mma_tma_from_t": {str(d): t for d, t in BWD_GATE_MMA_TMA_MIN_T.items()},
    }


def format_table(records) -> str:
    """A text table: median ms (the median of the per-round ratios to SDPA [p20-p80]) per (mode, D, T) row, one
    column per provider."""
    timing = [r for r in records if r.get("kind") == "timing"]
    providers = list(dict.fromkeys(r["provider"] for r in timing))
    lines = [f"{'mode':7s} {'D':>4s} {'T':>6s} " + " ".join(f"{p:>30s}" for p in providers)]
    keys = list(dict.fromkeys((r["mode"], r["D"], r["T"]) for r in timing))
    for mode, D, T in keys:
        cells = []
        for p in providers:
            r = next((r for r in timing if (r["mode"], r["D"], r["T"], r["provider"]) == (mode, D, T, p)), None)
            if r is None or "ms" not in r:
                cells.append(f"{(r or {}).get('status', '-')[:30]:>30s}")
            else:
                ratio = f" ({ratio_text(r, 'ratio_to_sdpa')})" if "ratio_to_sdpa" in r else ""
                cells.append(f"{r['ms']:.3f}{ratio}".rjust(30))
        lines.append(f"{mode:7s} {D:4d} {T:6d} " + " ".join(cells))
    return "\n".join(lines)


def plot_attention_bench(records, path) -> None:
    """Time vs T (log-log, one line per provider) per mode x D panel, with the ratio to SDPA underneath (the median
    of the per-round ratios, p20-p80 shaded)."""
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
            spread = [r for r in ratio if "ratio_to_sdpa_p20" in r]
            if spread:
                ax_r.fill_between([r["T"] for r in spread], [r["ratio_to_sdpa_p20"] for r in spread],
                                  [r["ratio_to_sdpa_p80"] for r in spread], color=f"C{i}", alpha=0.2)  # fmt: skip
        ax_t.set_xscale("log", base=2)
        ax_t.set_yscale("log")
        ax_t.set_title(f"{mode}, D={D}")
        ax_t.set_ylabel("median time (ms)")
        ax_t.grid(True, which="both", alpha=0.3)
        ax_r.axhline(1.0, color="black", lw=0.8)
        ax_r.set_xlabel("sequence length T (B*T fixed)")
        ax_r.set_ylabel("time / SDPA causal (pairs)")
        ax_r.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    info = next(iter(timing))
    fig.suptitle(f"{info.get('device', '')}  torch {info.get('torch', '')}  triton {info.get('triton', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


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
    rounds: int = 10,
) -> list[dict]:
    """The whole benchmark run (optional config sweep, timings, parity); writes JSON and PNG under ``out``.
    ``rounds``: rounds of the interleaved timing, one ratio pair each.

    ``tune``: first sweep the kernels' block configs (:func:`evalsuite.bench.tune.forgetting.tune_block_configs`,
    written to ``tune.json``) and time with the fastest (the sweep alone: ``evalsuite bench tune forgetting``).
    """
    if not torch.cuda.is_available():
        from evalsuite.errors import UserError

        raise UserError("the attention benchmark needs a CUDA GPU")
    torch_dtype = getattr(torch, dtype)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    configs = None
    if tune:
        from evalsuite.bench.tune.forgetting import best_block_configs, tune_block_configs

        tuned = tune_block_configs(head_dims=head_dims, n_heads=n_heads, tokens_per_call=tokens_per_call,
                                   dtype=torch_dtype)  # fmt: skip
        (out / "tune.json").write_text(json.dumps(tuned, indent=1))
        configs = best_block_configs(tuned)
        print("using tuned configs:", {D: c.flat() for D, c in configs.items()}, flush=True)
    return run_attention_bench(
        out, seq_lens=seq_lens, head_dims=head_dims, modes=modes, n_heads=n_heads,
        tokens_per_call=tokens_per_call, dtype=torch_dtype, providers=providers, parity_seq_lens=parity_seq_lens,
        configs=configs, rounds=rounds,
    )  # fmt: skip
