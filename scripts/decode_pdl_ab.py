"""The compiled decode step with programmatic dependent launch off and on, in one process (results/decode/pdl-h200/).

    python3 scripts/decode_pdl_ab.py OUT.jsonl [--card fox-pro] [--length 4096] [--batch 1] [--rounds 8]

Random weights of the card's shapes, bf16. For each setting (``EVALSUITE_PDL=0``, then on: the compiled step is
compiled for each, evalsuite/models/base.py) two decoders take the same prompt and capture their CUDA graphs; each
round replays 16 steps of each setting's first decoder in turns (the order flips every round; each step also copies
its logits out), timed with CUDA events, and as many of its twin, untimed. Appends one JSON line: ms a step (median
over rounds) per setting, the median of the per-round ratios on / off, whether the two decoders of each setting gave
the same logits bit for bit at every step (a race between kernels launched early would break that), and the largest
logit difference between the settings over the first 8 steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from evalsuite.bench.common import random_weights_adapter
from evalsuite.generation.engine import CudaGraphStep, _decoder
from evalsuite.runs.provenance import git_commit, versions

SETTINGS = {"off": "0", "on": "1"}
STEPS_A_ROUND = 16  # timed, of the first decoder; its twin takes as many


def _build(model, ids, capacity):
    """Two (graph step, next token) pairs of the compiled path after the prompt ``ids``, under the current setting."""
    pairs = []
    for _ in range(2):
        decoder, _ = _decoder(model, "compiled", ids.device, ids.shape[0], capacity, None)
        pairs.append([CudaGraphStep(model, decoder, choose=None), model.logits(decoder.prefill(ids)).argmax(-1)])
    return pairs


def _steps(pair, n: int) -> torch.Tensor:
    """``n`` steps of one decoder: their logits ``[n, B, V]``; advances it."""
    out = []
    for _ in range(n):
        logits = pair[0](pair[1]).clone()
        pair[1] = logits.argmax(-1)
        out.append(logits)
    return torch.stack(out)


def main(out: str, card: str, length: int, batch: int, rounds: int) -> None:
    adapter = random_weights_adapter(card, "cuda")
    model = adapter.model
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, adapter.tokenizer.vocab_size, (batch, length), generator=gen).to(adapter.device)
    capacity = length + 8 + rounds * STEPS_A_ROUND + 16  # + the graph's warm-up steps
    built, first, same = {}, {}, {}
    with torch.inference_mode(), adapter._autocast():
        for name, value in SETTINGS.items():
            os.environ["EVALSUITE_PDL"] = value
            built[name] = _build(model, ids, capacity)
            first[name] = [_steps(pair, 8) for pair in built[name]]
            same[name] = torch.equal(*first[name])
        os.environ.pop("EVALSUITE_PDL")
        times = {name: [] for name in SETTINGS}
        for r in range(rounds):
            for name in list(SETTINGS)[:: 1 if r % 2 == 0 else -1]:
                pairs = built[name]
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                timed = _steps(pairs[0], STEPS_A_ROUND)
                end.record()
                twin = _steps(pairs[1], STEPS_A_ROUND)  # untimed: the same steps, so the same bits
                end.synchronize()
                times[name].append(start.elapsed_time(end) / STEPS_A_ROUND)
                same[name] = same[name] and torch.equal(timed, twin)
    record = {
        "card": card, "length": length, "batch": batch, "rounds": rounds,
        "ms_per_step": {name: statistics.median(t) for name, t in times.items()},
        "on_over_off": statistics.median(a / b for a, b in zip(times["on"], times["off"], strict=True)),
        "twins_same_bits": same,
        "max_logit_diff_first_8_steps": float((first["on"][0] - first["off"][0]).abs().max()),
        "times_ms": times, "device": torch.cuda.get_device_name(), "commit": git_commit(), "versions": versions(),
    }  # fmt: skip
    shown = ("card", "length", "batch", "ms_per_step", "on_over_off", "twins_same_bits")
    print(json.dumps({k: record[k] for k in shown}))
    with open(out, "a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--card", default="fox-pro")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    main(args.out, args.card, args.length, args.batch, args.rounds)
