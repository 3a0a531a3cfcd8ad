"""Write a self-made LongBench-format directory (``<task>.jsonl`` and ``<task>_e.jsonl``) for the FoX paper's 14
tasks, from text you have: a corpus of books for the prose tasks and Python's own standard library for the code
tasks. It tests the pipeline at realistic lengths (contexts of 1K-12K words, every LongBench-E bucket); its scores
say nothing about LongBench itself, whose data must come from its authors.

Records follow the official schema (input, context, answers, length in words, all_classes, dataset, language,
_id). Answers are recoverable from the context, so a model that reads it can score:

* question answering (narrativeqa, qasper, multifieldqa_en, hotpotqa, 2wikimqa, musique, triviaqa): a fact
  sentence ("The keeper of the silver lamp was called Odalys.") hidden at a random depth of a book excerpt;
  the question asks for the name;
* summarisation (gov_report, qmsum, multi_news, samsum): the reference is the excerpt's first three sentences;
* trec: few-shot "Question / Type" lines from a fixed set, the test question one of them;
* lcc, repobench-p: a standard-library module cut at a random line; the answer is the next code line.

Usage: python scripts/make_longbench_fixture.py --books ../shared/data/gutenberg/heldout --out DIR [--per-task 20]
"""

from __future__ import annotations

import argparse
import json
import re
import sysconfig
from pathlib import Path

import numpy as np

from evalsuite.data.corpus import iter_documents

QA = ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "triviaqa")
SUMMARY = ("gov_report", "qmsum", "multi_news", "samsum")
CODE = ("lcc", "repobench-p")
E_TASKS = {"qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
           "samsum", "lcc", "repobench-p"}  # fmt: skip
OBJECTS = ("silver lamp", "blue ledger", "brass key", "north gate", "old clock", "green boat", "iron bell")
NAMES = ("Odalys", "Brannoc", "Kaveh", "Liesel", "Rurik", "Soraya", "Tomasz", "Marisol", "Anneke", "Ilse")
TREC = [
    ("What is the capital of Peru?", "Location"),
    ("Who wrote the novel Middlemarch?", "Human being"),
    ("How many legs does a spider have?", "Numeric value"),
    ("What does the abbreviation NASA stand for?", "Abbreviation"),
    ("What is a hologram?", "Description and abstract concept"),
    ("What kind of animal is a dingo?", "Entity"),
]
TREC_CLASSES = sorted({c for _, c in TREC})


def excerpt(words: list[str], n: int, rng: np.random.Generator) -> str:
    start = int(rng.integers(0, max(1, len(words) - n)))
    return " ".join(words[start : start + n])


def sentences(text: str, k: int) -> str:
    return " ".join(re.split(r"(?<=[.!?])\s+", text.strip())[:k])


def qa_record(task, words, n, rng):
    context = excerpt(words, n, rng)
    obj, name = OBJECTS[int(rng.integers(len(OBJECTS)))], NAMES[int(rng.integers(len(NAMES)))]
    cut = [m.end() for m in re.finditer(r"[.!?] ", context)] or [len(context)]
    at = cut[int(rng.integers(len(cut)))]
    context = f"{context[:at]}The keeper of the {obj} was called {name}. {context[at:]}"
    question = f"Who was the keeper of the {obj}?"
    if task == "triviaqa":
        question = f"Question: {question}\nAnswer:"
    return context, question, [name], None


def summary_record(task, words, n, rng):
    context = excerpt(words, n, rng)
    question = "Summarize the text." if task == "qmsum" else ("Summary:" if task == "samsum" else "")
    return context, question, [sentences(context, 3)], None


def trec_record(rng, n_shots):
    shots = [TREC[int(i)] for i in rng.integers(0, len(TREC), n_shots)]
    context = "\n".join(f"Question: {q}\nType: {c}" for q, c in shots)
    q, c = shots[int(rng.integers(len(shots)))]
    return context, f"Question: {q}\nType:", [c], TREC_CLASSES


def code_record(task, sources, n, rng):
    lines = sources[int(rng.integers(len(sources)))].split("\n")
    ok = [i for i, line in enumerate(lines) if i > 20 and line.strip() and not line.strip().startswith(("#", '"'))]
    cut = ok[int(rng.integers(len(ok)))]
    prefix = "\n".join(lines[max(0, cut - n // 4) : cut]) + "\n"
    answer = lines[cut]
    if task == "repobench-p":
        return "\n".join(lines[: max(0, cut - 20)])[-4 * n :] + "\n", "\n".join(lines[cut - 20 : cut]) + "\n", [answer]
    return prefix, "", [answer]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--books", required=True, help="folder or file of documents (.txt, .jsonl[.xz])")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--per-task", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    words = [w for doc in iter_documents(Path(args.books)) for w in (doc.text or "").split()][:3_000_000]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(stdlib.glob("*.py"))[:200]]
    sources = [s for s in sources if s.count("\n") > 200]
    args.out.mkdir(parents=True, exist_ok=True)
    for task in (*QA, *SUMMARY, "trec", *CODE):
        for suffix in ("", "_e") if task in E_TASKS else ("",):
            rows = []
            for i in range(args.per_task):
                n = int(np.exp(rng.uniform(np.log(1000), np.log(12000))))  # words: 1K-12K, every E bucket
                if task in QA:
                    context, question, answers, classes = qa_record(task, words, n, rng)
                elif task in SUMMARY:
                    context, question, answers, classes = summary_record(task, words, n, rng)
                elif task == "trec":
                    context, question, answers, classes = trec_record(rng, max(8, n // 12))
                else:
                    context, question, answers = code_record(task, sources, n, rng)
                    classes = None
                length = len(context.split()) + len(question.split())
                row = dict(input=question, context=context, answers=answers, length=length, all_classes=classes)
                rows.append({**row, "dataset": task, "language": "en", "_id": f"fixture-{task}{suffix}-{i}"})
            path = args.out / f"{task}{suffix}.jsonl"
            path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
            print(path, len(rows))


if __name__ == "__main__":
    main()
