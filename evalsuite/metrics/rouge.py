"""ROUGE for summaries: word-level ROUGE-1/2/L/Lsum (``rouge-score``), ROUGE over model tokens, bootstrap CIs.

* :func:`rouge_scores` -- Google's ``rouge-score`` package (the reference implementation most papers report),
  called as ``RougeScorer(types, use_stemmer=True).score(target, prediction)``: **target first**. Its default
  tokenizer lower-cases, keeps ``[a-z0-9]`` runs and Porter-stems tokens longer than 3 characters (nltk's
  stemmer needs no download). ``rougeLsum`` is the summary-level union LCS over sentences separated by ``"\\n"``;
  we put those newlines in ourselves with :func:`split_sentences` (below) and never use the package's
  ``split_summaries=True``, whose nltk punkt model is a download. The newlines do not change ROUGE-1/2/L (the
  tokenizer drops them).
* :func:`bpe_rouge` -- ROUGE-1/2/L over the model's token ids, the flavour the DRT paper (arXiv:2410.01651)
  reports for XSum and CNN/DM. See its docstring for how ours differs from the paper's script.
* :func:`bootstrap_cis` -- our own seeded percentile bootstrap of per-example means.
  ``rouge_score.scoring.BootstrapAggregator`` resamples with the unseeded global ``np.random``, so its
  intervals change from run to run; we use ``numpy.random.default_rng(seed)``.

Every score is a fraction in [0, 1] (papers usually print 100x).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

from evalsuite.tokenizers import Tokenizer

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")
BPE_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")

# ---------------------------------------------------------------------------------------------
# Sentences
# ---------------------------------------------------------------------------------------------

# A sentence ends at a run of . ! ? (closing quotes or brackets may follow) before whitespace and a character
# that is not a lower-case letter.
_SENTENCE_END = re.compile(r"""[.!?]+["'\u201d\u2019)\]]*(?=\s+[^\sa-z]|\s*$)""")
# Words after which a period does not end a sentence (titles and common abbreviations), lower-cased.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st mt sen rep gov gen lt col capt sgt jr sr rev hon vs etc e.g i.e approx dept est "
    "fig inc ltd co corp jan feb mar apr jun jul aug sep sept oct nov dec".split()
)


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text``, by a small deterministic rule (no model, no download).

    Every line break ends a sentence. Inside a line, a sentence ends after ``.``, ``!`` or ``?`` (optionally
    followed by closing quotes or brackets) when whitespace and then a character other than a lower-case ASCII
    letter follow -- unless the period closes a single letter (initials, "U.S.") or a word in a short list of
    abbreviations ("Mr.", "Dr.", "St.", months, ...; "No." only before a digit). So "in the U.S. The" is one
    sentence. Empty sentences are dropped, the rest stripped.
    """
    out: list[str] = []
    for line in text.splitlines():
        start = 0
        for m in _SENTENCE_END.finditer(line):
            if m.group().startswith(".") and _abbreviation_before(line, m.start(), line[m.end() :].lstrip()):
                continue
            out.append(line[start : m.end()])
            start = m.end()
        out.append(line[start:])
    return [s.strip() for s in out if s.strip()]


def _abbreviation_before(line: str, dot: int, after: str) -> bool:
    """Whether the period at ``line[dot]`` closes a single letter, a known abbreviation, or "No" before a digit."""
    word = re.search(r"[\w.]*$", line[:dot]).group().lower()
    last = word.rsplit(".", 1)[-1]
    if word == "no":
        return after[:1].isdigit()
    return (len(last) == 1 and last.isalpha()) or word in _ABBREVIATIONS


def lead_sentence(document: str) -> str:
    """The lead-1 baseline's summary: the document's first sentence (:func:`split_sentences`), or ``""``."""
    sentences = split_sentences(document)
    return sentences[0] if sentences else ""


def sentences_on_lines(text: str) -> str:
    """``text`` with one sentence per line, the form ``rougeLsum`` expects."""
    return "\n".join(split_sentences(text))


# ---------------------------------------------------------------------------------------------
# Scores
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _word_scorer():
    try:
        from rouge_score import rouge_scorer
    except ModuleNotFoundError:  # pragma: no cover - a declared dependency
        from evalsuite.errors import UserError

        raise UserError("ROUGE needs the 'rouge-score' package: pip install rouge-score") from None
    return rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def _flatten(scores: Mapping, prefix: str = "") -> dict[str, float]:
    """``{type: Score(p, r, f)}`` -> ``{type: f, type_precision: p, type_recall: r}`` (prefixed)."""
    out = {}
    for kind, s in scores.items():
        out[f"{prefix}{kind}"] = float(s.fmeasure)
        out[f"{prefix}{kind}_precision"] = float(s.precision)
        out[f"{prefix}{kind}_recall"] = float(s.recall)
    return out


def rouge_scores(prediction: str, reference: str) -> dict[str, float]:
    """Word-level ROUGE of ``prediction`` against ``reference`` (stemmed), as
    ``{rouge1, rouge1_precision, rouge1_recall, ..., rougeLsum_recall}``; the bare name is the F-measure.

    Both texts are put one sentence per line (:func:`split_sentences`) for ``rougeLsum``. An empty prediction
    or reference scores 0.
    """
    scores = _word_scorer().score(sentences_on_lines(reference), sentences_on_lines(prediction))
    return _flatten(scores)


class _TokenIds:
    """A ``rouge-score`` tokenizer: a text's token ids under the model's tokenizer (no BOS), as strings."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def tokenize(self, text: str) -> list[str]:
        return [str(i) for i in self.tokenizer.encode(text, add_bos=False)]


def bpe_rouge(prediction: str, reference: str, tokenizer: Tokenizer) -> dict[str, float]:
    """ROUGE-1/2/L over model tokens: ``{bpe_rouge1, bpe_rouge1_precision, ..., bpe_rougeL_recall}``.

    Both texts are encoded with ``tokenizer`` (no BOS) and scored by ``rouge-score`` on the id sequences:
    clipped n-gram counts for ROUGE-1/2 and the plain LCS for ROUGE-L, no stemming, no lower-casing.

    What the DRT paper's script does (arXiv:2410.01651, its code's ``eval/eval_sum.py``): the PyPI ``rouge``
    package's ``Rouge().get_scores(pred, ref, avg=True)`` over the space-joined GPT-2 BPE token *strings*. That
    package (1.0.x) counts each distinct n-gram once (sets, not clipped counts), splits both texts into
    "sentences" at ``.`` and takes ROUGE-L as the summary-level union LCS. Our
    numbers therefore follow the same idea (overlap of model tokens) but are not the paper's metric exactly;
    they are labelled ``bpe_rouge*`` so they are never mistaken for word-level ROUGE.
    """
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(BPE_ROUGE_TYPES), tokenizer=_TokenIds(tokenizer))
    return _flatten(scorer.score(reference, prediction), prefix="bpe_")


# ---------------------------------------------------------------------------------------------
# Bootstrap
# ---------------------------------------------------------------------------------------------


def bootstrap_cis(
    columns: Mapping[str, Sequence[float]], samples: int = 1000, confidence: float = 0.95, seed: int = 0
) -> dict[str, dict]:
    """Mean and percentile bootstrap interval of each column of per-example scores.

    All columns must have one value per example; every resample draws the same example indices for all of
    them (``numpy.random.default_rng(seed)``, ``samples`` resamples of n examples with replacement), so the
    intervals of different metrics are paired and reproducible. Returns ``{name: {mean, low, high, n}}``;
    ``low``/``high`` are None when ``samples`` is 0 or there are no examples.
    """
    if samples < 0 or not 0 < confidence < 1:
        raise ValueError("bootstrap samples must be >= 0 and confidence in (0, 1)")
    names = list(columns)
    matrix = np.array([np.asarray(columns[k], dtype=float) for k in names]).reshape(len(names), -1)
    n = matrix.shape[1]
    out = {
        k: {"mean": float(matrix[i].mean()) if n else None, "low": None, "high": None, "n": n}
        for i, k in enumerate(names)
    }
    if n == 0 or samples == 0:
        return out
    rng = np.random.default_rng(seed)
    means = np.empty((len(names), samples))
    chunk = max(1, 2_000_000 // n)  # bounds the index matrix at ~16 MB
    for s in range(0, samples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, samples - s), n))
        means[:, s : s + idx.shape[0]] = matrix[:, idx].mean(-1)
    alpha = (1 - confidence) / 2
    low, high = np.quantile(means, [alpha, 1 - alpha], axis=1)
    for i, k in enumerate(names):
        out[k]["low"], out[k]["high"] = float(low[i]), float(high[i])
    return out


def bootstrap_ci(values: Sequence[float], samples: int = 1000, confidence: float = 0.95, seed: int = 0) -> dict:
    """:func:`bootstrap_cis` for one column: ``{mean, low, high, n}``."""
    return bootstrap_cis({"value": values}, samples, confidence, seed)["value"]
