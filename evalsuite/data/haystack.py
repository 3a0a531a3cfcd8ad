"""Haystacks for the needle-in-a-haystack tests: user text or the built-in synthetic filler, as token ids.

The FoX test (``eval/niah/prompt.py``, from LongAlign's ``Needle_test``, from gkamradt's tester) builds its
haystack text by concatenating every file of the haystack directory (no separator) and repeating that whole
pass until the text has at least ``max(context lengths)`` tokens, counted with the tokenizer's BOS. Here:

* ``--haystack PATH`` is a file or a directory of ``.txt`` / ``.jsonl`` (a ``text`` field per line), either
  optionally ``.xz``-compressed, read in sorted path order (FoX used unsorted ``glob`` order, a reproducibility
  hazard); every document counts as one of FoX's files, and ``.txt`` files get universal newlines as Python's
  text mode gives FoX. The Paul Graham essays are used only when pointed at.
* ``synthetic`` (the default) is a built-in filler of English-like sentences (:mod:`evalsuite.data.synthetic`)
  in :data:`FILLER_DOCS` documents of :data:`FILLER_WORDS` words, about 60K GPT-2 tokens per pass.

A large corpus is not tokenised whole: only a prefix that is certainly longer than needed, cut right before a
space that follows a non-space. GPT-2's pre-tokenizer always splits there (no pattern reaches across
"non-space, space"), so the prefix's ids are exactly the first ids of the whole text.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from evalsuite.data.builtin import SYNTHETIC, resolve_corpus
from evalsuite.data.corpus import corpus_files, iter_documents
from evalsuite.data.synthetic import synthetic_text
from evalsuite.errors import UserError
from evalsuite.runs.store import file_sha256
from evalsuite.tokenizers import JsonGPT2Tokenizer, Tokenizer, gpt2_encoding

FILLER_DOCS = 4
FILLER_WORDS = 12000
_MARGIN = 64  # extra tokens asked of a prefix, for tokenizers whose pre-tokenizer we cannot reason about
_CHARS_PER_TOKEN = 6  # first guess of prefix size; doubled until it suffices


def haystack_texts(source: str, seed: int = 0) -> Iterator[str]:
    """The haystack's documents in order: a path's text documents, or the synthetic filler."""
    if source == SYNTHETIC:
        for i in range(FILLER_DOCS):
            yield synthetic_text(FILLER_WORDS, seed=1_000_003 * seed + i)
        return
    for file in corpus_files(Path(resolve_corpus(source))):
        name = file.name.lower()
        if name.endswith(".npy"):
            raise UserError(f"haystack {file}: pre-tokenised .npy files cannot be haystacks; use text files")
        for doc in iter_documents(file):
            # FoX opens .txt files in text mode: universal newlines ("\r\n" and "\r" read as "\n").
            yield doc.text if name.endswith((".jsonl", ".jsonl.xz")) else _universal_newlines(doc.text)


def _universal_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def haystack_identity(source: str, seed: int = 0) -> str:
    """What the haystack's content is: ``synthetic-<seed>`` or the sha256 of its files (for config hashes)."""
    if source == SYNTHETIC:
        return f"{SYNTHETIC}-{seed}"
    return file_sha256(corpus_files(Path(resolve_corpus(source))))


def decode_skip_special(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Decode as FoX does (HF ``decode(ids, skip_special_tokens=True)``): special ids dropped first.

    For the JSON-escaped GPT-2 tokenizer this reproduces FoX's ``JSONGPT2Tokenizer.decode``: GPT-2 decode,
    then ``json.loads`` of the quoted text, and when that fails (e.g. a cut inside an escape) the best-effort
    ``unicode_escape`` decode with errors ignored. Other tokenizers use their own decode.
    """
    special = {i for i in (tokenizer.bos_id, tokenizer.eos_id) if i is not None}
    kept = [i for i in ids if i not in special]
    if isinstance(tokenizer, JsonGPT2Tokenizer):
        raw = gpt2_encoding().decode(kept)
        try:
            return json.loads(f'"{raw}"')
        except json.JSONDecodeError:
            return raw.encode().decode("unicode_escape", "ignore")
    return tokenizer.decode(kept)


def safe_cut(text: str, at: int) -> int:
    """The largest ``p <= at`` with ``text[p] == " "`` and ``text[p-1]`` not whitespace (``at`` if none)."""
    p = text.rfind(" ", 1, at + 1)
    while p > 0 and text[p - 1].isspace():
        p = text.rfind(" ", 1, p)
    return p if p > 0 else at


@dataclass
class Haystack:
    """The FoX haystack text and its token ids.

    Attributes:
        text: the haystack text (FoX: whole passes over the documents), or a prefix of it when the whole is
            far longer than needed.
        ids: the tokens of ``text``, with the tokenizer's BOS first when it adds one (FoX counts BOS).
        complete: ``text`` is the whole haystack (else a prefix whose ids are the first ids of the whole).
        passes: how many times the documents were repeated.
        source: ``synthetic`` or the path.
        n_prefix: how many special ids (BOS) the tokenizer put before the text ids.
    """

    text: str
    ids: list[int]
    complete: bool
    passes: int
    source: str
    n_prefix: int = 0

    def context(self, length: int, tokenizer: Tokenizer) -> str:
        """FoX's ``encode_and_trim``: the text of the first ``length`` ids (BOS counted), or the whole text."""
        if len(self.ids) > length:
            return decode_skip_special(tokenizer, self.ids[:length])
        if not self.complete:
            raise ValueError(f"haystack prefix has {len(self.ids)} tokens, fewer than the {length} asked for")
        return self.text

    def tokens(self, start: int, count: int) -> list[int]:
        """``count`` text ids (BOS left out) from ``start``, wrapping around (for the token-level tests)."""
        body = self.ids[self.n_prefix :]
        if not body:
            raise UserError(f"haystack {self.source} is empty")
        return [body[(start + i) % len(body)] for i in range(count)]


def load_haystack(source: str, tokenizer: Tokenizer, n_tokens: int, seed: int = 0) -> Haystack:
    """The haystack text repeated or cut as FoX does for a grid whose longest context is ``n_tokens``."""
    docs = haystack_texts(source, seed)
    n_prefix = len(tokenizer.encode(""))  # BOS, when the tokenizer adds one
    parts: list[str] = []
    chars, want, exhausted = 0, _CHARS_PER_TOKEN * (n_tokens + _MARGIN), False
    while True:
        while chars <= want and not exhausted:
            doc = next(docs, None)
            if doc is None:
                exhausted = True
            else:
                parts.append(doc)
                chars += len(doc)
        text = "".join(parts)
        if chars > want:  # try a prefix: FoX's first pass is then certainly long enough, so it is used once
            cut = safe_cut(text, want)
            ids = tokenizer.encode(text[:cut])
            if len(ids) >= n_tokens + _MARGIN:
                return Haystack(text[:cut], ids, complete=False, passes=1, source=source, n_prefix=n_prefix)
        if exhausted:
            break
        want *= 2
    if len(tokenizer.encode(text)) <= n_prefix:
        raise UserError(f"haystack {source} is empty: it has no text to hide a needle in")
    return _repeat_pass(text, tokenizer, n_tokens, source, n_prefix)


def _repeat_pass(one_pass: str, tokenizer: Tokenizer, n_tokens: int, source: str, n_prefix: int) -> Haystack:
    """FoX's loop: the fewest whole passes whose token count (BOS counted) reaches ``n_tokens``.

    Joining two passes changes the count by at most a few tokens at the seam, so every ``k`` below
    ``(n_tokens - 1) // (per_pass + 8)`` falls short and the search can start there.
    """
    per_pass = len(tokenizer.encode(one_pass, add_bos=False))
    k = max(1, (n_tokens - 1) // (per_pass + 8))
    while True:
        text = one_pass * k
        ids = tokenizer.encode(text)
        if len(ids) >= n_tokens:
            return Haystack(text, ids, complete=True, passes=k, source=source, n_prefix=n_prefix)
        k += 1


class LastHaystack:
    """The haystack of the last :meth:`get`, kept while the same one is asked for again: a task's ``evaluate`` runs
    once per batch under torchrun, and the haystack of a long grid costs seconds to build."""

    def __init__(self):
        self._key: tuple | None = None
        self._haystack: Haystack | None = None

    def get(self, source: str, tokenizer: Tokenizer, n_tokens: int, seed: int = 0) -> Haystack:
        """:func:`load_haystack`'s result for these arguments."""
        key = (source, tokenizer.spec, n_tokens, seed)
        if key != self._key:
            self._key, self._haystack = key, load_haystack(source, tokenizer, n_tokens, seed)
        return self._haystack
