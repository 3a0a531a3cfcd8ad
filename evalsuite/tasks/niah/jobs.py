"""The jobs of a NIAH cell (each prompt to generate from, with what scores its answer) and the scoring."""

from __future__ import annotations

from dataclasses import dataclass, field

from evalsuite.data.haystack import Haystack
from evalsuite.metrics.judge import OpenAIJudge
from evalsuite.metrics.match import match_answer, phrase_position
from evalsuite.tasks import multihop
from evalsuite.tasks.niah.grid import Cell, NiahConfig
from evalsuite.tasks.niah.prompts import (
    EASY_NEEDLE,
    JUDGE_QUESTION,
    JUDGE_REFERENCE,
    KEY_PHRASES,
    STANDARD_NEEDLE,
    build_prompt,
    two_hop_prompts,
)
from evalsuite.tokenizers import Tokenizer


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
