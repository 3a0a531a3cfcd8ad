"""DRT's chunk memory at long context (``evalsuite bench drt-memory``): device memory and decode speed with the chunk
store on the GPU vs in CPU memory (the GCA paper's offloading, arXiv:2410.01651 §3.4 / Table 3).

The ``drt`` card (the paper's 128M shape, random weights, bf16 autocast over fp32 weights) prefills a context of L
tokens into a chunk-memory decode state, then decodes new tokens one at a time. For each L and placement of the
chunk store it records the peak device memory of the prefill and of the decoding, the state's device-resident and
host bytes, and milliseconds per decoded token. With the store in CPU memory the device holds the window caches, the
landmark embeddings and the retrieved chunks only, so its share must stay flat as L grows. Writes
``OUT/drt_memory.json`` and ``OUT/drt_memory.md``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

MIB = 2**20


class DeviceMemory:
    """Peak allocated bytes above a baseline on CUDA; zeros elsewhere (the CPU smoke run)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()

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
        memory.reset()
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
        "state_device_mib": state.device_nbytes() / MIB,
        "state_host_mib": state.host_nbytes() / MIB,
        "state_total_mib": state.nbytes() / MIB,
        "new_tokens": new_tokens,
    }


def drt_memory(out, lengths=(16384, 65536, 262144), new_tokens: int = 128, model: str = "drt",
               device: str = "cuda") -> dict:  # fmt: skip
    """Measure every (length, placement) (module doc; ``new_tokens``: 128 in the paper's Table 3; ``model``: a DRT
    card, ``drt-tiny`` for a CPU run) and write the JSON and the Markdown table. Returns the JSON's document."""
    from evalsuite.cards import load_card
    from evalsuite.runs.provenance import device_name, provenance
    from evalsuite.training.train import build_model

    card = load_card(model)
    dev = torch.device(device)
    net = build_model(card, seed=0).to(dev).eval()
    weights_mib = sum(p.numel() * p.element_size() for p in net.parameters()) / MIB
    rows = []
    for length in lengths:
        for offload in (False, True):
            try:
                row = measure(net, length, offload, new_tokens)
            except torch.OutOfMemoryError:  # recorded, and the sweep goes on
                row = {"length": length, "offload": offload, "error": "out of memory"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"model": card.name, "weights_mib": weights_mib, "rows": rows,
              "provenance": provenance(device=device_name(dev))}  # fmt: skip
    (out / "drt_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    table = format_table(result, new_tokens)
    (out / "drt_memory.md").write_text(table + "\n")
    print(table)
    return result


def format_table(result: dict, new_tokens: int) -> str:
    """The Markdown table of :func:`drt_memory`'s rows."""
    lines = [
        f"DRT (`{result['model']}` card, random weights, bf16 autocast; weights {result['weights_mib']:.0f} MiB, not "
        f"counted below) on {result['provenance']['device']}: peak device memory above the weights, state bytes, "
        f"decode speed ({new_tokens} tokens).",
        "",
        "| context | chunk store | prefill s | prefill peak MiB | decode peak MiB | state on device MiB "
        "| state in CPU MiB | ms / token |",
        "|---:|:---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        place = "CPU memory" if r["offload"] else "device"
        if "error" in r:
            lines.append(f"| {r['length']} | {place} | {r['error']} | | | | | |")
            continue
        lines.append(
            f"| {r['length']} | {place} | {r['prefill_seconds']:.1f} | {r['prefill_peak_mib']:.0f} | "
            f"{r['decode_peak_mib']:.0f} | {r['state_device_mib']:.1f} | {r['state_host_mib']:.1f} | "
            f"{r['ms_per_token']:.1f} |"
        )
    return "\n".join(lines)
