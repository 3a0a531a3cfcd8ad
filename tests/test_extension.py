"""The spine is open: a model family, an adapter kind and a task that exist only in this file plug in by
registration and run through the CLI, with no file under ``evalsuite/`` touched.

* ``test-ema``: a tiny recurrent LM (an exponential moving average of token embeddings, then a linear head),
  with a fixed-size decode state and two backends (a closed-form matrix and an explicit loop). It passes the
  model contracts of ``test_contracts.py`` and runs ``evalsuite loss`` and ``evalsuite niah``.
* ``scripted:right`` / ``scripted:wrong``: a text-only adapter that answers needle questions by reading the
  needle out of the prompt (or not). NIAH must score the first 10 and the second 1 everywhere, and the token-level
  loss task must refuse it up front.
* ``test-echo-length``: a task that asks for a short continuation of prompts of several lengths.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

import pytest
import torch
from conftest import assert_one_line_error
from test_contracts import MODEL_CONTRACTS, check_checkpoint_round_trip, check_text_adapter, tiny_model
from torch import nn

from evalsuite.adapters.base import ModelInfo, TextAdapter
from evalsuite.adapters.registry import ADAPTERS
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.metrics.cells import cell_means
from evalsuite.models.base import CausalLM, DecodeState
from evalsuite.models.registry import FAMILIES, Family, register_family
from evalsuite.tasks.base import TASKS, Item, ItemTask, register_task
from evalsuite.tokenizers import get_tokenizer

# -- a model family ----------------------------------------------------------------------------------------------


@dataclass
class EmaConfig:
    vocab_size: int = 50257
    hidden_size: int = 16
    decay: float = 0.8

    def to_dict(self) -> dict:
        return asdict(self)


class EmaState(DecodeState):
    kind = "recurrent"

    def __init__(self, h: torch.Tensor, start: torch.Tensor | None):
        self.h, self.start, self.length = h, start, 0  # h: [B, D]

    def nbytes(self) -> int:
        return self.h.numel() * self.h.element_size()


class EmaLM(CausalLM):
    """``h_t = a h_{t-1} + (1 - a) e_t`` over token embeddings (padding embeds to 0), logits = head(h_t)."""

    backends = ("auto", "loop")
    reference_backend = "loop"

    def __init__(self, config: EmaConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=True)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def input_embedding(self) -> nn.Embedding:
        return self.embed

    def init_weights(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, input_ids, state=None, start=None):
        B, T = input_ids.shape
        offset = 0 if state is None else state.length
        start = state.start if state is not None else start
        e = self.embed(input_ids)
        if start is not None:
            pad = torch.arange(offset, offset + T)[None] < start[:, None]
            e = e.masked_fill(pad[..., None], 0.0)
        h0 = torch.zeros(B, e.shape[-1], dtype=e.dtype) if state is None else state.h
        a = self.config.decay
        if self.attention_backend == "loop":
            out, h = [], h0
            for t in range(T):
                h = a * h + (1 - a) * e[:, t]
                out.append(h)
            hidden = torch.stack(out, 1)
        else:  # closed form: h_t = a^{t+1} h0 + (1 - a) sum_{s<=t} a^{t-s} e_s
            t = torch.arange(T, dtype=e.dtype)
            w = torch.tril((1 - a) * a ** (t[:, None] - t[None, :]).clamp(min=0))
            hidden = torch.einsum("ts,bsd->btd", w, e) + a ** (t + 1)[None, :, None] * h0[:, None]
        if state is not None:
            state.h, state.length = hidden[:, -1], state.length + T
        return hidden

    def logits(self, hidden):
        return self.head(hidden)

    def new_state(self, batch, capacity, start=None):
        return EmaState(torch.zeros(batch, self.config.hidden_size, dtype=self.state_dtype()), start)

    def decode_state_size(self, length, dtype):
        item = torch.empty((), dtype=dtype).element_size()
        d = self.config.hidden_size
        return {"kind": "recurrent", "elements": d, "bytes": d * item, "dtype": str(dtype).removeprefix("torch.")}


# -- a text-only adapter -----------------------------------------------------------------------------------------


class ScriptedAdapter(TextAdapter):
    """Answers "What is the best thing to do in X?" prompts from the needle sentence in the prompt ("right"), or
    with a fixed wrong answer ("wrong"). No logits: text tier only."""

    NEEDLE = re.compile(r"The best thing to do in San Francisco is ([^.\n]*)")

    def __init__(self, mode: str):
        self.mode = mode
        self.tokenizer = get_tokenizer("gpt2")
        self.info = ModelInfo(f"scripted-{mode}", f"script-{mode}-v1", "gpt2", "n/a", 2048, 8192)

    def generate_until(self, prompts: Sequence[str], config: GenerationConfig) -> list[Generation]:
        out = []
        for prompt in prompts:
            found = self.NEEDLE.search(prompt)
            text = f" {found.group(1)}." if self.mode == "right" and found else " go to the beach and fly a kite."
            out.append(Generation(text, [], "stop"))
        return out


# -- a task ------------------------------------------------------------------------------------------------------


@dataclass
class EchoConfig:
    lengths: list[int] = field(default_factory=lambda: [8, 32])
    new_tokens: int = 3


class EchoLengthTask(ItemTask):
    """Continues prompts of several lengths; records how many tokens came back."""

    name = "test-echo-length"
    Config = EchoConfig

    def items(self, plan, adapter):
        return [Item((f"len|{n}",), n) for n in self.config.lengths]

    def evaluate(self, plan, adapter, items: Sequence[Item], run) -> Iterator[dict]:
        prompts = [" ".join(["word"] * it.data) for it in items]
        gens = adapter.generate_until(prompts, GenerationConfig(max_new_tokens=self.config.new_tokens))
        for it, gen in zip(items, gens, strict=True):
            tokens = len(adapter.tokenizer.encode(gen.text, add_bos=False))
            yield {"key": it.keys[0], "subtask": "echo", "length": it.data, "scores": {"returned_tokens": tokens}}

    def aggregate(self, plan, rows, adapter, run):
        return cell_means(rows, adapter.name, self.name), {"items": len(rows)}


# -- registration (undone after the module's tests) ---------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def registered():
    register_family(
        Family("test-ema", EmaConfig, EmaLM, {"test-ema-small": {"hidden_size": 8}}, tiny={"vocab_size": 61})
    )
    ADAPTERS.register("scripted", lambda name, options: ScriptedAdapter(name))
    register_task(EchoLengthTask)
    yield
    FAMILIES.unregister("test-ema")
    ADAPTERS.unregister("scripted")
    TASKS.unregister("test-echo-length")


@pytest.fixture
def card(tmp_path):
    path = tmp_path / "ema.yaml"
    body = {"architecture": "test-ema-small", "tokenizer": "gpt2", "weights": {"source": "random", "seed": 3}}
    path.write_text(json.dumps({**body, "train_length": 512, "max_length": 4096}))
    return path


@pytest.mark.parametrize("contract", MODEL_CONTRACTS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_test_family_keeps_the_model_contracts(contract):
    contract(tiny_model("test-ema-small"))


def test_test_family_checkpoint_round_trip(tmp_path):
    check_checkpoint_round_trip(tiny_model("test-ema"), tmp_path)


def test_test_family_runs_loss_and_niah_through_the_cli(card, tmp_path, run_cli):
    code, out, err = run_cli(["loss", "--model", card, "--length", "64", "--max-docs", "2", "--out", "loss"], tmp_path)
    assert code == 0, err
    results = json.loads((tmp_path / "loss" / "results.json").read_text())
    assert results["model"] == "ema" and results["provenance"]["card"]["architecture"] == "test-ema-small"
    assert results["summary"]["documents"]["used"] == 2 and "P(l)" in out
    args = ["niah", "--model", card, "--lengths", "512,1024", "--depths", "0,100", "--max-new-tokens", "2"]
    code, out, err = run_cli([*args, "--out", "niah"], tmp_path)
    assert code == 0, err
    assert len((tmp_path / "niah" / "records.jsonl").read_text().splitlines()) == 4
    code, _, _ = run_cli(["models"], tmp_path)  # the listing still works with a foreign family registered
    assert code == 0


@pytest.mark.parametrize("mode, score", [("right", 10), ("wrong", 1)])
def test_niah_scores_the_answer_not_the_prompt(mode, score, tmp_path, run_cli):
    """A model that states the needle scores 10 in every cell; one that does not scores 1 (the prompt always
    contains the needle, so scoring the prompt instead of the answer would give 10 to both)."""
    args = ["niah", "--model", f"scripted:{mode}", "--mode", "standard", "--preset", "cpu", "--out", "run"]
    code, out, err = run_cli(args, tmp_path)
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 20 and {r["scores"]["score"] for r in rows} == {score}
    assert f"within {float(score):.3f}" in out


def test_text_adapter_contract_and_token_tasks_refuse_it(tmp_path, run_cli):
    check_text_adapter(ScriptedAdapter("right"))
    code, _, err = run_cli(["loss", "--model", "scripted:right", "--out", "run"], tmp_path)
    message = "task loss needs token-level access (logits over token ids), which model scripted-right does not give"
    assert_one_line_error(code, err, message)
    assert not (tmp_path / "run").exists()


def test_test_task_runs_through_the_generic_command(card, tmp_path, run_cli):
    args = ["run", "test-echo-length", "--model", card, "--set", "lengths=[4, 16, 64]", "--set", "new_tokens=2"]
    code, out, err = run_cli([*args, "--out", "echo"], tmp_path)
    assert code == 0, err
    results = json.loads((tmp_path / "echo" / "results.json").read_text())
    assert results["task"] == "test-echo-length" and results["summary"] == {"items": 3}
    assert [r["length"] for r in results["records"]] == [4, 16, 64]
    assert "3 records" in out
    code, out, _ = run_cli(["tasks"], tmp_path)
    assert code == 0 and "test-echo-length" in out and "loss" in out


def test_plugins_load_from_the_environment(tmp_path):
    """Code outside the repository registers through ``$EVALSUITE_PLUGINS`` (a real process, a real import)."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_lab_plugin.py").write_text(
        "from test_extension import EchoLengthTask\n"
        "from evalsuite.tasks.base import register_task\n"
        "register_task(type('LabTask', (EchoLengthTask,), {'name': 'lab-task', '__doc__': 'From a plugin.'}))\n"
    )
    tests_dir = os.path.dirname(__file__)
    env = {**os.environ, "EVALSUITE_PLUGINS": "my_lab_plugin", "PYTHONPATH": f"{tmp_path}:{tests_dir}"}
    out = subprocess.run([sys.executable, "-m", "evalsuite.cli", "tasks"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert "lab-task" in out.stdout and "From a plugin." in out.stdout
    env["EVALSUITE_PLUGINS"] = "no_such_plugin_module"
    out = subprocess.run([sys.executable, "-m", "evalsuite.cli", "tasks"], capture_output=True, text=True, env=env)
    assert out.returncode == 2 and "cannot import plugin 'no_such_plugin_module'" in out.stderr


def test_registry_loads_builtins_once_across_threads(tmp_path, monkeypatch):
    """Threads (cells trained in threads of one process, training/pool.py) that look up a registry while its builtin
    modules are still importing wait for them, instead of seeing it half-loaded."""
    import sys
    import threading

    from evalsuite.registry import Registry

    registry = Registry("widget", builtins=("slow_widgets",))
    (tmp_path / "slow_widgets.py").write_text(
        "import time\nimport test_extension\ntime.sleep(0.3)\ntest_extension.SLOW_REGISTRY.register('w', 1)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "SLOW_REGISTRY", registry, raising=False)
    found, errors = [], []

    def look_up():
        try:
            found.append(registry.get("w"))
        except Exception as e:  # noqa: BLE001 -- collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and found == [1, 1, 1, 1]
