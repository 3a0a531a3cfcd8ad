"""How each row of a generation ends: :class:`Finisher`, the one place that decides it, for the decode engine's
whole-call :func:`~evalsuite.generation.engine.generate` and for a caller that steps a
:class:`~evalsuite.generation.steps.DecodeRun` (the serve scheduler) alike."""

from __future__ import annotations

from collections.abc import Sequence

from evalsuite.generation.types import Generation, GenerationConfig, apply_stop


class Finisher:
    """How each row ends, decided on the host token by token, each row under its own config (``configs``, one per
    row; ``eos``: the tokenizer's EOS id, or None). EOS ends a row whose config stops at EOS (the EOS is not kept);
    a token of the row's ``stop_token_ids`` ends it (kept in the ids, its text not in the text, as vLLM does); else
    the token is kept, and a stop string in the decoded text ends the row (the text cut before it, the token ids up
    to this token) -- once the row has ``min_tokens`` tokens, and then only a stop string that ends in the text of
    those tokens' successors or the last of them; a row that has taken ``max_new_tokens`` tokens ends for
    ``"length"``, as do rows still open at the end. Tokens after a row's end are ignored, so feeding a block of
    tokens at once gives the same result as one at a time."""

    def __init__(self, tokenizer, configs: Sequence[GenerationConfig], eos: int | None):
        self.tokenizer, self.configs = tokenizer, list(configs)
        self.eos = [eos if c.stop_at_eos else None for c in self.configs]
        self.stop_ids = [frozenset(c.stop_token_ids) for c in self.configs]
        B = len(self.configs)
        self.floor = [0] * B  # characters of text before which no stop string may end (min_tokens)
        self.taken = [0] * B  # tokens fed to the row, an EOS included
        self.new: list[list[int]] = [[] for _ in range(B)]
        self.results: list[Generation | None] = [None] * B

    def feed(self, rows: Sequence[Sequence[int]]) -> None:
        """``rows[b]``: row b's next tokens, in order."""
        for b, tokens in enumerate(rows):
            for tok in tokens:
                if self.results[b] is not None:
                    break
                self.results[b] = self._take(b, tok)

    def _take(self, b: int, tok: int) -> Generation | None:
        """Row b's result once ``tok`` ends it, else None."""
        config, new = self.configs[b], self.new[b]
        self.taken[b] += 1
        if tok == self.eos[b]:
            return Generation(self.tokenizer.decode(new), new, "eos")
        new.append(tok)
        if tok in self.stop_ids[b]:
            return Generation(self.tokenizer.decode(new[:-1]), new, "stop")
        if config.stop and len(new) >= config.min_tokens:
            if len(new) == config.min_tokens > 1:  # stop strings count from here (vLLM): past the text made so far
                self.floor[b] = len(self.tokenizer.decode(new[:-1]))
            text, stopped = apply_stop(self.tokenizer.decode(new), config.stop, self.floor[b])
            if stopped:
                return Generation(text, new, "stop")
        if self.taken[b] >= config.max_new_tokens:
            return Generation(self.tokenizer.decode(new), new, "length")
        return None

    def all_done(self) -> bool:
        return all(r is not None for r in self.results)

    def generations(self) -> list[Generation]:
        done = zip(self.results, self.new, strict=True)
        return [r or Generation(self.tokenizer.decode(new), new, "length") for r, new in done]
