"""The lm-eval bridge: our adapters as lm-eval's ``evalsuite`` model.

End to end, offline: local lm-eval task YAMLs (multiple choice, rolling log-likelihood, generate_until with exact
match) over JSONL files written here, run through ``evalsuite lm-eval`` and ``python -m evalsuite.lm_eval_main``
in subprocesses whose sockets refuse every connection (and log the attempt); lm-eval's per-sample answers must be
the native adapter's own numbers and text. Around it: the rolling windows against lm-eval's own window utility, the
request mapping (trailing spaces, gen_kwargs, model_args), the text tier's refusals, one-line CLI errors.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error
from lm_eval.api.instance import Instance

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD, ModelInfo, TextAdapter
from evalsuite.adapters.lm_eval_bridge import EvalsuiteLM, generation_config, rolling_windows, split_trailing_space
from evalsuite.adapters.registry import AdapterOptions, load_adapter
from evalsuite.errors import UserError
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.tokenizers import get_tokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = "fox-pro-tiny"
MC_DOCS = [
    {"question": "The capital of France is", "choices": [" Paris", " London", " Rome"], "answer": 0},
    {"question": "Two plus two equals", "choices": [" four", " five"], "answer": 1},
]
PPL_DOCS = [
    {"text": "The quick brown fox jumps over the lazy dog.\nIt was a sunny day, and nobody minded."},
    {"text": "Efficient attention makes long context cheaper: é, ü and 42."},
]
GEN_PROMPTS = ["Q: What colour is the sky?\nA:", "Say hello:"]
GEN_KWARGS = {"until": ["\n"], "max_gen_toks": 8, "do_sample": False}

# A sitecustomize for the subprocesses: every non-local socket connection and name lookup is logged and refused.
NET_GUARD = """
import os, socket
_log = os.environ["EVALSUITE_NET_LOG"]
_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

def _refuse(what):
    with open(_log, "a") as f:
        f.write(repr(what) + "\\n")
    raise OSError(f"network disabled in this test: {what!r}")

def _local(host):
    return host in (None, "localhost", "127.0.0.1", "::1")

def connect(self, address):
    if self.family != socket.AF_UNIX and not _local(address[0]):
        _refuse(address)
    return _connect(self, address)

def connect_ex(self, address):
    if self.family != socket.AF_UNIX and not _local(address[0]):
        _refuse(address)
    return _connect_ex(self, address)

def getaddrinfo(host, *args, **kwargs):
    if not _local(host):
        _refuse(host)
    return _getaddrinfo(host, *args, **kwargs)

socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
"""


@pytest.fixture(scope="module")
def adapter():
    return load_adapter(MODEL, AdapterOptions(device="cpu"))


def greedy(adapter, prompts):
    config = GenerationConfig(max_new_tokens=GEN_KWARGS["max_gen_toks"], stop=GEN_KWARGS["until"])
    return [adapter.generate_until([p], config)[0].text for p in prompts]


def write_jsonl(path: Path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def task_yaml(name: str, data: str, body: str) -> str:
    return f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {json.dumps(data)}\n" + (
        f"test_split: test\n{body}"
    )


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, adapter):
    """Three local tasks; the first generation doc's answer is what the model generates, the second's is not."""
    root = tmp_path_factory.mktemp("lm_eval_tasks")
    tasks = root / "tasks"
    tasks.mkdir()
    answers = [greedy(adapter, GEN_PROMPTS[:1])[0], " hello"]
    gen_rows = [{"prompt": p, "answer": a} for p, a in zip(GEN_PROMPTS, answers, strict=True)]
    mc = 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
    mc += 'doc_to_target: "{{answer}}"\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n'
    ppl = 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
    ppl += "  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n"
    gen = 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\ndoc_to_target: "{{answer}}"\n'
    gen += f"generation_kwargs: {json.dumps(GEN_KWARGS)}\nmetric_list:\n  - metric: exact_match\n"
    (tasks / "mc.yaml").write_text(task_yaml("es_mc", write_jsonl(root / "mc.jsonl", MC_DOCS), mc))
    (tasks / "ppl.yaml").write_text(task_yaml("es_ppl", write_jsonl(root / "ppl.jsonl", PPL_DOCS), ppl))
    (tasks / "gen.yaml").write_text(task_yaml("es_gen", write_jsonl(root / "gen.jsonl", gen_rows), gen))
    return tasks


def offline_run(args, tmp_path: Path, returncode: int = 0) -> subprocess.CompletedProcess:
    """``python -m ARGS`` with the HF libraries offline, their caches under tmp_path, and no network beyond
    127.0.0.1; it must exit with ``returncode``."""
    guard = tmp_path / "netguard"
    guard.mkdir(exist_ok=True)
    (guard / "sitecustomize.py").write_text(NET_GUARD)
    net_log = tmp_path / "net.log"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(guard), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "EVALSUITE_NET_LOG": str(net_log),
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets"),
        "TOKENIZERS_PARALLELISM": "false",
    }
    out = subprocess.run(
        [sys.executable, "-m", *map(str, args)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600
    )
    assert out.returncode == returncode, out.stdout[-3000:] + out.stderr[-3000:]
    assert not net_log.exists(), f"network access attempted: {net_log.read_text()}"
    return out


def test_evalsuite_lm_eval_end_to_end_matches_the_adapter(tmp_path, task_dir, adapter):
    output = tmp_path / "results.json"
    args = ["evalsuite.cli", "lm-eval", "--model", MODEL, "--device", "cpu", "--tasks", "es_mc,es_ppl,es_gen"]
    args += ["--include-path", task_dir, "--no-builtin-tasks", "--batch-size", "2", "--output", output, "--log-samples"]
    out = offline_run(args, tmp_path)
    assert "es_mc" in out.stdout and "word_perplexity" in out.stdout and "exact_match" in out.stdout
    results = json.loads(output.read_text())
    assert set(results["results"]) == {"es_mc", "es_ppl", "es_gen"}
    assert results["config"]["evalsuite"]["model"] == MODEL and results["config"]["batch_size"] == 2
    samples = results["samples"]

    # multiple choice: every (context, continuation) lm-eval asked about, scored as the adapter scores it
    pairs, answers = [], []
    for sample in sorted(samples["es_mc"], key=lambda s: s["doc_id"]):
        pairs += [tuple(a) for a in sample["arguments"]]
        answers += [r[0] for r in sample["resps"]]
    assert pairs == [(d["question"], c) for d in MC_DOCS for c in d["choices"]]
    for (logprob, is_greedy), (want, want_greedy) in zip(answers, adapter.loglikelihood(pairs), strict=True):
        assert logprob == pytest.approx(want, abs=1e-5) and is_greedy == want_greedy
    choices = [[adapter.loglikelihood([(d["question"], c)])[0][0] for c in d["choices"]] for d in MC_DOCS]
    acc = sum(max(range(len(c)), key=c.__getitem__) == d["answer"] for c, d in zip(choices, MC_DOCS, strict=True))
    assert results["results"]["es_mc"]["acc,none"] == pytest.approx(acc / len(MC_DOCS))

    # rolling: the whole document's NLL (BOS first, one window at the card's max_length)
    for sample in samples["es_ppl"]:
        ids = torch.tensor([adapter.tokenizer.encode(PPL_DOCS[sample["doc_id"]]["text"])])
        nll = float(adapter.token_nll(ids[:, :-1], ids[:, 1:]).double().sum())
        assert sample["resps"][0][0] == pytest.approx(-nll, abs=1e-4)

    # generation: the adapter's greedy continuation; exact match finds the one doc whose answer is it
    for sample in samples["es_gen"]:
        assert sample["resps"][0][0] == greedy(adapter, [GEN_PROMPTS[sample["doc_id"]]])[0]
    assert results["results"]["es_gen"]["exact_match,none"] == 0.5


def test_lm_eval_command_line_with_the_model_registered(tmp_path, task_dir):
    """``python -m evalsuite.lm_eval_main``: lm-eval's own CLI (legacy form, no ``run``), ``--model evalsuite``;
    model_args' device wins over lm-eval's --device."""
    args = ["evalsuite.lm_eval_main", "--model", "evalsuite", "--model_args", f"model={MODEL},device=cpu,max_length=32"]
    args += ["--device", "cuda:7", "--tasks", "es_mc", "--include_path", task_dir, "--limit", "1"]
    out = offline_run(args, tmp_path)
    assert "es_mc" in out.stdout and "acc" in out.stdout


def test_tasks_the_model_cannot_answer_are_refused_before_any_request(tmp_path, task_dir):
    """An API model with log-likelihoods but no token-level scores, asked for a generation, a multiple-choice and
    a rolling-perplexity task: one line naming the task it cannot run, and not one request sent for the others."""
    from test_openai_adapter import FaultServer

    with FaultServer() as server:
        spec = f"openai:m,base_url={server.base_url},api=completions,tokenizer=gpt2,cache=off"
        args = ["evalsuite.cli", "lm-eval", "--model", spec, "--tasks", "es_gen,es_mc,es_ppl"]
        out = offline_run([*args, "--include-path", task_dir, "--no-builtin-tasks"], tmp_path, returncode=2)
        assert server.hits == []
    message = "model m cannot answer lm-eval task(s) es_ppl (loglikelihood_rolling) (it offers: generate, loglikelihood"
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]  # after lm-eval's own notes
    assert errors == out.stderr.strip().splitlines()[-1:] and message in errors[0], out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("n_tokens", [1, 5, 7, 8, 9, 23])
@pytest.mark.parametrize("max_length", [1, 4, 8])
def test_rolling_windows_are_lm_evals(n_tokens, max_length):
    """Our windows are lm-eval's (get_rolling_token_windows + make_disjoint_window, context_len=1)."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    tokens = list(range(100, 100 + n_tokens))
    seq = [-1] + tokens  # -1: the prefix token
    theirs = [
        make_disjoint_window(w)
        for w in get_rolling_token_windows(tokens, prefix_token=-1, max_seq_len=max_length, context_len=1)
    ]
    ours = rolling_windows(n_tokens, max_length)
    assert [seq[end - n : end] for _, end, n in ours] == [cont for _, cont in theirs]
    assert [seq[start : end - 1] for start, end, _ in ours] == [(ctx + cont)[:-1] for ctx, cont in theirs]
    assert sum(n for *_, n in ours) == n_tokens and all(end - 1 - start <= max_length for start, end, _ in ours)


def test_windowed_rolling_nll_and_batching(adapter):
    """With max_length 8 a document is scored window by window, each window as the token tier scores it; the
    batched and unbatched bridges give the adapter's numbers."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    doc = PPL_DOCS[0]["text"]
    tokens = adapter.tokenizer.encode(doc, add_bos=False)
    want = 0.0
    for ctx, cont in map(make_disjoint_window, get_rolling_token_windows(tokens, adapter.tokenizer.bos_id, 8, 1)):
        ids = torch.tensor([ctx + cont])
        want -= float(adapter.token_nll(ids[:, :-1], ids[:, 1:])[0, -len(cont) :].double().sum())
    docs = [Instance("loglikelihood_rolling", {}, (d["text"],), i) for i, d in enumerate(PPL_DOCS)]
    one = EvalsuiteLM(adapter=adapter, max_length=8).loglikelihood_rolling(docs)
    four = EvalsuiteLM(adapter=adapter, max_length=8, batch_size=4).loglikelihood_rolling(docs)
    assert one[0] == pytest.approx(want, abs=1e-4) and four == pytest.approx(one, abs=1e-4)

    pairs = [(d["question"], c) for d in MC_DOCS for c in d["choices"]] + [("", " Paris"), ("x", "")]
    reqs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    got = EvalsuiteLM(adapter=adapter, batch_size=3).loglikelihood(reqs)
    want_pairs = adapter.loglikelihood(pairs[:-1])  # "" is BOS alone for this tokenizer
    assert [g for _, g in got[:-1]] == [g for _, g in want_pairs]
    assert [lp for lp, _ in got[:-1]] == pytest.approx([lp for lp, _ in want_pairs], abs=1e-5)
    assert got[-1] == (0.0, True)  # nothing to score


def test_long_context_is_cut_from_the_left(adapter):
    context, continuation = "one two three four five six seven eight nine ten", " eleven"
    lm = EvalsuiteLM(adapter=adapter, max_length=6)
    cont = adapter.tokenizer.encode(continuation, add_bos=False)
    kept = adapter.tokenizer.encode(context)[-(7 - len(cont)) :]
    ids = torch.tensor([kept + cont])
    want = -float(adapter.token_nll(ids[:, :-1], ids[:, 1:])[0, -len(cont) :].double().sum())
    ((got, _),) = lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)])
    assert got == pytest.approx(want, abs=1e-5)
    with pytest.raises(UserError, match="exceeds max_length"):
        EvalsuiteLM(adapter=adapter, max_length=2).loglikelihood([Instance("loglikelihood", {}, ("a", " b c d"), 0)])
    with pytest.raises(UserError, match="exceeds model fox-pro-tiny's max_length"):
        EvalsuiteLM(adapter=adapter, max_length=10**9)


def test_request_mapping():
    assert split_trailing_space("Answer: ", "Paris") == ("Answer:", " Paris")
    assert split_trailing_space("Answer:", " Paris") == ("Answer:", " Paris")
    config = generation_config({"until": "\n\n", "max_gen_toks": 5})
    assert (config.stop, config.max_new_tokens, config.temperature) == (["\n\n"], 5, 0.0)
    assert generation_config({"temperature": 0.7}).temperature == 0.7  # no do_sample: temperature > 0 samples
    assert generation_config({"do_sample": False, "temperature": 0.7}).temperature == 0.0
    assert generation_config({"do_sample": True}).temperature == 1.0
    assert generation_config({}).max_new_tokens == 256
    sampled = generation_config({"do_sample": True, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 3})
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.seed) == (0.5, 0.9, 40, 3)


def test_registered_and_built_from_model_args():
    from lm_eval.api.registry import get_model

    assert get_model("evalsuite") is EvalsuiteLM
    lm = EvalsuiteLM.create_from_arg_string(
        f"model={MODEL},device=cpu,max_length=64,batch_size=3", {"device": "cuda", "batch_size": 1}
    )
    assert (lm.adapter.name, str(lm.adapter.device), lm.max_length, lm.batch_size) == (MODEL, "cpu", 64, 3)
    with pytest.raises(UserError, match="model_args need model=SPEC"):
        EvalsuiteLM.create_from_arg_string("device=cpu")
    with pytest.raises(UserError, match="unknown model"):  # extra keys travel in the spec, where they are checked
        EvalsuiteLM.create_from_arg_string(f"model={MODEL},flavour=x,device=cpu")


def test_hf_model_through_the_bridge(tmp_path):
    """An ``hf:`` model (BOS from its tokenizer config, right-padded batches without a mask) gives the adapter's
    own log-likelihoods, rolling NLL and greedy text; spec options after the model travel in the spec."""
    from test_hf_adapter import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny-llama")
    lm = EvalsuiteLM.create_from_arg_string(f"model=hf:{path},device=cpu,batch_size=3,train_length=128")
    adapter = lm.adapter
    assert (adapter.train_length, lm.max_length, adapter.tokenizer.bos_id) == (128, 256, 1)
    pairs = [("the cat sat", " on the mat"), ("a", " b"), ("", " hello"), ("the dog ran far", " away")]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)])
    want = adapter.loglikelihood(pairs)
    assert [g for _, g in got] == [g for _, g in want]
    assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], abs=1e-4)
    docs = ["the cat sat on the mat", "a b c d e f g"]
    rolled = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (d,), i) for i, d in enumerate(docs)])
    for doc, value in zip(docs, rolled, strict=True):
        ids = torch.tensor([adapter.tokenizer.encode(doc, add_bos=True)])
        assert value == pytest.approx(-float(adapter.token_nll(ids[:, :-1], ids[:, 1:]).double().sum()), abs=1e-4)
    gen = [Instance("generate_until", {}, (d, dict(GEN_KWARGS)), i) for i, d in enumerate(docs)]
    assert lm.generate_until(gen) == [greedy(adapter, [d])[0] for d in docs]


class EchoText(TextAdapter):
    """A text-tier model: generation only, or log-likelihoods too."""

    def __init__(self, scores: bool):
        self.tokenizer = get_tokenizer("bytes")
        self.info = ModelInfo(name="echo", weights_id="echo-1", tokenizer="bytes", dtype="float32", max_length=64)
        self.capabilities = frozenset({GENERATE, LOGLIKELIHOOD} if scores else {GENERATE})
        self.seen = []

    def generate_until(self, prompts, config):
        self.seen.append((list(prompts), config))
        return [Generation(p.upper()[: config.max_new_tokens], [], "length") for p in prompts]

    def loglikelihood(self, requests):
        return [(-float(len(c)), c.strip() == ctx.strip()) for ctx, c in requests]


def test_text_tier_runs_what_it_declares():
    text_only = EchoText(scores=False)
    lm = EvalsuiteLM(adapter=text_only)
    gen = [Instance("generate_until", {}, (p, {"until": ["\n"], "max_gen_toks": 3}), i) for i, p in enumerate("ab")]
    assert lm.generate_until(gen) == ["A", "B"]
    prompts, config = text_only.seen[0]
    assert prompts == ["a", "b"] and config.stop == ["\n"] and config.temperature == 0  # one call: its concurrency
    with pytest.raises(UserError, match="cannot answer lm-eval loglikelihood requests"):
        lm.loglikelihood([Instance("loglikelihood", {}, ("a", "b"), 0)])
    for scores in (False, True):
        with pytest.raises(UserError, match="loglikelihood_rolling"):
            EvalsuiteLM(adapter=EchoText(scores)).loglikelihood_rolling(
                [Instance("loglikelihood_rolling", {}, ("a",), 0)]
            )
    scored = EvalsuiteLM(adapter=EchoText(scores=True)).loglikelihood([Instance("loglikelihood", {}, ("x ", "x"), 0)])
    assert scored == [(-2.0, True)]  # the trailing space moved: ("x", " x")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tasks", "no_such_task"], "unknown lm-eval task(s) no_such_task"),
        (["--tasks", "es_mc", "--limit", "0"], "--limit must be positive"),
        (["--tasks", "es_mc", "--include-path", "/nonexistent"], "is not a directory"),
        (["--tasks", ","], "--tasks needs at least one"),
    ],
)
def test_cli_errors_are_one_line(run_cli, tmp_path, task_dir, extra, message):
    args = ["lm-eval", "--model", MODEL, "--device", "cpu", "--no-builtin-tasks"]
    if "--include-path" not in extra:
        args += ["--include-path", task_dir]
    code, _, err = run_cli([*args, *extra], tmp_path)
    assert_one_line_error(code, err, message)
