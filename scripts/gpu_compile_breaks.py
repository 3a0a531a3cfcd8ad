"""Where torch.compile breaks FoX's one-token decoding step (issue #18): each graph break splits the compiled step
into pieces with host work between them, which is what keeps the ``compiled`` decode path from the bandwidth bound.

Runs ``torch._dynamo.explain`` on :meth:`FoxStaticDecoder._step_on_device` after a short prefill, under the same
autocast as generation, and writes every break with its reason and the user-code frames that led to it.

Usage: python scripts/gpu_compile_breaks.py --out DIR [--model fox-pro-random] [--device cuda] [--dtype bfloat16]
(on a CPU the step takes the reference attention, whose cache slice is itself a break: a smoke test of the script)
"""

from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path

import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.models.fox.decoder import FoxStaticDecoder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="fox-pro-random")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--prompt", type=int, default=256, help="prefill length before the explained step")
    args = ap.parse_args()

    adapter = NativeAdapter(load_card(args.model), device=args.device, dtype=args.dtype)
    model = adapter.model
    ids = torch.randint(0, model.vocab_size, (1, args.prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), adapter._autocast():
        decoder = model.static_decoder(1, args.prompt + 8)
        tok = model.logits(decoder.prefill(ids.to(adapter.device))).argmax(-1)[:, None]
        explained = torch._dynamo.explain(FoxStaticDecoder._step_on_device)(decoder, tok)

    breaks = [
        {"reason": str(b.reason), "user_stack": traceback.format_list(b.user_stack)} for b in explained.break_reasons
    ]
    report = {
        "model": args.model,
        "device": str(adapter.device),
        "dtype": args.dtype,
        "graphs": explained.graph_count,
        "graph_breaks": explained.graph_break_count,
        "breaks": breaks,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "compile_breaks.json").write_text(json.dumps(report, indent=1))
    print(f"{args.model} on {adapter.device}: {explained.graph_count} graphs, {explained.graph_break_count} breaks")
    for b in breaks:
        print("-", b["reason"].splitlines()[0][:200])
        print("  at", (b["user_stack"][-1].strip().splitlines() or ["?"])[0] if b["user_stack"] else "?")


if __name__ == "__main__":
    main()
