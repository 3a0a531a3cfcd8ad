"""The decode engine's paths against each other, token for token: the computation of tests/gpu/test_generate.py
(also run on the CPU, without the graph path: tests/test_gpu_generate_check.py).

For a model card, a dtype and a left-padded batch of random prompts of mixed lengths, :func:`check_model` decodes on
each path -- ``eager`` (``model.forward`` with a state: the reference), ``static`` (the family's static decoder, eager
steps), ``graph`` (its step, LM head and argmax replayed as a CUDA graph) and ``compiled`` (the step through
torch.compile, then a graph) -- first free-running, then sampled (temperature 0.8, top-k 50, top-p 0.9, one seed:
the counter-based draw on the device, inside the graph on the graph paths), then greedy under per-row logit rules
(penalties, logit_bias, min_tokens: applied on the device, inside the graph too), then with a stop string and an EOS
id taken from the eager output so rows end inside a sync block. A record per (ending, path): equal to eager, equal to
static, the first differing position per row, seconds for the call; a sampled record also whether the path's
step-by-step ``DecodeRun`` drew the same tokens, and the logits it drew from (:func:`stepped`). :func:`failures` says
which records break the rules (see there).
"""

import time
from dataclasses import replace

import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.generation.engine import compiled_support, static_support
from evalsuite.generation.types import GenerationConfig

PATHS = ("eager", "static", "graph", "compiled")
NEAR_TIE = 1e-3  # largest logit difference (float32) under which a sampled row's other draw counts as a near-tie


def stepped(adapter, prompts, config: GenerationConfig) -> tuple[list[list[int]], list[torch.Tensor]]:
    """(token ids per row, the logits of every draw: ``[B, V]`` float32 on the CPU, the prefill's first) of ``config``
    (no stop: every row makes ``max_new_tokens``) decoded a step at a time through the adapter's ``DecodeRun`` on its
    path, which leaves the logits outside the graph for its chooser to read."""
    run = adapter.decode_run(prompts, config)
    run.prefill()
    tokens, logits = [], []
    for i in range(config.max_new_tokens):
        if i:
            run.step(tokens[-1])
        logits.append(run.logits.float().cpu())
        tokens.append(run.next_tokens())
    return torch.stack(tokens, 1).tolist(), logits


def logit_gaps(ref: list[torch.Tensor], got: list[torch.Tensor], first_diff: list[int | None]) -> list[float]:
    """Per row: the largest |logit difference| between two paths' draws over the steps they share a history (through
    the first differing token, or every step where none differs)."""
    gaps = []
    for b, first in enumerate(first_diff):
        last = min(len(ref), len(got)) if first is None else min(first + 1, len(ref), len(got))
        gaps.append(max((float((ref[i][b] - got[i][b]).abs().max()) for i in range(last)), default=0.0))
    return gaps


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[int | None]:
    """Per row: the first position where the token ids differ (or one list ends early), None where equal."""
    out = []
    for x, y in zip(a, b, strict=True):
        i = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        out.append(None if x == y else i)
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_model(card, dtype: str, lengths: list[int], new_tokens: int, device="cuda", seed: int = 0) -> list[dict]:
    adapter = NativeAdapter(card, device=device, dtype=dtype)
    with adapter._autocast():
        support, compiles = static_support(adapter.model), compiled_support(adapter.model)
    base = {"card": card.name, "architecture": card.architecture, "dtype": dtype, "static_support": support,
            "prompt_lengths": lengths, "new_tokens": new_tokens}  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, adapter.tokenizer.vocab_size, (n,), generator=gen).tolist() for n in lengths]
    paths = [p for p in PATHS if p == "eager" or (p == "static" and support) or (p == "graph" and support == "graph")
             or (p == "compiled" and compiles)]  # fmt: skip
    records = []
    free = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    adapter.decode_path = "eager"
    ref = adapter.generate(prompts, free)
    text = ref[0].text
    mid = len(text) // 3
    stop = next((text[i : i + 2] for i in range(mid, len(text) - 1) if text[i : i + 2].strip()), None)
    saved_eos = adapter.tokenizer.eos_id
    # sampling: the seed's counter-based draws on the device; same seed, same draws on every path
    sampled = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False, temperature=0.8, top_k=50, top_p=0.9,
                               seed=3)  # fmt: skip
    rules = [dict(repetition_penalty=1.3, presence_penalty=0.4, logit_bias={11: 1.0}),
             dict(frequency_penalty=0.6, min_tokens=2)]  # fmt: skip
    ruled = [replace(free, **rules[b % 2]) for b in range(len(prompts))]  # one config per row
    endings = [("free", free, None), ("sampled", sampled, None), ("ruled", ruled, None)]
    if stop is not None and len(ref) > 1 and len(ref[1].token_ids) > new_tokens // 2:
        stopping = GenerationConfig(max_new_tokens=new_tokens, stop=[stop])
        endings.append(("stop+eos", stopping, ref[1].token_ids[new_tokens // 2]))
    for ending, config, eos in endings:
        adapter.tokenizer.eos_id = eos if eos is not None else saved_eos
        outs, drawn = {}, {}
        try:
            for path in paths:
                adapter.decode_path = path
                adapter.generate(prompts, config)  # warm-up: compiles and autotunes
                _sync(adapter.device)
                t0 = time.perf_counter()
                got = adapter.generate(prompts, config)
                _sync(adapter.device)
                outs[path] = got
                rec = {**base, "ending": ending, "path": path, "seconds": time.perf_counter() - t0}
                rec.update(finish_reasons=[g.finish_reason for g in got], tokens=[len(g.token_ids) for g in got])
                if ending == "sampled":
                    ids, drawn[path] = stepped(adapter, prompts, config)
                    rec["equal_stepped"] = ids == [g.token_ids for g in got]
                for peer in ("eager", "static"):
                    if peer in outs and peer != path:
                        ids, peer_ids = [g.token_ids for g in got], [g.token_ids for g in outs[peer]]
                        rec[f"equal_{peer}"] = ids == peer_ids and [g.text for g in got] == [g.text for g in outs[peer]]
                        rec[f"first_difference_{peer}"] = first_difference(ids, peer_ids)
                if path in drawn and "eager" in drawn and path != "eager":
                    rec["logit_gap_eager"] = logit_gaps(drawn["eager"], drawn[path], rec["first_difference_eager"])
                records.append(rec)
        finally:
            adapter.tokenizer.eos_id = saved_eos
    return records


def failures(records: list[dict]) -> list[dict]:
    """Graph records that differ from static, or from eager in float32; compiled records that differ from eager in
    float32 (fused kernels may round differently from static's, so bf16 differences are recorded, not failures). A
    sampled float32 difference whose logits agreed to within ``NEAR_TIE`` is a near-tie, not a failure. On any path,
    a sampled generate call that differs from the same path's step-by-step run."""
    bad = []
    for r in records:
        near_tie = max(r.get("logit_gap_eager") or [float("inf")]) <= NEAR_TIE
        fp32_differs = r["dtype"] == "float32" and r.get("equal_eager") is False and not near_tie
        if (
            (r.get("path") == "graph" and (r.get("equal_static") is False or fp32_differs))
            or (r.get("path") == "compiled" and fp32_differs)
            or r.get("equal_stepped") is False
        ):
            bad.append(r)
    return bad
