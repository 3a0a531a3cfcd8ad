"""How long one per-token-loss window takes, and where the time goes (``evalsuite bench loss-window``).

Random-init weights of each card's shapes (bf16 on CUDA as ``evalsuite loss`` runs them, float32 on a CPU), one
seeded window of ``length`` tokens a sequence. Each model is timed on the loss task's own call,
:meth:`~evalsuite.adapters.base.TokenAdapter.token_nll` (forward, chunked LM head, cross-entropy, the copy to the
host), in interleaved rounds (A B A B ...; one warm-up call each first), so the models' times are of the same
moments. Then one call each under ``torch.profiler``: the device's kernels grouped into attention (the suite's
Triton kernels and SDPA's), GEMMs and the rest (norms, gates, activations, casts, the loss), and the longest
kernels. Achieved TFLOP/s counts the linear maps (``2 * weights * tokens``, LM head included) and, for the
softmax-attention families, the causal half of attention (``2 * B * T^2 * H * hd`` a layer); linear-attention
families count their linear maps only (``attention_tflop`` is null then).

A model is ``CARD`` or ``CARD:BACKEND`` (an attention backend of the card's family, e.g. ``transformer-pro:sdpa``
for PyTorch's own kernel as the peer). ``compile``: ``"off"``, ``"on"`` (the adapters' ``compile``: full-sequence
forwards through torch.compile; the warm-up call compiles) or ``"both"`` (each model twice). Writes
``loss_window.json`` and ``loss_window.md`` under ``out``.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import torch

from evalsuite.bench.common import env_info, format_kernel_rows, kernel_table, random_weights_adapter, wall_seconds
from evalsuite.errors import UserError

# kernel name patterns of each group, tried in order (the rest is "other")
KERNEL_GROUPS = (
    ("attention", re.compile(r"flash|fmha|attention|^_\w*(fwd|scan|walk|state|segment|read|write|pair)\w*kernel")),
    ("gemm", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|matmul|addmm|^aten::mm$|^aten::bmm$|^aten::linear$")),
)


def parse_model(spec: str) -> tuple[str, str]:
    """``"card"`` or ``"card:backend"`` -> ``(card, backend)`` (``"auto"`` when none is named)."""
    card, _, backend = spec.partition(":")
    if not card:
        raise UserError(f"--models {spec!r}: name a card, optionally with :BACKEND")
    return card, backend or "auto"


def kernel_group(name: str) -> str:
    """The group of a kernel (or, on a CPU, of a leaf op): ``"attention"``, ``"gemm"`` or ``"other"``."""
    for group, pattern in KERNEL_GROUPS:
        if pattern.search(name):
            return group
    return "other"


def window_flops(model: torch.nn.Module, batch: int, length: int) -> tuple[float, float | None]:
    """``(linear FLOPs, attention FLOPs or None)`` of one forward over ``batch`` windows of ``length`` tokens.

    Linear: ``2 * tokens`` per weight of every ``nn.Linear`` and of a tied LM head (the embedding's weights).
    Attention: the causal half of ``QK^T`` and ``PV``, ``2 * B * T^2 * H * hd`` per layer, for the softmax families
    (the FoX architectures: :class:`~evalsuite.models.fox.model.ForgettingTransformer`); None for the others.
    """
    from evalsuite.models.fox.model import ForgettingTransformer

    tokens = batch * length
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    if getattr(getattr(model, "cfg", None), "tie_word_embeddings", False):
        weights += model.embed.weight.numel()
    if not isinstance(model, ForgettingTransformer):
        return 2.0 * weights * tokens, None
    cfg = model.cfg
    return 2.0 * weights * tokens, 2.0 * batch * length**2 * cfg.hidden_size * cfg.num_layers


COMPILE_MODES = {"off": (False,), "on": (True,), "both": (False, True)}


def _profile_groups(call, device: str) -> tuple[float, dict, list[dict]]:
    """``(device ms, ms per group, rows of the 25 longest kernels)`` of one ``call()`` under ``torch.profiler``."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        call()
        if cuda:
            torch.cuda.synchronize(device)
    total_us, rows = kernel_table(prof, 1, cuda, top=None)
    groups = {"attention": 0.0, "gemm": 0.0, "other": 0.0}
    for r in rows:
        groups[kernel_group(r["kernel"])] += r["us_per_call"] / 1e3
    return total_us / 1e3, groups, rows[:25]


def bench_loss_window(out, models: list[str], length: int = 65536, batch: int = 1, rounds: int = 3,
                      device: str = "cuda", compile: str = "off", seed: int = 0) -> list[dict]:  # fmt: skip
    """Time and profile each of ``models`` on ``batch`` windows of ``length`` tokens (module doc); returns the
    records written to ``loss_window.json``."""
    if not models:
        raise UserError("name at least one model in --models")
    if length < 2 or batch < 1 or rounds < 1:
        raise UserError(f"need --length >= 2, --batch >= 1 and --rounds >= 1; got {length}, {batch}, {rounds}")
    if compile not in COMPILE_MODES:
        raise UserError(f"--compile takes {', '.join(COMPILE_MODES)}; got {compile!r}")
    parsed = [(*parse_model(m), c) for m in models for c in COMPILE_MODES[compile]]
    adapters = [
        random_weights_adapter(card, device, attention_backend=backend, compile=c) for card, backend, c in parsed
    ]
    for adapter in adapters:
        adapter.check_length(length)
    gen = torch.Generator().manual_seed(seed)
    vocab = min(a.tokenizer.vocab_size for a in adapters)
    ids = torch.randint(0, vocab, (batch, length + 1), generator=gen)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    calls = [lambda a=a: a.token_nll(inputs, targets) for a in adapters]
    warmup = [wall_seconds(call, device) for call in calls]  # compiles, autotunes, allocates
    seconds: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for i, call in enumerate(calls):
            seconds[i].append(wall_seconds(call, device))
    env = env_info()
    records = []
    for (card, backend, compiled), adapter, call, first, times in zip(parsed, adapters, calls, warmup, seconds,
                                                                      strict=True):  # fmt: skip
        device_ms, groups, top = _profile_groups(call, device)
        linear, attention = window_flops(adapter.model, batch, length)
        median = statistics.median(times)
        flops = linear + (attention or 0.0)
        records.append({
            "model": card, "backend": backend, "compile": compiled, "length": length, "batch": batch, "rounds": rounds,
            "seconds_median": median, "seconds_min": min(times), "seconds_max": max(times), "seconds": times,
            "warmup_seconds": first, "tokens_per_s": batch * length / median,
            "linear_tflop": linear / 1e12, "attention_tflop": None if attention is None else attention / 1e12,
            "tflops_achieved": flops / median / 1e12,
            "profile": {"device_ms": device_ms, "group_ms": groups, "top": top},
            **env,
        })  # fmt: skip
    _write(Path(out), records)
    return records


def _write(out: Path, records: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_window.json").write_text(json.dumps(records, indent=1) + "\n")
    env = records[0]
    lines = [f"# Per-token loss, one window: {env['device']}, torch {env['torch']}, commit {env['git_commit']}", "",
             "| model | backend | compile | B x T | s a window [min-max] | tokens/s | TFLOP/s | attention | GEMM "
             "| other |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in records:
        g, dev = r["profile"]["group_ms"], r["profile"]["device_ms"]
        shares = " | ".join(f"{g[k]:.0f} ms ({g[k] / dev:.0%})" for k in ("attention", "gemm", "other"))
        compiled = "yes" if r["compile"] else "no"
        lines.append(f"| {r['model']} | {r['backend']} | {compiled} | {r['batch']} x {r['length']} | "
                     f"{r['seconds_median']:.3f} [{r['seconds_min']:.3f}-{r['seconds_max']:.3f}] | "
                     f"{r['tokens_per_s']:,.0f} | {r['tflops_achieved']:.3g} | {shares} |")  # fmt: skip
    for r in records:
        dev = r["profile"]["device_ms"]
        name = f"{r['model']} ({r['backend']}{', compiled' if r['compile'] else ''})"
        lines += ["", f"## {name}: {dev:.1f} ms of device kernels, the longest", "", "```"]
        lines += format_kernel_rows(r["profile"]["top"], dev * 1e3, unit="window") + ["```"]
    (out / "loss_window.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[: 2 + 2 + len(records)]))
