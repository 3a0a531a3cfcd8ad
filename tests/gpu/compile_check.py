"""Where torch.compile breaks FoX's one-token decoding step: each graph break splits the compiled step into pieces
with host work between them. The computation of tests/gpu/test_compile.py (also run on a CPU, where the reference
attention's cache slice is a break: tests/test_generation_engine.py)."""

import traceback
from dataclasses import replace

import torch


def decode_step_breaks(card: str, device: str, dtype: str, prompt: int = 256) -> dict:
    """``torch._dynamo.explain`` of :meth:`FoxStaticDecoder._step_on_device` after a ``prompt``-token prefill,
    under the same autocast as generation (random weights of the card's shapes): the graph and break counts and
    every break's reason with the user-code frames that led to it."""
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card
    from evalsuite.models.fox.decoder import FoxStaticDecoder

    spec = replace(load_card(card), weights={"source": "random", "seed": 0})
    adapter = NativeAdapter(spec, device=device, dtype=dtype)
    model = adapter.model
    ids = torch.randint(0, model.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode(), adapter._autocast():
        decoder = model.static_decoder(1, prompt + 8)
        tok = model.logits(decoder.prefill(ids.to(adapter.device))).argmax(-1)[:, None]
        explained = torch._dynamo.explain(FoxStaticDecoder._step_on_device)(decoder, tok)
    breaks = [{"reason": str(b.reason), "user_stack": traceback.format_list(b.user_stack)}
              for b in explained.break_reasons]  # fmt: skip
    return {"graphs": explained.graph_count, "graph_breaks": explained.graph_break_count, "breaks": breaks}
