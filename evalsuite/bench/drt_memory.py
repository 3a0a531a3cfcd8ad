"""DRT's chunk memory at long context, against its Base LM (``evalsuite bench drt-memory``): decode speed and memory
with the chunk store on the device vs in CPU memory, and their ratios to a sliding-window Base LM measured in the same
run (the GCA paper's offloading and its Table 3, arXiv:2410.01651 §3.2 "Memory Offloading" and §4.3).

A DRT card (``drt``: the paper's 128M shape) and its Base LM (``drt-base-lm``: the same shape with every one of the 12
layers a sliding-window ALiBi layer, nothing retrieved), random weights, bf16 autocast over fp32 weights, batch 1: each
prefills a context of L random tokens into its decode state, then decodes new tokens one at a time (greedy, eager
steps, as the authors' released code decodes). On a GPU each model and placement first makes one untimed run at the
smallest L that crosses a chunk boundary, so no timed row compiles a kernel. Per L and placement of DRT's chunk store
(the Base LM has none) a row holds the peak device memory of the prefill and of the decoding (both above the weights,
so the decoding's counts the state), the state's device-resident and host bytes, and milliseconds per decoded token.
With the store in CPU memory the device holds the window caches, the landmark embeddings and the retrieved chunks only,
so its share stays flat as L grows.

Table 3's ratios, DRT over the Base LM at the same L, per placement: ``time_per_token`` (ms per decoded token),
``cache_memory`` (the decode state's bytes on the device) and ``peak_memory`` (the decoding's peak device memory; none
on a CPU). The table's "mem. cost" is ``cache_memory``: Landmark Attention's ratios without offload are exactly L/512
(32 at 16K, 96 at 48K), its whole KV cache over the Base LM's 512-position window, so the paper counts attention-cache
memory, not process memory. Writes ``OUT/drt_memory.json`` and ``OUT/drt_memory.md``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from evalsuite.bench.common import ratio_fields
from evalsuite.errors import UserError

MIB = 2**20
JSON_NAME, MD_NAME = "drt_memory.json", "drt_memory.md"


class DeviceMemory:
    """Peak allocated bytes above a baseline on CUDA; zeros elsewhere (the CPU smoke run)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def reset(self) -> None:
        """A new baseline (what is allocated now) and a new peak."""
        if self.cuda:
            self.reset_peak()
            self.base = torch.cuda.memory_allocated()

    def reset_peak(self) -> None:
        """A new peak over the same baseline."""
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()

    def peak_mib(self) -> float:
        if not self.cuda:
            return 0.0
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - self.base) / MIB


def measure(model, length: int, offload: bool, new_tokens: int) -> dict:
    """Prefill ``length`` random tokens, then decode ``new_tokens`` greedily; memory and time of both phases."""
    device = next(model.parameters()).device
    memory = DeviceMemory(device)
    ids = torch.randint(0, 50000, (1, length), generator=torch.Generator().manual_seed(length)).to(device)
    memory.reset()
    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16):
        state = model.new_state(1, length + new_tokens, offload=offload)
        t0 = time.perf_counter()
        hidden = model(ids, state=state)
        token = model.logits(hidden[:, -1:]).argmax(-1)
        prefill_peak = memory.peak_mib()
        prefill_s = time.perf_counter() - t0
        del hidden
        memory.reset_peak()  # the baseline stays the weights': the decoding's peak counts the state
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            token = model.logits(model(token, state=state)).argmax(-1)
        decode_peak = memory.peak_mib()
        decode_s = time.perf_counter() - t0
    return {
        "length": length,
        "offload": offload,
        "prefill_seconds": prefill_s,
        "prefill_peak_mib": prefill_peak,
        "decode_peak_mib": decode_peak,
        "ms_per_token": 1000 * decode_s / new_tokens,
        "state_device_bytes": state.device_nbytes(),
        "state_device_mib": state.device_nbytes() / MIB,
        "state_host_mib": state.host_nbytes() / MIB,
        "state_total_mib": state.nbytes() / MIB,
        "new_tokens": new_tokens,
    }


def _timed_rows(nets: dict, lengths: list[int], placements: dict, new_tokens: int, rounds: int) -> list[dict]:
    """Every (model, length, placement) row, ``rounds`` times over in turns (A B C, A B C, ...: each round's ratios
    compare the same moment of the machine, as the kernel benchmarks do, bench/common.py). A row keeps its first
    round's memory (the same every round) and the median ms per token with every round's; out of memory is a row."""
    for name, net in nets.items():  # on CUDA an untimed run past a chunk boundary: the kernels compiled
        for offload in placements[name] if net.embed.weight.is_cuda else ():
            measure(net, lengths[0], offload, net.cfg.chunk_size + 2)
    rows = []
    for length in lengths:
        runs = {(name, offload): [] for name in nets for offload in placements[name]}
        for _ in range(rounds):
            for (name, offload), done in runs.items():
                if done and "error" in done[0]:
                    continue
                try:
                    done.append(measure(nets[name], length, offload, new_tokens))
                except torch.OutOfMemoryError:  # recorded, and the sweep goes on
                    done.append({"length": length, "offload": offload, "error": "out of memory"})
        for (name, _), done in runs.items():
            row = {"model": name, **done[0]}
            if "error" not in row:  # (a later round out of memory leaves fewer rounds)
                times = [d["ms_per_token"] for d in done if "error" not in d]
                row.update(ms_per_token=statistics.median(times), ms_per_token_rounds=times)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table3_ratios(rows: list[dict], model: str, base: str) -> list[dict]:
    """Per length and placement of ``model``'s chunk store, its row over ``base``'s at the same length (see the module
    docstring): ``time_per_token`` (:func:`~evalsuite.bench.common.ratio_fields` of the rounds both rows hold:
    the median of the per-round ratios, ``_p20``, ``_p80``, ``_pairs``), ``cache_memory``, ``peak_memory`` (None
    without a device peak)."""
    bases = {r["length"]: r for r in rows if r["model"] == base and "error" not in r}
    out = []
    for r in rows:
        b = bases.get(r["length"])
        if r["model"] != model or "error" in r or b is None:
            continue
        ours, peer = (x.get("ms_per_token_rounds", [x["ms_per_token"]]) for x in (r, b))
        n = min(len(ours), len(peer))  # the rounds both rows hold
        peak = r["decode_peak_mib"] / b["decode_peak_mib"] if b["decode_peak_mib"] > 0 else None
        cache = r["state_device_bytes"] / b["state_device_bytes"]
        out.append({**{key: r[key] for key in ("length", "offload", "new_tokens")},
                    **ratio_fields("time_per_token", ours[:n], peer[:n]), "cache_memory": cache,
                    "peak_memory": peak})  # fmt: skip
    return out


def _card(name: str, base: bool):
    """The card ``name``, a DRT that retrieves (``base`` False) or a Base LM (a DRT without upper layers)."""
    from evalsuite.cards import load_card

    card = load_card(name)
    if card.family.name != "drt" or card.model_config().retrieves == base:
        what = "a Base LM card (a DRT with lower_layers = num_layers)" if base else "a DRT card with retrieval"
        raise UserError(f"--{'base' if base else 'model'} {name} is not {what}")
    return card


def drt_memory(out, lengths=(16384, 65536, 262144), new_tokens: int = 128, model: str = "drt",
               base: str | None = "drt-base-lm", device: str = "cuda", rounds: int = 5) -> dict:  # fmt: skip
    """Measure every (model, length, placement) (module doc; ``new_tokens``: 128 in the paper's Table 3; ``model``: a
    DRT card, ``drt-tiny`` for a CPU run; ``base``: its Base LM card, ``drt-base-lm-tiny`` beside ``drt-tiny``, None
    for DRT alone; ``rounds``: timed rounds of every row, in turns) and write the JSON and the Markdown table. Returns
    the JSON's document."""
    from evalsuite.runs.provenance import device_name, provenance
    from evalsuite.training.train import build_model

    if not lengths or min(lengths) < 1 or new_tokens < 1 or rounds < 1:
        raise UserError("give positive --lengths, --new-tokens and --rounds")
    cards = [(_card(model, base=False), (False, True))] + ([(_card(base, base=True), (False,))] if base else [])
    dev = torch.device(device)
    nets = {card.name: build_model(card, seed=0).to(dev).eval() for card, _ in cards}  # 0.5 GiB each: all held
    weights_mib = {n: sum(p.numel() * p.element_size() for p in net.parameters()) / MIB for n, net in nets.items()}
    rows = _timed_rows(nets, sorted(set(lengths)), {card.name: p for card, p in cards}, new_tokens, rounds)
    names = [card.name for card, _ in cards]
    result = {"model": names[0], "base": names[1] if base else None, "new_tokens": new_tokens, "rounds": rounds,
              "weights_mib": weights_mib, "rows": rows,
              "ratios": table3_ratios(rows, *names) if base else [],
              "provenance": provenance(device=device_name(dev))}  # fmt: skip
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / JSON_NAME).write_text(json.dumps(result, indent=1) + "\n")
    table = format_table(result)
    (out / MD_NAME).write_text(table + "\n")
    print(table)
    return result


def format_table(result: dict) -> str:
    """The Markdown tables of :func:`drt_memory`'s rows and ratios."""
    weights = ", ".join(f"{name} {mib:.0f} MiB" for name, mib in result["weights_mib"].items())
    lines = [
        f"DRT (`{result['model']}` card) and its Base LM (`{result['base']}`), random weights, bf16 autocast, batch 1, "
        f"eager steps, on {result['provenance']['device']} (weights: {weights}, not counted below): peak device memory "
        f"above the weights, state bytes, decode speed ({result['new_tokens']} tokens; median of "
        f"{result.get('rounds', 1)} rounds taken in turns).",
        "",
        "| model | context | chunk store | prefill s | prefill peak MiB | decode peak MiB | state on device MiB "
        "| state in CPU MiB | ms / token |",
        "|:---|---:|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        place = "CPU memory" if r["offload"] else "device"
        if "error" in r:
            lines.append(f"| {r['model']} | {r['length']} | {place} | {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['model']} | {r['length']} | {place} | {r['prefill_seconds']:.1f} | {r['prefill_peak_mib']:.0f} | "
            f"{r['decode_peak_mib']:.0f} | {r['state_device_mib']:.1f} | {r['state_host_mib']:.1f} | "
            f"{r['ms_per_token']:.1f} |"
        )
    if result["ratios"]:
        head = "| context | chunk store | time / token [p20-p80] | mem. cost | peak memory |"
        head += "\n|---:|:---|---:|---:|---:|"
        lines += ["", "DRT / Base LM (the GCA paper's Table 3; mem. cost = the decode state on the device):", "", head]
        for r in result["ratios"]:
            peak = "-" if r["peak_memory"] is None else f"{r['peak_memory']:.2f}×"
            place = "CPU memory" if r["offload"] else "device"
            spread = ""
            if "time_per_token_p20" in r:  # (absent from records made before rounds)
                spread = f" [{r['time_per_token_p20']:.2f}-{r['time_per_token_p80']:.2f}]"
            ratios = f"{r['time_per_token']:.2f}×{spread} | {r['cache_memory']:.2f}× | {peak}"
            lines.append(f"| {r['length']} | {place} | {ratios} |")
    return "\n".join(lines)
