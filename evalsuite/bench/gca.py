"""Grouped Cross Attention benchmark (``evalsuite bench gca``): our Triton GCA kernel against its PyTorch reference
and per-chunk SDPA.

DRT's shapes: sequences of T tokens cut into C = T / 64 query chunks of Sq = 64 rows, each attending to K = 8
retrieved chunks of Skv = 64 keys, H = 12 heads of D = 64, bf16, batch B. For each (mode, softmax_one, B, T,
provider) a record holds the median / 20% / 80% ms (``triton.testing.do_bench``), the peak extra memory of one call,
TFLOP/s of the four matmul-equivalents, and the ratios ours / SDPA and ours / reference at the same point.

Providers (inputs prepared in each one's layout outside the timed region; the timed call includes everything
after that, fusion by w included; fwdbwd: forward + backward to every input, w included):

* ``gca_triton``: :func:`~evalsuite.kernels.grouped_cross.forward.gca_triton` (App. B Algorithms 1-2).
* ``gca_reference``: :func:`~evalsuite.kernels.grouped_cross.reference.gca_reference` (einsums in float32).
* ``sdpa_chunks``: ``torch.nn.functional.scaled_dot_product_attention`` with every (chunk c, retrieved k) pair as
  one batch element: q ``[B*C*K, H, Sq, D]`` (chunk c's queries expanded K times inside the call), k/v
  ``[B*C*K, H, Skv, D]``, then ``einsum`` with w. With ``softmax_one=False`` it computes exactly our function; with
  ``softmax_one=True`` it is emulated by one extra zero key/value row per chunk (Skv + 1 keys, prepared outside
  the timed call), which costs SDPA a ragged key block -- so the ``off`` rows are the like-for-like comparison.

Also :func:`check_parity`: max abs / relative error of ours (and SDPA's forward) against the reference run in
float32 on the same rounded inputs. The run writes ``gca_bench.json`` (env, params, records), ``gca_bench.md``
(the tables) and ``gca_bench.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from evalsuite.bench.common import env_info, errors, peak_memory_mib, time_ms

PROVIDERS = ("gca_triton", "gca_reference", "sdpa_chunks")
MODES = ("fwd", "fwdbwd")
DEFAULT_SEQ_LENS = (4096, 16384, 65536)
DEFAULT_BATCHES = (1, 4)
SHAPE = dict(chunk=64, n_retrieved=8, n_heads=12, head_dim=64)  # DRT (arXiv:2410.01651 App. A)
JSON_NAME, MD_NAME, PNG_NAME = "gca_bench.json", "gca_bench.md", "gca_bench.png"


def make_inputs(B, T, *, chunk=64, n_retrieved=8, n_heads=12, head_dim=64, dtype=torch.bfloat16, device="cuda",
                seed=0) -> dict:  # fmt: skip
    """q ``[B, C, chunk, H, D]``, k/v ``[B, C, K, chunk, H, D]`` (dtype), w = softmax of random scores (float32)."""
    C = max(1, T // chunk)
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g).to(dtype)

    q = randn(B, C, chunk, n_heads, head_dim)
    k, v = (randn(B, C, n_retrieved, chunk, n_heads, head_dim) for _ in range(2))
    w = torch.randn(B, C, n_retrieved, device=device, generator=g).softmax(-1)
    return dict(q=q, k=k, v=v, w=w)


def provider_leaves(provider: str, x: dict, softmax_one: bool, grad: bool) -> dict:
    """The inputs in the provider's layout, as fresh leaves (``requires_grad`` when ``grad``)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")
    q, k, v, w = x["q"], x["k"], x["v"], x["w"]
    if provider == "sdpa_chunks":
        B, C, K, Skv, H, D = k.shape
        q = q.permute(0, 1, 3, 2, 4).contiguous()  # [B, C, H, Sq, D]
        k, v = (t.permute(0, 1, 2, 4, 3, 5).reshape(B * C * K, H, Skv, D) for t in (k, v))
        if softmax_one:  # one zero key and value per chunk: exp(0) = the "+1" of Softmax_1
            k, v = (F.pad(t, (0, 0, 0, 1)) for t in (k, v))
        k, v = k.contiguous(), v.contiguous()
    return {name: t.detach().clone().requires_grad_(grad) for name, t in dict(q=q, k=k, v=v, w=w).items()}


def provider_call(provider: str, xs: dict, softmax_one: bool) -> torch.Tensor:
    """One GCA call of ``provider`` on :func:`provider_leaves`; the output in our layout ``[B, C, Sq, H, D]``
    (SDPA's ``[B, C, H, Sq, D]`` is returned as a permuted view)."""
    q, k, v, w = xs["q"], xs["k"], xs["v"], xs["w"]
    if provider == "gca_triton":
        from evalsuite.kernels.grouped_cross.forward import gca_triton

        return gca_triton(q, k, v, w, softmax_one=softmax_one)
    if provider == "gca_reference":
        from evalsuite.kernels.grouped_cross.reference import gca_reference

        return gca_reference(q, k, v, w, softmax_one=softmax_one)
    B, C, H, Sq, D = q.shape
    K = w.shape[2]
    qe = q.unsqueeze(2).expand(B, C, K, H, Sq, D).reshape(B * C * K, H, Sq, D)
    o = F.scaled_dot_product_attention(qe, k, v).view(B, C, K, H, Sq, D)
    return torch.einsum("bckhsd,bck->bchsd", o, w.to(o.dtype)).permute(0, 1, 3, 2, 4)


def gca_flops(B, T, mode, *, chunk=64, n_retrieved=8, n_heads=12, head_dim=64) -> float:
    """Matmul FLOPs: per (chunk, retrieved chunk, head) two Sq x Skv x D products; the backward does five."""
    fwd = 4.0 * B * max(1, T // chunk) * n_retrieved * n_heads * chunk * chunk * head_dim
    return fwd if mode == "fwd" else 3.5 * fwd


def bench_one(provider, mode, B, T, softmax_one, *, dtype=torch.bfloat16, shape=None, device="cuda", warmup=25,
              rep=100) -> dict:  # fmt: skip
    """Time one configuration (on CUDA: ``device`` is for tests); ``status`` is "ok", "oom" or the error."""
    shape = shape or SHAPE
    rec = {"kind": "timing", "provider": provider, "mode": mode, "B": B, "T": T, "softmax_one": softmax_one,
           "dtype": str(dtype).removeprefix("torch."), **shape}  # fmt: skip
    if provider == "sdpa_chunks" and softmax_one:
        rec["emulation"] = "zero key/value row appended (Skv + 1 keys)"
    fn = xs = None
    try:
        x = make_inputs(B, T, dtype=dtype, device=device, **shape)
        xs = provider_leaves(provider, x, softmax_one, grad=mode == "fwdbwd")
        del x
        leaves = list(xs.values())
        if mode == "fwdbwd":
            do = torch.randn_like(provider_call(provider, xs, softmax_one).detach())

            def fn():
                provider_call(provider, xs, softmax_one).backward(do)

        else:

            def fn():
                with torch.no_grad():
                    provider_call(provider, xs, softmax_one)

        fn()  # compile / warm up outside the timing
        peak = peak_memory_mib(fn, leaves)
        ms, lo, hi = time_ms(fn, leaves, device, warmup, rep)
        rec.update(status="ok", ms=ms, ms_p20=lo, ms_p80=hi, peak_mem_mib=peak)
        rec["tflops"] = gca_flops(B, T, mode, **shape) / (ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError:
        rec["status"] = "oom"
    except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop the sweep
        rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
    finally:
        fn = xs = None  # free the inputs before the next configuration
        torch.cuda.empty_cache()
    return rec


def add_ratios(records) -> None:
    """``ratio_to_<provider>`` = ms / that provider's ms at the same (mode, softmax_one, B, T)."""
    ms = {(r["mode"], r["softmax_one"], r["B"], r["T"], r["provider"]): r["ms"] for r in records if "ms" in r}
    for r in records:
        if r.get("kind") != "timing" or "ms" not in r:
            continue
        for peer in ("sdpa_chunks", "gca_reference"):
            base = ms.get((r["mode"], r["softmax_one"], r["B"], r["T"], peer))
            if base and peer != r["provider"]:
                r[f"ratio_to_{peer}"] = r["ms"] / base


def check_parity(B=1, T=4096, *, dtype=torch.bfloat16, softmax_one=True, device="cuda", shape=None) -> dict:
    """Ours (forward and dq, dk, dv, dw) and SDPA's forward against the reference in float32 on the same rounded
    inputs: max abs and relative (Frobenius) errors."""
    shape = shape or SHAPE
    x = make_inputs(B, T, dtype=dtype, device=device, seed=1, **shape)
    do = torch.randn_like(x["q"])
    ours = provider_leaves("gca_triton", x, softmax_one, grad=True)
    o = provider_call("gca_triton", ours, softmax_one)
    grads = torch.autograd.grad(o, list(ours.values()), do)
    ref = {n: t.detach().float().requires_grad_() for n, t in x.items()}
    o_ref = provider_call("gca_reference", ref, softmax_one)
    ref_grads = torch.autograd.grad(o_ref, list(ref.values()), do.float())
    with torch.no_grad():
        o_sdpa = provider_call("sdpa_chunks", provider_leaves("sdpa_chunks", x, softmax_one, False), softmax_one)
    rec = {"kind": "parity", "B": B, "T": T, "softmax_one": softmax_one, "dtype": str(dtype).removeprefix("torch."),
           "reference": "gca_reference in float32 on the same inputs", **shape}  # fmt: skip
    for name, a, b in zip(("o", "dq", "dk", "dv", "dw", "o_sdpa"), (o, *grads, o_sdpa), (o_ref, *ref_grads, o_ref),
                          strict=True):  # fmt: skip
        errs = errors(a, b)
        rec[f"max_abs_err_{name}"], rec[f"rel_err_{name}"] = errs["max_abs"], errs["rel"]
    return rec


def format_markdown(records) -> str:
    """Timing table (ms, ratios, peak MiB) per (mode, softmax_one, B, T) and the parity table."""
    timing = [r for r in records if r.get("kind") == "timing"]
    providers = list(dict.fromkeys(r["provider"] for r in timing))
    head = ["mode", "softmax_one", "B", "T", *[f"{p} ms" for p in providers]]
    head += ["ours/sdpa", "ours/reference", *[f"{p} MiB" for p in providers]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in dict.fromkeys((r["mode"], r["softmax_one"], r["B"], r["T"]) for r in timing):
        at = {r["provider"]: r for r in timing if (r["mode"], r["softmax_one"], r["B"], r["T"]) == key}
        ms = [f"{at[p]['ms']:.3f}" if "ms" in at.get(p, {}) else at.get(p, {}).get("status", "-")[:20]
              for p in providers]  # fmt: skip
        ours = at.get("gca_triton", {})
        ratios = [f"{ours[f'ratio_to_{p}']:.2f}x" if f"ratio_to_{p}" in ours else "-"
                  for p in ("sdpa_chunks", "gca_reference")]  # fmt: skip
        mem = [f"{at[p]['peak_mem_mib']:.0f}" if "ms" in at.get(p, {}) else "-" for p in providers]
        lines.append("| " + " | ".join([key[0], "on" if key[1] else "off", str(key[2]), str(key[3]), *ms, *ratios,
                                        *mem]) + " |")  # fmt: skip
    parity = [r for r in records if r.get("kind") == "parity"]
    if parity:
        names = ("o", "dq", "dk", "dv", "dw", "o_sdpa")
        lines += [
            "",
            "Max abs error (relative error) vs the float32 reference:",
            "",
            "| dtype | softmax_one | B | T | " + " | ".join(names) + " |",
            "|" + "---|" * (4 + len(names)),
        ]
        for r in parity:
            cells = [f"{r[f'max_abs_err_{n}']:.2e} ({r[f'rel_err_{n}']:.1e})" if f"rel_err_{n}" in r else "-"
                     for n in names]  # fmt: skip
            on = "on" if r["softmax_one"] else "off"
            lines.append(f"| {r['dtype']} | {on} | {r['B']} | {r['T']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_gca_bench(records, path, env=None) -> None:
    """Median ms vs T (log-log) per mode x softmax_one panel, one line per (provider, B)."""
    from matplotlib.figure import Figure

    timing = [r for r in records if r.get("kind") == "timing" and "ms" in r]
    panels = list(dict.fromkeys((r["mode"], r["softmax_one"]) for r in timing))
    if not panels:
        return
    fig = Figure(figsize=(4.5 * len(panels), 4.0))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    lines = list(dict.fromkeys((r["provider"], r["B"]) for r in timing))
    batches = sorted({B for _, B in lines})
    for ax, (mode, one) in zip(axes, panels, strict=True):
        for p, B in lines:
            rs = [r for r in timing if (r["mode"], r["softmax_one"], r["provider"], r["B"]) == (mode, one, p, B)]
            rs.sort(key=lambda r: r["T"])
            if rs:
                style = ("-", "--", ":", "-.")[batches.index(B) % 4]
                color = f"C{PROVIDERS.index(p)}"
                ax.plot([r["T"] for r in rs], [r["ms"] for r in rs], style, marker="o", color=color, label=f"{p} B={B}")
        ax.set(xscale="log", yscale="log", xlabel="tokens per sequence T", ylabel="median ms",
               title=f"{mode}, softmax_one={'on' if one else 'off'}")  # fmt: skip
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    env = env or {}
    fig.suptitle(f"GCA  {env.get('device', '')}  torch {env.get('torch', '')}  triton {env.get('triton', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def bench_gca(out, *, seq_lens=DEFAULT_SEQ_LENS, batches=DEFAULT_BATCHES, providers=PROVIDERS, modes=MODES,
              softmax_one=(False, True), dtype="bfloat16", parity_T: int | None = 4096, warmup=25, rep=100,
              verbose=True) -> list[dict]:  # fmt: skip
    """The whole run (CUDA only); writes ``gca_bench.json``, ``.md`` and ``.png`` under ``out``; returns the records."""
    if not torch.cuda.is_available():
        from evalsuite.errors import UserError

        raise UserError("the GCA benchmark needs a CUDA GPU")
    bad = [p for p in providers if p not in PROVIDERS] + [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown provider/mode {', '.join(bad)}")
    torch_dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    env = env_info()
    params = dict(seq_lens=list(seq_lens), batches=list(batches), providers=list(providers), modes=list(modes),
                  softmax_one=list(softmax_one), dtype=str(torch_dtype).removeprefix("torch."), parity_T=parity_T,
                  **SHAPE)  # fmt: skip
    records: list[dict] = []

    def save():
        add_ratios(records)
        doc = {"env": env, "params": params, "records": records}
        (out / JSON_NAME).write_text(json.dumps(doc, indent=1, default=str))  # rewritten as it goes

    for mode in modes:
        for one in softmax_one:
            for B in batches:
                for T in seq_lens:
                    for p in providers:
                        records.append({**bench_one(p, mode, B, T, one, dtype=torch_dtype, warmup=warmup, rep=rep),
                                        "device": env["device"]})  # fmt: skip
                        if verbose:
                            r = records[-1]
                            what = f"{r['ms']:9.3f} ms {r['peak_mem_mib']:9.0f} MiB" if "ms" in r else r["status"]
                            print(f"{mode:7s} one={int(one)} B={B} T={T:<6d} {p:14s} {what}", flush=True)
                    save()
    if parity_T:
        for one in softmax_one:
            records.append({**check_parity(1, parity_T, dtype=torch_dtype, softmax_one=one), "device": env["device"]})
            if verbose:
                r = records[-1]
                print("parity", " ".join(f"{k[12:]}={v:.2e}" for k, v in r.items() if k.startswith("max_abs_err_")))
    save()
    table = format_markdown(records)
    head = f"# GCA benchmark\n\n{env['device']}, torch {env.get('torch')}, triton {env.get('triton')}, {params}\n\n"
    (out / MD_NAME).write_text(head + table + "\n")
    plot_gca_bench(records, out / PNG_NAME, env)
    if verbose:
        print(table)
    return records
