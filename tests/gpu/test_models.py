"""The FoX-paper models on a GPU: the float32 reference attention on CUDA against the CPU forward, bf16 autocast with
the Triton kernel against the float32 reference, cached decoding against the full forward, for the four
architectures at small shapes; and the 760M FoX (Pro) (random weights) scoring a 16K window. Committed H100 runs:
1.9e-5, 8.0e-3 and 1.5e-3 at worst (results/model-checks/models_gpu.json)."""

from dataclasses import replace

import pytest
import torch

from evalsuite.bench.common import rel_error
from evalsuite.models.fox import ARCHITECTURES, ForgettingTransformer, FoxConfig

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_gpu_paths_agree(arch):
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
    assert rel_error(gpu_ref.cpu(), cpu) < 1e-4
    assert rel_error(gpu_bf16, gpu_ref) < 2e-2
    assert rel_error(torch.cat(steps, 1), gpu_bf16) < 5e-3


def test_760m_scores_a_16k_window():
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card

    card = replace(load_card("fox-pro"), weights={"source": "random", "seed": 0})
    adapter = NativeAdapter(card, device="cuda", dtype="bfloat16")
    ids = torch.randint(0, 50257, (1, 16384), generator=torch.Generator().manual_seed(16384))
    nll = adapter.token_nll(ids, ids)
    assert nll.numel() > 0 and torch.isfinite(nll).all()
