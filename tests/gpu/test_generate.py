"""The decode engine's paths on a GPU, token for token (:mod:`gpu.generate_check`): the tiny GSA and TNL cards in
float32 and bfloat16, and the 760M FoX (Pro) (random weights; the tiny FoX cards' heads are too small for the Triton
kernels) in bfloat16. ``graph`` must equal ``static`` everywhere
(the same function, captured: bit for bit) and ``eager`` in float32; ``compiled`` must equal ``eager`` in float32
(fused kernels may round differently from static's, so bf16 differences are allowed); a sampled float32 row that
draws another token is allowed only where the logits agreed to within ``NEAR_TIE`` (a near-tie). Committed H100 run:
no failure (results/decode/generate-check/)."""

from dataclasses import replace

import pytest

from evalsuite.cards import load_card
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
