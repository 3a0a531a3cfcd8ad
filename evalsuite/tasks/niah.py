"""Needle in a haystack (FoX paper, arXiv:2503.02130, §4.3, Appendix B.3 and F.5), plus the text 2-hop test.

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

**2-hop** (:mod:`evalsuite.tasks.multihop`) hides two chained facts and a distractor chain (the same insertion
rule, generalised to several needles) and asks a question that needs both hops, with a 1-hop control over the
same context. The DRT paper's token-level multi-hop passkey is its own task, :mod:`evalsuite.tasks.drt_passkey`.

Runs write ``records.jsonl`` (one line per cell: length, depth, prompt hash, prediction, scores, the raw judge
reply) and, when done, ``results.json`` (long-format summary records). Rerunning resumes: finished cells are
skipped, cells whose judge call failed are judged again, and adding ``--judge`` to a finished run judges its
stored predictions without generating again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from evalsuite.adapters.base import TextAdapter
from evalsuite.data.haystack import (
    SYNTHETIC,
    Haystack,
    LastHaystack,
    decode_skip_special,
    haystack_identity,
    load_haystack,
)
from evalsuite.errors import UserError
from evalsuite.generation.types import GenerationConfig
from evalsuite.metrics.cells import cell_means, within_beyond
from evalsuite.metrics.judge import OpenAIJudge
from evalsuite.metrics.match import match_answer, phrase_position
from evalsuite.resources import task_presets
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.rundir import RunDir
from evalsuite.tasks import multihop
from evalsuite.tasks.base import RUNS_ROOT, Item, ItemTask, register_task, run_task
from evalsuite.tokenizers import Tokenizer

MODES = ("easy", "standard", "2hop")
AUTO = "auto"  # batch_size: prompts per call from free memory
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

    mode: str = "easy"  # easy | standard | 2hop (text; the DRT passkey is evalsuite.tasks.drt_passkey)
    preset: str | None = None  # cpu | fox; None: cpu on a CPU device, fox otherwise
    lengths: list[int] | None = None
    depths: list[float] | None = None
    samples: int | None = None  # per cell (2hop)
    haystack: str = SYNTHETIC
    max_new_tokens: int | None = None
    stop_newline: bool = False
    batch_size: int | str = 4  # prompts per generate call; "auto": as many as fit in free memory
    judge: str | None = None  # openai:MODEL
    seed: int = 0

    @property
    def label(self) -> str:
        """``easy``, ``standard`` or ``2hop``: the run's name part and the records' subtask root."""
        return self.mode


def load_presets() -> dict:
    """The grid presets of ``tasks/niah.yaml``."""
    return task_presets("niah")


def preset_for(name: str | None, device_type: str) -> tuple[str, dict]:
    """(name, preset): the named one, or ``cpu`` on a CPU device and ``fox`` otherwise."""
    presets = load_presets()
    name = name or ("cpu" if device_type == "cpu" else "fox")
    if name not in presets:
        raise UserError(f"unknown NIAH preset {name!r}; known: {', '.join(presets)}")
    return name, presets[name]


def resolve_config(config: NiahConfig, device_type: str = "cpu") -> NiahConfig:
    """Validate ``config`` and fill its open fields from the preset; the result is what gets hashed."""
    if config.mode not in MODES:
        raise UserError(f"unknown NIAH mode {config.mode!r}; use {', '.join(MODES)}")
    name, preset = preset_for(config.preset, device_type)
    lengths = sorted({int(x) for x in (config.lengths or preset["lengths"])})
    depths = sorted({_as_number(x) for x in (config.depths or preset["depths"])})
    samples = config.samples if config.samples is not None else int(preset.get("samples", 1))
    max_new = config.max_new_tokens if config.max_new_tokens is not None else int(preset["max_new_tokens"])
    if not lengths or min(lengths) < 1:
        raise UserError("NIAH lengths must be positive token counts")
    for d in depths:
        _check_depth(d)
    if samples < 1 or max_new < 1:
        raise UserError("--samples and --max-new-tokens must be at least 1")
    if config.batch_size != AUTO and not (isinstance(config.batch_size, int) and config.batch_size >= 1):
        raise UserError(f"--batch-size must be a positive integer or {AUTO!r}; got {config.batch_size!r}")
    if config.mode != "2hop" and samples != 1:
        raise UserError("--samples applies to --mode 2hop only (easy/standard cells are deterministic)")
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
    return ("2hop", "1hop") if config.mode == "2hop" else (config.mode,)


def cells_by_length(cells: Sequence[Cell], size: int | Callable[[int], int]) -> Iterator[list[Cell]]:
    """Up to ``size`` cells of one length at a time (``size(length)`` when callable): prompts of one length need
    (almost) no padding."""
    by_length: dict[int, list[Cell]] = {}
    for cell in cells:
        by_length.setdefault(cell.length, []).append(cell)
    for length, group in by_length.items():
        n = size(length) if callable(size) else size
        for i in range(0, len(group), n):
            yield group[i : i + n]


def items_by_length(items: Sequence[Item], size: int | Callable[[int], int]) -> list[list[Item]]:
    """:func:`cells_by_length` over items whose data are cells (the units a rank gets under torchrun)."""
    by_cell = {it.data: it for it in items}
    return [[by_cell[c] for c in group] for group in cells_by_length([it.data for it in items], size)]


def split_by_max_length(cells: list[Cell], max_length: int | None, model: str) -> tuple[list[Cell], list[dict]]:
    """(cells the model can take, notes on the lengths skipped beyond its max_length); none left is an error."""
    skipped = sorted({c.length for c in cells if max_length is not None and c.length > max_length})
    kept = [c for c in cells if c.length not in skipped]
    if not kept:
        raise UserError(f"every length of the grid exceeds model {model}'s max_length {max_length}")
    return kept, [{"length": L, "reason": f"beyond model {model}'s max_length {max_length}"} for L in skipped]


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
        job = Job(cell.key(config.mode), config.mode, cell, prompt, JUDGE_QUESTION, JUDGE_REFERENCE, KEY_PHRASES)
        job.extra = {"needle": needle}
        return [job]
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
# The task
# ---------------------------------------------------------------------------------------------


def run_dir_for(adapter_name: str, config: NiahConfig, chash: str) -> Path:
    return RUNS_ROOT / "niah" / f"{adapter_name}-{config.label}-{chash}"


@register_task
class NiahTask(ItemTask):
    """Generate an answer per prompt, score it offline (and with the judge when configured).

    Rerunning resumes: finished cells are skipped, cells whose judge call failed are judged again, and adding a
    judge to a finished run judges its stored predictions without generating again (the judge is not hashed).
    """

    name = "niah"
    Config = NiahConfig

    def __init__(self, config: NiahConfig | None = None, judge: OpenAIJudge | None = None):
        super().__init__(config)
        # built here, so a missing API key fails before any model work
        self.judge = (
            judge if judge is not None else (OpenAIJudge.from_spec(self.config.judge) if self.config.judge else None)
        )
        self._haystack = LastHaystack()

    def hashed_config(self, adapter: TextAdapter) -> dict:
        self.resolved = resolve_config(self.config, adapter.device.type)
        self._auto_sizes: dict[int, int] | None = None  # batch_size "auto": cells per call by length, once per run
        self.cells, self.skipped = split_by_max_length(grid_cells(self.resolved), adapter.max_length, adapter.name)
        hashed = {**asdict(self.resolved), "batch_size": None, "preset": None}  # neither changes a record
        hashed["haystack"] = haystack_identity(self.resolved.haystack, self.resolved.seed)
        return hashed

    def shown_config(self, hashed: dict) -> dict:
        return {**asdict(self.resolved), "haystack_id": hashed["haystack"]}

    def legacy_hashed_configs(self, adapter: TextAdapter, hashed: dict) -> list[dict]:
        """The legacy schema's config: these fields plus ``flavour: text`` (NIAH, as against the DRT passkey)."""
        return [{"task": "niah", **hashed, "flavour": "text"}]

    def default_dir(self, adapter: TextAdapter, chash: str) -> Path:
        return run_dir_for(adapter.name, self.resolved, chash)

    def items(self, adapter: TextAdapter) -> list[Item]:
        names = subtasks(self.resolved)
        return [Item(tuple(c.key(s) for s in names), c) for c in self.cells]

    def batches(self, adapter: TextAdapter, items: Sequence[Item]) -> list[list[Item]]:
        """The cells :meth:`evaluate` generates for together: up to a batch of prompts of one length."""
        return items_by_length(items, self._cells_per_call(adapter, len(subtasks(self.resolved))))

    def execute(self, adapter: TextAdapter, run: RunDir, progress: bool = True) -> list[dict]:
        if self.judge is not None:
            stale = [r for r in run.latest().values() if _needs_judge(r)]
            if run.world is not None:  # each rank re-judges its share
                stale = run.world.shard(stale)
            with progress_bar(len(stale), f"judge {adapter.name}", enabled=progress and bool(stale)) as bar:
                for record in stale:
                    run.append(_rejudge(record, self.judge))
                    bar.advance()
        return super().execute(adapter, run, progress)

    def evaluate(self, adapter: TextAdapter, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        if not items:
            return
        config, tok = self.resolved, adapter.tokenizer
        # FoX repeats a short haystack to the grid's longest length (the whole grid's, so a resumed run sees
        # the same text).
        haystack = self._haystack.get(config.haystack, tok, max(config.lengths), config.seed)
        done = run.latest()
        per_cell = len(subtasks(config))
        for batch in cells_by_length([it.data for it in items], self._cells_per_call(adapter, per_cell)):
            jobs = [j for c in batch for j in cell_jobs(config, c, haystack, tok) if j.key not in done]
            yield from self._answer(adapter, jobs, run.config_hash)

    def _cells_per_call(self, adapter: TextAdapter, per_cell: int) -> int | Callable[[int], int]:
        """Cells per generate call: ``batch_size`` prompts, or with ``auto`` per length what fits in free memory
        (:func:`evalsuite.generation.engine.prompts_per_call`)."""
        config = self.resolved
        if config.batch_size != AUTO:
            return max(1, config.batch_size // per_cell)
        if self._auto_sizes is None:  # once, before any generation: free memory with the weights alone loaded
            from evalsuite.generation.engine import prompts_per_call
            from evalsuite.runs import distributed

            new = config.max_new_tokens
            sizes = {n: max(1, prompts_per_call(adapter, n, new) // per_cell) for n in config.lengths}
            world = distributed.current()
            if world is not None:  # under torchrun every rank must form the same batches: the smallest fits all
                sizes = {n: min(s[n] for s in world.all_gather(sizes)) for n in sizes}
            self._auto_sizes = sizes
        return self._auto_sizes.__getitem__

    def _answer(self, adapter: TextAdapter, jobs: list[Job], chash: str) -> Iterator[dict]:
        """Generate for a batch of jobs (greedy, cached, batched), then score each answer."""
        config = self.resolved
        gen_config = GenerationConfig(
            max_new_tokens=config.max_new_tokens,
            temperature=0.0,
            stop=["\n"] if config.stop_newline else [],
            seed=config.seed,
        )
        generations = adapter.generate_until([j.prompt for j in jobs], gen_config)
        for job, gen in zip(jobs, generations, strict=True):
            prediction = gen.text.strip()  # FoX strips the decoded answer
            scores, verdict = score_job(job, prediction, self.judge)
            yield {
                "key": job.key,
                "task": "niah",
                "subtask": job.subtask,
                "length": job.cell.length,
                "depth": job.cell.depth,
                "sample": job.cell.sample,
                "prompt_sha256": prompt_sha256(job.prompt),
                "prompt_tokens": len(adapter.tokenizer.encode(job.prompt)),
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

    def aggregate(self, rows: list[dict], adapter: TextAdapter, run: RunDir) -> tuple[list[dict], dict]:
        records = cell_means(rows, adapter.name)
        summary = {
            "mode": self.resolved.mode,
            "label": self.resolved.label,
            "judge": self.judge.spec if self.judge is not None else _judge_of(rows),
            "skipped": self.skipped,
            "within_beyond": within_beyond(records, adapter.train_length),
        }
        return records, summary


def run_niah(
    adapter: TextAdapter,
    config: NiahConfig,
    out_dir: Path | None = None,
    *,
    judge: OpenAIJudge | None = None,
    progress: bool = True,
) -> dict:
    """Run, resume or re-judge a NIAH evaluation; returns ``results.json``'s content.

    ``config.judge`` (``openai:MODEL``) builds the judge before anything is generated (a missing key fails
    first); or pass a ready ``judge``.
    """
    return run_task(NiahTask(config, judge), adapter, out_dir, progress)


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
