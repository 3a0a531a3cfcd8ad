"""Read documents from a file or directory: ``.txt``, ``.jsonl`` (``text`` field), either optionally
``.xz``-compressed, or pre-tokenised ``.npy`` (1-D: one document; 2-D: one document per row).

Directories are walked recursively in sorted path order, so a corpus always yields the same
documents in the same order on any machine.
"""

from __future__ import annotations

import json
import lzma
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evalsuite.errors import UserError

TEXT_SUFFIXES = (".txt", ".txt.xz", ".jsonl", ".jsonl.xz")
TOKEN_SUFFIXES = (".npy",)


@dataclass
class Document:
    """One document: raw text, or token ids when the corpus is pre-tokenised."""

    id: str
    text: str | None = None
    tokens: np.ndarray | None = None


def _suffix(path: Path) -> str | None:
    name = path.name.lower()
    for suffix in TEXT_SUFFIXES + TOKEN_SUFFIXES:
        if name.endswith(suffix):
            return suffix
    return None


def corpus_files(path: Path) -> list[Path]:
    """Supported files under ``path`` (or ``path`` itself), sorted; UserError when there are none."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"data path {path} does not exist")
    if path.is_file():
        if _suffix(path) is None:
            raise UserError(f"{path}: unsupported file type; use {', '.join(TEXT_SUFFIXES + TOKEN_SUFFIXES)}")
        return [path]
    files = sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p) is not None)
    if not files:
        raise UserError(f"no documents in {path}: expected {', '.join(TEXT_SUFFIXES + TOKEN_SUFFIXES)} files")
    return files


def _read_bytes(path: Path) -> bytes:
    if path.name.lower().endswith(".xz"):
        try:
            with lzma.open(path, "rb") as f:
                return f.read()
        except lzma.LZMAError as e:
            raise UserError(f"{path}: not a valid .xz file ({e})") from None
    return path.read_bytes()


def _decode_utf8(data: bytes, path: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not valid UTF-8 text (bad byte at offset {e.start})") from None


def _jsonl_documents(path: Path) -> Iterator[Document]:
    text = _decode_utf8(_read_bytes(path), path)
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise UserError(f"{path}:{lineno}: each JSONL line needs a string 'text' field")
        yield Document(id=str(row.get("id", f"{path.name}:{lineno}")), text=row["text"])


def _load_npy(path: Path) -> np.ndarray:
    """A 1-D or 2-D integer array (memory-mapped); anything else is one clear error naming the file."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        reason = "not a .npy array file" if "pickle" in str(e) else str(e)
        raise UserError(f"{path}: cannot read as .npy ({reason})") from None
    if not np.issubdtype(arr.dtype, np.integer) or arr.ndim not in (1, 2):
        raise UserError(f"{path}: pre-tokenised data must be a 1-D or 2-D integer array, got {arr.dtype} {arr.shape}")
    return arr


def _npy_documents(path: Path) -> Iterator[Document]:
    arr = _load_npy(path)
    rows = arr[None] if arr.ndim == 1 else arr
    for i in range(rows.shape[0]):
        yield Document(id=f"{path.name}:{i}", tokens=np.asarray(rows[i], dtype=np.int64))


def iter_documents(path: Path) -> Iterator[Document]:
    """All documents under ``path`` in a deterministic order."""
    for file in corpus_files(path):
        suffix = _suffix(file)
        if suffix in (".jsonl", ".jsonl.xz"):
            yield from _jsonl_documents(file)
        elif suffix == ".npy":
            yield from _npy_documents(file)
        else:
            yield Document(id=file.name, text=_decode_utf8(_read_bytes(file), file))


def count_documents(path: Path) -> int:
    """Number of documents ``iter_documents`` will yield (reads JSONL files once to count lines)."""
    n = 0
    for file in corpus_files(path):
        suffix = _suffix(file)
        if suffix in (".jsonl", ".jsonl.xz"):
            n += sum(1 for line in _read_bytes(file).split(b"\n") if line.strip())
        elif suffix == ".npy":
            arr = _load_npy(file)
            n += 1 if arr.ndim == 1 else arr.shape[0]
        else:
            n += 1
    return n
