"""GPU checks of the FoX-paper models (run on the lent GPU machine; writes JSON to --out).

1. Parity on CUDA for the four architectures (small shapes): fp32 reference attention on the GPU vs the
   CPU forward; bf16 autocast with the Triton kernel vs fp32 reference; cached decoding vs full forward.
2. The 760M FoX (Pro) and Transformer (LLaMA) shapes (random init, fp32 weights, bf16 autocast, Triton
   attention): per-token NLL of one 16K and one 64K window through the adapter (time, tokens/s, peak
   memory), and greedy generation with the cache from a 4K prompt (tokens/s).

Usage: PYTHONPATH=. python3 scripts/gpu_models_check.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation.types import GenerationConfig
from evalsuite.models.fox import ARCHITECTURES, ForgettingTransformer, FoxConfig
from evalsuite.runs.provenance import versions


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def parity(arch: str) -> dict:
    cfg = FoxConfig.from_dict(
        {**ARCHITECTURES[arch], "vocab_size": 1000, "hidden_size": 256, "num_layers": 4, "num_heads": 4}
    )
    model = ForgettingTransformer(cfg)
    model.init_weights(0)
    ids = torch.randint(0, 1000, (2, 1500), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.set_attention_backend("reference")
        cpu = model.logits(model(ids))
        model.cuda()
        gpu_ref = model.logits(model(ids.cuda()))
        model.set_attention_backend("triton")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            gpu_bf16 = model.logits(model(ids.cuda())).float()
            state = model.new_state(2, 1500)
            steps = [model.logits(model(ids[:, :1400].cuda(), state=state)).float()]
            steps += [model.logits(model(ids[:, t : t + 1].cuda(), state=state)).float() for t in range(1400, 1500)]
        cached = torch.cat(steps, 1)
    return {
        "arch": arch,
        "fp32_gpu_reference_vs_cpu": rel_err(gpu_ref, cpu),
        "bf16_triton_vs_fp32_reference": rel_err(gpu_bf16, gpu_ref),
        "bf16_cached_decode_vs_full": rel_err(cached, gpu_bf16),
    }


def big_model(card_name: str) -> list[dict]:
    card = load_card(card_name)
    card.weights = {"source": "random", "seed": 0}  # official weights are not on this machine
    adapter = NativeAdapter(card, device="cuda", dtype="bfloat16")
    out = []
    for T in (16384, 65536):
        ids = torch.randint(0, 50257, (1, T), generator=torch.Generator().manual_seed(T))
        adapter.token_nll(ids[:, :1024], ids[:, :1024])  # warm-up / compile
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        nll = adapter.token_nll(ids, ids)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        out.append(
            {
                "model": card_name,
                "what": "token_nll",
                "T": T,
                "seconds": dt,
                "tokens_per_s": T / dt,
                "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30,
                "mean_nll": float(nll.mean()),
                "finite": bool(torch.isfinite(nll).all()),
            }
        )
        print(out[-1], flush=True)
    prompt = torch.randint(0, 50257, (4096,), generator=torch.Generator().manual_seed(1)).tolist()
    adapter.generate([prompt], GenerationConfig(max_new_tokens=4, stop_at_eos=False))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    gen = adapter.generate([prompt], GenerationConfig(max_new_tokens=128, stop_at_eos=False))[0]
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    out.append(
        {"model": card_name, "what": "generate", "prompt": 4096, "new_tokens": len(gen.token_ids), "seconds": dt}
    )
    print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    report = {"device": torch.cuda.get_device_name(), **versions(), "parity": [], "big": []}
    for arch in ARCHITECTURES:
        report["parity"].append(parity(arch))
        print(report["parity"][-1], flush=True)
    for name in ("fox-pro", "transformer-llama"):
        report["big"] += big_model(name)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "models_gpu.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
