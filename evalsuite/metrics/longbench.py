"""LongBench v1 scoring (Bai et al., arXiv:2308.14508), behaving as the official ``metrics.py`` / ``eval.py``.

Every metric takes a prediction and one gold answer (trec/lsht also ``all_classes``) and returns a float in
[0, 1]; a sample scores the max over its answers, a task ``round(100 * mean, 2)``. As upstream computes them:

* ``qa_f1_score``: lower case, ASCII punctuation out, articles a/an/the out, whitespace tokens; multiset F1.
  ``qa_f1_zh_score``: jieba tokens (``cut_all=False``), each :func:`normalize_zh_answer`-ed, empties dropped.
* ``rouge_score``: ROUGE-L F of the PyPI package ``rouge`` 1.0.1 (pltrdy), **not** Google's ``rouge-score``:
  sentences split on '.', whitespace tokens, case-sensitive, no stemming, union LCS over *unique* words. Any
  exception scores 0.0: an empty or '.'-only prediction, or a long period-free text that overflows the
  package's recursive LCS back-trace (where that falls depends on the recursion limit, as upstream's).
  ``rouge_zh_score``: both texts jieba-tokenised and joined with spaces first.
* ``classification_score``: the classes found in the prediction as substrings, pruned by upstream's
  remove-while-iterating pass (see the function); 1/len(matches) if the gold class is a match, else 0.
* ``retrieval_score`` / ``retrieval_zh_score`` / ``count_score``: the fraction of the integers in the
  prediction equal to the gold paragraph number ("Paragraph N" / "段落N") or the gold count.
* ``code_sim_score``: the first line (leading newlines stripped) with no '`', '#' or '//' ("" if none), then
  fuzzywuzzy's ``fuzz.ratio`` to the gold line / 100: 100 for equal strings, 0 when either is empty, else
  ``int(round(100 * SequenceMatcher(None, a, b).ratio()))``.

Fuzzy backend (``fuzzy=``). fuzzywuzzy's ``fuzz.ratio`` uses python-Levenshtein's matcher when that is
installed (2 * LCS / total length) and difflib's otherwise (greedy longest blocks, so matches <= LCS, plus
difflib's autojunk for 200+ characters); the integers differ (``"if (a < b) {"`` vs ``"if (b > a) {"``: 67 vs
75). Both are implemented here, so the user chooses, not the environment. **Default "difflib"**: LongBench's
``requirements.txt`` installs ``fuzzywuzzy`` alone (no python-Levenshtein, no ``speedup`` extra), so a setup
following it, as behind the published numbers, runs difflib's matcher. "levenshtein" reproduces setups that
had python-Levenshtein installed.

First-line rule (``first_line=``): "upstream" cuts the prediction to ``pred.lstrip('\\n').split('\\n')[0]``
for trec, triviaqa, samsum and lsht; "fox" (the FoX paper's eval, arXiv:2503.02130) for every task.
:func:`score_predictions` scores a folder in upstream ``pred.py``'s layout and writes its ``result.json``.

``rouge``, ``jieba`` and python-Levenshtein are the ``longbench`` extra (``pip install 'evalsuite[longbench]'``),
imported by the metrics that use them, so the English QA, classification, retrieval, counting and difflib code
metrics need none of them.
"""

from __future__ import annotations

import difflib
import json
import re
import string
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from evalsuite.errors import UserError, missing_extra, require
from evalsuite.runs.store import atomic_write_bytes

FUZZY_BACKENDS = ("difflib", "levenshtein")
DEFAULT_FUZZY = "difflib"  # what LongBench's requirements.txt installs; see the module docstring
FIRST_LINE_RULES = ("upstream", "fox")
FIRST_LINE_TASKS_UPSTREAM = frozenset({"trec", "triviaqa", "samsum", "lsht"})
BUCKETS = ("0-4k", "4-8k", "8k+")  # LongBench-E length buckets (``length`` < 4000, < 8000, else)
RESULT_FILE = "result.json"

# The Chinese (full-width and CJK) punctuation upstream removes on top of string.punctuation; the last one is
# an ASCII '.', already in string.punctuation, kept so the set is upstream's character for character.
ZH_PUNCTUATION = (
    "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿"
    "–—‘’‛“”„‟…‧﹏."
)
_EN_PUNCT = frozenset(string.punctuation)
_ZH_PUNCT = frozenset(string.punctuation + ZH_PUNCTUATION)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_INTEGER = re.compile(r"\d+")


# --- normalisation and token F1 --------------------------------------------------------------------------


EXTRA_MODULES = ("rouge", "jieba", "Levenshtein")  # the longbench extra: ROUGE-L, the _zh metrics, fuzzy matching


def check_metrics_installed(user: str) -> None:
    """A UserError naming the ``longbench`` extra unless its packages are found (not imported: jieba is slow to)."""
    import importlib.util

    if any(importlib.util.find_spec(module) is None for module in EXTRA_MODULES):
        raise missing_extra("longbench", user)


def normalize_answer(s: str) -> str:
    """Lower case -> drop ASCII punctuation -> each article (a/an/the, whole word) to a space -> single spaces."""
    text = "".join(ch for ch in s.lower() if ch not in _EN_PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def normalize_zh_answer(s: str) -> str:
    """Lower case -> drop ASCII and Chinese punctuation -> remove all whitespace (no article rule)."""
    return "".join("".join(ch for ch in s.lower() if ch not in _ZH_PUNCT).split())


def _token_f1(prediction: Sequence[str], ground_truth: Sequence[str]) -> float:
    """F1 of two token lists over their multiset overlap; 0 when nothing overlaps."""
    same = sum((Counter(prediction) & Counter(ground_truth)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(ground_truth)
    return 2 * precision * recall / (precision + recall)


def _jieba_tokens(text: str) -> list[str]:
    jieba = require("jieba", "longbench", "LongBench's Chinese metrics")  # imported here: it loads a large dictionary
    return list(jieba.cut(text, cut_all=False))


def qa_f1_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Token F1 after :func:`normalize_answer` (SQuAD-style)."""
    return _token_f1(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def qa_f1_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Token F1 over jieba tokens, each normalised with :func:`normalize_zh_answer`, empty ones dropped."""

    def tokens(text: str) -> list[str]:
        return [t for t in (normalize_zh_answer(tok) for tok in _jieba_tokens(text)) if t]

    return _token_f1(tokens(prediction), tokens(ground_truth))


# --- ROUGE-L ---------------------------------------------------------------------------------------------


def rouge_score(prediction: str, ground_truth: str, **_: object) -> float:
    """ROUGE-L F of the ``rouge`` 1.0.1 package (all its default metrics computed, as upstream); 0.0 on error."""
    rouge = require("rouge", "longbench", "LongBench's ROUGE-L")  # outside the try: a missing extra is no score of 0
    try:
        return float(rouge.Rouge().get_scores([prediction], [ground_truth], avg=True)["rouge-l"]["f"])
    except Exception:  # upstream's bare except; KeyboardInterrupt/SystemExit still propagate here
        return 0.0


def rouge_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """:func:`rouge_score` of the jieba tokens of both texts joined with single spaces."""
    return rouge_score(" ".join(_jieba_tokens(prediction)), " ".join(_jieba_tokens(ground_truth)))


# --- classification, retrieval, counting -----------------------------------------------------------------


def classification_score(
    prediction: str, ground_truth: str, *, all_classes: Sequence[str] | None = None, **_: object
) -> float:
    """1/len(matches) when the gold class is among the classes found in ``prediction``, else 0 (trec, lsht).

    The pruning pass mimics upstream's removal from the list it iterates over: the iteration index keeps
    advancing after a removal, so the class that slid into the removed one's place is never checked.
    """
    if all_classes is None:
        raise ValueError("classification_score needs all_classes (the task's class names)")
    matches = [name for name in all_classes if name in prediction]
    i = 0
    while i < len(matches):
        name = matches[i]
        if name in ground_truth and name != ground_truth:
            matches.remove(name)  # first occurrence, as list.remove does upstream
        i += 1
    return 1.0 / len(matches) if ground_truth in matches else 0.0


def _fraction_equal(prediction: str, target: str) -> float:
    numbers = _INTEGER.findall(prediction)
    return sum(n == target for n in numbers) / len(numbers) if numbers else 0.0


def _paragraph_id(ground_truth: str, pattern: str) -> str:
    found = re.findall(pattern, ground_truth)
    if not found:
        raise ValueError(f"answer {ground_truth!r} has no paragraph number (pattern {pattern!r})")
    return found[0]


def retrieval_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Fraction of the integers in ``prediction`` equal to N of the gold "Paragraph N"."""
    return _fraction_equal(prediction, _paragraph_id(ground_truth, r"Paragraph (\d+)"))


def retrieval_zh_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Fraction of the integers in ``prediction`` equal to N of the gold "段落N"."""
    return _fraction_equal(prediction, _paragraph_id(ground_truth, r"段落(\d+)"))


def count_score(prediction: str, ground_truth: str, **_: object) -> float:
    """Fraction of the integers in ``prediction`` equal to the gold count (compared as strings)."""
    return _fraction_equal(prediction, str(ground_truth))


# --- code similarity -------------------------------------------------------------------------------------


def _check_fuzzy(fuzzy: str) -> None:
    if fuzzy not in FUZZY_BACKENDS:
        raise UserError(f"unknown fuzzy backend {fuzzy!r}; choose from {list(FUZZY_BACKENDS)}")


def fuzzy_ratio(a: str, b: str, fuzzy: str = DEFAULT_FUZZY) -> int:
    """fuzzywuzzy's ``fuzz.ratio(a, b)`` with an explicit matcher: an integer percent (Python's round)."""
    _check_fuzzy(fuzzy)
    if a == b:
        return 100
    if not a or not b:
        return 0
    if fuzzy == "difflib":
        ratio = difflib.SequenceMatcher(None, a, b).ratio()
    else:
        ratio = require("Levenshtein", "longbench", "fuzzy='levenshtein'").ratio(a, b)
    return int(round(100 * ratio))


def code_line(prediction: str) -> str:
    """The first line (after leading newlines) containing none of '`', '#', '//'; "" when there is none."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def code_sim_score(prediction: str, ground_truth: str, *, fuzzy: str = DEFAULT_FUZZY, **_: object) -> float:
    """``fuzz.ratio(code_line(prediction), ground_truth) / 100`` with the chosen matcher (lcc, repobench-p)."""
    return fuzzy_ratio(code_line(prediction), ground_truth, fuzzy) / 100


# --- tasks, samples, aggregates --------------------------------------------------------------------------

Metric = Callable[..., float]

# The 21 LongBench v1 tasks -> metric, upstream's eval.py mapping. Every metric takes
# ``(prediction, ground_truth, *, all_classes=None, fuzzy=DEFAULT_FUZZY)`` and ignores what it does not use.
TASK_METRIC: dict[str, Metric] = {
    "narrativeqa": qa_f1_score,
    "qasper": qa_f1_score,
    "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score,
    "hotpotqa": qa_f1_score,
    "2wikimqa": qa_f1_score,
    "musique": qa_f1_score,
    "dureader": rouge_zh_score,
    "gov_report": rouge_score,
    "qmsum": rouge_score,
    "multi_news": rouge_score,
    "vcsum": rouge_zh_score,
    "trec": classification_score,
    "triviaqa": qa_f1_score,
    "samsum": rouge_score,
    "lsht": classification_score,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score,
    "repobench-p": code_sim_score,
}
TASKS = tuple(TASK_METRIC)
CLASSIFICATION_TASKS = frozenset(t for t, m in TASK_METRIC.items() if m is classification_score)
ZH_TASKS = frozenset({"multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"})
# LongBench-E: the 13 tasks with a ``<task>_e`` file, the English ones but narrativeqa, musique and qmsum.
E_TASKS = tuple(t for t in TASKS if t not in ZH_TASKS | {"narrativeqa", "musique", "qmsum"})


def _check_task(task: str) -> Metric:
    if task not in TASK_METRIC:
        raise UserError(f"unknown LongBench task {task!r}; choose from {list(TASKS)}")
    return TASK_METRIC[task]


def _check_first_line(first_line: str) -> None:
    if first_line not in FIRST_LINE_RULES:
        raise UserError(f"unknown first_line rule {first_line!r}; choose from {list(FIRST_LINE_RULES)}")


def scored_text(task: str, prediction: str, first_line: str = "upstream") -> str:
    """The prediction after the first-line rule: ``prediction.lstrip('\\n').split('\\n')[0]`` where it applies."""
    _check_first_line(first_line)
    if first_line == "fox" or task in FIRST_LINE_TASKS_UPSTREAM:
        return prediction.lstrip("\n").split("\n")[0]
    return prediction


def score_sample(
    task: str,
    pred: str,
    answers: Sequence[str],
    all_classes: Sequence[str] | None = None,
    *,
    first_line: str = "upstream",
    fuzzy: str = DEFAULT_FUZZY,
) -> float:
    """One sample's score in [0, 1]: the task's metric maxed over ``answers`` (0.0 when there are none).

    ``first_line`` is "upstream" or "fox" (see :func:`scored_text`), ``fuzzy`` "difflib" or "levenshtein".
    Raises UserError for an unknown task or option, ValueError for data a metric cannot score (a
    classification task without ``all_classes``, a retrieval answer without a paragraph number).
    """
    metric = _check_task(task)
    _check_fuzzy(fuzzy)
    text = scored_text(task, pred, first_line)
    score = 0.0
    for answer in answers:
        score = max(score, metric(text, answer, all_classes=all_classes, fuzzy=fuzzy))
    return float(score)


def task_score(samples: Sequence[float]) -> float:
    """``round(100 * mean, 2)`` of per-sample scores, computed as upstream's plain ``scorer`` does.

    A running float sum, then ``round(100 * total / n, 2)`` (not ``sum()``, which compensates rounding on
    Python 3.12+, nor numpy's pairwise sum), so a result on a rounding edge rounds the same way.
    """
    if not samples:
        raise ValueError("task_score of no samples")
    total = 0.0
    for s in samples:
        total += s
    return round(100 * total / len(samples), 2)


def length_bucket(length: float) -> str:
    """LongBench-E bucket of a record's ``length`` (words, or characters for Chinese): "0-4k", "4-8k", "8k+"."""
    return "0-4k" if length < 4000 else "4-8k" if length < 8000 else "8k+"


def bucket_scores(samples: Sequence[float], lengths: Sequence[float]) -> dict[str, float | None]:
    """``{bucket: round(100 * mean, 2)}`` for the three LongBench-E buckets, as upstream's ``scorer_e``.

    Upstream takes ``numpy.mean`` and rounds the numpy float (numpy's rounding), both kept here; an empty
    bucket is None (upstream writes NaN, which is not JSON).
    """
    if len(samples) != len(lengths):
        raise ValueError(f"{len(samples)} scores but {len(lengths)} lengths")
    groups: dict[str, list[float]] = {b: [] for b in BUCKETS}
    for score, length in zip(samples, lengths, strict=True):
        groups[length_bucket(length)].append(score)
    return {b: float(round(100 * np.mean(v), 2)) if v else None for b, v in groups.items()}


# --- scoring a folder of predictions ---------------------------------------------------------------------


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_line(line: str, e: bool) -> dict:
    """One prediction line -> its dict; ValueError with the reason when it is malformed."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if not isinstance(row.get("pred"), str):
        raise ValueError("'pred' is missing or not a string")
    if not _is_str_list(row.get("answers")):
        raise ValueError("'answers' is missing or not a list of strings")
    if row.get("all_classes") is not None and not _is_str_list(row["all_classes"]):
        raise ValueError("'all_classes' must be null or a list of strings")
    if e and not _is_number(row.get("length")):
        raise ValueError("'length' (a number) is needed for LongBench-E buckets")
    return row


def read_predictions(path: Path | str, e: bool = False) -> list[tuple[int, dict]]:
    """(line number, record) for every non-blank line of a ``<task>.jsonl`` prediction file.

    Each line is ``{"pred": str, "answers": [str], "all_classes": [str] | null, "length": number}``
    (``length`` required with ``e``). Any malformed line, the last one included, raises UserError naming
    ``file:line`` and the reason.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}") from None
    rows = []
    # split("\n"), not splitlines(): JSON written with ensure_ascii=False may hold a raw U+2028 inside a string.
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            rows.append((number, _parse_line(line, e)))
        except ValueError as err:
            raise UserError(f"{path}:{number}: {err}") from None
    return rows


def score_file(
    path: Path | str, task: str, *, e: bool = False, first_line: str = "upstream", fuzzy: str = DEFAULT_FUZZY
) -> float | dict[str, float | None]:
    """Score one ``<task>.jsonl``: the task score, or ``{bucket: score}`` with ``e``.

    As upstream's ``eval.py``, one ``all_classes`` serves the whole file: the value on its last line.
    """
    path = Path(path)
    rows = read_predictions(path, e)
    if not rows:
        raise UserError(f"{path}: no predictions")
    last_line, last = rows[-1]
    all_classes = last.get("all_classes")
    if task in CLASSIFICATION_TASKS and all_classes is None:
        raise UserError(f"{path}:{last_line}: {task} needs 'all_classes' (upstream reads it from the last line)")
    scores = []
    for number, row in rows:
        try:
            scores.append(
                score_sample(task, row["pred"], row["answers"], all_classes, first_line=first_line, fuzzy=fuzzy)
            )
        except ValueError as err:
            raise UserError(f"{path}:{number}: {err}") from None
    if e:
        return bucket_scores(scores, [row["length"] for _, row in rows])
    return task_score(scores)


def score_predictions(
    pred_dir: Path | str, *, e: bool = False, first_line: str = "upstream", fuzzy: str = DEFAULT_FUZZY
) -> dict[str, float] | dict[str, dict[str, float | None]]:
    """Score every ``<task>.jsonl`` in ``pred_dir`` (upstream ``pred.py``'s layout) and write ``result.json``.

    Returns and writes ``{task: score}``, or with ``e`` ``{task: {"0-4k": s, "4-8k": s, "8k+": s}}`` (an
    empty bucket is null), tasks in LongBench's order. A ``.jsonl`` file whose name is not a LongBench task
    (e.g. ``records.jsonl``, ``qasper_e.jsonl``) is skipped with a note on stderr; a folder with no task file,
    an unknown option or a malformed line (``file:line`` and why) raises UserError.
    """
    pred_dir = Path(pred_dir)
    if not pred_dir.is_dir():
        raise UserError(f"prediction folder {pred_dir} does not exist")
    _check_fuzzy(fuzzy)
    _check_first_line(first_line)
    files = {}
    for path in sorted(pred_dir.glob("*.jsonl")):
        task = path.name[: -len(".jsonl")]
        if task in TASK_METRIC:
            files[task] = path
        else:
            print(f"evalsuite: note: {path}: not a LongBench task file; skipped", file=sys.stderr, flush=True)
    if not files:
        raise UserError(f"no LongBench prediction files (<task>.jsonl, task one of {list(TASKS)}) in {pred_dir}")
    result = {
        task: score_file(files[task], task, e=e, first_line=first_line, fuzzy=fuzzy) for task in TASKS if task in files
    }
    atomic_write_bytes(pred_dir / RESULT_FILE, json.dumps(result, ensure_ascii=False, indent=4) + "\n")
    return result
