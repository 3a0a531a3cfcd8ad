"""The FoX needle-in-a-haystack judge, through any OpenAI-compatible chat-completions endpoint.

FoX (``eval/niah/eval.py``, adapted from LongAlign) asks GPT-4o-2024-08-06 at temperature 0, with the
system message "You are a helpful assistant." and the user message :data:`JUDGE_TEMPLATE` below (verbatim,
including its "small language model" wording and the "numberical" typo of the criteria), to rate an answer
from 1 to 10; the rating is the first ``[[N]]`` in the reply. Here the call goes through the ``openai``
SDK, so any compatible server works: the key comes from ``$OPENAI_API_KEY`` and the endpoint from
``$OPENAI_BASE_URL`` (the SDK's own variables; unset means api.openai.com). The client and its retry policy
are :mod:`evalsuite.openai_client`'s, shared with the ``openai:`` model adapter.

Failures: 429, 5xx, 408/409, timeouts, dropped connections and malformed replies are retried with exponential
backoff (honouring ``Retry-After``); after the last attempt the score is recorded as missing with the error, so a
resumed run can try again. Other HTTP errors (bad key, unknown model, bad request) stop the run with a
:class:`UserError`: retrying cannot fix them. A reply without ``[[N]]`` is kept and scored as missing.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from evalsuite.errors import UserError
from evalsuite.openai_client import OpenAIClient, RequestFailed, RequestRejected

JUDGE_SYSTEM = "You are a helpful assistant."

# FoX's user template, verbatim (its placeholders: criteria, reference, input, prediction).
JUDGE_TEMPLATE = (
    "[Instruction]\nPlease act as an impartial judge and evaluate the quality of the response provided by small "
    "language model to a question displayed below. {criteria}[Ground truth]\n{reference}\nRemember that the model "
    "is small and not instruction-tuned so it may output additional garbage content and have strange formatting. "
    "These should absolutely not affect your rating as long as the ground truth is included in the model's "
    "response. Only give your rating based on the relevant (if any) part of the response. Begin your evaluation by "
    "providing a short explanation. Be as objective as possible. After providing your explanation, you must rate "
    'the response on a scale of 1 to 10 by strictly following this format: "[[rating]]", for example: "Rating: '
    '[[5]]". Some bad models might give empty response in which case you should give the lowest score.\n\n'
    "[Question]\n{input}\n\n[The Start of the Model's Answer]\n{prediction}\n[The End of the Model's Answer]"
)

# The "accuracy" criterion as FoX writes it: an indented triple-quoted string, so every line carries the
# four-space indentation and the text starts and ends with a newline (+ indentation).
ACCURACY_CRITERION = (
    "\n"
    "    Score 1: The answer is completely unrelated to the reference.\n"
    "    Score 3: The answer has minor relevance but does not align with the reference.\n"
    "    Score 5: The answer has moderate relevance but contains inaccuracies.\n"
    "    Score 7: The answer aligns with the reference but has minor omissions.\n"
    "    Score 10: The answer is completely accurate and aligns perfectly with the reference.\n"
    "    Only respond with a numberical score\n"
    "    "
)
JUDGE_CRITERIA = (
    "For this evaluation, you should primarily consider the following criteria:\n" + f"accuracy: {ACCURACY_CRITERION}\n"
)

RATING = re.compile(r"\[\[(\d+)\]\]")


def judge_message(question: str, reference: str, prediction: str) -> str:
    """The user message FoX sends for one answer."""
    return JUDGE_TEMPLATE.format(criteria=JUDGE_CRITERIA, reference=reference, input=question, prediction=prediction)


def parse_rating(reply: str | None) -> int | None:
    """The first ``[[N]]`` of a judge reply as an int, or None when there is none."""
    match = RATING.search(reply or "")
    return int(match.group(1)) if match else None


@dataclass
class JudgeResult:
    """One judged answer. ``score`` is None when the reply had no ``[[N]]`` or every attempt failed."""

    model: str
    score: int | None
    reply: str | None
    error: str | None
    attempts: int

    def to_dict(self) -> dict:
        return asdict(self)


def parse_judge_spec(spec: str) -> str:
    """``openai:MODEL`` -> MODEL; UserError for anything else."""
    provider, _, model = spec.partition(":")
    if provider != "openai" or not model:
        raise UserError(f"unknown judge {spec!r}; use openai:MODEL (e.g. openai:gpt-4o-2024-08-06)")
    return model


class OpenAIJudge:
    """Rates answers 1-10 with the FoX judge prompt on an OpenAI-compatible endpoint.

    The HTTP client and its retry policy are :class:`~evalsuite.openai_client.OpenAIClient`, shared with the
    ``openai:`` adapter.

    Args:
        model: the judge model name sent to the endpoint.
        client_options: :class:`~evalsuite.openai_client.OpenAIClient`'s (``api_key``, ``base_url``, ``env``,
            ``max_attempts`` (FoX: 5, the default), ``backoff``, ``max_backoff``, ``timeout``, ``sleep``); a missing
            key is a UserError raised here, so a run fails before it generates anything.
    """

    def __init__(self, model: str, **client_options):
        self.model = model
        self.client = OpenAIClient(purpose="the judge", **client_options)

    @classmethod
    def from_spec(cls, spec: str, **kwargs) -> OpenAIJudge:
        """A judge from ``openai:MODEL``."""
        return cls(parse_judge_spec(spec), **kwargs)

    @property
    def spec(self) -> str:
        return f"openai:{self.model}"

    def rate(self, question: str, reference: str, prediction: str) -> JudgeResult:
        """Judge one answer; never raises for transient failures (see the module docstring)."""
        messages = [
            {"role": "system", "content": JUDGE_SYSTEM},
            {"role": "user", "content": judge_message(question, reference, prediction)},
        ]
        body = {"model": self.model, "messages": messages, "temperature": 0}
        try:
            reply = self.client.post("chat", body)
        except RequestRejected as e:
            raise UserError(f"judge request to {self.model} failed ({e.status}): {e.message}") from None
        except RequestFailed as e:
            return JudgeResult(self.model, None, None, str(e), e.attempts)
        choices = reply.data.get("choices") or []
        content = (choices[0].get("message") or {}).get("content") if choices else None
        return JudgeResult(self.model, parse_rating(content), content or "", None, reply.attempts)
