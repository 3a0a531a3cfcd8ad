"""The decode engine's paths on a GPU, token for token (:mod:`gpu.generate_check`): every tiny card of a registered
family and the 760M FoX (Pro) (random weights), in float32 and bfloat16. ``graph`` must equal ``static`` everywhere
(the same function, captured: bit for bit) and ``eager`` in float32; ``compiled`` must equal ``eager`` in float32
(fused kernels may round differently from static's, so bf16 differences are allowed); a sampled float32 row that
draws another token is allowed only where the logits agreed to within ``NEAR_TIE`` (a near-tie). Committed H100 run:
no failure (results/bench/h100/decode-10/generate_check/)."""

from dataclasses import replace

import pytest

from evalsuite.cards import list_cards, load_card
from gpu.generate_check import check_model, failures

pytestmark = pytest.mark.gpu


def _models():
    tiny = [(c.name, [37, 64, 5]) for c in list_cards() if c.name.endswith("-tiny") and c.weights["source"] == "random"]
    return [*tiny, ("fox-pro", [4096, 3000, 1024])]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name,lengths", _models(), ids=[m[0] for m in _models()])
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
