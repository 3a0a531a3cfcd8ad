"""Small-LM training (lm_train.py): the token stream, batches, retrieval rows, the chunked loss, a whole run."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.models.checkpoint import load_checkpoint
from evalsuite.tokenizers import GPT2_EOT_ID, get_tokenizer
from evalsuite.training.lm_train import (
    LMTrainConfig,
    chunked_cross_entropy,
    corpus_tokens,
    lm_batches,
    retrieval_row,
    train_lm,
)
from evalsuite.training.train import IGNORE_INDEX, build_model, masked_cross_entropy

WORDS = "the river ran quiet under a grey sky while the miller counted his sacks of flour".split()


@pytest.fixture()
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALSUITE_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    path = tmp_path / "books.jsonl"
    docs = [" ".join(rng.choice(WORDS, size=900)) for _ in range(3)]
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path, docs


@pytest.fixture()
def gpt2_stream(corpus):
    """(the GPT-2 tokenizer, the corpus as its token stream)."""
    tok = get_tokenizer("gpt2")
    return tok, corpus_tokens(corpus[0], tok)


def test_corpus_tokens_joins_documents_with_eos_and_caches(corpus, tmp_path):
    path, docs = corpus
    tok = get_tokenizer("gpt2")
    tokens = corpus_tokens(path, tok)
    expected = [t for d in docs for t in (*tok.encode(d, add_bos=False), GPT2_EOT_ID)]
    assert tokens.dtype == np.uint16 and tokens.tolist() == expected
    assert len(list((tmp_path / "cache" / "tokens").glob("*.npy"))) == 1
    assert corpus_tokens(path, tok).tolist() == expected  # from the cache
    assert len(corpus_tokens(path, tok, max_tokens=100)) == 100


def test_lm_batches_are_shifted_windows():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = next(lm_batches(tokens, 16, 4, seed=0))
    assert x.shape == y.shape == (4, 16) and torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(y - x, torch.ones_like(x))
    with pytest.raises(UserError, match="too few"):
        next(lm_batches(tokens[:10], 16, 4, seed=0))


@pytest.mark.parametrize("kind", ["passkey", "2hop"])
def test_retrieval_rows_label_the_sample_only(gpt2_stream, kind):
    tok, tokens = gpt2_stream
    x, y = retrieval_row(tokens, tok, 512, kind, np.random.default_rng(1))
    labelled = int((y != IGNORE_INDEX).sum())
    assert x.shape == y.shape == (512,) and torch.equal(x[1:labelled], y[: labelled - 1])
    assert (y[labelled:] == IGNORE_INDEX).all() and labelled == (512 - 64 + (5 if kind == "passkey" else 11))


def test_chunked_cross_entropy_is_the_mean_of_row_means():
    """Each row weighs the same however many positions it labels; with every position labelled, the token mean."""
    model = build_model(load_card("transformer-llama-tiny"), {"vocab_size": 97}, seed=0)
    x = torch.randint(0, 97, (3, 20))
    y = torch.randint(0, 97, (3, 20))
    full = chunked_cross_entropy(model, x, y, rows=7)  # several chunks and a ragged last one
    torch.testing.assert_close(full, masked_cross_entropy(model, x, y))
    y[0, :15] = IGNORE_INDEX  # row 0: 5 labels (an answer-labelled row), row 2: none (no weight at all)
    y[2] = IGNORE_INDEX
    rows = [masked_cross_entropy(model, x[i : i + 1], y[i : i + 1]) for i in (0, 1)]
    expected = (rows[0] + rows[1]) / 2
    expected.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    chunked = chunked_cross_entropy(model, x, y, rows=7)
    chunked.backward()
    torch.testing.assert_close(chunked, expected)
    for g, p in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, g)


def test_train_lm_writes_a_loadable_checkpoint(corpus, tmp_path):
    path, _ = corpus
    config = LMTrainConfig(corpus=str(path), seq_len=256, batch_size=2, steps=4, finetune_steps=2, eval_every=3,
                           eval_rows=2, warmup_steps=1)  # fmt: skip
    summary = train_lm(load_card("transformer-llama-tiny"), config, tmp_path / "run", progress=False)
    assert summary["steps"] == 6 and summary["final_eval"]["step"] == 6 and summary["save_dtype"] == "bfloat16"
    final = summary["final_eval"]  # with retrieval training, the held-out passkey/2-hop answers are scored too
    assert 0 <= final["retrieval_first_accuracy"] <= 1 and final["retrieval_loss"] > 0 and "first_accuracy" not in final
    assert json.loads((tmp_path / "run" / "train.json").read_text())["history"] == summary["history"]
    assert [t["max_steps"] for t in summary["train"]] == [4, 2]  # one schedule per stage
    model, layout = load_checkpoint(tmp_path / "run" / "checkpoint")  # weights stored in bf16, loaded into fp32
    stored = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    assert layout == "evalsuite" and all(t.dtype == torch.bfloat16 for t in stored.values())
    assert torch.equal(model.embed.weight, stored["embed.weight"].float())
    with pytest.raises(UserError, match="multiple of 64 and at least 256"):
        LMTrainConfig(corpus=str(path), seq_len=100)


@pytest.mark.parametrize("kind", ["passkey", "2hop"])
def test_answer_only_rows_label_the_answer_alone(gpt2_stream, kind):
    tok, tokens = gpt2_stream
    x, y_all = retrieval_row(tokens, tok, 512, kind, np.random.default_rng(1))
    x2, y = retrieval_row(tokens, tok, 512, kind, np.random.default_rng(1), answer_only=True)
    kept = (y != IGNORE_INDEX).nonzero().flatten()
    n = 5 if kind == "passkey" else 11
    assert torch.equal(x, x2) and len(kept) == n and torch.equal(y[kept], y_all[kept])
    assert int(kept[-1]) == int((y_all != IGNORE_INDEX).nonzero().max())  # the sample's last labels are its answer
    assert torch.equal(kept, torch.arange(int(kept[0]), int(kept[0]) + n))


def test_train_lm_keeps_the_pretrained_model_and_fine_tunes_from_it(corpus, tmp_path):
    path, _ = corpus
    card = load_card("transformer-llama-tiny")
    config = LMTrainConfig(corpus=str(path), seq_len=256, batch_size=2, steps=3, finetune_steps=2, eval_every=5,
                           eval_rows=2, warmup_steps=1)  # fmt: skip
    train_lm(card, config, tmp_path / "run", progress=False)
    pretrained = load_file(tmp_path / "run" / "pretrained" / "model.safetensors")
    final = load_file(tmp_path / "run" / "checkpoint" / "model.safetensors")
    assert pretrained.keys() == final.keys() and not torch.equal(pretrained["embed.weight"], final["embed.weight"])

    tune = LMTrainConfig(corpus=str(path), seq_len=256, batch_size=2, steps=0, finetune_steps=2, eval_every=5,
                         eval_rows=2, warmup_steps=1, finetune_loss="answer")  # fmt: skip
    summary = train_lm(card, tune, tmp_path / "tune", init=tmp_path / "run" / "pretrained", progress=False)
    assert summary["steps"] == 2 and summary["init"].endswith("pretrained")
    assert not (tmp_path / "tune" / "pretrained").exists()  # no pre-training stage to keep
    with pytest.raises(UserError, match="not a fox-pro model"):
        train_lm(load_card("fox-pro-tiny"), tune, tmp_path / "x", init=tmp_path / "run" / "pretrained", progress=False)
    with pytest.raises(UserError, match="finetune_loss"):
        LMTrainConfig(corpus=str(path), seq_len=256, finetune_loss="question")
    with pytest.raises(UserError, match="nothing to train"):
        LMTrainConfig(corpus=str(path), seq_len=256, steps=0, finetune_steps=0)


def test_held_out_scores_count_each_rows_first_labelled_position():
    """``first_accuracy``: the argmax at each row's first labelled position (the DRT evaluator's answer token)."""
    from evalsuite.training.lm_train import held_out_scores

    model = load_card("transformer-llama-tiny").build_module().eval()
    x = torch.randint(0, 97, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        pred = model.logits(model(x)).argmax(-1)  # [3, 12]
    y = torch.full_like(x, IGNORE_INDEX)
    wrong = (pred + 1) % model.vocab_size
    y[0, 4:7], y[1, 2:3], y[2, 9:12] = pred[0, 4:7], wrong[1, 2:3], pred[2, 9:12]  # row 1 wrong at its first
    y[2, 9] = wrong[2, 9]  # row 2 wrong at its first, right after it
    scores = held_out_scores(model, x, y, batch=2)
    assert scores["first_accuracy"] == 1 / 3 and scores["accuracy"] == 5 / 7


def test_pretraining_batches_can_carry_retrieval_rows(corpus, gpt2_stream, tmp_path):
    """``pretrain_retrieval_rows``: that many rows of each pre-training batch are passkey/2-hop rows (their labels
    stop at the answer), the rest plain windows (labelled to the end)."""
    from evalsuite.training.lm_train import concatenated, lm_batches, retrieval_batches

    path, _ = corpus
    tok, tokens = gpt2_stream
    x, y = next(concatenated(lm_batches(tokens, 256, 3, 0), retrieval_batches(tokens, tok, 256, 2, 1)))
    assert x.shape == y.shape == (5, 256)
    assert (y[:3] != IGNORE_INDEX).all() and (y[3:, -1] == IGNORE_INDEX).all()
    config = LMTrainConfig(corpus=str(path), seq_len=256, batch_size=3, steps=2, finetune_steps=0, eval_every=5,
                           eval_rows=2, warmup_steps=1, pretrain_retrieval_rows=1)  # fmt: skip
    assert train_lm(load_card("transformer-llama-tiny"), config, tmp_path / "run", progress=False)["steps"] == 2
    with pytest.raises(UserError, match="pretrain_retrieval_rows"):
        LMTrainConfig(corpus=str(path), seq_len=256, batch_size=3, pretrain_retrieval_rows=3)
    with pytest.raises(UserError, match="multiple of 64"):
        LMTrainConfig(corpus=str(path), seq_len=100, finetune_steps=0, pretrain_retrieval_rows=1)


def test_fine_tuning_restarts_the_schedule(corpus, tmp_path):
    """Pre-training and fine-tuning each warm up to the peak rate and anneal to ``min_lr_ratio`` of it (the GCA paper
    fine-tunes "with all other hyper-parameters unchanged"), not one cosine over both stages."""
    path, _ = corpus
    config = LMTrainConfig(corpus=str(path), seq_len=256, batch_size=1, steps=50, finetune_steps=50, eval_every=100,
                           eval_rows=2, warmup_steps=5, lr=1e-3, min_lr_ratio=0.2, max_tokens=20000)  # fmt: skip
    card = dataclasses.replace(load_card("transformer-llama-tiny").with_config({"vocab_size": 258}), tokenizer="bytes")
    summary = train_lm(card, config, tmp_path / "run", progress=False)  # bytes: no 50K-way logits to pay for
    lr = {h["step"]: h["lr"] for h in summary["history"] if "loss" in h}
    assert lr[25] == pytest.approx(lr[75]) and lr[25] > 5e-4  # the same point of each stage's schedule
    assert 2e-4 <= lr[50] < lr[25] and 2e-4 <= lr[100] < lr[75]  # each ends near the floor, 0.2 x 1e-3
    assert [h["step"] for h in summary["history"]] == sorted(h["step"] for h in summary["history"])
    assert summary["final_eval"]["step"] == 100 and summary["steps"] == 100
