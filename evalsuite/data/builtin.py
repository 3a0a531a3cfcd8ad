"""Corpora that ship with the package, so every command runs with no data to find.

``synthetic`` (:mod:`evalsuite.data.synthetic`) is generated; ``books`` is a sample of eight held-out
public-domain books (``evalsuite/data/books/README.md`` names them and their source), real text for per-token loss
and NIAH haystacks.
"""

from __future__ import annotations

from pathlib import Path

SYNTHETIC = "synthetic"
BOOKS = "books"
BOOKS_FILE = Path(__file__).resolve().parent / "books" / "heldout-sample.jsonl.xz"


def resolve_corpus(source: str) -> str:
    """``source`` with the name ``books`` replaced by the built-in books' path (``synthetic`` and paths unchanged)."""
    return str(BOOKS_FILE) if source == BOOKS else source
