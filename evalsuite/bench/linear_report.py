"""Summary and plot of :mod:`evalsuite.bench.linear` records: the markdown tables of the targets and
``linear_bench.png`` (same style as :func:`evalsuite.bench.attention.plot_attention_bench`). Ratios to fla are the
medians of the per-round ratios of the interleaved timing, with their p20-p80 spread."""

from __future__ import annotations

import math

from evalsuite.bench import lightning_claims
from evalsuite.bench.common import ratio_text
from evalsuite.bench.linear_ops import OP_PROVIDERS, OPS, PEERS, PROVIDERS, SDPA_PROVIDERS, VANILLA
from evalsuite.report.palette import display_name, model_color

TIMED = ("fwd", "fwdbwd", "bwd")


def _get(records, **match):
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def _ours(records, op):
    names = [p for p in OP_PROVIDERS[op][:2] if _get(records, kind="op", op=op, provider=p)]
    return names[0] if names else None


def _fla_table(records, op_recs, T: int) -> list[str]:
    """The ratio of ours to the op's fla peer at ``T``, per op and mode."""
    lines = [f"### Time vs fla at T = {T} (target: ours <= 1.00x; median of interleaved pairs [p20-p80])", "",
              "| op | mode | ours | ours ms | fla ms | ratio | pairs | target |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for op in OPS:
        ours = _ours(records, op)
        for mode in TIMED:
            a = _get(op_recs, op=op, provider=ours, mode=mode, T=T)
            b = _get(op_recs, op=op, provider=PEERS[op], mode=mode, T=T)
            if not a and not b:
                continue
            ratio = a[0].get("ratio_to_fla") if a else None
            verdict = "n/a" if ratio is None else ("pass" if ratio <= 1.0 else "FAIL")
            lines.append(f"| {op} | {mode} | {ours} | {_fmt(a, 'ms')} | {_fmt(b, 'ms')} | "
                         f"{ratio_text(a[0] if a else {}, 'ratio_to_fla')} | "
                         f"{(a[0] if a else {}).get('ratio_to_fla_pairs', '-')} | {verdict} |")  # fmt: skip
    return lines


def _constant_speed(op_recs, Ts: list[int]) -> list[str]:
    """Tokens/s at the longest T over the shortest, per provider and mode (at a fixed B·T)."""
    lines = ["", f"### Constant speed: tokens/s at T = {Ts[-1]} vs T = {Ts[0]} (target: >= 0.85)",
              "", "| op | provider | mode | tok/s short | tok/s long | long / short | target |",
              "| --- | --- | --- | ---: | ---: | ---: | --- |"]  # fmt: skip
    for op in OPS if len(Ts) > 1 else ():
        for provider in [p for p in OP_PROVIDERS[op] if _get(op_recs, op=op, provider=p)]:
            for mode in TIMED:
                lo = _get(op_recs, op=op, provider=provider, mode=mode, T=Ts[0])
                hi = _get(op_recs, op=op, provider=provider, mode=mode, T=Ts[-1])
                if not lo or not hi:
                    continue
                ratio = hi[0]["tokens_per_s"] / lo[0]["tokens_per_s"]
                verdict = "pass" if ratio >= 0.85 else "FAIL"
                lines.append(f"| {op} | {provider} | {mode} | {lo[0]['tokens_per_s']:.3g} | "
                             f"{hi[0]['tokens_per_s']:.3g} | {ratio:.2f} | {verdict} |")  # fmt: skip
    return lines


def format_summary(records, ref_T: int = 16384) -> str:
    """Markdown: ratios to fla at ``ref_T`` and at every T, speed at the longest vs shortest T, the Lightning paper's
    Figure 4 claims (when Vanilla or the ``bwd`` mode ran), decode latency, decode-state memory vs context (with
    ``decode_total_mib``, state + step peak beyond the weights, on CUDA), parity."""
    lines = []
    op_recs = [r for r in records if r.get("kind") == "op" and "ms" in r]
    if op_recs:
        Ts = sorted({r["T"] for r in op_recs})
        T = ref_T if ref_T in Ts else Ts[-1]
        if any(r["provider"] in PEERS.values() for r in op_recs):
            lines += _fla_table(records, op_recs, T)
            lines += _ratio_grid(records, op_recs, Ts)
        if len({r["B"] * r["T"] for r in op_recs}) == 1:  # B·T fixed: a linear-time op costs the same at every T
            lines += _constant_speed(op_recs, Ts)
    if any(r.get("provider") == VANILLA or r.get("mode") == "bwd" for r in records if r.get("kind") == "op"):
        lines += ["", lightning_claims.claims_markdown(records)]
    dec = [r for r in records if r.get("kind") == "decode" and "ms" in r]
    if dec:
        batches = sorted({r["batch"] for r in dec})
        lines += ["", "### Decode step latency (ms per step; the state does not grow with context)", "",
                  "| op | provider | " + " | ".join(f"B={b}" for b in batches) + " |",
                  "| --- | --- | " + " | ".join("---:" for _ in batches) + " |"]  # fmt: skip
        for op, provider in dict.fromkeys((r["op"], r["provider"]) for r in dec):
            cells = [_fmt(_get(dec, op=op, provider=provider, batch=b), "ms") for b in batches]
            lines.append(f"| {op} | {provider} | " + " | ".join(cells) + " |")
    mem = [r for r in records if r.get("kind") == "state_memory"]
    if mem:
        ctxs = sorted({r["context"] for r in mem})
        lines += ["", "### Decode-state memory vs context (MiB of state; flat = last / first <= 1.01)", "",
                  "| arch | kind | " + " | ".join(f"{c}" for c in ctxs) + " | last / first | flat | decode MiB |",
                  "| --- | --- | " + " | ".join("---:" for _ in ctxs) + " | ---: | --- | --- |"]  # fmt: skip
        for arch in dict.fromkeys(r["arch"] for r in mem):
            rs = {r["context"]: r for r in _get(mem, arch=arch) if "state_nbytes" in r}
            if not rs:
                lines.append(f"| {arch} | {_get(mem, arch=arch)[0]['status'][:60]} |")
                continue
            cells = [f"{rs[c]['state_nbytes'] / 2**20:.3g}" if c in rs else "-" for c in ctxs]
            first, last = rs[min(rs)]["state_nbytes"], rs[max(rs)]["state_nbytes"]
            growth = last / first if first else math.inf
            kind = next(iter(rs.values()))["state_kind"]
            total = [f"{rs[c]['decode_total_mib']:.1f}" for c in sorted(rs) if "decode_total_mib" in rs[c]]
            lines.append(f"| {arch} | {kind} | " + " | ".join(cells) + f" | {growth:.2f} | "
                         f"{'yes' if growth <= 1.01 else 'no'} | {' -> '.join(total) or '-'} |")  # fmt: skip
    par = [r for r in records if r.get("kind") == "parity"]
    if par:
        lines += ["", "### Parity, ours vs fla (same inputs, fwd + bwd)", "", "| op | ours | peer | T | max rel err |",
                  "| --- | --- | --- | ---: | ---: |"]  # fmt: skip
        for r in par:
            err = f"{r['max_rel_err']:.2e}" if "max_rel_err" in r else r["status"][:60]
            lines.append(f"| {r['op']} | {r['provider']} | {r['peer']} | {r['T']} | {err} |")
    return "\n".join(lines).strip()


def _ratio_grid(records, op_recs, Ts) -> list[str]:
    """Markdown rows: ours / fla per (op, mode) at every T, median of the interleaved pairs [p20-p80]."""
    rows = []
    for op in OPS:
        ours = _ours(records, op)
        for mode in TIMED:
            cells = [ratio_text(next(iter(_get(op_recs, op=op, provider=ours, mode=mode, T=T)), {}), "ratio_to_fla")
                     for T in Ts]  # fmt: skip
            if any(c != "-" for c in cells):
                rows.append(f"| {op} | {mode} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "### Ours / fla at every T (median of the per-round ratios [p20-p80])", "",
            "| op | mode | " + " | ".join(f"T = {T}" for T in Ts) + " |",
            "| --- | --- | " + " | ".join("---:" for _ in Ts) + " |", *rows]  # fmt: skip


def _fmt(rs, key) -> str:
    if not rs:
        return "-"
    return f"{rs[0][key]:.3f}" if key in rs[0] else rs[0].get("status", "-")[:30]


def _plot_op_panel(column, timing, op, mode, colors) -> None:
    """One (op, mode) column: time and tokens/s against T per provider (SDPA dashed) and, when the column has a
    third axis, ours / fla with its p20-p80 band."""
    ax_t, ax_s = column[0], column[1]
    fixed_tokens = len({r["B"] for r in _get(timing, op=op, mode=mode)}) > 1
    for p in [*OP_PROVIDERS[op], *SDPA_PROVIDERS]:
        rs = sorted(_get(timing, op="sdpa" if p in SDPA_PROVIDERS else op, provider=p, mode=mode), key=lambda r: r["T"])
        if not rs:
            continue
        style = dict(marker="o", color=colors[p], label=p, ls="--" if p in SDPA_PROVIDERS else "-")
        ax_t.plot([r["T"] for r in rs], [r["ms"] for r in rs], **style)
        ax_s.plot([r["T"] for r in rs], [r["tokens_per_s"] for r in rs], **style)
        ratio = [r for r in rs if "ratio_to_fla_p20" in r and p != PEERS.get(op)]
        if ratio and len(column) > 2:
            ax_r = column[2]
            ax_r.axis("on")
            ax_r.plot([r["T"] for r in ratio], [r["ratio_to_fla"] for r in ratio], **style)
            ax_r.fill_between([r["T"] for r in ratio], [r["ratio_to_fla_p20"] for r in ratio],
                              [r["ratio_to_fla_p80"] for r in ratio], color=colors[p], alpha=0.2)  # fmt: skip
            ax_r.axhline(1.0, color="black", lw=0.8)
            ax_r.set(ylabel="ours / fla (pairs, p20-p80)", xlabel="sequence length T")
            ax_r.set_xscale("log", base=2)
            ax_r.grid(True, alpha=0.3)
    for ax, ylabel in ((ax_t, "median time (ms)"), (ax_s, "tokens / s")):
        ax.axis("on")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_xlabel("sequence length T" + (" (B*T fixed)" if fixed_tokens else ""))
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_title(f"{op}, {mode}")
    ax_t.legend(fontsize=7)


def plot_linear_bench(records, path, env=None) -> None:
    """Top row: time vs T per (op, mode) with the fla peer and SDPA (dashed); then tokens/s; then ours / fla (the
    median of the interleaved pairs, p20-p80 shaded) when fla ran; bottom: decode latency vs batch and decode-state
    memory vs context. Same style as :func:`.attention.plot_attention_bench`."""
    from matplotlib.figure import Figure

    timing = [r for r in records if r.get("kind") == "op" and "ms" in r]
    panels = sorted({(r["op"], r["mode"]) for r in timing if r["op"] != "sdpa"}, key=lambda p: (OPS.index(p[0]), p[1]))
    dec = [r for r in records if r.get("kind") == "decode" and "ms" in r]
    mem = [r for r in records if r.get("kind") == "state_memory" and "state_nbytes" in r]
    ratios = any("ratio_to_fla_p20" in r for r in timing)
    n = max(2, len(panels))
    op_rows = (3 if ratios else 2) if panels else 0
    n_rows = op_rows + (1 if dec or mem else 0)  # only the rows the run measured
    fig = Figure(figsize=(4.2 * n, 3.5 * max(n_rows, 1)), layout="constrained")
    axes = fig.subplots(max(n_rows, 1), n, squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    present = [p for p in PROVIDERS if any(r.get("provider") == p for r in records)]  # colours of this figure's lines
    colors = {p: f"C{i % 10}" for i, p in enumerate(present)}
    for col, (op, mode) in enumerate(panels):
        _plot_op_panel([axes[row][col] for row in range(op_rows)], timing, op, mode, colors)
    if dec or mem:
        ax_d, ax_m = axes[-1][0], axes[-1][1]
        for op, p in dict.fromkeys((r["op"], r["provider"]) for r in dec):
            rs = sorted(_get(dec, op=op, provider=p), key=lambda r: r["batch"])
            ax_d.plot([r["batch"] for r in rs], [r["ms"] for r in rs], marker="o", color=colors[p],
                      label=f"{op}: {p}")  # fmt: skip
        ax_d.set(yscale="log", title="decode step", xlabel="batch", ylabel="ms per step")
        ax_d.set_xscale("log", base=2)
        for arch in dict.fromkeys(r["arch"] for r in mem):  # each architecture in its colour of every figure
            rs = sorted(_get(mem, arch=arch), key=lambda r: r["context"])
            ax_m.plot([r["context"] for r in rs], [r["state_nbytes"] / 2**20 for r in rs], marker="o",
                      color=model_color(arch), label=f"{display_name(arch)} ({rs[0]['state_kind']})")  # fmt: skip
        ax_m.set(yscale="log", title="decode state (model level)", xlabel="context length", ylabel="state MiB")
        ax_m.set_xscale("log", base=2)
        for ax, used in ((ax_d, dec), (ax_m, mem)):
            if used:
                ax.axis("on")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
    info = env or {}
    fig.suptitle(f"{info.get('device', '')}  torch {info.get('torch', '')}  triton {info.get('triton', '')}  "
                 f"fla {info.get('fla') or '-'}")  # fmt: skip
    fig.savefig(path, dpi=120)
