"""The CUDA-graph training step on a GPU: at the ``gsa-paper`` preset's cell (d = 128), each kernel family's model
trains 20 steps eagerly and again with every step replayed as a CUDA graph, in float32 and bf16 autocast, and FoX
(Pro) a third time with the forward and loss through torch.compile, from the same weights on the same batches. The
graph replays the eager step's kernels (same losses, same weights up to float32 summation order); the compiled step
fuses kernels (close, not equal). Also the float32 output and gradients with the Triton backend against the PyTorch
reference backend (GSA's fp32 dots are 3xTF32; FoX's kernel takes bf16/fp16 only and is skipped there)."""

import numpy as np
import pytest
import torch

from evalsuite.bench.common import rel_error

pytestmark = pytest.mark.gpu
MODELS = ("fox-pro", "transformer-llama", "gsa", "tnl")
STEPS = 20


@pytest.fixture
def cell(gsa_paper_cell):
    return gsa_paper_cell


def _model(cell, name):
    from evalsuite.tasks.mqar.sweep import resolve_model
    from evalsuite.training.train import build_model

    sweep = cell[0]
    return build_model(resolve_model(name), sweep.overrides(name, 128), seed=0).cuda()


def _trained(cell, name, amp, graph, compile=False):
    from evalsuite.training.train import shuffled_batches, train

    sweep, seq_len, batch, x, y, loss_fn = cell
    model = _model(cell, name)
    tcfg = sweep.train_config(1e-3, seq_len)
    tcfg.amp, tcfg.max_steps, tcfg.log_every = amp, STEPS, 1
    result = train(model, shuffled_batches(x, y, batch, np.random.default_rng(0)), tcfg, loss_fn=loss_fn,
                   cuda_graph=graph, compile=compile)  # fmt: skip
    return [h["loss"] for h in result.history], torch.cat([p.detach().flatten().float() for p in model.parameters()])


@pytest.mark.parametrize("amp", ["none", "auto"])
@pytest.mark.parametrize("name", MODELS)
def test_graph_step_follows_eager(cell, name, amp):
    eager_losses, eager_w = _trained(cell, name, amp, graph=False)
    graph_losses, graph_w = _trained(cell, name, amp, graph=True)
    assert len(eager_losses) == STEPS and eager_losses[-1] < eager_losses[0]
    assert max(abs(a - b) for a, b in zip(eager_losses, graph_losses, strict=True)) < 1e-3
    assert rel_error(graph_w, eager_w) < 1e-3


def test_compiled_step_stays_close_to_eager(cell):
    eager_losses, eager_w = _trained(cell, "fox-pro", "auto", graph=False)
    compiled_losses, compiled_w = _trained(cell, "fox-pro", "auto", graph=True, compile=True)
    assert max(abs(a - b) for a, b in zip(eager_losses, compiled_losses, strict=True)) < 5e-2
    assert rel_error(compiled_w, eager_w) < 5e-2


@pytest.mark.parametrize("name", ["fox-llama", "transformer-llama", "gsa", "tnl"])
def test_fp32_triton_backend_matches_reference(cell, name):
    x = cell[3]
    model = _model(cell, name)
    available = model.available_backends(torch.device("cuda"))
    if "triton" not in available:
        pytest.skip(f"{name} has no Triton backend here")
    reference = "reference" if "reference" in available else "chunked"
    out = {}
    for backend in ("triton", reference):
        model.set_attention_backend(backend)
        model.zero_grad(set_to_none=True)
        try:
            hidden = model(x[:8])
        except TypeError:
            pytest.skip(f"{name}'s kernel takes bf16/fp16 only")
        hidden.float().square().mean().backward()
        out[backend] = [hidden.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]
    # 1.0e-3 for TNL on an H200 (3xTF32 dots in the kernels, plain float32 in the reference)
    assert max(rel_error(a, b) for a, b in zip(out["triton"], out[reference], strict=True)) < 5e-3
