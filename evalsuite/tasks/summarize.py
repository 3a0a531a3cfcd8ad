"""Summarization: generate a summary per document, score it with ROUGE against the reference.

**Data**: a JSON-lines file, one object per line with the document and its reference summary (field names
``document_field``/``summary_field``, default ``document``/``summary`` as in XSum, arXiv:1808.08745; use
``article``/``highlights`` for CNN/DM). An ``id_field`` value, when present, goes into the records. Every line is
checked before anything runs; the first bad one is a UserError naming ``file:line``.

**Prompt** (``template``):

* ``drt`` -- ``{document}|Summary:``, the DRT paper's format (arXiv:2410.01651, code ``reader/dataset_xsum.py``:
  ``enc(document) + enc("|Summary") + enc(":")``, no instruction, no space). We build the text and the adapter
  encodes it whole; with GPT-2 BPE that gives the same ids except where the document ends in punctuation that
  BPE merges with ``|`` (1 of the first 200 XSum documents). BOS follows the model's tokenizer.
* ``chat`` -- ``instruction + "\\n\\n" + document`` as one user message through the tokenizer's chat template
  (``tokenizer.chat_template(messages)``); a tokenizer without one (``has_chat_template``) is an error.

**Truncation**: the document is cut at its tail, in tokens of the adapter's tokenizer, so that the whole prompt
(BOS and template included) plus ``max_new_tokens`` fits the model's ``max_length`` (and the prompt fits
``max_prompt_tokens`` when set). DRT also keeps the document's start. Records carry ``truncated`` and the counts.

**Decoding**: greedy by default (``temperature=0``), or seeded sampling with temperature, ``top_k`` and ``top_p``
(:class:`~evalsuite.adapters.base.GenerationConfig`). DRT samples with top-k=2 (``--temperature 1 --top-k 2``);
its seed-1 global RNG stream is not reproduced (our seeds are per document). Sampled documents
are generated one at a time with a seed derived from ``seed`` and the document's key, so a resumed or re-batched
run samples the same summaries. Generation stops at EOS, ``max_new_tokens`` (default 128, DRT's) or a ``stop``
string (default none: DRT stops at EOS only, and CNN/DM references span several lines).

**Scores** (:mod:`evalsuite.metrics.rouge`): ROUGE-1/2/L/Lsum F, precision and recall with ``rouge-score``,
stemmed; optionally ``bpe_rouge*`` over model tokens (DRT's flavour, see :func:`~evalsuite.metrics.rouge.bpe_rouge`).
All values are fractions in [0, 1]. The summary gives each metric's mean with a seeded percentile bootstrap
interval and, with ``lead_baseline``, the lead-1 baseline (the document's first sentence, scored the same way).

Records are keyed by document (``index|sha256(document)[:12]``): a rerun resumes, and ``max_docs`` is not
hashed, so raising it extends a finished run. Every record carries its provenance (model, weights, tokenizer,
data file and line, data sha256, config hash, git commit).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from evalsuite.adapters.base import TextAdapter
from evalsuite.errors import UserError
from evalsuite.generation.types import GenerationConfig
from evalsuite.metrics.rouge import bootstrap_cis, bpe_rouge, lead_sentence, rouge_scores
from evalsuite.runs.provenance import git_commit
from evalsuite.runs.rundir import RunDir
from evalsuite.runs.store import file_sha256
from evalsuite.tasks.base import RUNS_ROOT, Item, ItemTask, Plan, register_task
from evalsuite.tasks.runner import run_task
from evalsuite.tokenizers import Tokenizer

TEMPLATES = ("drt", "chat")
DRT_SUFFIX = "|Summary:"
DEFAULT_INSTRUCTION = "Summarize the following article in one sentence."
# Config fields that change no record: left out of the hash (max_docs only selects how many documents run).
UNHASHED = ("batch_size", "max_docs", "bootstrap_samples", "confidence", "lead_baseline")


@dataclass
class SummarizeConfig:
    """One summarization run (see the module docstring for each choice)."""

    data: str | None = None  # JSONL file; required
    document_field: str = "document"
    summary_field: str = "summary"
    id_field: str = "id"  # recorded when present; optional
    max_docs: int | None = None  # the first N documents
    template: str = "drt"  # drt | chat
    instruction: str = DEFAULT_INSTRUCTION  # chat only
    max_new_tokens: int = 128
    max_prompt_tokens: int | None = None  # an extra cap on the prompt (tokens, BOS and template included)
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # sampling: the k likeliest tokens only (DRT: top-k 2, seed 1); 0: no cut
    stop: list[str] = field(default_factory=list)
    bpe_rouge: bool = False  # also ROUGE-1/2/L over model tokens (bpe_rouge*)
    lead_baseline: bool = True  # the lead-1 baseline in the summary
    bootstrap_samples: int = 1000
    confidence: float = 0.95
    batch_size: int = 4
    seed: int = 0  # sampling and bootstrap

    def __post_init__(self):
        if not self.data:
            raise UserError("summarize needs data=FILE.jsonl (one {document, summary} object per line)")
        if self.template not in TEMPLATES:
            raise UserError(f"unknown summarization template {self.template!r}; use {', '.join(TEMPLATES)}")
        if self.max_new_tokens < 1 or self.batch_size < 1 or (self.max_docs is not None and self.max_docs < 1):
            raise UserError("max_new_tokens, batch_size and max_docs must be at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise UserError("temperature must be >= 0, top_p in (0, 1] and top_k >= 0")
        if self.bootstrap_samples < 0 or not 0 < self.confidence < 1:
            raise UserError("bootstrap_samples must be >= 0 and confidence in (0, 1)")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) and s for s in self.stop):
            raise UserError("stop must be a list of non-empty strings")


@dataclass(frozen=True)
class Doc:
    """One document of the data file."""

    index: int
    line: int
    doc_id: object
    document: str
    reference: str

    @property
    def key(self) -> str:
        return f"{self.index}|{hashlib.sha256(self.document.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------


def load_documents(
    path: str | Path,
    document_field: str = "document",
    summary_field: str = "summary",
    id_field: str | None = "id",
    max_docs: int | None = None,
) -> list[Doc]:
    """The documents of a JSONL file (blank lines skipped); a bad line is a UserError naming ``file:line``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"summarization data {path} does not exist (a JSONL file of {document_field}/{summary_field} objects)"
        )
    docs: list[Doc] = []
    with path.open("rb") as f:  # bytes: a line that is not UTF-8 is named like any other bad line
        for line_no, raw in enumerate(f, 1):
            if max_docs is not None and len(docs) >= max_docs:
                break
            where = f"{path}:{line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise UserError(f"{where}: not UTF-8 text (byte {e.start} of the line); is it a JSONL file?") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise UserError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for name in (document_field, summary_field):
                if name not in row:
                    raise UserError(f"{where}: no field {name!r} (fields: {', '.join(map(str, row)) or 'none'})")
                if not isinstance(row[name], str):
                    raise UserError(f"{where}: field {name!r} must be a string, got {type(row[name]).__name__}")
            doc_id = row.get(id_field) if id_field else None
            docs.append(Doc(len(docs), line_no, doc_id, row[document_field], row[summary_field]))
    if not docs:
        raise UserError(f"summarization data {path} holds no documents")
    return docs


# ---------------------------------------------------------------------------------------------
# Prompts and truncation
# ---------------------------------------------------------------------------------------------


def renderer(template: str, tokenizer: Tokenizer, instruction: str = DEFAULT_INSTRUCTION) -> Callable[[str], str]:
    """``document -> prompt text`` for a template."""
    if template == "drt":
        return lambda document: document + DRT_SUFFIX
    if template == "chat":
        if not getattr(tokenizer, "has_chat_template", False):
            raise UserError(
                f"template chat needs a tokenizer with a chat template; {tokenizer.spec!r} has none (use template=drt)"
            )
        return lambda document: tokenizer.chat_template([{"role": "user", "content": f"{instruction}\n\n{document}"}])
    raise UserError(f"unknown summarization template {template!r}; use {', '.join(TEMPLATES)}")


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # as the adapter encodes it (BOS included when the tokenizer adds one)
    document_tokens: int
    kept_tokens: int

    @property
    def truncated(self) -> bool:
        return self.kept_tokens < self.document_tokens


def fit_prompt(document: str, render: Callable[[str], str], tokenizer: Tokenizer, budget: int | None) -> Prompt:
    """The prompt of ``document``, its tail cut (in tokens) until the prompt has at most ``budget`` tokens."""
    text = render(document)
    n = len(tokenizer.encode(text))
    doc_ids = tokenizer.encode(document, add_bos=False)
    if budget is None or n <= budget:
        return Prompt(text, n, len(doc_ids), len(doc_ids))
    keep = len(doc_ids) - (n - budget)
    while keep > 0:
        text = render(tokenizer.decode(doc_ids[:keep]))
        n = len(tokenizer.encode(text))
        if n <= budget:
            return Prompt(text, n, len(doc_ids), keep)
        keep -= n - budget  # re-encoding a cut can merge tokens differently: shrink by the overshoot and retry
    raise UserError(f"the prompt template alone needs more than {budget} tokens (max_length minus max_new_tokens)")


def prompt_budget(config: SummarizeConfig, max_length: int | None) -> int | None:
    """Most prompt tokens: ``max_length - max_new_tokens``, capped by ``max_prompt_tokens``; None: no limit."""
    limits = [] if max_length is None else [max_length - config.max_new_tokens]
    limits += [] if config.max_prompt_tokens is None else [config.max_prompt_tokens]
    budget = min(limits) if limits else None
    if budget is not None and budget < 1:
        raise UserError(
            f"no room for a prompt: max_length {max_length}, max_new_tokens {config.max_new_tokens}, "
            f"max_prompt_tokens {config.max_prompt_tokens}"
        )
    return budget


def sample_seed(seed: int, key: str) -> int:
    """The sampling seed of one document: fixed by the run's seed and the document's key."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{key}".encode()).digest()[:4], "little") & 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# The task
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SummarizePlan(Plan):
    """The run resolved for one model: the prompt renderer, the prompt token budget, the documents and the data
    file's sha256."""

    render: Callable[[str], str]
    budget: int | None
    docs: list[Doc]
    data_sha256: str


@register_task
class SummarizeTask(ItemTask):
    """Summaries of a JSONL file's documents, scored with ROUGE; the lead-1 baseline beside them."""

    name = "summarize"
    command = "summarize"
    Config = SummarizeConfig

    def prepare(self, adapter: TextAdapter) -> SummarizePlan:
        config = self.config
        render = renderer(config.template, adapter.tokenizer, config.instruction)
        budget = prompt_budget(config, adapter.max_length)
        docs = load_documents(config.data, config.document_field, config.summary_field, config.id_field,
                              config.max_docs)  # fmt: skip
        data_sha256 = file_sha256([Path(config.data)])
        hashed = {k: v for k, v in asdict(config).items() if k not in UNHASHED}
        hashed["data"] = data_sha256  # the content, not where it lies
        if config.template != "chat":
            hashed["instruction"] = None
        shown = {**asdict(config), "data": str(config.data), "data_sha256": data_sha256}
        return SummarizePlan(config=hashed, shown=shown, render=render, budget=budget, docs=docs,
                             data_sha256=data_sha256)  # fmt: skip

    def default_dir(self, plan: SummarizePlan, adapter: TextAdapter, chash: str) -> Path:
        return RUNS_ROOT / self.name / f"{adapter.name}-{self.config.template}-{chash}"

    def items(self, plan: SummarizePlan, adapter: TextAdapter) -> list[Item]:
        return [Item((doc.key,), doc) for doc in plan.docs]

    def batches(self, plan: SummarizePlan, adapter: TextAdapter, items: Sequence[Item]) -> list[list[Item]]:
        """The documents :meth:`evaluate` summarises together (the prompt lengths decide them when greedy)."""
        jobs = [(it, fit_prompt(it.data.document, plan.render, adapter.tokenizer, plan.budget)) for it in items]
        return [[it for it, _ in batch] for batch in self._batches(jobs)]

    def _batches(self, jobs: list[tuple]) -> list[list[tuple]]:
        """``(x, Prompt)`` jobs in generation batches: greedy, similar lengths share a batch (less left padding);
        sampled, one at a time (each document's seed)."""
        sampling = self.config.temperature > 0
        if not sampling:
            jobs = sorted(jobs, key=lambda job: job[1].tokens)  # stable: ties keep the run order
        size = 1 if sampling else self.config.batch_size
        return [jobs[i : i + size] for i in range(0, len(jobs), size)]

    def evaluate(self, plan: SummarizePlan, adapter: TextAdapter, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        config, tok = self.config, adapter.tokenizer
        jobs = [(it.data, fit_prompt(it.data.document, plan.render, tok, plan.budget)) for it in items]
        sampling = config.temperature > 0
        for batch in self._batches(jobs):
            seed = sample_seed(config.seed, batch[0][0].key) if sampling else config.seed
            gen_config = GenerationConfig(
                config.max_new_tokens,
                config.temperature,
                config.top_p,
                list(config.stop),
                seed=seed,
                top_k=config.top_k,
            )
            generations = adapter.generate_until([p.text for _, p in batch], gen_config)
            for (doc, prompt), gen in zip(batch, generations, strict=True):
                yield self._record(plan, adapter, run, doc, prompt, gen, gen_config)

    def _record(self, plan: SummarizePlan, adapter, run, doc: Doc, prompt: Prompt, gen, gen_config) -> dict:
        prediction = gen.text.strip()
        scores = rouge_scores(prediction, doc.reference)
        if self.config.bpe_rouge:
            scores.update(bpe_rouge(prediction, doc.reference, adapter.tokenizer))
        return {
            "key": doc.key,
            "task": self.name,
            "subtask": self.config.template,
            "index": doc.index,
            "doc_id": doc.doc_id,
            "length": prompt.tokens,
            "document_tokens": prompt.document_tokens,
            "kept_document_tokens": prompt.kept_tokens,
            "truncated": prompt.truncated,
            "prompt_sha256": hashlib.sha256(prompt.text.encode("utf-8", "surrogatepass")).hexdigest(),
            "prediction": prediction,
            "reference": doc.reference,
            "finish_reason": gen.finish_reason,
            "generated_tokens": len(gen.token_ids),
            "scores": scores,
            "decoding": {
                "temperature": gen_config.temperature,
                "top_p": gen_config.top_p,
                "top_k": gen_config.top_k,
                "seed": gen_config.seed,
                "max_new_tokens": gen_config.max_new_tokens,
                "stop": gen_config.stop,
            },
            "config_hash": run.config_hash,
            "provenance": {
                **adapter.identity(),
                "data": f"{self.config.data}:{doc.line}",
                "data_sha256": plan.data_sha256,
                "git_commit": git_commit(),
            },
        }

    def aggregate(self, plan: SummarizePlan, rows: list[dict], adapter: TextAdapter, run: RunDir) -> tuple[list, dict]:
        config = self.config
        metrics = list(rows[0]["scores"]) if rows else []
        cis = self._cis({m: [r["scores"][m] for r in rows] for m in metrics})
        records = [
            {
                "model": adapter.name,
                "task": self.name,
                "subtask": config.template,
                "length": None,
                "depth": None,
                "metric": m,
                "value": ci["mean"],
                "n": ci["n"],
                "low": ci["low"],
                "high": ci["high"],
            }
            for m, ci in cis.items()
        ]
        lead = None
        if config.lead_baseline and rows:
            by_key = {d.key: d for d in plan.docs}
            lead_scores = [rouge_scores(lead_sentence(by_key[r["key"]].document), r["reference"]) for r in rows]
            lead = self._cis({m: [s[m] for s in lead_scores] for m in lead_scores[0]})
        summary = {
            "template": config.template,
            "decoding": "greedy"
            if config.temperature == 0
            else f"sampling (temperature {config.temperature}, "
            f"top_k {config.top_k or 'off'}, top_p {config.top_p}, per-document seeds from seed {config.seed})",
            "scale": "fractions in [0, 1] (x100 for the usual tables)",
            "documents": len(rows),
            "truncated": sum(bool(r["truncated"]) for r in rows),
            "mean_prompt_tokens": float(np.mean([r["length"] for r in rows])) if rows else None,
            "metrics": cis,
            "lead_baseline": lead,
            "bootstrap": {
                "samples": config.bootstrap_samples,
                "confidence": config.confidence,
                "seed": config.seed,
                "interval": "percentile",
                "resampled": "documents",
            },
        }
        if config.bpe_rouge:
            summary["bpe_rouge"] = (
                "bpe_rouge*: ROUGE-1/2/L over the model's token ids (clipped counts, plain LCS), "
                "DRT's flavour but not its exact script; not comparable with word-level ROUGE"
            )
        return records, summary

    def _cis(self, columns: dict) -> dict:
        return bootstrap_cis(columns, self.config.bootstrap_samples, self.config.confidence, self.config.seed)


def run_summarize(
    adapter: TextAdapter, config: SummarizeConfig, out_dir: Path | str | None = None, progress: bool = True
) -> dict:
    """Run or resume a summarization evaluation; returns ``results.json``'s content."""
    return run_task(SummarizeTask(config), adapter, out_dir, progress)
