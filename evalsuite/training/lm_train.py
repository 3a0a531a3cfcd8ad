"""Train a small language model on a text corpus, then fine-tune it on the DRT paper's retrieval tests.

The small-scale version of the GCA paper's protocol (arXiv:2410.01651 §4.1-4.2): pre-train on books at a
short context (PG19 there, the Gutenberg train split here), then fine-tune for a tenth of the pre-training steps on
synthetic retrieval samples of the evaluation's own format (the token-level passkey of §4.2 and the 2-hop test of
§4.3: :mod:`evalsuite.tasks.drt_passkey`) at the same length, and evaluate far beyond that length. The same data
and budget train every model compared (DRT, FoX, Transformer). Our deviation: one fine-tuning stage on both tests
(rows drawn half and half) instead of one fine-tuned model per test.

Pieces, each usable alone: :func:`corpus_tokens` (a corpus as one token stream, cached), :func:`lm_batches` (random
windows), :func:`retrieval_batches` (passkey and 2-hop rows), :func:`chunked_cross_entropy` (the LM loss without a
``[B, T, V]`` logits tensor), :func:`train_lm` (all of it, writing a checkpoint, a card and a log).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from evalsuite.cards import ModelCard
from evalsuite.data.corpus import corpus_files, iter_documents
from evalsuite.data.passkey import DRT_CHUNK, drt_sample, passkey_sample
from evalsuite.errors import UserError
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.provenance import device_name, provenance
from evalsuite.runs.store import atomic_write_json
from evalsuite.runtime import cache_root
from evalsuite.tokenizers import Tokenizer, get_tokenizer
from evalsuite.training.train import IGNORE_INDEX, TrainConfig, build_model, gathered_cross_entropy, train

RETRIEVAL_KINDS = ("passkey", "2hop")
FINETUNE_LOSSES = ("all", "answer")


@dataclass
class LMTrainConfig:
    """One training run: ``steps`` of pre-training on ``corpus`` then ``finetune_steps`` on retrieval rows (0: none;
    the paper: a tenth of the pre-training steps), both at ``seq_len`` tokens (a multiple of 64 when fine-tuning)."""

    corpus: str
    seq_len: int = 1024
    batch_size: int = 32
    steps: int = 3000
    finetune_steps: int = 300
    lr: float = 1e-3
    warmup_steps: int = 100  # per stage
    min_lr_ratio: float = 0.2  # the cosine's floor / peak, per stage: the GCA paper's 4e-4 / 2e-3 (arXiv:2410.01651)
    weight_decay: float = 0.1
    grad_clip: float | None = 1.0
    eval_every: int = 250
    eval_rows: int = 32
    seed: int = 0
    max_tokens: int | None = None  # read at most this many corpus tokens (None: all)
    # "all": the LM loss over the whole fine-tuning sample, as the released data label it (the default); "answer":
    # only the answer tokens (a small model's retrieval signal is otherwise ~1% of its loss)
    finetune_loss: str = "all"
    # rows of every pre-training batch that are retrieval rows (labelled as finetune_loss says) instead of plain
    # windows; 0 (the paper) keeps pre-training plain
    pretrain_retrieval_rows: int = 0

    def __post_init__(self):
        if self.seq_len < 2 or self.batch_size < 1 or self.steps < 0 or self.finetune_steps < 0:
            raise UserError("seq_len >= 2, batch_size >= 1, steps >= 0 and finetune_steps >= 0 are needed")
        if self.steps + self.finetune_steps < 1:
            raise UserError("nothing to train: steps and finetune_steps are both 0")
        if not 0 <= self.pretrain_retrieval_rows < self.batch_size:
            raise UserError(f"pretrain_retrieval_rows must be 0..batch_size - 1 ({self.batch_size - 1})")
        if self.finetune_loss not in FINETUNE_LOSSES:
            raise UserError(f"finetune_loss must be one of {', '.join(FINETUNE_LOSSES)}, got {self.finetune_loss!r}")
        if (self.finetune_steps or self.pretrain_retrieval_rows) and (
            self.seq_len % DRT_CHUNK or self.seq_len < 4 * DRT_CHUNK
        ):
            raise UserError(f"fine-tuning on the DRT tests needs seq_len a multiple of {DRT_CHUNK} and at least "
                            f"{4 * DRT_CHUNK}, got {self.seq_len}")  # fmt: skip


# -- data -------------------------------------------------------------------------------------------------------


def corpus_tokens(corpus: Path | str, tokenizer: Tokenizer, max_tokens: int | None = None) -> np.ndarray:
    """Every document of ``corpus`` tokenised (no BOS) and joined with the EOS id between documents (GPT-2's
    ``<|endoftext|>``, as the GCA paper's PG19 preparation does), as one 1-D array. Cached under ``tokens/`` of
    :func:`evalsuite.runtime.cache_root` by the files' names, sizes and times and the tokenizer."""
    files = corpus_files(Path(corpus))
    ident = [tokenizer.spec, max_tokens] + [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    cache = cache_root() / "tokens" / f"{hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:16]}.npy"
    if cache.exists():
        return np.load(cache)
    sep = [tokenizer.eos_id] if tokenizer.eos_id is not None else []
    parts, total = [], 0
    for doc in iter_documents(Path(corpus)):
        ids = doc.tokens if doc.tokens is not None else tokenizer.encode(doc.text, add_bos=False)
        parts.append(np.asarray(list(ids) + sep, dtype=np.int64))
        total += len(parts[-1])
        if max_tokens is not None and total >= max_tokens:
            break
    if not parts:
        raise UserError(f"corpus {corpus} holds no documents")
    tokens = np.concatenate(parts)[:max_tokens].astype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.int32)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npy")
    np.save(tmp, tokens)
    tmp.replace(cache)
    return tokens


def lm_batches(tokens: np.ndarray, seq_len: int, batch: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(inputs, labels)`` ``[batch, seq_len]`` from uniformly drawn windows of ``seq_len + 1`` tokens."""
    if len(tokens) <= seq_len + 1:
        raise UserError(f"the corpus has {len(tokens)} tokens, too few for windows of {seq_len + 1}")
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(tokens) - seq_len - 1, size=batch)
        rows = torch.from_numpy(np.stack([tokens[s : s + seq_len + 1] for s in starts]).astype(np.int64))
        yield rows[:, :-1], rows[:, 1:]


def retrieval_row(
    tokens: np.ndarray, tokenizer: Tokenizer, seq_len: int, kind: str, rng: np.random.Generator, answer_only=False
):
    """One fine-tuning row: a passkey or 2-hop sample built on a random ``seq_len``-token window of the corpus, as
    ``(inputs [seq_len], labels [seq_len])``; the LM loss covers the whole sample (haystack, needles, question and
    answer), or with ``answer_only`` its answer tokens alone; positions after the last answer token carry no label."""
    start = int(rng.integers(0, len(tokens) - seq_len))
    window = tokens[start : start + seq_len].tolist()
    sample = (passkey_sample if kind == "passkey" else drt_sample)(window, tokenizer, rng)
    ids = torch.tensor(sample.input_ids, dtype=torch.long)
    inputs = torch.full((seq_len,), tokenizer.eos_id or 0, dtype=torch.long)
    labels = torch.full((seq_len,), IGNORE_INDEX, dtype=torch.long)
    inputs[: len(ids) - 1] = ids[:-1]
    labels[: len(ids) - 1] = ids[1:]
    if answer_only:  # labels[t] is the token after inputs[t]: the answer's labels start one position early
        lo = sample.answer_start - 1
        labels[:lo] = IGNORE_INDEX
        labels[lo + sample.answer_len :] = IGNORE_INDEX
    return inputs, labels


def retrieval_batches(
    tokens: np.ndarray, tokenizer: Tokenizer, seq_len: int, batch: int, seed: int, answer_only: bool = False
):
    """Endless batches of :func:`retrieval_row` rows, the kinds drawn half and half."""
    rng = np.random.default_rng([seed, 1])
    while True:
        rows = [
            retrieval_row(tokens, tokenizer, seq_len, RETRIEVAL_KINDS[int(rng.integers(2))], rng, answer_only)
            for _ in range(batch)
        ]
        yield torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])


def concatenated(first: Iterator, second: Iterator) -> Iterator:
    """Batches ``(inputs, labels)`` of ``first`` with the rows of ``second``'s batches appended."""
    for (x1, y1), (x2, y2) in zip(first, second, strict=True):
        yield torch.cat([x1, x2]), torch.cat([y1, y2])


# -- loss -------------------------------------------------------------------------------------------------------


def chunked_cross_entropy(model, inputs: torch.Tensor, labels: torch.Tensor, rows: int = 8192) -> torch.Tensor:
    """The mean over rows of each row's mean cross-entropy over its labelled positions, the LM head applied to
    ``rows`` positions at a time and recomputed in the backward pass (activation checkpointing), so no
    ``[B, T, V]`` logits tensor ever exists. For plain windows (every position labelled) this is the token mean; a
    retrieval row labelled at its answer alone weighs as much as a plain row, not as its 5-11 tokens (mixed into
    pre-training as 8 rows of 32 they were 0.2% of a token-mean loss, and a byte-level run learnt nothing from
    them: ``results/drt_claim/2026-11-26-bytes`` at commit 164742b)."""
    hidden = model(inputs)
    mask = labels != IGNORE_INDEX
    counts = mask.sum(1)  # [B]
    weight = (1.0 / counts.clamp(min=1).float())[:, None].expand_as(mask)[mask]  # [N] per labelled position
    h, y = hidden[mask], labels[mask]

    def part(hh, yy, ww):
        return (F.cross_entropy(model.logits(hh).float(), yy, reduction="none") * ww).sum()

    chunks = range(0, len(y), rows)
    total = sum(checkpoint(part, h[s : s + rows], y[s : s + rows], weight[s : s + rows], use_reentrant=False)
                for s in chunks)  # fmt: skip
    return total / max(int((counts > 0).sum()), 1)


# -- the run ----------------------------------------------------------------------------------------------------


@torch.no_grad()
def held_out_scores(model, inputs: torch.Tensor, labels: torch.Tensor, batch: int = 8) -> dict:
    """Mean loss and next-token accuracy over the labelled positions of fixed held-out rows (``[N, T]``), and the
    accuracy at each row's first labelled position (``first_accuracy``: for answer-labelled retrieval rows, the DRT
    evaluator's first-answer-token accuracy)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, hits, count, first_hits = 0.0, 0, 0, 0
    for s in range(0, len(inputs), batch):
        x, y = inputs[s : s + batch].to(device), labels[s : s + batch].to(device)
        hidden = model(x)
        mask = y != IGNORE_INDEX
        logits = model.logits(hidden[mask]).float()
        loss_sum += F.cross_entropy(logits, y[mask], reduction="sum").item()
        right = logits.argmax(-1) == y[mask]
        hits += right.sum().item()
        count += int(mask.sum())
        first = torch.cumsum(mask.int(), 1)[mask] == 1  # the first labelled position of each row, in mask order
        first_hits += right[first].sum().item()
    model.train(was_training)
    return {"loss": loss_sum / count, "accuracy": hits / count, "first_accuracy": first_hits / len(inputs)}


def evaluate(model, rows: torch.Tensor, retrieval: tuple[torch.Tensor, torch.Tensor] | None) -> dict:
    """Held-out LM scores of ``rows [N, T + 1]`` and, given retrieval rows ``(inputs, answer labels)``, the answers'
    loss, token accuracy and first-token accuracy (``retrieval_*``): whether retrieval is being learnt, during
    training, without a separate evaluation run."""
    scores = held_out_scores(model, rows[:, :-1], rows[:, 1:])
    scores.pop("first_accuracy")  # every position of a plain row is labelled: the same as the first token's
    if retrieval is not None:
        scores.update({f"retrieval_{k}": v for k, v in held_out_scores(model, *retrieval).items()})
    return scores


def _stage_config(config: LMTrainConfig, steps: int) -> TrainConfig:
    """The optimisation settings of one stage of ``steps`` steps (pre-training or fine-tuning)."""
    return TrainConfig(
        lr=config.lr,
        max_steps=steps,
        warmup_steps=min(config.warmup_steps, steps),
        min_lr_ratio=config.min_lr_ratio,
        weight_decay=config.weight_decay,
        grad_clip=config.grad_clip,
        eval_every=config.eval_every,
        early_stop=None,
        log_every=25,
    )


def _split_held_out(config: LMTrainConfig, tokenizer: Tokenizer, heldout: str | None):
    """(training tokens, held-out rows ``[eval_rows, seq_len + 1]``, held-out passkey/2-hop rows scored on their
    answers or None): the held-out text is ``heldout``'s start, or else the training corpus's tail, kept apart."""
    tokens = corpus_tokens(config.corpus, tokenizer, config.max_tokens)
    T, n_eval = config.seq_len, config.eval_rows
    if heldout is None:  # keep the tail for evaluation
        held, tokens = tokens[-n_eval * (T + 1) :], tokens[: -n_eval * (T + 1)]
    else:
        held = corpus_tokens(heldout, tokenizer, n_eval * (T + 1))
    if len(held) < n_eval * (T + 1):
        raise UserError(f"held-out corpus too short for {n_eval} rows of {T + 1} tokens")
    rows = torch.from_numpy(held[: n_eval * (T + 1)].astype(np.int64)).view(n_eval, T + 1)
    retrieval = None
    if config.finetune_steps or config.pretrain_retrieval_rows:  # passkey/2-hop rows on the held-out text, answers
        retrieval = next(retrieval_batches(held, tokenizer, T, n_eval, config.seed + 2, answer_only=True))
    return tokens, rows, retrieval


def _initial_model(card: ModelCard, seed: int, init: Path | str | None) -> torch.nn.Module:
    """``card``'s model from its random init, or from the checkpoint ``init`` (which must hold that architecture)."""
    from evalsuite.models.checkpoint import load_checkpoint, read_config

    if init is None:
        return build_model(card, seed=seed)
    model, _ = load_checkpoint(Path(init))
    stored = read_config(Path(init)).get("architecture")  # ours name it; a released layout names its family
    if stored not in (None, card.architecture) or not isinstance(model, card.family.model_cls):
        raise UserError(f"checkpoint {init} holds a {stored or type(model).__name__}, not a {card.architecture} "
                        "model")  # fmt: skip
    return model


def train_lm(
    card: ModelCard,
    config: LMTrainConfig,
    out_dir: Path,
    *,
    device: str | torch.device = "cpu",
    heldout: str | None = None,
    init: Path | str | None = None,
    save_dtype: torch.dtype = torch.bfloat16,
    progress: bool = True,
    cuda_graph: bool = False,
) -> dict:
    """Train ``card``'s model from its random init (or from the checkpoint ``init``, e.g. an earlier run's
    ``pretrained/`` to fine-tune it another way); write ``out_dir/checkpoint`` (our format, weights in
    ``save_dtype``), ``out_dir/pretrained`` (the same, when pre-training is followed by fine-tuning),
    ``out_dir/train.json`` (config, history, held-out scores, provenance) and return the latter.
    ``heldout``: a corpus for the held-out rows (default: the training corpus's last windows, not trained on).
    ``cuda_graph``: replay each step of plain pre-training as one CUDA graph (the same updates, a fraction of the
    launch cost of a small model's step). Each stage saves a snapshot to ``out_dir`` every few minutes and a rerun
    resumes from it."""
    from evalsuite.models.checkpoint import save_checkpoint

    device = torch.device(device)
    tokenizer = get_tokenizer(card.tokenizer)
    tokens, rows, retrieval = _split_held_out(config, tokenizer, heldout)
    T = config.seq_len
    model = _initial_model(card, config.seed, init).to(device).train()
    answer_only = config.finetune_loss == "answer"
    mixed = config.pretrain_retrieval_rows
    batches = lm_batches(tokens, T, config.batch_size - mixed, config.seed)
    if mixed:
        batches = concatenated(batches, retrieval_batches(tokens, tokenizer, T, mixed, config.seed + 1, answer_only))
    # Each stage is its own run of the schedule, as the paper fine-tunes "with all other hyper-parameters unchanged"
    # (arXiv:2410.01651 §4.2): warmup, then a cosine from the peak rate. One schedule over both stages left the
    # fine-tuning at the tail of the pre-training cosine (1.5e-4 falling to 0), too low to learn retrieval.
    tests = retrieval_batches(tokens, tokenizer, T, config.batch_size, config.seed, answer_only)
    stages = [(n, b) for n, b in ((config.steps, batches), (config.finetune_steps, tests)) if n > 0]
    graphed = cuda_graph and not mixed and device.type == "cuda"  # plain windows: every position labelled
    # With every position labelled the token mean (gathered, static shapes: capturable) equals the row mean of
    # chunked_cross_entropy; the [B, T, V] logits this builds are small for a byte vocabulary.
    plain_loss = partial(gathered_cross_entropy, labels_per_row=T) if graphed else chunked_cross_entropy
    total = config.steps + config.finetune_steps
    history, seconds, done, final = [], 0.0, 0, None
    with progress_bar(total, f"train {card.name}", enabled=progress) as bar:
        for stage, (n, stage_batches) in enumerate(stages):
            result = train(
                model,
                stage_batches,
                _stage_config(config, n),
                evaluate=lambda m: evaluate(m, rows, retrieval),
                loss_fn=plain_loss if stage_batches is batches else chunked_cross_entropy,
                on_step=lambda step, done=done: bar.update(completed=done + step),
                cuda_graph=graphed and stage_batches is batches,
                snapshot=out_dir / f"snapshot-{stage}.pt",
            )
            history += [{**h, "step": h["step"] + done, "seconds": h["seconds"] + seconds} for h in result.history]
            final = {**result.final_eval, "step": result.final_eval["step"] + done}
            done, seconds = done + result.steps, seconds + result.seconds
            if done == config.steps and config.finetune_steps:  # keep the pre-trained model: fine-tune it another way
                save_checkpoint(model, out_dir / "pretrained", architecture=card.architecture, dtype=save_dtype)
    model.to(save_dtype)
    save_checkpoint(model, out_dir / "checkpoint", architecture=card.architecture)
    summary = {
        "model": card.name,
        "architecture": card.architecture,
        "params": sum(p.numel() for p in model.parameters()),
        "config": asdict(config),
        "init": None if init is None else str(init),
        "train": [_stage_config(config, n).to_dict() for n, _ in stages],  # pre-training, fine-tuning
        "tokens_seen": total * config.batch_size * T,
        "corpus_tokens": int(len(tokens)),
        "steps": done,
        "seconds": seconds,
        "final_eval": final,
        "history": history,
        "save_dtype": str(save_dtype).removeprefix("torch."),
        "provenance": provenance(device=device_name(device)),
    }
    atomic_write_json(out_dir / "train.json", summary)
    return summary
