"""The generation benchmark's Markdown table and plot (:mod:`evalsuite.bench.generate`)."""

from __future__ import annotations

import statistics

PATH_STYLES = {"eager": "-", "static": "-.", "graph": "--", "compiled": ":"}
SAMPLING_MARKERS = {"greedy": "o", "sampled": "x"}


def format_markdown(records, env: dict, params: dict) -> str:
    """One table per model: prefill and decode tokens/s, ms per step, the bound and the fraction of it."""
    bw = env.get("copy_bandwidth", {})
    lines = [f"# Generation benchmark\n\n{env.get('device')}, torch {env.get('torch')}, {params['dtype']}, "
             f"{params['weights']} weights, {params['new_tokens']} new tokens per call; copy bandwidth "
             f"{bw.get('bytes_per_s', 0) / 1e9:.1f} GB/s ({bw.get('copy_mib')} MiB copy)."]  # fmt: skip
    head = ["path", "sampling", "length", "batch", "prefill tok/s", "decode tok/s", "ms/step", "ms/step in call",
            "bound tok/s", "of bound", "in call", "status"]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in records):
        lines += ["", f"## {model}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows = sorted((r for r in records if r["model"] == model),
                      key=lambda r: (r["path"], r.get("sampling", "greedy"), r["length"], r["batch"]))  # fmt: skip
        for r in rows:

            def num(key, fmt, r=r):
                return format(r[key], fmt) if key in r else "-"

            def pct(key, r=r):
                return f"{100 * r[key]:.1f}%" if key in r else "-"

            cells = [r["path"], r.get("sampling", "greedy"), str(r["length"]), str(r["batch"]),
                     num("prefill_tokens_per_s", ".0f"), num("decode_tokens_per_s", ".1f"), num("ms_per_step", ".2f"),
                     num("ms_per_step_in_call", ".2f"), num("bound_tokens_per_s", ".0f"), pct("fraction_of_bound"),
                     pct("fraction_of_bound_in_call"), r["status"][:60]]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    if params.get("call_tokens"):
        lines += ["", *_call_seconds(records)]
    return "\n".join(lines)


def _call_seconds(records) -> list[str]:
    """Seconds of a whole generate call per number of new tokens (median over the repeats), prefill included."""
    counts = sorted({int(k) for r in records for k in r.get("call_times_s", {})})
    lines = ["## Seconds per generate call (prompt prefill included), by new tokens", "",
             "| model | path | length | batch | " + " | ".join(map(str, counts)) + " |",
             "|" + "---|" * (4 + len(counts))]  # fmt: skip
    for r in sorted((r for r in records if "call_times_s" in r), key=lambda r: (r["model"], r["path"], r["length"],
                                                                                r["batch"])):  # fmt: skip
        times = r["call_times_s"]
        cells = [f"{statistics.median(times[str(k)]):.3f}" if str(k) in times else "-" for k in counts]
        lines.append(f"| {r['model']} | {r['path']} | {r['length']} | {r['batch']} | " + " | ".join(cells) + " |")
    return lines


def plot_generate_bench(records, path, env=None) -> None:
    """Per model: decode tokens/s vs prompt length (one line per path, sampling and batch, the bound dashed) above
    prefill tokens/s; log scales."""
    from matplotlib.figure import Figure

    ok = [r for r in records if r.get("status") == "ok"]
    models = list(dict.fromkeys(r["model"] for r in ok))
    if not models:
        return
    fig = Figure(figsize=(5.5 * len(models), 7.5))
    axes = fig.subplots(2, len(models), squeeze=False)
    batches = sorted({r["batch"] for r in ok})
    for col, model in enumerate(models):
        ax_d, ax_p = axes[0][col], axes[1][col]
        for i, B in enumerate(batches):
            color = f"C{i}"
            bound = {r["length"]: r for r in records
                     if r["model"] == model and r["batch"] == B and "bound_tokens_per_s" in r}  # fmt: skip
            bound = [bound[n] for n in sorted(bound)]
            if bound:
                ax_d.plot([r["length"] for r in bound], [r["bound_tokens_per_s"] for r in bound], ":", color=color,
                          alpha=0.6, label=f"bound B={B}")  # fmt: skip
            for p, s in [(p, s) for p in PATH_STYLES for s in SAMPLING_MARKERS]:
                rs = sorted((r for r in ok if (r["model"], r["batch"], r["path"]) == (model, B, p)
                             and r.get("sampling", "greedy") == s and "decode_tokens_per_s" in r),
                            key=lambda r: r["length"])  # fmt: skip
                label = f"{p}{'' if s == 'greedy' else ' ' + s} B={B}"
                xs, style = [r["length"] for r in rs], dict(marker=SAMPLING_MARKERS[s], color=color, label=label)
                if rs:
                    ax_d.plot(xs, [r["decode_tokens_per_s"] for r in rs], PATH_STYLES[p], **style)
                    ax_p.plot(xs, [r["prefill_tokens_per_s"] for r in rs], PATH_STYLES[p], **style)
        for ax, what in ((ax_d, "decode tokens/s"), (ax_p, "prefill tokens/s")):
            ax.set(xscale="log", yscale="log", xlabel="prompt length (tokens)", ylabel=what)
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        ax_d.set_title(model)
        ax_d.legend(fontsize=7)
    env = env or {}
    fig.suptitle(f"generate  {env.get('device', '')}  torch {env.get('torch', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
