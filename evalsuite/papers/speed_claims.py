"""The claims of the papers' speed figures that print no numbers, checked on ``evalsuite bench`` records.

Each figure's item has no columns (the text gives no values), so ``paper render`` checks what the text says about
its curves on our records (one function per figure below) and draws them (:mod:`evalsuite.papers.speed_figures`):

* Lightning Attention paper, Figure 1(a) (arXiv:2405.17381 §5.2): training tokens per GPU per second (TGS) against
  the sequence length, 1K to 128K: TNL's "remains consistently high, while the other three models exhibit a rapid
  decline". Read from ``evalsuite bench train`` records at a fixed number of tokens a step (the b × n = const regime
  of the title's "constant speed": a model whose work per token does not grow with n keeps its tokens/s). A series is
  constant where its lowest tokens/s is at least :data:`FLAT` of its highest; declining where its longest length's
  falls below :data:`FLAT` of its shortest's.
* GCA paper, Figure 3(a) (arXiv:2410.01651 §4.3): "the total training time increases linearly with the increment of
  the sequence length": the seconds per sequence (a step's time over its batch) of DRT-architecture models against
  the length, from ``bench train`` records at a fixed number of tokens a step. The log-log slope over all lengths
  reads as linear within :data:`LINEAR_BAND` of 1.
* Lightning Attention paper, Figure 5 (§5.2): inference throughput of 7B models at the largest batch that fits, a
  512-token prompt and 1024 new tokens: TNL's is "up to 11× higher than transformer structure models". Read from
  ``evalsuite bench throughput`` records (generated tokens/s): TNL-architecture models over each other model; the
  claim's direction (higher) is what is checked, the paper's factor is printed beside ours.
* Lightning Attention paper, Figure 7 (App. F): the Triton SRMSNorm against PyTorch's, forward and backward, against
  the sequence length at d = 3072 and the feature dim at n = 4096: Triton "outperforming conventional PyTorch
  implementations", with "notable improvements in processing speed for larger dimensions". Read from ``evalsuite
  bench srmsnorm`` records (``torch`` is PyTorch): faster at every point; and, per mode, the median of PyTorch's time
  over ours across the larger half of the dims above that across the smaller half (one noisy point does not decide).

A check's result per claim: ``claim`` (the paper's words), ``ours`` (what the records show) and ``agrees`` (True,
False, or None where the records cannot say).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import numpy as np

FLAT = 0.85  # a series whose lowest tokens/s is at least this much of its highest reads as constant (within 15%)
LINEAR_BAND = 0.2  # a log-log slope within this of 1 reads as linear growth


def train_series(records, keep: Callable[[dict], bool]) -> dict[str, list[dict]]:
    """``{model: [ok train_step records by length]}`` of the records ``keep`` accepts."""
    series: dict[str, list[dict]] = {}
    for r in records:
        if r.get("op") == "train_step" and r.get("status") == "ok" and keep(r):
            series.setdefault(r["model"], []).append(r)
    return {m: sorted(rs, key=lambda r: r["length"]) for m, rs in series.items()}


def _k(n: float) -> str:
    return f"{n / 1e3:.1f}k"


def length_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _fixed_tokens(rs: list[dict]) -> bool:
    return len({r["tokens_per_step"] for r in rs}) == 1


def _tgs_shape(rs: list[dict], want_flat: bool) -> tuple[str, bool | None]:
    """What one model's tokens/s against the length shows, and whether it is constant (``want_flat``) or declining."""
    if len(rs) < 2:
        return "fewer than two lengths measured", None
    if not _fixed_tokens(rs):
        return "tokens per step differ between lengths: rerun at LENGTHxBATCH shapes of one token count", None
    first, last = rs[0], rs[-1]
    lowest = min(r["tokens_per_s"] for r in rs) / max(r["tokens_per_s"] for r in rs)
    text = (f"{_k(first['tokens_per_s'])} tokens/s at {length_label(first['length'])}, {_k(last['tokens_per_s'])} at "
            f"{length_label(last['length'])} ({last['tokens_per_s'] / first['tokens_per_s']:.2f}×; lowest "
            f"{lowest:.2f}× its highest)")  # fmt: skip
    flat = lowest >= FLAT
    return text, flat if want_flat else last["tokens_per_s"] < FLAT * first["tokens_per_s"]


def lightning_figure1(records) -> list[dict]:
    """§5.2's two claims about Figure 1(a) on ``bench train`` records: TNL-architecture models constant, the others
    declining (one line per model)."""
    series = train_series(records, lambda r: True)
    tnl = {m: rs for m, rs in series.items() if rs[0].get("architecture") == "tnl"}
    others = {m: rs for m, rs in series.items() if m not in tnl}
    out = []
    claim = "the TGS (tokens per GPU per second) for TNL remains consistently high"
    for model, rs in tnl.items() or {"tnl": []}.items():
        ours, agrees = _tgs_shape(rs, want_flat=True) if rs else ("not measured", None)
        out.append({"claim": f"{claim} ({model})", "ours": ours, "agrees": agrees})
    claim = "the other three models exhibit a rapid decline when sequence length is scaled from 1K to 128K"
    for model, rs in others.items() or {"LLaMA-FA2": []}.items():
        ours, agrees = _tgs_shape(rs, want_flat=False) if rs else ("not measured", None)
        out.append({"claim": f"{claim} ({model})", "ours": ours, "agrees": agrees})
    return out


def seconds_per_sequence(r: dict) -> float:
    return r["ms_per_step"] / 1e3 / r["batch"]


def gca_figure3a(records) -> list[dict]:
    """§4.3's claim about Figure 3(a) on ``bench train`` records of DRT-architecture models (DRT and its Base LM)."""
    series = train_series(records, lambda r: r.get("architecture") == "drt")
    claim = "the total training time increases linearly with the increment of the sequence length"
    out = []
    for model, rs in series.items() or {"drt": []}.items():
        if len(rs) < 2:
            ours, agrees = "fewer than two lengths measured", None
        elif not _fixed_tokens(rs):
            ours, agrees = "tokens per step differ between lengths: rerun at shapes of one token count", None
        else:
            # every length counts (not only the longer half, as for kernels: a step is never launch-bound)
            xs = np.log([r["length"] for r in rs])
            slope = float(np.polyfit(xs, np.log([seconds_per_sequence(r) for r in rs]), 1)[0])
            ours = (f"{seconds_per_sequence(rs[0]):.3f} s per sequence at {length_label(rs[0]['length'])} to "
                    f"{seconds_per_sequence(rs[-1]):.3f} s at {length_label(rs[-1]['length'])}: log-log slope "
                    f"{slope:.2f}")  # fmt: skip
            agrees = abs(slope - 1.0) <= LINEAR_BAND
        out.append({"claim": f"{claim} ({model})", "ours": ours, "agrees": agrees})
    return out


def _batch(r: dict) -> str:
    """The batch of a throughput record, ``≥`` where the search stopped at its limit."""
    return f"{'≥' if r.get('at_limit') else ''}{r['batch']}"


def lightning_figure5(records) -> list[dict]:
    """§5.2's claim about Figure 5 on ``bench throughput`` records: each TNL model's generated tokens/s over each
    other model's, at each one's largest batch."""
    ok = [r for r in records if r.get("status") == "ok" and "generated_tokens_per_s" in r]
    tnl = [r for r in ok if r.get("architecture") == "tnl"]
    others = [r for r in ok if r.get("architecture") != "tnl"]
    claim = "TNL achieves a throughput rate that up to 11× higher than transformer structure models"
    if not tnl or not others:
        return [{"claim": claim, "ours": "not measured (a TNL model and another, one bench throughput run)",
                 "agrees": None}]  # fmt: skip
    out = []
    for t in tnl:
        for o in others:
            ratio = t["generated_tokens_per_s"] / o["generated_tokens_per_s"]
            ours = (f"{t['model']} {t['generated_tokens_per_s']:,.0f} generated tokens/s at batch {_batch(t)}, "
                    f"{o['model']} {o['generated_tokens_per_s']:,.0f} at batch {_batch(o)}: {ratio:.2f}× "
                    "(the paper's largest ratio: 11×)")  # fmt: skip
            out.append({"claim": f"{claim} ({t['model']} / {o['model']})", "ours": ours, "agrees": ratio > 1})
    return out


def lightning_figure7(records) -> list[dict]:
    """App. F's two claims about Figure 7 on ``bench srmsnorm`` records (the ``torch`` provider against ours)."""
    peer = [r for r in records if r.get("op") == "srmsnorm" and r.get("provider") == "torch" and "ratio_to_triton" in r]
    claim = "the Triton SRMSNorm outperforms conventional PyTorch implementations"
    if not peer:
        return [{"claim": claim, "ours": "not measured (bench srmsnorm with triton and torch)", "agrees": None}]
    out = []
    for mode in sorted({r["mode"] for r in peer}):
        rs = [r for r in peer if r["mode"] == mode]
        ratios = [r["ratio_to_triton"] for r in rs]
        ours = (f"{mode}: PyTorch / Triton {min(ratios):.2f}-{max(ratios):.2f}× over {len(rs)} points; "
                f"faster at {sum(x > 1 for x in ratios)} of them")  # fmt: skip
        out.append({"claim": f"{claim} ({mode})", "ours": ours, "agrees": all(x > 1 for x in ratios)})
    claim = "notable improvements in processing speed for larger dimensions"
    for mode in sorted({r["mode"] for r in peer}):
        dims = sorted((r for r in peer if r["mode"] == mode and r.get("sweep") == "dim"), key=lambda r: r["D"])
        if len(dims) < 2:
            out.append({"claim": f"{claim} ({mode})", "ours": "fewer than two dims measured", "agrees": None})
            continue
        half = len(dims) // 2
        small, large = dims[:half], dims[len(dims) - half :]
        lo, hi = (statistics.median(r["ratio_to_triton"] for r in rs) for rs in (small, large))
        ours = (f"{mode}: PyTorch / Triton median {lo:.2f}× over d = {small[0]['D']}-{small[-1]['D']}, {hi:.2f}× "
                f"over d = {large[0]['D']}-{large[-1]['D']}")  # fmt: skip
        grows = hi > lo
        out.append({"claim": f"{claim} ({mode})", "ours": ours, "agrees": grows})
    return out
