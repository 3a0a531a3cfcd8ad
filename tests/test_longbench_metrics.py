"""LongBench v1 metrics, scoring of prediction folders and tables (evalsuite.metrics/report.longbench).

Golden values are worked out by hand in the comments, from the metric definitions of the LongBench paper's
``metrics.py`` (arXiv:2308.14508); the two fuzzy backends are also checked against fuzzywuzzy itself.
"""

from __future__ import annotations

import difflib
import json
import random
from pathlib import Path

import jieba
import pandas as pd
import pytest
from fuzzywuzzy import fuzz
from fuzzywuzzy.StringMatcher import StringMatcher

from evalsuite.errors import UserError
from evalsuite.metrics import longbench as lb
from evalsuite.report.longbench import flat_columns, longbench_table, write_longbench_tables

# --- QA F1 -----------------------------------------------------------------------------------------------


def test_normalize_answer() -> None:
    # lower -> punctuation out ("cat's" -> "cats", "," "!" gone) -> "the"/"an" to spaces -> single spaces
    assert lb.normalize_answer("The Cat's  hat, an apple!") == "cats hat apple"
    # punctuation goes *before* the article rule: "the-end" -> "theend" is no longer an article
    assert lb.normalize_answer("A.B. the-end") == "ab theend"


def test_qa_f1_score() -> None:
    # pred [eiffel, tower, in, paris] vs gt [eiffel, tower]: overlap 2, P = 2/4, R = 2/2, F1 = 2*.5*1/1.5 = 2/3
    assert lb.qa_f1_score("The Eiffel Tower in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    # multiset overlap: min(3, 1) = 1 -> P = 1/3, R = 1, F1 = (2/3)/(4/3) = 1/2
    assert lb.qa_f1_score("paris paris paris", "Paris") == pytest.approx(0.5)
    # [paris, paris] vs [paris, paris, london]: overlap min(2,2) = 2 -> P = 1, R = 2/3, F1 = (4/3)/(5/3) = 0.8
    # (a set overlap would give 1 -> P = 1/2, R = 1/3, F1 = 0.4)
    assert lb.qa_f1_score("Paris, Paris", "Paris Paris London") == pytest.approx(0.8)
    assert lb.qa_f1_score("London", "Paris") == 0.0
    assert lb.qa_f1_score("", "Paris") == 0.0


def test_normalize_zh_answer() -> None:
    # full-width ，！ and the ASCII '.' go, every whitespace goes, Latin letters are lower-cased
    assert lb.normalize_zh_answer("你好，世界！ Hello World.") == "你好世界helloworld"
    # upstream's Chinese set has the closing 》 but not the opening 《 ; — and … are in it
    assert lb.normalize_zh_answer("《三体》—— 刘慈欣…") == "《三体刘慈欣"


def test_qa_f1_zh_score() -> None:
    # jieba: 北京/是/中国/的/首都/。 (。 normalises to "" and is dropped: 5 tokens) vs 首都/是/北京 (3 tokens)
    assert list(jieba.cut("北京是中国的首都。", cut_all=False)) == ["北京", "是", "中国", "的", "首都", "。"]
    assert list(jieba.cut("首都是北京", cut_all=False)) == ["首都", "是", "北京"]
    # overlap {北京, 是, 首都} = 3: P = 3/5, R = 3/3, F1 = 2*.6/1.6 = 0.75
    assert lb.qa_f1_zh_score("北京是中国的首都。", "首都是北京") == pytest.approx(0.75)
    assert lb.qa_f1_zh_score("。", "北京") == 0.0


# --- ROUGE-L (the `rouge` package) -----------------------------------------------------------------------


def test_rouge_score_unique_words_and_epsilon() -> None:
    # one sentence each; `rouge` counts *unique* words: m = |{the,cat,lay,on,mat}| = 5, n = 5.
    # LCS(the cat lay on the mat, the cat sat on the mat) = the cat on the mat -> unique {the,cat,on,mat} = 4.
    # R = P = 4/5, F = 2 * (0.64) / (1.6 + 1e-8). (rouge-score would say 5/6 here.)
    value = lb.rouge_score("the cat sat on the mat", "the cat lay on the mat")
    assert value == pytest.approx(1.28 / (1.6 + 1e-8), rel=1e-12)
    assert value != pytest.approx(5 / 6, abs=1e-3)


def test_rouge_score_is_lcs_not_unigram() -> None:
    # same five words, order changed: ROUGE-1 would be 1. LCS([mat the on sat cat], [the cat sat on mat]) = 2
    # ("the" then one of on/sat/cat) -> P = R = 2/5, F = 2 * .16 / (.8 + 1e-8)
    assert lb.rouge_score("mat the on sat cat", "the cat sat on mat") == pytest.approx(0.32 / (0.8 + 1e-8), rel=1e-12)


def test_rouge_score_case_sensitive() -> None:
    # {The, cat} vs {the, cat}: LCS is [cat] -> P = R = 1/2, F = 2 * .25 / (1 + 1e-8)
    assert lb.rouge_score("The cat", "the cat") == pytest.approx(0.5 / (1 + 1e-8), rel=1e-12)


@pytest.mark.parametrize("prediction", ["", "...", " . "])
def test_rouge_score_exception_is_zero(prediction: str) -> None:
    # "" and "..." split on '.' into no sentence: the package raises "Hypothesis is empty" -> 0.0.
    # " . " gives two blank sentences: no error in rouge-l, but a non-empty hypothesis of no words -> 0.
    assert lb.rouge_score(prediction, "the cat sat") == 0.0


def test_rouge_zh_score() -> None:
    # jieba: 我 爱 北京 vs 我 爱 天安门 (space-joined); unique m = n = 3, LCS [我, 爱] = 2
    # P = R = 2/3, F = 2 * (4/9) / (4/3 + 1e-8)
    assert lb.rouge_zh_score("我爱北京", "我爱天安门") == pytest.approx((8 / 9) / (4 / 3 + 1e-8), rel=1e-12)
    assert lb.rouge_zh_score("", "我爱天安门") == 0.0


# --- classification, retrieval, count --------------------------------------------------------------------


def test_classification_score() -> None:
    classes = ["Location", "Person", "Number"]
    assert lb.classification_score("Person", "Person", all_classes=classes) == 1.0
    # matches (in all_classes order) [Location, Person]; neither is a strict substring of "Person" -> 1/2
    assert lb.classification_score("Person or Location", "Person", all_classes=classes) == 0.5
    assert lb.classification_score("Number", "Person", all_classes=classes) == 0.0
    assert lb.classification_score("nothing", "Person", all_classes=classes) == 0.0
    with pytest.raises(ValueError, match="all_classes"):
        lb.classification_score("Person", "Person")


def test_classification_removal_quirk() -> None:
    # matches = [birth, place, "place of birth"]. i=0: "birth" is a strict substring of the gold -> removed,
    # "place" slides to index 0; i=1 checks "place of birth" (== gold, kept). "place" escapes -> 1/2.
    # (A correct pruning would leave ["place of birth"] and score 1.0.)
    classes = ["birth", "place", "place of birth", "date"]
    assert lb.classification_score("place of birth", "place of birth", all_classes=classes) == 0.5
    # with a non-matching class between them nothing slides past: [birth, place of birth] -> [place of birth]
    assert (
        lb.classification_score("birth place of birth", "place of birth", all_classes=["birth", "place of birth"]) == 1
    )


def test_retrieval_and_count() -> None:
    # integers in pred [12, 3]; gold paragraph 12 -> 1/2
    assert lb.retrieval_score("Paragraph 12, not Paragraph 3", "Paragraph 12") == 0.5
    assert lb.retrieval_score("The answer is Paragraph 12", "Paragraph 12") == 1.0
    assert lb.retrieval_score("none of them", "Paragraph 12") == 0.0
    # "段落7和段落17": integers [7, 17], gold 7 -> 1/2 (17 is not a match for 7)
    assert lb.retrieval_zh_score("段落7和段落17", "段落7") == 0.5
    # the gold number is the one after "Paragraph " / "段落", not the first integer of the answer
    assert lb.retrieval_score("12", "Of 30 paragraphs: Paragraph 12") == 1.0
    assert lb.retrieval_zh_score("7", "共30段，段落7") == 1.0
    # [3, 30] vs 3 -> 1/2; [3, 3] -> 1
    assert lb.count_score("There are 3 unique paragraphs out of 30", "3") == 0.5
    assert lb.count_score("3, I said 3", "3") == 1.0
    with pytest.raises(ValueError, match="paragraph number"):
        lb.retrieval_score("12", "twelve")


# --- code similarity --------------------------------------------------------------------------------------


def test_code_line_selection() -> None:
    pred = "\n\n```python\n# a comment\nint x; // c\nx = `a`\n    return x + 1\nfoo()"
    assert lb.code_line(pred) == "    return x + 1"
    assert lb.code_line("# only\n// comments\n```") == ""
    assert lb.code_line("a = 1\nb = 2") == "a = 1"


def test_code_sim_backends_differ() -> None:
    # both 12 chars, total 24. difflib: greedy blocks "if (" (4), ") {" (3), then in "a < b" vs "b > a" the
    # earliest 1-char block "a"/"a" -> M = 8, 2*8/24 = .667 -> 67. Levenshtein: LCS = "if (" + "  " + ") {" = 9,
    # 2*9/24 = .75 -> 75.
    assert lb.code_sim_score("if (a < b) {", "if (b > a) {", fuzzy="difflib") == 0.67
    assert lb.code_sim_score("if (a < b) {", "if (b > a) {", fuzzy="levenshtein") == 0.75
    assert lb.DEFAULT_FUZZY == "difflib"
    assert lb.code_sim_score("if (a < b) {", "if (b > a) {") == 0.67
    # "ccaa" vs "abbac": difflib takes the first 1-char block c/c and nothing is left on either side -> 2/9 = 22;
    # LCS "aa" -> 4/9 = 44
    assert (lb.fuzzy_ratio("ccaa", "abbac", "difflib"), lb.fuzzy_ratio("ccaa", "abbac", "levenshtein")) == (22, 44)


def test_fuzzy_ratio_edges() -> None:
    # one common char in 16: 100 * 2/16 = 12.5 -> Python's round-half-even gives 12 (not 13)
    assert (
        lb.fuzzy_ratio("abcdefgh", "aijklmno", "difflib") == lb.fuzzy_ratio("abcdefgh", "aijklmno", "levenshtein") == 12
    )
    assert lb.fuzzy_ratio("", "x") == lb.fuzzy_ratio("x", "") == 0
    # fuzzywuzzy's equality check comes before its empty check: "" vs "" is 100, so an all-comment prediction
    # scores 1.0 against an empty gold line
    assert lb.fuzzy_ratio("", "") == 100
    assert lb.code_sim_score("# only a comment", "") == 1.0
    with pytest.raises(UserError, match="fuzzy"):
        lb.fuzzy_ratio("a", "b", "rapidfuzz")


def _string_pairs() -> list[tuple[str, str]]:
    rng = random.Random(0)
    pairs = [("", ""), ("", "a"), ("a", ""), ("same", "same"), ("if (a < b) {", "if (b > a) {")]
    for _ in range(300):
        pairs.append(tuple("".join(rng.choice("abc ") for _ in range(rng.randint(1, 12))) for _ in range(2)))
    # 200+ characters: difflib's autojunk heuristic comes into play
    for _ in range(20):
        pairs.append(tuple("".join(rng.choice("ab(x); ") for _ in range(rng.randint(200, 260))) for _ in range(2)))
    return pairs


@pytest.mark.parametrize("backend", ["difflib", "levenshtein"])
def test_fuzzy_ratio_matches_fuzzywuzzy(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # fuzzywuzzy with the matcher it would pick: difflib's without python-Levenshtein, StringMatcher with it
    matcher = difflib.SequenceMatcher if backend == "difflib" else StringMatcher
    monkeypatch.setattr(fuzz, "SequenceMatcher", matcher)
    pairs = _string_pairs()
    ours = [lb.fuzzy_ratio(a, b, backend) for a, b in pairs]
    assert ours == [fuzz.ratio(a, b) for a, b in pairs]
    other = "levenshtein" if backend == "difflib" else "difflib"
    assert ours != [lb.fuzzy_ratio(a, b, other) for a, b in pairs]  # the pairs do tell the backends apart


# --- samples, first-line rules, aggregates -----------------------------------------------------------------


def test_score_sample_first_line_rules() -> None:
    # triviaqa is on upstream's list: "\n\nParis\n..." -> "Paris" -> F1 1
    assert lb.score_sample("triviaqa", "\n\nParis\nThe capital is London", ["Paris"]) == 1.0
    # hotpotqa is not: [paris, london] vs [paris] -> P 1/2, R 1, F1 2/3; FoX cuts it to "Paris" -> 1
    assert lb.score_sample("hotpotqa", "Paris\nLondon", ["Paris"], None) == pytest.approx(2 / 3)
    assert lb.score_sample("hotpotqa", "Paris\nLondon", ["Paris"], None, first_line="fox") == 1.0
    # lcc upstream picks the first code line "x = 1" (equal -> 1.0); FoX keeps only "# comment" -> "" -> 0
    assert lb.score_sample("lcc", "# comment\nx = 1", ["x = 1"]) == 1.0
    assert lb.score_sample("lcc", "# comment\nx = 1", ["x = 1"], first_line="fox") == 0.0
    # trec: first line only, so "Location" on line 2 is not seen
    assert lb.score_sample("trec", "Person\nLocation", ["Location"], ["Person", "Location"]) == 0.0
    assert lb.scored_text("qmsum", "a\nb") == "a\nb"
    assert lb.scored_text("qmsum", "\na\nb", "fox") == "a"


def test_score_sample_max_over_answers_and_errors() -> None:
    assert lb.score_sample("hotpotqa", "Barack Obama", ["Obama", "Barack Obama"]) == 1.0
    # best of "Obama" (P 1/2, R 1 -> 2/3) and "Michelle" (0)
    assert lb.score_sample("hotpotqa", "Barack Obama", ["Obama", "Michelle"]) == pytest.approx(2 / 3)
    assert lb.score_sample("hotpotqa", "Barack Obama", []) == 0.0
    with pytest.raises(UserError, match="unknown LongBench task"):
        lb.score_sample("squad", "x", ["x"])
    with pytest.raises(UserError, match="first_line"):
        lb.score_sample("hotpotqa", "x", ["x"], first_line="all")
    with pytest.raises(UserError, match="fuzzy"):
        lb.score_sample("lcc", "x", ["x"], fuzzy="rapidfuzz")


def test_task_metric_table() -> None:
    assert len(lb.TASK_METRIC) == 21
    assert lb.FIRST_LINE_TASKS_UPSTREAM == {"trec", "triviaqa", "samsum", "lsht"}
    expected = {
        "qa_f1_score": {"narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "triviaqa"},
        "qa_f1_zh_score": {"multifieldqa_zh"},
        "rouge_score": {"gov_report", "qmsum", "multi_news", "samsum"},
        "rouge_zh_score": {"dureader", "vcsum"},
        "classification_score": {"trec", "lsht"},
        "count_score": {"passage_count"},
        "retrieval_score": {"passage_retrieval_en"},
        "retrieval_zh_score": {"passage_retrieval_zh"},
        "code_sim_score": {"lcc", "repobench-p"},
    }
    assert {name: {t for t, m in lb.TASK_METRIC.items() if m.__name__ == name} for name in expected} == expected
    assert len(lb.E_TASKS) == 13 and not {"narrativeqa", "musique", "qmsum"} & set(lb.E_TASKS)


def test_task_score_and_buckets() -> None:
    assert lb.task_score([1.0, 0.0, 0.5]) == 50.0  # 100 * 1.5 / 3
    assert lb.task_score([1 / 3] * 3) == 33.33
    # 100 * 0.02675 is the float 2.675 (just below 2.675): Python's round -> 2.67 (upstream's plain scorer);
    # numpy's round of the numpy mean -> 2.68 (upstream's LongBench-E scorer)
    assert lb.task_score([0.02675]) == 2.67
    assert lb.bucket_scores([0.02675], [10])["0-4k"] == 2.68
    with pytest.raises(ValueError):
        lb.task_score([])
    lengths = (0, 3999, 4000, 7999, 8000, 10**6)
    assert [lb.length_bucket(n) for n in lengths] == ["0-4k", "0-4k", "4-8k", "4-8k", "8k+", "8k+"]
    # 0-4k: [1] -> 100; 4-8k: [0, 1] -> 50; 8k+: [0.5] -> 50
    assert lb.bucket_scores([1, 0, 0.5, 1], [100, 5000, 9000, 4000]) == {"0-4k": 100.0, "4-8k": 50.0, "8k+": 50.0}
    assert lb.bucket_scores([1], [100]) == {"0-4k": 100.0, "4-8k": None, "8k+": None}


# --- scoring a folder of predictions -----------------------------------------------------------------------


def _write(path: Path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))


def _pred_dir(tmp_path: Path) -> Path:
    d = tmp_path / "pred"
    d.mkdir()
    # trec: the first line's all_classes is stale; upstream scores every line with the *last* line's list,
    # so line 1 matches [Person, Location] -> 1/2 (per-line classes would give 1), line 2 -> 1: mean 75.00
    _write(
        d / "trec.jsonl",
        [
            {"pred": "Person or Location", "answers": ["Person"], "all_classes": ["Person"], "length": 1000},
            {"pred": "Location", "answers": ["Location"], "all_classes": ["Person", "Location"], "length": 9000},
        ],
    )
    # hotpotqa: 1 (length 100), 2/3 (5000), 0 (5001): mean 5/9 -> 55.56; buckets 100 / 33.33 / -
    _write(
        d / "hotpotqa.jsonl",
        [
            {"pred": "Paris", "answers": ["Paris"], "all_classes": None, "length": 100},
            {"pred": "Paris London", "answers": ["Paris"], "all_classes": None, "length": 5000},
            {"pred": "Rome", "answers": ["Paris"], "all_classes": None, "length": 5001},
        ],
    )
    # lcc: "if (a < b) {" vs "if (b > a) {" -> .67 (difflib) or .75 (levenshtein); one line, length 9000
    _write(
        d / "lcc.jsonl",
        [{"pred": "\n# c\nif (a < b) {", "answers": ["if (b > a) {"], "all_classes": None, "length": 9000}],
    )
    _write(d / "records.jsonl", [{"key": "x"}])  # not a task: skipped with a note
    return d


def test_score_predictions_plain(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = _pred_dir(tmp_path)
    result = lb.score_predictions(d)
    assert result == {"hotpotqa": 55.56, "trec": 75.0, "lcc": 67.0}
    assert list(result) == ["hotpotqa", "trec", "lcc"]  # LongBench's task order
    assert json.loads((d / "result.json").read_text()) == result
    assert "records.jsonl" in capsys.readouterr().err
    assert lb.score_predictions(d, fuzzy="levenshtein")["lcc"] == 75.0
    # FoX's rule: lcc's first line is "# c" -> "" -> 0; hotpotqa and trec have single-line predictions
    assert lb.score_predictions(d, first_line="fox") == {"hotpotqa": 55.56, "trec": 75.0, "lcc": 0.0}


def test_score_predictions_e(tmp_path: Path) -> None:
    d = _pred_dir(tmp_path)
    result = lb.score_predictions(d, e=True)
    assert result == {
        "hotpotqa": {"0-4k": 100.0, "4-8k": 33.33, "8k+": None},
        "trec": {"0-4k": 50.0, "4-8k": None, "8k+": 100.0},
        "lcc": {"0-4k": None, "4-8k": None, "8k+": 67.0},
    }
    assert json.loads((d / "result.json").read_text()) == result


@pytest.mark.parametrize(
    ("lines", "where", "reason"),
    [
        (['{"pred": "a", "answers": ["a"]}', '{"pred": "a", "answers": '], 2, "not valid JSON"),
        (['{"pred": "a", "answers": ["a"]}', "", '["a"]'], 3, "JSON object"),  # blank lines still count
        (['{"answers": ["a"]}'], 1, "'pred'"),
        (['{"pred": "a", "answers": "a"}'], 1, "'answers'"),
        (['{"pred": "a", "answers": ["a"], "all_classes": "a"}'], 1, "'all_classes'"),
    ],
)
def test_malformed_lines_name_file_and_line(tmp_path: Path, lines: list[str], where: int, reason: str) -> None:
    (tmp_path / "qasper.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=rf"qasper\.jsonl:{where}: .*{reason}"):
        lb.score_predictions(tmp_path)


def test_score_predictions_data_errors(tmp_path: Path) -> None:
    (tmp_path / "qasper.jsonl").write_text('{"pred": "a", "answers": ["a"]}\n')
    with pytest.raises(UserError, match=r"qasper\.jsonl:1: 'length'"):
        lb.score_predictions(tmp_path, e=True)
    (tmp_path / "qasper.jsonl").unlink()
    _write(
        tmp_path / "passage_retrieval_en.jsonl",
        [{"pred": "1", "answers": ["Paragraph 1"]}, {"pred": "1", "answers": ["x"]}],
    )
    with pytest.raises(UserError, match=r"passage_retrieval_en\.jsonl:2: .*paragraph number"):
        lb.score_predictions(tmp_path)
    (tmp_path / "passage_retrieval_en.jsonl").unlink()
    _write(
        tmp_path / "trec.jsonl",
        [{"pred": "a", "answers": ["a"], "all_classes": ["a"]}, {"pred": "a", "answers": ["a"]}],
    )
    with pytest.raises(UserError, match=r"trec\.jsonl:2: trec needs 'all_classes'"):
        lb.score_predictions(tmp_path)
    (tmp_path / "trec.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no predictions"):
        lb.score_predictions(tmp_path)
    (tmp_path / "trec.jsonl").unlink()
    with pytest.raises(UserError, match="no LongBench prediction files"):
        lb.score_predictions(tmp_path)
    with pytest.raises(UserError, match="does not exist"):
        lb.score_predictions(tmp_path / "missing")


# --- tables ---------------------------------------------------------------------------------------------------

FOX14 = {
    "narrativeqa": 10.0,
    "qasper": 20.0,
    "multifieldqa_en": 30.0,
    "hotpotqa": 1.0,
    "2wikimqa": 2.0,
    "musique": 3.0,
    "gov_report": 4.0,
    "qmsum": 5.0,
    "multi_news": 6.0,
    "trec": 7.0,
    "triviaqa": 8.0,
    "samsum": 9.0,
    "lcc": 50.0,
    "repobench-p": 40.0,
}


def test_table2_groups_and_means() -> None:
    table = longbench_table({"fox": FOX14, "partial": {"narrativeqa": 10.0, "qasper": 20.0}})
    groups = list(dict.fromkeys(c for c, _ in table.columns))
    assert groups == ["Single-Doc QA", "Multi-Doc QA", "Summarization", "Few-shot", "Code", "Overall"]
    assert [t for c, t in table.columns if c == "Single-Doc QA"] == ["NarrativeQA", "Qasper", "MFQA-en", "Avg"]
    assert [t for c, t in table.columns if c == "Code"] == ["LCC", "RepoBench-P", "Avg"]
    row = table.loc["fox"]
    # category means: (10+20+30)/3 = 20, (1+2+3)/3 = 2, (4+5+6)/3 = 5, (7+8+9)/3 = 8, (50+40)/2 = 45
    assert [row[(c, "Avg")] for c in groups[:-1]] == [20.0, 2.0, 5.0, 8.0, 45.0]
    # overall = mean of the category means = 80/5 = 16 (the mean over the 14 tasks would be 195/14 = 13.93)
    assert row[("Overall", "Avg")] == pytest.approx(16.0)
    # a model missing tasks: its scores are shown, but no mean is made of fewer tasks
    partial = table.loc["partial"]
    assert partial[("Single-Doc QA", "Qasper")] == 20.0
    assert pd.isna(partial[("Single-Doc QA", "Avg")]) and pd.isna(partial[("Overall", "Avg")])


def test_table2_synthetic_when_present() -> None:
    scores = FOX14 | {"passage_count": 2.0, "passage_retrieval_en": 8.0, "multifieldqa_zh": 99.0}
    table = longbench_table({"fox": scores})
    assert [t for c, t in table.columns if c == "Synthetic"] == ["PassageCount", "PassageRetrieval-en", "Avg"]
    assert not any("zh" in t for _, t in table.columns)  # Chinese tasks are not in Table 2
    # synthetic mean 5; overall (20 + 2 + 5 + 8 + 45 + 5) / 6 = 85/6
    assert table.loc["fox", ("Overall", "Avg")] == pytest.approx(85 / 6)


def test_write_longbench_tables(tmp_path: Path) -> None:
    paths = write_longbench_tables({"fox": FOX14, "tf": FOX14 | {"lcc": 10.0}}, tmp_path / "lb")
    assert [p.name for p in paths] == ["lb.csv", "lb.md", "lb.tex"]
    csv = pd.read_csv(tmp_path / "lb.csv", index_col="model")
    assert list(csv.columns[:4]) == ["NarrativeQA", "Qasper", "MFQA-en", "Single-Doc QA Avg"]
    assert csv.loc["tf", "Code Avg"] == 25.0 and csv.loc["fox", "Avg"] == pytest.approx(16.0)
    # tf: code mean (10 + 40)/2 = 25 -> overall (20 + 2 + 5 + 8 + 25)/5 = 12
    assert csv.loc["tf", "Avg"] == pytest.approx(12.0)
    assert "| fox" in (tmp_path / "lb.md").read_text()
    tex = (tmp_path / "lb.tex").read_text()
    assert "Single-Doc QA" in tex and "multicolumn{4}" in tex and "multicolumn{3}" in tex  # 3 tasks + Avg; Code 2+1
    assert list(flat_columns(longbench_table({"fox": FOX14})).columns)[-1] == "Avg"
    with pytest.raises(UserError, match="e=True"):
        write_longbench_tables({"fox": {"qasper": {"0-4k": 1.0}}}, tmp_path / "x")


def test_write_longbench_e_tables(tmp_path: Path) -> None:
    e_result = {t: {"0-4k": 10.0, "4-8k": 20.0, "8k+": None} for t in lb.E_TASKS}
    paths = write_longbench_tables({"fox": e_result}, tmp_path / "lbe", e=True)
    assert [p.name for p in paths if p.suffix == ".csv"] == ["lbe_0-4k.csv", "lbe_4-8k.csv", "lbe_8kplus.csv"]
    low = pd.read_csv(tmp_path / "lbe_0-4k.csv", index_col="model")
    # narrativeqa, musique and qmsum have no LongBench-E data: not columns; Single-Doc QA = qasper + MFQA-en
    assert "NarrativeQA" not in low.columns and "MuSiQue" not in low.columns and "QMSum" not in low.columns
    assert list(low.columns[:3]) == ["Qasper", "MFQA-en", "Single-Doc QA Avg"]
    assert "PassageCount" in low.columns
    assert low.loc["fox", "Avg"] == 10.0
    assert pd.read_csv(tmp_path / "lbe_4-8k.csv", index_col="model").loc["fox", "Avg"] == 20.0
    high = pd.read_csv(tmp_path / "lbe_8kplus.csv", index_col="model")
    assert pd.isna(high.loc["fox", "Avg"]) and list(high.columns) == list(low.columns)  # same layout, all blank
    with pytest.raises(UserError, match="not LongBench-E buckets"):
        write_longbench_tables({"fox": FOX14}, tmp_path / "y", e=True)
