"""Profile cached greedy decoding of a paper-sized model on the GPU (where does each token's time go?).

Usage: PYTHONPATH=. python3 scripts/profile_decode.py [card]   (random-init weights; prints the top ops)
"""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from evalsuite.adapters.base import GenerationConfig
from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card

card = load_card(sys.argv[1] if len(sys.argv) > 1 else "fox-pro")
card.weights = {"source": "random", "seed": 0}
adapter = NativeAdapter(card, device="cuda", dtype="bfloat16")
prompt = torch.randint(0, 50257, (4096,), generator=torch.Generator().manual_seed(0)).tolist()
cfg = GenerationConfig(max_new_tokens=32, stop_at_eos=False)
adapter.generate([prompt], cfg)  # warm-up: compiles every kernel shape
torch.cuda.synchronize()
t0 = time.perf_counter()
adapter.generate([prompt], cfg)
torch.cuda.synchronize()
print(f"{card.name}: 4096-token prompt + 32 new tokens in {time.perf_counter() - t0:.3f} s")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    adapter.generate([prompt], cfg)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
