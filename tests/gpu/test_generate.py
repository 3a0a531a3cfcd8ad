"""The decode engine's paths on a GPU, token for token (:mod:`gpu.generate_check`): the tiny GSA and TNL cards in
float32 and bfloat16, and the 760M FoX (Pro) (random weights; the tiny FoX cards' heads are too small for the Triton
kernels) in bfloat16. ``graph`` must equal ``static`` everywhere
(the same function, captured: bit for bit) and ``eager`` in float32; ``compiled`` must equal ``eager`` in float32
(fused kernels may round differently from static's, so bf16 differences are allowed); a sampled float32 row that
draws another token is allowed only where the logits agreed to within ``NEAR_TIE`` (a near-tie); a sampled generate
call must equal its path's step-by-step run. Committed H100 run: no failure (results/decode/generate-check/).
Then the sampler alone: no host sync in a sampled choice, and the CPU's draws from the same logits."""

from dataclasses import replace

import pytest
import torch

from evalsuite.cards import load_card
from evalsuite.generation.sampling import SamplerRows, TokenChooser, draw_uniforms, sample_next
from evalsuite.generation.types import GenerationConfig
from gpu.generate_check import check_model, failures

pytestmark = pytest.mark.gpu


MODELS = [("gsa-tiny", [37, 64, 5], "float32"), ("gsa-tiny", [37, 64, 5], "bfloat16"),
          ("tnl-tiny", [37, 64, 5], "float32"), ("tnl-tiny", [37, 64, 5], "bfloat16"),
          ("fox-pro", [4096, 3000, 1024], "bfloat16")]  # fmt: skip


@pytest.mark.parametrize("name,lengths,dtype", MODELS, ids=[f"{m[0]}-{m[2]}" for m in MODELS])
def test_paths_agree(name, lengths, dtype):
    card = load_card(name)
    if name == "fox-pro":
        card = replace(card, weights={"source": "random", "seed": 0})
    records = check_model(card, dtype, lengths, new_tokens=64, device="cuda")
    assert {r["path"] for r in records} >= {"eager"}
    assert failures(records) == [], [
        {k: r.get(k) for k in ("ending", "path", "first_difference_eager", "first_difference_static")}
        for r in failures(records)
    ]


ROWS = [GenerationConfig(max_new_tokens=10, temperature=0.9, top_k=50, top_p=0.9, min_p=0.02, seed=5,
                         repetition_penalty=1.3, min_tokens=3, stop_token_ids=[7], logit_bias={11: 1.0}),
        GenerationConfig(max_new_tokens=10, frequency_penalty=0.5),
        GenerationConfig(max_new_tokens=10, temperature=1.2, seed=-3)]  # fmt: skip


def test_a_sampled_choice_makes_no_host_sync():
    """TokenChooser on the GPU, sampled and greedy rows under every logit rule and cut: ten steps with torch's sync
    debug mode set to raise at any host sync (which it does for a read of a value, as checked first)."""
    device = torch.device("cuda")
    select = TokenChooser(ROWS, torch.randint(0, 1000, (3, 8), device=device), None, 1000, 0, device)
    logits = torch.randn(10, 3, 1000, device=device)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError):
            float(logits[0, 0, 0])
        tokens = [select(step) for step in logits]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.stack(tokens).shape == (10, 3)


def test_the_gpu_draws_the_cpus_tokens():
    """The seeds' uniforms on the GPU equal the CPU's bit for bit (integer ops); the tokens drawn from the same
    float32 logits (64 rows of their own seeds and cuts, 20 steps, a 50257-token vocabulary) are the CPU's too, up to
    float ties between the uniforms and the cumulative probabilities (none with these logits)."""
    configs = [GenerationConfig(max_new_tokens=20, temperature=0.5 + b / 64, top_k=(0, 50)[b % 2],
                                top_p=(1.0, 0.9)[b // 2 % 2], min_p=(0.0, 0.02)[b // 4 % 2], seed=1000 + b)
               for b in range(64)]  # fmt: skip
    cuda = torch.device("cuda")
    u = draw_uniforms(configs, 64, 20)
    assert torch.equal(draw_uniforms(configs, 64, 20, cuda).cpu(), u)
    logits = torch.randn(20, 64, 50257, generator=torch.Generator().manual_seed(0)) * 3
    rows, rows_gpu = SamplerRows.of(configs), SamplerRows.of(configs, cuda)
    cpu = torch.stack([sample_next(logits[n], rows, u[:, n]) for n in range(20)])
    gpu = torch.stack([sample_next(logits[n].to(cuda), rows_gpu, u[:, n].to(cuda)) for n in range(20)])
    assert torch.equal(gpu.cpu(), cpu)
