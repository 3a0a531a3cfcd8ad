"""Needle in a haystack (FoX paper §4.3, Appendix B.3 and F.5; fox.md §4), plus the 2-hop tests.

**Easy and standard modes** reproduce the FoX test (``eval/niah``, adapted from LongAlign's ``Needle_test``,
itself from gkamradt's tester) prompt for prompt. For a cell (context length ``L`` tokens, depth ``d`` %):

1. the haystack (:mod:`evalsuite.data.haystack`) is cut to its first ``L`` tokens, BOS counted, and decoded;
2. that text is re-encoded without BOS, cut to ``L - 200 - len(needle)`` tokens when text + needle would
   exceed ``L - 200`` (the 200-token buffer), and the needle goes in at token ``int(len * d / 100)``, moved
   back to just after the previous ``.`` token (id 13 in GPT-2); at ``d = 100`` it is appended;
3. the result is decoded, and the prompt is ``context + QUIZ + question``: the quiz sentence and the
   completion cue "... Answer: The best thing to do in San Francisco is". No chat template.

Standard mode hides the plain San Francisco needle; easy mode's needle also carries the question, so the
model can answer by copying. With the FoX tokenizer (JSON-escaped GPT-2, BOS counted) and the haystack files
in sorted order, :func:`build_prompt` returns exactly the text FoX's ``prompt.py`` writes for the cell.

**2-hop** (:mod:`evalsuite.tasks.multihop`): ``text`` hides two chained facts and a distractor chain (the
same insertion rule, generalised to several needles) and asks a question that needs both hops, with a 1-hop
control over the same context; ``drt`` is the DRT paper's token-level multi-hop passkey, teacher-forced.

Runs write ``records.jsonl`` (one line per cell: length, depth, prompt hash, prediction, scores, the raw judge
reply) and, when done, ``results.json`` (long-format summary records). Rerunning resumes: finished cells are
skipped, cells whose judge call failed are judged again, and adding ``--judge`` to a finished run judges its
stored predictions without generating again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from evalsuite.adapters.base import Adapter, GenerationConfig
from evalsuite.cards import builtin_dir
from evalsuite.data.haystack import SYNTHETIC, Haystack, decode_skip_special, haystack_identity, load_haystack
from evalsuite.errors import UserError
from evalsuite.metrics.judge import OpenAIJudge
from evalsuite.metrics.match import match_answer, phrase_position
from evalsuite.progress import progress_bar
from evalsuite.provenance import provenance
from evalsuite.store import RECORDS_FILE, RESULTS_FILE, append_jsonl, atomic_write_json, config_hash, read_jsonl
from evalsuite.tasks import multihop
from evalsuite.tokenizers import Tokenizer

MODES = ("easy", "standard", "2hop")
FLAVOURS = ("text", "drt")
BUFFER = 200  # FoX/gkamradt "final_context_length_buffer"

# FoX's strings (config-prompt-{easy,standard}.yaml, prompt.py, config-eval.yaml), verbatim.
STANDARD_NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
EASY_NEEDLE = (
    "\nWhat is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is eat a "
    "sandwich and sit in Dolores Park on a sunny day.\n"
)
QUESTION = "What is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is"
JUDGE_QUESTION = "What is the best thing to do in San Francisco?"
JUDGE_REFERENCE = STANDARD_NEEDLE
QUIZ = (
    "\n\nThere is an important piece of information hidden inside the above document. Now that you've read the "
    "document, I will quiz you about it. Answer the following question: "
)
# The offline scorer's key phrases for the San Francisco fact (metrics/match.py has the rule).
KEY_PHRASES = ("eat a sandwich", "dolores park")

MANIFEST = "config.json"


# ---------------------------------------------------------------------------------------------
# Prompts
# ---------------------------------------------------------------------------------------------


def insert_needles(context: str, needles: Sequence[tuple[str, float]], length: int, tokenizer: Tokenizer) -> str:
    """FoX's ``insert_needle``, generalised to several needles; with one needle it is FoX's exactly.

    The context is encoded without BOS and, when context + needles exceed ``length - 200`` tokens, cut to
    ``length - 200 - len(needles)``. Each needle's point is ``int(n * depth / 100)`` on that cut context,
    moved back to just after the previous ``.`` token (or the start); depth 100 means the end. Needles
    sharing a point keep the given order. Returns the decoded text.
    """
    tokens = tokenizer.encode(context, add_bos=False)
    needle_ids = [tokenizer.encode(text, add_bos=False) for text, _ in needles]
    period = set(tokenizer.encode(".", add_bos=False))
    limit = length - BUFFER
    total = sum(map(len, needle_ids))
    if limit - total < 1:
        raise UserError(f"length {length} is too short for the {BUFFER}-token buffer and {total} needle tokens")
    if len(tokens) + total > limit:
        tokens = tokens[: limit - total]
    points = []
    for _, depth in needles:
        if depth == 100:
            points.append(len(tokens))
            continue
        point = int(len(tokens) * (depth / 100))
        while point > 0 and tokens[point - 1] not in period:
            point -= 1
        points.append(point)
    out: list[int] = []
    prev = 0
    for i in sorted(range(len(needles)), key=lambda i: (points[i], i)):
        out += tokens[prev : points[i]] + needle_ids[i]
        prev = points[i]
    out += tokens[prev:]
    return decode_skip_special(tokenizer, out)


def needle_prompt(
    haystack: Haystack, tokenizer: Tokenizer, length: int, needles: Sequence[tuple[str, float]], question: str
) -> str:
    """``context + QUIZ + question`` for a cell with the given needles."""
    context = insert_needles(haystack.context(length, tokenizer), needles, length, tokenizer)
    return context + QUIZ + question


def build_prompt(
    tokenizer: Tokenizer,
    mode: str,
    length: int,
    depth: float,
    haystack: Haystack | str = SYNTHETIC,
    *,
    grid_max_length: int | None = None,
    seed: int = 0,
) -> str:
    """The prompt text of an easy/standard cell, exactly as FoX builds it.

    ``haystack`` is a loaded :class:`Haystack` or a source (``synthetic`` or a path), loaded here for a grid
    whose longest length is ``grid_max_length`` (default ``length``; FoX repeats a short haystack until it
    covers the grid's longest length, which can shift a short haystack's text at the repeat seam).
    """
    if mode not in ("easy", "standard"):
        raise UserError(f"build_prompt covers the easy and standard modes, not {mode!r}")
    _check_depth(depth)
    if not isinstance(haystack, Haystack):
        haystack = load_haystack(haystack, tokenizer, max(grid_max_length or length, length), seed)
    needle = EASY_NEEDLE if mode == "easy" else STANDARD_NEEDLE
    return needle_prompt(haystack, tokenizer, length, [(needle, depth)], QUESTION)


def two_hop_prompts(haystack: Haystack, tokenizer: Tokenizer, length: int, item: multihop.TwoHopItem) -> dict:
    """The 2-hop prompt and its 1-hop control (same context, question about the town): {hops: prompt}."""
    context = insert_needles(haystack.context(length, tokenizer), item.needles(), length, tokenizer)
    return {hops: context + QUIZ + item.question(hops) for hops in (2, 1)}


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()


def _check_depth(depth: float) -> None:
    if not 0 <= depth <= 100:
        raise UserError(f"needle depth {depth} is outside 0..100 (percent)")


# ---------------------------------------------------------------------------------------------
# Configuration and grid
# ---------------------------------------------------------------------------------------------


@dataclass
class NiahConfig:
    """One NIAH run. ``None`` fields come from the preset (tasks/niah.yaml)."""

    mode: str = "easy"
    flavour: str = "text"  # 2hop only: text | drt
    preset: str | None = None  # cpu | fox; None: cpu on a CPU device, fox otherwise
    lengths: list[int] | None = None
    depths: list[float] | None = None
    samples: int | None = None  # per cell (2hop)
    haystack: str = SYNTHETIC
    max_new_tokens: int | None = None
    stop_newline: bool = False
    batch_size: int = 4
    judge: str | None = None  # openai:MODEL
    seed: int = 0

    @property
    def label(self) -> str:
        """``easy``, ``standard``, ``2hop`` or ``2hop-drt``: the run's name part and the task's subtask root."""
        return "2hop-drt" if self.mode == "2hop" and self.flavour == "drt" else self.mode


def load_presets() -> dict:
    """The grid presets of ``tasks/niah.yaml``."""
    path = builtin_dir("tasks") / "niah.yaml"
    try:
        presets = yaml.safe_load(path.read_text(encoding="utf-8"))["presets"]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise UserError(f"cannot read NIAH presets from {path}: {e}") from None
    return presets


def resolve_config(config: NiahConfig, device_type: str = "cpu") -> NiahConfig:
    """Validate ``config`` and fill its open fields from the preset; the result is what gets hashed."""
    if config.mode not in MODES:
        raise UserError(f"unknown NIAH mode {config.mode!r}; use one of {', '.join(MODES)}")
    if config.flavour not in FLAVOURS:
        raise UserError(f"unknown 2-hop flavour {config.flavour!r}; use one of {', '.join(FLAVOURS)}")
    if config.mode != "2hop" and config.flavour != "text":
        raise UserError("--flavour applies to --mode 2hop only")
    presets = load_presets()
    name = config.preset or ("cpu" if device_type == "cpu" else "fox")
    if name not in presets:
        raise UserError(f"unknown NIAH preset {name!r}; presets: {', '.join(presets)}")
    preset = presets[name]
    drt = config.label == "2hop-drt"
    grid = preset["drt"] if drt else preset
    lengths = sorted({int(x) for x in (config.lengths or grid["lengths"])})
    depths = [] if drt else sorted({_as_number(x) for x in (config.depths or grid["depths"])})
    samples = config.samples if config.samples is not None else int(grid.get("samples", 1))
    max_new = config.max_new_tokens if config.max_new_tokens is not None else int(preset["max_new_tokens"])
    if not lengths or min(lengths) < 1:
        raise UserError("NIAH lengths must be positive token counts")
    for d in depths:
        _check_depth(d)
    if samples < 1 or max_new < 1 or config.batch_size < 1:
        raise UserError("--samples, --max-new-tokens and --batch-size must be at least 1")
    if config.mode != "2hop" and samples != 1:
        raise UserError("--samples applies to --mode 2hop only (easy/standard cells are deterministic)")
    if drt and config.judge:
        raise UserError("the DRT 2-hop test is scored teacher-forced; --judge does not apply")
    return replace(
        config, preset=name, lengths=lengths, depths=depths, samples=samples, max_new_tokens=max_new, judge=None
    )


def _as_number(x) -> float | int:
    x = float(x)
    return int(x) if x.is_integer() else x


@dataclass(frozen=True)
class Cell:
    """One grid point. ``depth`` is None for the DRT test (random needle positions)."""

    length: int
    depth: float | None
    sample: int = 0

    def key(self, subtask: str) -> str:
        depth = "-" if self.depth is None else f"{self.depth:g}"
        return f"{subtask}|{self.length}|{depth}|{self.sample}"


def grid_cells(config: NiahConfig) -> list[Cell]:
    """Cells in run order: by length, then depth, then sample (similar lengths share a batch)."""
    depths = config.depths or [None]
    return [Cell(L, d, s) for L in config.lengths for d in depths for s in range(config.samples)]


def subtasks(config: NiahConfig) -> tuple[str, ...]:
    """The record subtasks a cell produces."""
    if config.label == "2hop":
        return ("2hop", "1hop")
    return (config.label,)


# ---------------------------------------------------------------------------------------------
# Jobs: the prompts of a cell and how to score their answers
# ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One prompt to generate from and everything needed to score its answer."""

    key: str
    subtask: str
    cell: Cell
    prompt: str
    judge_question: str
    judge_reference: str
    key_phrases: tuple[str, ...]
    distractors: tuple[tuple[str, ...], ...] = ()
    bridge: str | None = None
    extra: dict = field(default_factory=dict)


def cell_jobs(config: NiahConfig, cell: Cell, haystack: Haystack, tokenizer: Tokenizer) -> list[Job]:
    """The generation jobs of a cell: one for easy/standard, the 2-hop prompt and its 1-hop control for 2hop."""
    if config.mode in ("easy", "standard"):
        prompt = build_prompt(tokenizer, config.mode, cell.length, cell.depth, haystack)
        needle = EASY_NEEDLE if config.mode == "easy" else STANDARD_NEEDLE
        return [
            Job(
                cell.key(config.mode),
                config.mode,
                cell,
                prompt,
                JUDGE_QUESTION,
                JUDGE_REFERENCE,
                KEY_PHRASES,
                extra={"needle": needle},
            )
        ]
    item = multihop.two_hop_item(cell.length, cell.depth, cell.sample, config.seed)
    prompts = two_hop_prompts(haystack, tokenizer, cell.length, item)
    jobs = []
    for hops, subtask in ((2, "2hop"), (1, "1hop")):
        jobs.append(
            Job(
                cell.key(subtask),
                subtask,
                cell,
                prompts[hops],
                item.judge_question(hops),
                item.judge_reference(hops),
                (item.target.activity,),
                ((item.distractor.activity,),),
                bridge=item.target.town if hops == 2 else None,
                extra={"item": item.to_dict()},
            )
        )
    return jobs


def score_job(job: Job, prediction: str, judge: OpenAIJudge | None) -> tuple[dict, dict | None]:
    """(scores, judge record) for one answer: offline match always, the judge when configured."""
    m = match_answer(prediction, job.key_phrases, job.distractors)
    scores = {"match": m.match, "score": m.score, "recall": m.recall}
    if job.bridge is not None:
        scores["bridge_stated"] = int(phrase_position(job.bridge, prediction) is not None)
    verdict = None
    if judge is not None:
        result = judge.rate(job.judge_question, job.judge_reference, prediction)
        scores["judge"] = result.score
        verdict = result.to_dict()
    return scores, verdict


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def run_dir_for(adapter_name: str, config: NiahConfig, chash: str) -> Path:
    return Path("results/runs/niah") / f"{adapter_name}-{config.label}-{chash}"


def run_niah(
    adapter: Adapter,
    config: NiahConfig,
    out_dir: Path | None = None,
    *,
    judge: OpenAIJudge | None = None,
    progress: bool = True,
) -> dict:
    """Run, resume or re-judge a NIAH evaluation; returns ``results.json``'s content.

    ``config.judge`` (``openai:MODEL``) builds the judge here, before anything is generated (a missing
    key fails first); or pass a ready ``judge``. The run directory's hash leaves the judge out, so judging
    a finished run later reuses its predictions.
    """
    device_type = getattr(getattr(adapter, "device", None), "type", "cpu")
    resolved = resolve_config(config, device_type)
    if judge is None and config.judge:
        judge = OpenAIJudge.from_spec(config.judge)
    if resolved.label == "2hop-drt" and judge is not None:
        raise UserError("the DRT 2-hop test is scored teacher-forced; --judge does not apply")
    tok = adapter.tokenizer
    prov = adapter.provenance()
    identity = {k: prov.get(k) for k in ("model", "checkpoint_sha256", "tokenizer", "dtype")}
    hashed = {**asdict(resolved), "batch_size": None, "preset": None}  # neither changes a record
    hashed["haystack"] = haystack_identity(resolved.haystack, resolved.seed)
    chash = config_hash({"task": "niah", **hashed, **identity})
    out_dir = Path(out_dir or run_dir_for(adapter.name, resolved, chash))
    _claim_dir(out_dir, chash, resolved)

    max_length = getattr(adapter, "max_length", None)
    cells = grid_cells(resolved)
    skipped = sorted({c.length for c in cells if max_length is not None and c.length > max_length})
    cells = [c for c in cells if c.length not in skipped]
    if not cells:
        raise UserError(f"every length of the grid exceeds model {adapter.name}'s max_length {max_length}")

    records_path = out_dir / RECORDS_FILE
    done = _latest(read_jsonl(records_path))
    names = subtasks(resolved)
    pending = [c for c in cells if any(c.key(s) not in done for s in names)]
    rejudge = [] if judge is None else [r for r in done.values() if _needs_judge(r)]

    if pending:
        # FoX repeats a short haystack to the grid's longest length (the whole grid's, so a resumed run sees
        # the same text); the DRT test takes one window per sample.
        n_tokens = max(resolved.lengths) * (resolved.samples if resolved.label == "2hop-drt" else 1)
        haystack = load_haystack(resolved.haystack, tok, n_tokens, resolved.seed)
    with progress_bar(len(pending) + len(rejudge), f"niah {resolved.label} {adapter.name}", enabled=progress) as bar:
        for record in rejudge:
            append_jsonl(records_path, _rejudge(record, judge))
            bar.advance()
        if resolved.label == "2hop-drt":
            for batch in _batches(pending, resolved.batch_size):
                for record in _drt_records(adapter, resolved, batch, haystack, chash):
                    append_jsonl(records_path, record)
                bar.advance(len(batch))
        else:
            per_cell = len(names)
            for batch in _batches(pending, max(1, resolved.batch_size // per_cell)):
                jobs = [j for c in batch for j in cell_jobs(resolved, c, haystack, tok) if j.key not in done]
                for record in _generate_records(adapter, resolved, jobs, judge, chash):
                    append_jsonl(records_path, record)
                bar.advance(len(batch))

    final = _latest(read_jsonl(records_path))
    keys = [c.key(s) for c in cells for s in names]
    rows = [final[k] for k in keys if k in final]
    from evalsuite.report.niah import summary_records, within_beyond

    train_length = getattr(getattr(adapter, "card", None), "train_length", None)
    records = summary_records(rows, adapter.name)
    results = {
        "task": "niah",
        "model": adapter.name,
        "mode": resolved.mode,
        "label": resolved.label,
        "train_length": train_length,
        "max_length": max_length,
        "config": asdict(resolved),
        "config_hash": chash,
        "judge": judge.spec if judge is not None else _judge_of(rows),
        "skipped": [{"length": L, "reason": f"beyond model {adapter.name}'s max_length {max_length}"} for L in skipped],
        "provenance": provenance(**prov, seed=resolved.seed),
        "records": records,
        "summary": within_beyond(records, train_length),
    }
    atomic_write_json(out_dir / RESULTS_FILE, results)
    return results


def _claim_dir(out_dir: Path, chash: str, config: NiahConfig) -> None:
    """Write the manifest on first use; a directory holding another configuration's records is an error."""
    manifest = out_dir / MANIFEST
    if manifest.exists():
        try:
            old = json.loads(manifest.read_text(encoding="utf-8")).get("config_hash")
        except (OSError, json.JSONDecodeError):
            old = None
        if old != chash:
            raise UserError(f"{out_dir} holds a NIAH run with another configuration; choose another --out")
        return
    if (out_dir / RECORDS_FILE).exists():
        raise UserError(f"{out_dir} has records but no {MANIFEST}; choose another --out")
    atomic_write_json(manifest, {"task": "niah", "config_hash": chash, "config": asdict(config)})


def _latest(rows: list[dict]) -> dict[str, dict]:
    """Records by key; a later line for the same key (a re-judged answer) replaces the earlier one."""
    out: dict[str, dict] = {}
    for row in rows:
        if "key" in row:
            out[row["key"]] = row
    return out


def _needs_judge(record: dict) -> bool:
    """No verdict yet, or the last judge call failed (an unparseable reply is final, not retried)."""
    verdict = record.get("judge")
    return verdict is None or verdict.get("error") is not None


def _judge_of(rows: list[dict]) -> str | None:
    """The judge named in the records (``openai:MODEL``), several joined by commas, or None."""
    models = sorted({r["judge"]["model"] for r in rows if r.get("judge")})
    return ",".join(f"openai:{m}" for m in models) or None


def _rejudge(record: dict, judge: OpenAIJudge) -> dict:
    result = judge.rate(record["judge_question"], record["judge_reference"], record["prediction"])
    scores = {**record["scores"], "judge": result.score}
    return {**record, "scores": scores, "judge": result.to_dict()}


def _batches(cells: list[Cell], size: int) -> Iterator[list[Cell]]:
    """Up to ``size`` cells of one length at a time: prompts of one length need (almost) no padding."""
    by_length: dict[int, list[Cell]] = {}
    for cell in cells:
        by_length.setdefault(cell.length, []).append(cell)
    for group in by_length.values():
        for i in range(0, len(group), size):
            yield group[i : i + size]


def _generate_records(
    adapter: Adapter, config: NiahConfig, jobs: list[Job], judge: OpenAIJudge | None, chash: str
) -> Iterator[dict]:
    """Generate for a batch of jobs (greedy, cached, batched), then score each answer."""
    if not jobs:
        return
    tok = adapter.tokenizer
    prompts = [tok.encode(j.prompt) for j in jobs]
    gen_config = GenerationConfig(
        max_new_tokens=config.max_new_tokens,
        temperature=0.0,
        stop=["\n"] if config.stop_newline else [],
        seed=config.seed,
    )
    for job, ids, gen in zip(jobs, prompts, adapter.generate(prompts, gen_config), strict=True):
        prediction = gen.text.strip()  # FoX strips the decoded answer
        scores, verdict = score_job(job, prediction, judge)
        yield {
            "key": job.key,
            "task": "niah",
            "subtask": job.subtask,
            "length": job.cell.length,
            "depth": job.cell.depth,
            "sample": job.cell.sample,
            "prompt_sha256": prompt_sha256(job.prompt),
            "prompt_tokens": len(ids),
            "prediction": prediction,
            "finish_reason": gen.finish_reason,
            "generated_tokens": len(gen.token_ids),
            "scores": scores,
            "judge": verdict,
            "judge_question": job.judge_question,
            "judge_reference": job.judge_reference,
            "key_phrases": list(job.key_phrases),
            **job.extra,
            "config_hash": chash,
        }


def _drt_records(adapter: Adapter, config: NiahConfig, cells: list[Cell], haystack: Haystack, chash: str):
    """Teacher-forced DRT samples for a batch of same-length cells: one forward pass."""
    tok, length = adapter.tokenizer, cells[0].length
    samples = []
    for cell in cells:
        rng = np.random.default_rng([config.seed, length, cell.sample])
        # Non-overlapping haystack windows, one per sample (wrapping around a short haystack), BOS kept first.
        window = haystack.ids[: haystack.n_prefix] + haystack.tokens(cell.sample * length, length - haystack.n_prefix)
        samples.append(multihop.drt_sample(window, tok, rng, keep_prefix=haystack.n_prefix))
    for cell, sample, scores in zip(cells, samples, multihop.drt_scores(adapter, samples), strict=True):
        yield {
            "key": cell.key("2hop-drt"),
            "task": "niah",
            "subtask": "2hop-drt",
            "length": length,
            "depth": None,
            "sample": cell.sample,
            "prompt_sha256": hashlib.sha256(json.dumps(sample.input_ids).encode()).hexdigest(),
            "prompt_tokens": len(sample.input_ids),
            "prediction": scores.pop("predicted_ids"),
            "answer": scores.pop("answer_ids"),
            "scores": scores,
            "judge": None,
            "needle_starts": sample.needle_starts,
            "query_start": sample.query_start,
            "answer_start": sample.answer_start,
            "config_hash": chash,
        }
