"""lm-eval's own API clients against a live ``evalsuite serve`` give the lm-eval bridge's numbers.

``local-completions`` (token-id requests and string requests) and ``local-chat-completions`` run local lm-eval
tasks (multiple choice, rolling log-likelihood, generate_until) against a server subprocess on 127.0.0.1; the same
tasks run through the bridge (``EvalsuiteLM``) in this process. lm-eval uses the server's tokenizer through
``/tokenizer_info``, ``/tokenize`` and ``/detokenize`` where it supports that (no local tokenizer files), and the
model's own tokenizer files for the ``hf:`` model (lm-eval's remote tokenizer never puts BOS before a context; its
``add_bos_token`` works with local files only).

The BOS rule (token ids are taken as given; a string gets the tokenizer's BOS unless it begins with it) is what
makes these agree: a BOS put before token ids shifts lm-eval's continuation slice by one token and doubles the BOS
of a rolling window.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ServeProcess, http
from test_lm_eval_bridge import GEN_PROMPTS, MC_DOCS, PPL_DOCS, task_yaml, write_jsonl

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("tenacity")  # lm-eval's API models need it (the lm-eval extra installs it)
pytest.importorskip("lm_eval.models.openai_completions")  # registers local-completions and local-chat-completions
from lm_eval.tasks import TaskManager  # noqa: E402

from evalsuite.adapters.lm_eval_bridge import EvalsuiteLM  # noqa: E402
from evalsuite.adapters.registry import AdapterOptions, load_adapter  # noqa: E402
from evalsuite.serve import chat_prompt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GEN_KWARGS = {"until": ["\n"], "max_gen_toks": 8, "do_sample": False}
FAST = {"TRITON_INTERPRET": None, "OMP_NUM_THREADS": "1"}  # a server as it runs on a CPU, beside its clients


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> TaskManager:
    root = tmp_path_factory.mktemp("lmeval_serve")
    mc = 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
    mc += 'doc_to_target: "{{answer}}"\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n'
    ppl = 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
    ppl += "  - metric: word_perplexity\n"
    gen = 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
    gen += f"generation_kwargs: {json.dumps(GEN_KWARGS)}\nmetric_list:\n  - metric: exact_match\n"
    rows = [{"prompt": p, "answer": "x"} for p in GEN_PROMPTS]
    (root / "mc.yaml").write_text(task_yaml("sv_mc", write_jsonl(root / "mc.jsonl", MC_DOCS), mc))
    (root / "ppl.yaml").write_text(task_yaml("sv_ppl", write_jsonl(root / "ppl.jsonl", PPL_DOCS), ppl))
    (root / "gen.yaml").write_text(task_yaml("sv_gen", write_jsonl(root / "gen.jsonl", rows), gen))
    return TaskManager(include_path=str(root), include_defaults=False)


def answers(tm: TaskManager, names: list[str], model, model_args: dict | None = None, **kwargs) -> dict:
    """``{task: [responses of doc 0, doc 1, ...]}`` of one lm-eval run (a response: (logprob, greedy), a float or
    a text)."""
    out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=names, task_manager=tm, log_samples=True,
                                  **kwargs)  # fmt: skip
    return {
        task: [[r[0] for r in s["resps"]] for s in sorted(samples, key=lambda s: s["doc_id"])]
        for task, samples in out["samples"].items()
    }


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for task in want:
        for g_doc, w_doc in zip(got[task], want[task], strict=True):
            for g, w in zip(g_doc, w_doc, strict=True):
                if isinstance(w, str):
                    assert g == w, task
                elif isinstance(w, tuple | list):  # (logprob, is_greedy)
                    assert g[0] == pytest.approx(w[0], abs=1e-4) and bool(g[1]) == bool(w[1]), task
                else:
                    assert g == pytest.approx(w, abs=1e-3), task


def completions_args(server: ServeProcess, name: str, **extra) -> dict:
    return {"base_url": f"{server.base_url}/completions", "model": name, **extra}


def chat_answers(tm: TaskManager, server: ServeProcess, name: str) -> list[str]:
    args = {"base_url": f"{server.base_url}/chat/completions", "model": name}
    got = answers(tm, ["sv_gen"], "local-chat-completions", args, apply_chat_template=True)
    return [doc[0] for doc in got["sv_gen"]]


def bridge_chat(adapter, prompts: list[str]) -> list[str]:
    """What the bridge generates for each prompt put through the server's chat template as one user message."""
    from lm_eval.api.instance import Instance

    contexts = [chat_prompt([{"role": "user", "content": p}], adapter.tokenizer) for p in prompts]
    reqs = [Instance("generate_until", {}, (c, dict(GEN_KWARGS)), i) for i, c in enumerate(contexts)]
    return EvalsuiteLM(adapter=adapter).generate_until(reqs)


# -- a native model whose tokenizer puts no BOS first: every request mode agrees ------------------------------------


@pytest.fixture(scope="module")
def gpt2_card(tmp_path_factory) -> Path:
    """fox-pro-tiny's architecture and weights with the plain GPT-2 tokenizer (no BOS before a prompt)."""
    card = (ROOT / "models" / "fox-pro-tiny.yaml").read_text().replace("tokenizer: gpt2-json", "tokenizer: gpt2")
    path = tmp_path_factory.mktemp("cards") / "fox-gpt2-tiny.yaml"
    path.write_text(card)
    return path


def test_native_model_through_local_completions_and_chat(tasks, gpt2_card):
    adapter = load_adapter(str(gpt2_card), AdapterOptions(device="cpu"))
    assert not adapter.tokenizer.add_bos
    want = answers(tasks, ["sv_mc", "sv_ppl", "sv_gen"], EvalsuiteLM(adapter=adapter))
    server = ServeProcess(str(gpt2_card), env=FAST).wait_ready()
    try:
        info = http("GET", f"{server.url}/tokenizer_info")[1]
        assert (info["eos_token"], info["add_bos_token"]) == ("<|endoftext|>", False)
        for tokenized in (True, False):  # the remote tokenizer is found by lm-eval's probe: no local files
            args = completions_args(server, "fox-gpt2-tiny", tokenized_requests=tokenized)
            assert_same(answers(tasks, ["sv_mc", "sv_ppl", "sv_gen"], "local-completions", args), want)
        assert chat_answers(tasks, server, "fox-gpt2-tiny") == bridge_chat(adapter, GEN_PROMPTS)
    finally:
        server.stop()


# -- a native model with BOS: token ids as given ----------------------------------------------------------------


def test_token_ids_are_taken_as_given(tasks, served_fox):
    """fox-pro-tiny's tokenizer puts BOS first. Token ids get none added: lm-eval's rolling windows (its own prefix
    token first) give the bridge's perplexity, and a context sent without BOS is scored as sent. A string gets one
    BOS, also when it already begins with the BOS token's text."""
    adapter = load_adapter("fox-pro-tiny", AdapterOptions(device="cpu"))
    tok = adapter.tokenizer
    args = completions_args(served_fox, "fox-pro-tiny", tokenized_requests=True)
    got = answers(tasks, ["sv_mc", "sv_ppl"], "local-completions", args)
    assert_same({"sv_ppl": got["sv_ppl"]}, answers(tasks, ["sv_ppl"], EvalsuiteLM(adapter=adapter)))
    for doc, responses in zip(MC_DOCS, got["sv_mc"], strict=True):
        for choice, (logprob, _) in zip(doc["choices"], responses, strict=True):
            ctx, cont = tok.encode(doc["question"], add_bos=False), tok.encode(choice, add_bos=False)
            ids = torch.tensor([ctx + cont])
            nll = adapter.token_nll(ids[:, :-1], ids[:, 1:])[0, -len(cont) :]
            assert logprob == pytest.approx(-float(nll.double().sum()), abs=1e-4)

    def echoed(prompt) -> list[str]:
        body = {"model": "fox-pro-tiny", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0}
        return http("POST", f"{served_fox.base_url}/completions", body)[1]["choices"][0]["logprobs"]["tokens"]

    ids = tok.encode("The river", add_bos=False)
    assert len(echoed(ids)) == len(ids) and len(echoed([tok.bos_id, *ids])) == len(ids) + 1
    assert len(echoed("The river")) == len(ids) + 1 == len(echoed("<|endoftext|>The river"))


# -- an hf: model ---------------------------------------------------------------------------------------------------


def test_hf_model_through_local_completions_and_chat(tasks, tmp_path):
    """The tiny LLaMA (BOS first): lm-eval with the model's tokenizer files and ``add_bos_token`` (both request
    modes) and with the server's tokenizer (rolling) gives the bridge's numbers; chat uses the model's template."""
    from test_hf_adapter import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny-llama")
    adapter = load_adapter(f"hf:{path}", AdapterOptions(device="cpu"))
    want = answers(tasks, ["sv_mc", "sv_ppl", "sv_gen"], EvalsuiteLM(adapter=adapter))
    server = ServeProcess(f"hf:{path}", env=FAST).wait_ready()
    try:
        for tokenized in (True, False):
            args = completions_args(server, "tiny-llama", tokenized_requests=tokenized, add_bos_token=True,
                                    tokenizer_backend="huggingface", tokenizer=str(path))  # fmt: skip
            got = answers(tasks, ["sv_mc", "sv_gen"], "local-completions", args)
            assert_same(got, {k: want[k] for k in ("sv_mc", "sv_gen")})
        args = completions_args(server, "tiny-llama", tokenized_requests=True, tokenizer_backend="remote")
        assert_same(answers(tasks, ["sv_ppl"], "local-completions", args), {"sv_ppl": want["sv_ppl"]})
        assert chat_answers(tasks, server, "tiny-llama") == bridge_chat(adapter, GEN_PROMPTS)
    finally:
        server.stop()


# -- RULER: a long-context task lm-eval builds offline ---------------------------------------------------------------


def test_ruler_niah_single_1_agrees(tmp_path, served_fox, monkeypatch):
    """lm-eval's RULER ``niah_single_1`` (its haystack is a repeated sentence, so no data is downloaded), sized by
    a local tokenizer: the bridge and ``local-completions`` against the server generate the same answers.

    RULER's module asks nltk for its ``punkt_tab`` sentence model at import and downloads it when absent; only the
    essay haystacks split sentences, so an empty ``punkt_tab`` folder on nltk's path keeps the import offline (a task
    that did split sentences would fail on the missing files, not pass)."""
    pytest.importorskip("wonderwords")
    import nltk
    from test_hf_adapter import build_tiny_model

    (tmp_path / "nltk" / "tokenizers" / "punkt_tab").mkdir(parents=True)
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk"), *nltk.data.path])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sizer = build_tiny_model(tmp_path / "sizer")  # RULER sizes its haystacks with a transformers tokenizer
    ruler = Path(lm_eval.__file__).parent / "tasks" / "ruler"
    tm = TaskManager(include_path=str(ruler), include_defaults=False,
                     metadata={"tokenizer": str(sizer), "max_seq_lengths": [512]})  # fmt: skip

    def run(model, model_args=None) -> list:
        out = lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=["niah_single_1"], task_manager=tm,
                                      limit=2, log_samples=True)  # fmt: skip
        return [s["resps"] for s in sorted(out["samples"]["niah_single_1"], key=lambda s: s["doc_id"])]

    adapter = load_adapter("fox-pro-tiny", AdapterOptions(device="cpu"))
    want = run(EvalsuiteLM(adapter=adapter))
    got = run("local-completions", completions_args(served_fox, "fox-pro-tiny", tokenized_requests=False))
    assert got == want and len(want) == 2 and all(r[0][0] for r in want)
