"""The papers' speed figures that print no numbers, drawn from ``evalsuite bench`` records with their claims checked
(:mod:`evalsuite.papers.speed_claims`): Lightning Figures 1(a), 5 and 7, GCA Figure 3(a).

:data:`SPEED_FIGURES` maps a figure's id to a :class:`SpeedFigure`: the bench command that measures it, the file that
command writes, which of that file's records the figure reads, its claims and its drawing. :func:`figure_records`
finds the records under a results folder (the newest file that has them), :func:`notes` says what ``paper render``
prints under the figure, :func:`draw` draws it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers import speed_claims as claims
from evalsuite.papers.found_bench import documents


@dataclass(frozen=True)
class SpeedFigure:
    """One figure measured by a bench command."""

    command: str
    file: str  # the JSON the command writes (its ``records`` are read)
    select: Callable[[list[dict]], list[dict]]  # the records the figure reads (none: the file does not measure it)
    check: Callable[[list[dict]], list[dict]]  # the claims against them
    plot: Callable[[list[dict], Path], list[Path]]  # the figure, ``<stem>.png`` and ``.pdf``
    about: str  # what the measurement is, for the render's notes


def _tnl_against_others(records: list[dict]) -> list[dict]:
    series = claims.train_series(records, lambda r: True)
    tnl = any(rs[0].get("architecture") == "tnl" for rs in series.values())
    return [r for rs in series.values() for r in rs] if tnl and len(series) > 1 else []


def _drt(records: list[dict]) -> list[dict]:
    series = claims.train_series(records, lambda r: r.get("architecture") == "drt")
    return [r for rs in series.values() if len(rs) > 1 for r in rs]


def _length_axis(ax, lengths: list[int] | None = None) -> None:
    """A sequence-length x axis: log 2, or linear with a tick at each of ``lengths``."""
    if lengths is None:
        ax.set_xscale("log", base=2)
    else:
        ax.set_xticks(lengths, [claims.length_label(n) for n in lengths])
    ax.set_xlabel("Sequence length")
    ax.grid(alpha=0.3, which="both")
    if ax.lines:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "not measured (CUDA runs record memory)", ha="center", transform=ax.transAxes)


def _env_title(records: list[dict], title: str) -> str:
    env = records[0].get("env", {})
    return f"{title}: {env.get('device', '')}, torch {env.get('torch', '')}"


def plot_tgs(records: list[dict], stem: Path) -> list[Path]:
    """Lightning Figure 1(a)'s layout: training tokens per GPU per second against the sequence length, a line per
    model; peak memory beside it (the paper's speed panel has none, but its title's claim is "fixed memory")."""
    from matplotlib.figure import Figure

    from evalsuite.report.plots import save_figure

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    speed, memory = fig.subplots(1, 2)
    for k, (model, rs) in enumerate(claims.train_series(records, lambda r: True).items()):
        label = f"{model} ({rs[0]['tokens_per_step']:,} tokens a step)"
        speed.plot([r["length"] for r in rs], [r["tokens_per_s"] for r in rs], marker="o", color=f"C{k}", label=label)
        mem = [(r["length"], r["peak_memory_gib"]) for r in rs if "peak_memory_gib" in r]
        if mem:
            memory.plot(*zip(*mem, strict=True), marker="o", color=f"C{k}", label=model)
    speed.set(ylabel="TGS (tokens / GPU / s)", ylim=(0, None), title="Training speed")
    memory.set(ylabel="Peak memory (GiB)", ylim=(0, None), title="Memory of a step")
    for ax in (speed, memory):
        _length_axis(ax)
    fig.suptitle(_env_title(records, "Lightning Attention, Figure 1(a)"))
    return save_figure(fig, stem)


def plot_training_time(records: list[dict], stem: Path) -> list[Path]:
    """GCA Figure 3(a)'s subject: training seconds per sequence against the sequence length, a line per model, with
    the linear growth through the shortest length's point for reference."""
    from matplotlib.figure import Figure

    from evalsuite.report.plots import save_figure

    fig = Figure(figsize=(5.5, 3.8), layout="constrained")
    ax = fig.subplots()
    for k, (model, rs) in enumerate(claims.train_series(records, lambda r: True).items()):
        lengths = [r["length"] for r in rs]
        ax.plot(lengths, [claims.seconds_per_sequence(r) for r in rs], marker="o", color=f"C{k}", label=model)
        first = claims.seconds_per_sequence(rs[0]) / lengths[0]
        ax.plot(lengths, [first * n for n in lengths], ls="--", color=f"C{k}", alpha=0.5, label=f"{model}, linear")
    ax.set(ylabel="Training seconds per sequence", ylim=(0, None), title="Training time against length")
    _length_axis(ax, sorted({r["length"] for r in records}))
    fig.suptitle(_env_title(records, "GCA, Figure 3(a)"))
    return save_figure(fig, stem)


def _throughput(records: list[dict]) -> list[dict]:
    ok = [r for r in records if r.get("status") == "ok" and "generated_tokens_per_s" in r]
    tnl = any(r.get("architecture") == "tnl" for r in ok)
    return ok if tnl and len(ok) > 1 else []


def plot_throughput(records: list[dict], stem: Path) -> list[Path]:
    """Lightning Figure 5's layout: a bar of generated tokens/s per model (mean over the attempts, the standard
    deviation as its error bar), the batch that fit written on it."""
    from matplotlib.figure import Figure

    from evalsuite.report.plots import save_figure

    fig = Figure(figsize=(1.6 * len(records) + 2.5, 3.8), layout="constrained")
    ax = fig.subplots()
    names = [r["model"] for r in records]
    values = [r["generated_tokens_per_s"] for r in records]
    bars = ax.bar(names, values, yerr=[r.get("generated_tokens_per_s_std", 0.0) for r in records],
                  color=[f"C{k}" for k in range(len(records))])  # fmt: skip
    ax.bar_label(
        bars,
        [f"batch {'≥' if r.get('at_limit') else ''}{r['batch']}" for r in records],
        label_type="center",
        color="white",
    )
    first = records[0]
    ax.set(ylabel="Generated tokens / s", title=f"{first['length']}-token prompts, {first['new_tokens']} new tokens, "
           "the largest batch that fits")  # fmt: skip
    ax.grid(alpha=0.3, axis="y")
    fig.suptitle(_env_title(records, "Lightning Attention, Figure 5"))
    return save_figure(fig, stem)


def _srmsnorm(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("op") == "srmsnorm"]


def plot_srmsnorm(records: list[dict], stem: Path) -> list[Path]:
    """Lightning Figure 7's layout: forward and backward ms against the sequence length (d = 3072, top) and the
    feature dim (n = 4096, bottom), a line per implementation."""
    from matplotlib.figure import Figure

    from evalsuite.report.plots import save_figure

    fig = Figure(figsize=(10, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    for row, (sweep, axis, label) in enumerate((("seq", "T", "Sequence length"), ("dim", "D", "Feature dim"))):
        for ax, mode in zip(axes[row], ("fwd", "bwd"), strict=True):
            for k, provider in enumerate(dict.fromkeys(r["provider"] for r in records)):
                key = (sweep, mode, provider)
                pts = sorted((r[axis], r["ms"]) for r in records if (r["sweep"], r["mode"], r["provider"]) == key
                             and "ms" in r)  # fmt: skip
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", color=f"C{k}", label=provider)
            fixed = "d = 3072" if sweep == "seq" else "n = 4096"
            ax.set(xscale="log", yscale="log", xlabel=label, ylabel="ms",
                   title=f"{'Forward' if mode == 'fwd' else 'Backward'}, {fixed}")  # fmt: skip
            ax.grid(alpha=0.3, which="both")
            if ax.lines:
                ax.legend(fontsize=8)
    fig.suptitle(_env_title(records, "Lightning Attention, Figure 7 (SRMSNorm)"))
    return save_figure(fig, stem)


TRAIN_SHAPES_128K = "1024x128,2048x64,4096x32,8192x16,16384x8,32768x4,65536x2,131072x1"
SPEED_FIGURES = {
    "lightning:figure1": SpeedFigure(
        command=(
            "evalsuite bench train --model transformer-llama-385m@sdpa,tnl --shape "
            + TRAIN_SHAPES_128K
            + " --checkpoint --rounds 3 --out results/runs/bench/lightning-figure1"
        ),  # fmt: skip
        file="train_bench.json",
        select=_tnl_against_others,
        check=claims.lightning_figure1,
        plot=plot_tgs,
        about="training tokens/s of TNL against a same-size LLaMA on SDPA (FlashAttention-2), 128K tokens a step, "
        "blocks recomputed in the backward (panel (b), training loss at 1B and 3B, needs training at that scale)",
    ),
    "lightning:figure5": SpeedFigure(
        command="evalsuite bench throughput --model transformer-llama-7b,tnl-7b --out results/runs/bench/"
        "lightning-figure5",
        file="throughput_bench.json",
        select=_throughput,
        check=claims.lightning_figure5,
        plot=plot_throughput,
        about="generated tokens/s of 7B shapes at the largest batch that fits, a 512-token prompt and 1024 new "
        "tokens (the paper's model list is in its image only: LLaMA-7B's shape stands for the transformers)",
    ),
    "lightning:figure7": SpeedFigure(
        command="evalsuite bench srmsnorm --out results/runs/bench/lightning-figure7",
        file="srmsnorm_bench.json",
        select=_srmsnorm,
        check=claims.lightning_figure7,
        plot=plot_srmsnorm,
        about="our Triton SRMSNorm against PyTorch eager (and torch.compile) at batch 1, bf16, forward and backward "
        "alone; the paper gives no batch",
    ),
    "gca:figure3a": SpeedFigure(
        command=(
            "evalsuite bench train --model drt-base-lm,drt --shape 32768x1,16384x2,8192x4,4096x8 "
            "--baseline drt-base-lm --out results/runs/bench/gca-table4"
        ),  # fmt: skip
        file="train_bench.json",
        select=_drt,
        check=claims.gca_figure3a,
        plot=plot_training_time,
        about="training seconds per sequence (a step's time over its batch) at 32,768 tokens a step; the records "
        "of GCA Table 4's run",
    ),
}


def figure_records(figure_id: str, root: Path) -> tuple[list[dict], Path]:
    """The records of the newest file under ``root`` that measures the figure, and that file; UserError if none."""
    figure = SPEED_FIGURES[figure_id]
    found = []
    for doc, path in documents(Path(root), figure.file):
        selected = figure.select([r for r in doc.get("records", []) if isinstance(r, dict)])
        if selected:
            found.append((path.stat().st_mtime, str(path), selected, path))
    if not found:
        raise UserError(f"no {figure_id} records under {root}: run {figure.command}")
    _, _, records, path = max(found, key=lambda f: f[:2])
    return records, path


def notes(figure_id: str, root: Path) -> list[str]:
    """The render's lines under the figure: the command, and where its records are, the claims against them."""
    figure = SPEED_FIGURES[figure_id]
    lines = [f"measured by: {figure.command} ({figure.about})"]
    try:
        records, path = figure_records(figure_id, root)
    except UserError:
        return [*lines, f"no records of that command under {root} yet"]
    lines.append(f"our records: {path}")
    verdict = {True: "agrees", False: "disagrees", None: "not measured"}
    return lines + [f'claim "{c["claim"]}": ours {c["ours"]}: {verdict[c["agrees"]]}' for c in figure.check(records)]


def draw(figure_id: str, root: Path, stem: Path) -> list[Path]:
    records, _ = figure_records(figure_id, root)
    return SPEED_FIGURES[figure_id].plot(records, stem)
