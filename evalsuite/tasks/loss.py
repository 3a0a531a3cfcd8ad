"""Per-token loss curves (FoX paper, arXiv:2503.02130, §4.2 and Appendix C).

One window of ``length`` tokens per document (default 65536, or the model's ``max_length`` when shorter), BOS
first: the model reads ``[BOS, x_0 .. x_{L-2}]`` and is scored on ``x_0 .. x_{L-1}``, so position ``i`` predicts
``x_i`` from ``i`` tokens of context (the FoX convention ``input_ids = roll(x, 1); input_ids[0] = BOS``). Documents
shorter than the window are skipped and counted. With ``roll`` each window is rotated by a seeded random shift first
(the LongCrawl64 convention that removes position bias).

Per-position NLL sums are kept in float64 with counts, accumulated one document at a time in corpus
order, so the result does not depend on batch size or on where a run was interrupted. The state is
saved atomically after every batch; a rerun with the same config resumes from it.

Outputs in the run directory:
* ``loss_per_token.npz``: ``loss_per_token`` (mean NLL per position, float64 ``[L]``), ``count``;
* ``results.json``: loss and perplexity over the first ``l`` tokens for ``l = 2^k <= L`` (and ``L``),
  plus the config, its hash and provenance.
"""

from __future__ import annotations

import itertools
import math
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from evalsuite.adapters.base import TOKENS, TokenAdapter
from evalsuite.data.builtin import SYNTHETIC, resolve_corpus
from evalsuite.data.corpus import Document, corpus_files, count_documents, iter_documents
from evalsuite.data.haystack import safe_cut
from evalsuite.data.synthetic import synthetic_documents
from evalsuite.errors import UserError
from evalsuite.runs.distributed import PeerFailed
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.rundir import RunDir
from evalsuite.runs.store import atomic_save_npz
from evalsuite.tasks.base import Plan, Task, register_task
from evalsuite.tasks.runner import run_task
from evalsuite.tokenizers import Tokenizer

LOSS_CURVE_FILE = "loss_per_token.npz"  # the per-position curve (report.records reads it)
STATE_FILE = "state.npz"  # running sums while a run is in progress
DEFAULT_LENGTH = 65536  # the FoX paper's evaluation length


@dataclass
class LossConfig:
    data: str = SYNTHETIC  # a file/directory of documents, "synthetic" or "books" (evalsuite/data/builtin.py)
    length: int | None = None  # window tokens, BOS included; None: DEFAULT_LENGTH, or the model's max_length if less
    max_docs: int | None = None
    roll: bool = False
    seed: int = 0
    batch_size: int = 1

    def __post_init__(self):
        if self.length is not None and self.length < 2:
            raise UserError(f"--length must be at least 2, got {self.length}")
        if self.max_docs is not None and self.max_docs < 1:
            raise UserError(f"--max-docs must be at least 1, got {self.max_docs}")
        if self.batch_size < 1:
            raise UserError(f"--batch-size must be at least 1, got {self.batch_size}")


@dataclass(frozen=True, kw_only=True)
class LossPlan(Plan):
    """``resolved``: the config with its window length set for the model."""

    resolved: LossConfig


def eval_lengths(length: int) -> list[int]:
    """``1, 2, 4, ... <= length``, plus ``length`` itself when it is not a power of two."""
    out = [2**k for k in range(int(math.log2(length)) + 1)]
    return out if out[-1] == length else out + [length]


def documents(config: LossConfig) -> tuple[int, Iterator[Document]]:
    """(number of documents, iterator over them); fails early on a bad path or an empty corpus."""
    if config.data == SYNTHETIC:
        n_words = int(config.length * 1.3) + 1000  # comfortably more than `length` GPT-2 tokens
        docs = synthetic_documents(n_docs=config.max_docs or 8, n_words=n_words, seed=config.seed)
        return len(docs), iter(docs)
    path = Path(resolve_corpus(config.data))
    return count_documents(path), iter_documents(path)


def window_tokens(doc: Document, tokenizer: Tokenizer, length: int) -> np.ndarray | None:
    """The first ``length`` tokens of a document (no BOS), or None if it is shorter.

    Long texts are tokenised from a prefix first, cut where the haystack loader cuts (before a space that
    follows a non-space, where GPT-2's pre-tokenizer always splits), keeping a 64-token margin for other
    tokenizers; the whole text is encoded when the prefix falls short.
    """
    if doc.tokens is not None:
        return doc.tokens[:length] if len(doc.tokens) >= length else None
    text = doc.text
    prefix_chars = 16 * length + 1024
    if len(text) > prefix_chars:
        ids = tokenizer.encode(text[: safe_cut(text, prefix_chars)], add_bos=False)
        if len(ids) >= length + 64:
            return np.asarray(ids[:length], dtype=np.int64)
    ids = tokenizer.encode(text, add_bos=False)
    return np.asarray(ids[:length], dtype=np.int64) if len(ids) >= length else None


def roll_window(x: np.ndarray, seed: int, doc_index: int) -> np.ndarray:
    """Rotate by a shift drawn from a generator seeded by (seed, document index): stable under resume."""
    shift = int(np.random.default_rng([seed, doc_index]).integers(0, len(x)))
    return np.roll(x, shift)


@dataclass
class _Batch:
    """Up to ``batch_size`` windows (``[L]`` int64 token ids each) in corpus order; ``next_doc``: the corpus index
    after the last one; ``skipped``: documents too short among those before ``next_doc``."""

    windows: list[np.ndarray]
    next_doc: int
    skipped: int


class _Walk:
    """The batches of a run from ``state`` on, as one process forms them (every rank walks the same way).

    ``skipped`` counts every too-short document walked so far (after the walk: the run's total)."""

    def __init__(self, config: LossConfig, tokenizer: Tokenizer, docs: Iterator[Document], state: _State):
        self.config, self.tokenizer, self.docs = config, tokenizer, docs
        self.start, self.used, self.skipped = state.next_doc, state.used, state.skipped

    def __iter__(self) -> Iterator[_Batch]:
        config, target = self.config, self.config.max_docs
        batch: list[tuple[int, np.ndarray]] = []
        skipped_at_batch = self.skipped
        for index, doc in enumerate(self.docs):
            if index < self.start:
                continue
            if target is not None and self.used + len(batch) >= target:
                break
            window = window_tokens(doc, self.tokenizer, config.length)
            if window is None:
                self.skipped += 1
                continue
            if config.roll:
                window = roll_window(window, config.seed, index)
            batch.append((index, window))
            skipped_at_batch = self.skipped
            if len(batch) == config.batch_size:
                self.used += len(batch)
                yield _Batch([w for _, w in batch], index + 1, skipped_at_batch)
                batch = []
        if batch:
            self.used += len(batch)
            yield _Batch([w for _, w in batch], batch[-1][0] + 1, skipped_at_batch)


def _nll(adapter: TokenAdapter, batch: _Batch) -> np.ndarray:
    """Per-position NLL of each window, float64 ``[n, L]``: position ``i`` scores ``x_i`` given BOS, ``x_<i``."""
    ids = np.stack(batch.windows)
    inputs = np.concatenate([np.full((len(ids), 1), adapter.tokenizer.bos_id), ids[:, :-1]], axis=1)
    return adapter.token_nll(torch.from_numpy(inputs), torch.from_numpy(ids)).double().numpy()


class _State:
    """Running sums; saved and restored as one npz."""

    def __init__(self, length: int):
        self.sum = np.zeros(length, dtype=np.float64)
        self.count = np.zeros(length, dtype=np.int64)
        self.next_doc = 0  # corpus index of the first document not yet consumed
        self.used = 0
        self.skipped = 0

    def add(self, nll: np.ndarray, batch: _Batch) -> None:
        """Add a batch's NLL rows, one document at a time: the float64 sum does not depend on the batching."""
        for row in nll:
            self.sum += row
            self.count += 1
        self.used += len(batch.windows)
        self.next_doc, self.skipped = batch.next_doc, batch.skipped

    def save(self, path: Path, chash: str) -> None:
        atomic_save_npz(
            path,
            sum=self.sum,
            count=self.count,
            counters=np.array([self.next_doc, self.used, self.skipped]),
            config_hash=np.array(chash),
        )

    @classmethod
    def load(cls, path: Path, length: int, chash: str) -> _State | None:
        """The saved state of this configuration, or None; an unreadable file is one clear error."""
        if not path.exists():
            return None
        try:
            with np.load(path, allow_pickle=False) as z:
                if str(z["config_hash"]) != chash or len(z["sum"]) != length:
                    return None
                st = cls(length)
                st.sum, st.count = z["sum"].copy(), z["count"].copy()
                st.next_doc, st.used, st.skipped = (int(v) for v in z["counters"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            raise UserError(f"{path} is corrupt ({type(e).__name__}); delete it to restart this run") from None
        return st


def summarize(sum_: np.ndarray, count: np.ndarray, model: str, n_docs: int) -> list[dict]:
    """Records of mean loss and perplexity over the first ``l`` tokens for each evaluation length."""
    loss_per_token = sum_ / count
    cum = np.cumsum(loss_per_token)
    records = []
    for l in eval_lengths(len(sum_)):  # noqa: E741 - the paper's name for the length
        loss = float(cum[l - 1] / l)
        for metric, value in (("loss", loss), ("perplexity", math.exp(loss))):
            records.append(dict(model=model, task="loss", subtask="", length=l, metric=metric, value=value, n=n_docs))
    return records


@register_task
class LossTask(Task):
    """Per-token loss over one window per document; keeps its own loop (running sums, resumable state)."""

    name = "loss"
    command = "loss"
    needs = frozenset({TOKENS})
    Config = LossConfig
    reuse_finished = True
    shards = True

    def prepare(self, adapter: TokenAdapter) -> LossPlan:
        config = self.config
        length = config.length or min(DEFAULT_LENGTH, adapter.max_length or DEFAULT_LENGTH)
        adapter.check_length(length)
        if adapter.tokenizer.bos_id is None:
            raise UserError(
                f"tokenizer {adapter.tokenizer.spec} has no BOS token; the loss protocol starts each window with BOS"
            )
        if config.data != SYNTHETIC:
            corpus_files(Path(resolve_corpus(config.data)))  # a bad path fails before the run directory is claimed
        resolved = replace(config, length=length)
        return LossPlan(config=asdict(resolved), resolved=resolved)

    def execute(self, plan: LossPlan, adapter: TokenAdapter, run: RunDir, progress: bool = True) -> _State | None:
        """Accumulate the sums (resuming from ``state.npz``); rank 0 returns them, with the curve written.

        The batches are dealt round-robin, ``world.size`` at a time: each rank scores its batch, rank 0 gathers the
        NLL rows and adds them in corpus order, so the sums are bit for bit those of one process."""
        config, world = plan.resolved, run.world
        state_path = run.path / STATE_FILE
        saved = _State.load(state_path, config.length, run.config_hash) if world.is_main else None
        state = saved or _State(config.length)
        # the other ranks walk the corpus from where rank 0's saved sums stop
        state.next_doc, state.used, state.skipped = world.broadcast((state.next_doc, state.used, state.skipped))
        n_docs, docs = documents(config)
        walk = _Walk(config, adapter.tokenizer, docs, state)
        total = n_docs if config.max_docs is None else min(config.max_docs, n_docs)  # short documents are skipped
        with progress_bar(total, f"loss {adapter.name}", enabled=progress, completed=state.used) as bar:
            batches = iter(walk)
            while step := list(itertools.islice(batches, world.size)):  # the same step on every rank
                mine = step[world.rank] if world.rank < len(step) else None
                rows = world.gather(_nll(adapter, mine) if mine is not None else None)
                if world.is_main:
                    for batch, nll in zip(step, rows, strict=False):
                        state.add(nll, batch)
                        bar.advance(len(batch.windows))
                    state.save(state_path, run.config_hash)
        state.skipped = walk.skipped
        if walk.used == 0:  # (only rank 0 adds up the sums; every rank walks the same documents)
            if world.is_main:
                state_path.unlink(missing_ok=True)
            message = f"no document has at least {config.length} tokens ({state.skipped} too short)"
            raise UserError(message) if world.is_main else PeerFailed(message, user_error=True)
        if not world.is_main:
            return None
        atomic_save_npz(run.path / LOSS_CURVE_FILE, loss_per_token=state.sum / state.count, count=state.count)
        return state

    def aggregate(self, plan: LossPlan, state: _State, adapter: TokenAdapter, run: RunDir) -> tuple[list, dict]:
        records = summarize(state.sum, state.count, adapter.name, state.used)
        return records, {"documents": {"used": state.used, "skipped_too_short": state.skipped}}

    def finished(self, run: RunDir) -> None:
        (run.path / STATE_FILE).unlink(missing_ok=True)  # the sums live on in loss_per_token.npz


def run_loss(adapter: TokenAdapter, config: LossConfig, out_dir: Path | None = None, progress: bool = True) -> dict:
    """Run (or resume, or return the finished) per-token loss evaluation; returns ``results.json``'s content."""
    return run_task(LossTask(config), adapter, out_dir, progress)
