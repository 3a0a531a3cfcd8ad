"""DRT's static decoder (evalsuite/models/drt/decoder.py): every step's hidden state equals the eager
forward pass with a chunk memory, across chunk boundaries (the eager steps), the window's wrap-around, retrieval
with GCA at work, left padding with several chunk grids and two retrieval groups; the engine's static path gives the
eager path's tokens."""

import pytest
import torch

from evalsuite.cards import load_card
from evalsuite.generation.engine import generate
from evalsuite.generation.types import GenerationConfig
from evalsuite.tokenizers import get_tokenizer
from evalsuite.training.train import build_model

STEPS = 140  # > 2 chunks of 63 tokens and past the tiny card's window of 128 positions


def _model(**overrides):
    return build_model(load_card("drt-tiny"), overrides, seed=0).eval()


def _teacher_forced(model, ids, prompt, start=None):
    """Hidden states ``[STEPS, B, D]`` of the tokens after ``prompt``: eager (forward with a state) and static."""
    B, T = ids.shape
    eager_state = model.new_state(B, T, start)
    decoder = model.static_decoder(B, T, start)
    eager, static, boundaries = [], [], 0
    with torch.inference_mode():
        model(ids[:, :prompt], state=eager_state)
        decoder.prefill(ids[:, :prompt])
        for t in range(prompt, T):
            boundaries += decoder.eager_step_due()
            eager.append(model(ids[:, t : t + 1], state=eager_state)[:, -1])
            static.append(decoder.step(ids[:, t : t + 1]))
    return torch.stack(eager), torch.stack(static), decoder, boundaries


@pytest.mark.parametrize("prompt", [5, 62, 190])
def test_static_steps_equal_the_eager_forward(prompt):
    model = _model()
    ids = torch.randint(0, 50000, (2, prompt + STEPS), generator=torch.Generator().manual_seed(prompt))
    eager, static, decoder, boundaries = _teacher_forced(model, ids, prompt)
    torch.testing.assert_close(static, eager, rtol=1e-5, atol=1e-5)
    assert boundaries == (prompt + STEPS) // 63 - prompt // 63  # one eager step per chunk completed
    grid = decoder.grids[0]
    assert grid.positions == (prompt + STEPS) + (prompt + STEPS) // 63  # the memory's count: at boundaries only
    assert grid.memory.tokens == prompt + STEPS
    assert (grid.plans[0].w > 0).any()  # retrieval ran: GCA saw real chunks
    assert decoder.state.length == prompt + STEPS


def test_left_padding_grids_and_two_retrieval_groups():
    """Rows with three different left paddings (three chunk grids, boundaries at different steps) and a model with
    two retrieval groups."""
    model = _model(num_layers=6, lower_layers=2, retrieval_groups=2)
    ids = torch.randint(0, 50000, (3, 70 + STEPS), generator=torch.Generator().manual_seed(7))
    start = torch.tensor([0, 9, 40])
    eager, static, decoder, boundaries = _teacher_forced(model, ids, 70, start)
    assert len(decoder.grids) == 3 and boundaries >= 6
    for row, s in enumerate(start.tolist()):
        torch.testing.assert_close(static[:, row], eager[:, row], rtol=1e-5, atol=1e-5)
        grid = next(g for g in decoder.grids if row in g.rows.tolist())
        assert grid.memory.tokens == 70 + STEPS - s


def test_generate_static_path_gives_the_eager_tokens():
    model, tokenizer = _model(), get_tokenizer("gpt2")
    ids = torch.randint(0, 50000, (2, 100), generator=torch.Generator().manual_seed(3))
    config = GenerationConfig(max_new_tokens=70, stop_at_eos=False)
    with torch.inference_mode():
        eager = generate(model, ids, None, config, tokenizer, path="eager")
        static = generate(model, ids, None, config, tokenizer, path="static")
    assert [g.token_ids for g in static] == [g.token_ids for g in eager]
    assert all(len(g.token_ids) == 70 for g in static)
