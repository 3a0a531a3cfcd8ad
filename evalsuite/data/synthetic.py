"""A built-in synthetic corpus, so every command runs with no data on disk.

Documents are English-like sentences over a small fixed vocabulary. Each paragraph is either new or,
with probability ``repeat_prob``, a verbatim copy of an earlier paragraph of the same document. The
copies make the corpus reward long context: a model that can look back far enough predicts a
repeated paragraph almost perfectly, so the per-token loss keeps falling with context length only for
models that really use it. Fully determined by the seed (numpy Generator, no global state).
"""

from __future__ import annotations

import numpy as np

from evalsuite.data.corpus import Document

_WORDS = """
the a of and to in is was he for it with as his on be at by had are but from or have an they which one
you were her all she there would their we him been has when who will more no if out so said what up its
about into than them can only other new some could time these two may then do first any my now such like
our over man me even most made after also did many before must through back years where much your way well
down should because each just those people how too little state good very make world still own see men work
long get here between both life being under never day same another know while last might us great old year
off come since against go came right used take three river garden lamp window letter morning evening winter
summer road bridge market harbor village city forest mountain valley island station captain doctor teacher
farmer sailor merchant painter soldier clerk baker widow child brother sister mother father friend stranger
walked carried opened closed watched found lost remembered forgot wrote read sang waited answered asked
quiet bright cold warm heavy narrow broad green grey silver wooden ancient careful sudden gentle strange
""".split()


def _sentence(rng: np.random.Generator) -> str:
    n = int(rng.integers(6, 18))
    words = [_WORDS[i] for i in rng.integers(0, len(_WORDS), n)]
    text = " ".join(words)
    if n > 9 and rng.random() < 0.4:  # a clause break now and then
        cut = text.index(" ", len(text) // 2)
        text = text[:cut] + "," + text[cut:]
    return text[0].upper() + text[1:] + ("?" if rng.random() < 0.08 else ".")


def synthetic_text(n_words: int, seed: int, repeat_prob: float = 0.3) -> str:
    """One document of at least ``n_words`` words, paragraphs separated by blank lines."""
    rng = np.random.default_rng(seed)
    paragraphs: list[str] = []
    total = 0
    while total < n_words:
        if paragraphs and rng.random() < repeat_prob:
            para = paragraphs[int(rng.integers(0, len(paragraphs)))]
        else:
            para = " ".join(_sentence(rng) for _ in range(int(rng.integers(3, 8))))
        paragraphs.append(para)
        total += para.count(" ") + 1
    return "\n\n".join(paragraphs) + "\n"


def synthetic_documents(n_docs: int = 8, n_words: int = 80000, seed: int = 0) -> list[Document]:
    """``n_docs`` documents; 80K words is about 100K GPT-2 tokens, enough for a 65536-token window."""
    return [
        Document(id=f"synthetic-{seed}-{i}", text=synthetic_text(n_words, seed * 100003 + i)) for i in range(n_docs)
    ]
