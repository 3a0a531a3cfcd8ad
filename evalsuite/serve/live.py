"""Streamed text as tokens arrive: the deltas a client receives concatenate to exactly the non-streamed text."""

from __future__ import annotations

from evalsuite.generation.types import Generation
from evalsuite.tokenizers import Tokenizer


class LiveText:
    """The text of a generation sent as it grows. Held back: a trailing incomplete character (U+FFFD of a cut
    multi-byte sequence) and the last ``len(longest stop) - 1`` characters, which a stop string completed by a later
    token would remove -- a stop string that ends the generation starts at or after what has been sent, since the
    text sent before contained no whole stop string. :meth:`finish` sends the rest of the final text."""

    def __init__(self, tokenizer: Tokenizer, stop: list[str]):
        self.tokenizer = tokenizer
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.ids: list[int] = []
        self.sent = ""

    def add(self, ids: list[int]) -> str:
        """New token ids -> the text that is safe to send now (possibly empty)."""
        self.ids += ids
        text = self.tokenizer.decode(self.ids).rstrip("\ufffd")
        safe = text[: len(text) - self.hold] if self.hold else text
        if len(safe) <= len(self.sent) or not safe.startswith(self.sent):
            return ""  # the tokens changed how the text decodes (an escape, a character): wait for more
        delta, self.sent = safe[len(self.sent) :], safe
        return delta

    def finish(self, gen: Generation) -> str:
        """The rest of the final text."""
        rest = gen.text[len(self.sent) :] if gen.text.startswith(self.sent) else ""
        self.sent = gen.text
        return rest
