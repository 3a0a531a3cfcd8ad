"""The papers' published tables as data and their layouts: loader validation, printed numbers, `paper show`
(CSV exactly as transcribed; Markdown and LaTeX marks, group headers, check-mark matrices) and `paper list`."""

import csv
import io
from pathlib import Path

import pytest
import yaml
from conftest import assert_one_line_error

from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.papers.format import CARD_FIELDS
from evalsuite.papers.found import FINDERS
from evalsuite.papers.layout import latex_escape, marks
from evalsuite.papers.numbers import NumberFormat, infer_format, parse_number
from evalsuite.papers.published import DATA_DIR, PAPER_ORDER, all_items, find_item, load_paper, load_papers
from evalsuite.papers.recipes import CARD_VALUES, RUN_KINDS

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "fox.md"


def demo_paper() -> dict:
    """A small valid paper file (as a dict, in the format of docs/paper-tables.md) the malformed cases below break
    one field of."""
    loss = {"kind": "loss", "dataset": "synthetic", "length": 64, "metric": "ppl"}
    row = {"group": None, "model": None, "scale": "tiny", "source": None}
    return {
        "paper": "demo",
        "title": "Demo",
        "arxiv": "0000.00000",
        "items": [
            {
                "id": "demo:table1",
                "kind": "table",
                "number": "1",
                "caption": "A demo table of two models.",
                "columns": [
                    {"key": "ppl", "label": "ppl", "group": None, "better": "lower", "unit": None, "recipe": loss},
                    {"key": "acc", "label": "acc", "group": "G", "better": "higher", "unit": "%", "recipe": None},
                ],
                "rows": [
                    {"label": "A", **row, "values": ["1.50", "60.0"]},
                    {"label": "B", **row, "values": ["1.20", None]},
                ],
                "averages": [],
                "footnotes": [],
                "marks": "best_second",
                "needs": "training",
            }
        ],
    }


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False))
    return path


def test_the_data_files_load_and_name_real_cards():
    papers = load_papers()
    items = all_items(papers)
    assert {"fox:table2", "fox:table3", "fox:table4", "fox:table6", "gsa:figure3a"} <= {i.id for i in items}
    for item in items:
        for row in item.rows:
            assert len(row.values) == len(item.columns)
            if row.model is not None:
                assert load_card(row.model).name == row.model, f"{item.id} row {row.label!r}"
    assert set(FINDERS) == set(RUN_KINDS)  # every run kind of a recipe has a way to find its values
    assert set(CARD_VALUES) == set(CARD_FIELDS)  # every field a card recipe may name is read from the card


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d["items"][0]["rows"][0].update(values=["1.50", 60.0]), "not a non-empty string as printed"),
        (lambda d: d["items"][0]["rows"][1].update(values=["1.20"]), "1 values for 2 columns"),
        (lambda d: d["items"][0]["columns"][0].update(recipe={"kind": "magic"}), "has no known kind"),
        (
            lambda d: d["items"][0]["columns"][0].update(recipe={"kind": "loss"}),
            "lacks ['dataset', 'length', 'metric']",
        ),
        (lambda d: d["items"][0]["columns"][0]["recipe"].update(lenght=2), "names ['lenght']"),
        (lambda d: d["items"][0]["columns"][1].update(recipe={"kind": "card", "field": "heads"}), "field is not one"),
        (
            lambda d: d["items"][0]["columns"][1].update(
                recipe={"kind": "longbench", "dataset": "trec", "first_line": "x"}
            ),
            "first_line is not one of ['fox', 'upstream']",
        ),
        (lambda d: d["items"][0].update(row_header=""), "row_header '' is not a non-empty string"),
        (lambda d: d["items"][0]["columns"][1].update(better="up"), "better 'up'"),
        (lambda d: d["items"][0].update(id="fox:table1"), "id 'fox:table1' does not match"),
        (lambda d: d["items"][0].update(kind="figure"), "does not match kind 'figure'"),
        (lambda d: d["items"][0].update(colour="red"), "'colour'"),
        (lambda d: d["items"][0].update(needs="luck"), "needs 'luck'"),
        (lambda d: d["items"][0].update(averages=[{"column": "avg", "of": ["acc"], "how": "mean"}]), "not a mean"),
        (lambda d: d["items"][0]["columns"][1].update(key="ppl"), "column keys repeat"),
        (lambda d: d["items"][0]["rows"][0].update(model="no-such-card"), "'no-such-card' is not a model card"),
        (lambda d: d["items"].append(dict(d["items"][0])), "duplicate item id(s) demo:table1"),
        (lambda d: d.update(paper="other"), "paper 'other' is not the file's stem 'demo'"),
    ],
)
def test_a_malformed_file_is_one_line_naming_file_and_item(tmp_path, change, message):
    data = demo_paper()
    load_paper(write(tmp_path, data))  # valid as written
    change(data)
    path = write(tmp_path, data)
    with pytest.raises(UserError) as raised:
        load_paper(path)
    text = str(raised.value)
    assert message in text and str(path) in text and "\n" not in text
    if "file's stem" not in message:
        assert data["items"][0]["id"] in text  # the item the problem is in


def test_printed_numbers_parse_and_print_in_the_papers_format():
    assert [parse_number(s) for s in ("63.5", "18.10", "09.9", "759M", "27k", "2.72×10⁹", "1×10⁻³", "-0.5")] == [
        63.5, 18.1, 9.9, 759e6, 27e3, 2.72e9, 1e-3, -0.5]  # fmt: skip
    assert [parse_number(s) for s in ("✓", "-", "N/A", "64×Ld", "64 for FoX, 128 for Transformer", None)] == [None] * 6
    assert infer_format(["13.38", "11.42"]) == NumberFormat(decimals=2)
    assert infer_format(["10.9", "10.79", "63.5"]) == NumberFormat(decimals=2, trim=True)
    assert infer_format(["759M", "757M"]) == NumberFormat(decimals=0, suffix="M")
    assert infer_format(["2.72×10⁹"]).format(2.7269e9) == "2.73×10⁹"
    assert NumberFormat(decimals=2, trim=True).format(55.0) == "55.0"  # Python's round(x, 2), as LongBench prints
    assert NumberFormat(decimals=0, suffix="M").format(759_441_984, extra=2) == "759.44M"
    assert NumberFormat(decimals=2).format(-0.004, signed=True) == "0.00"
    assert NumberFormat(decimals=2).format(1.5, signed=True) == "+1.50"
    # one column printing "63.5" beside "13.38" makes the whole table Python-rounded (FoX Table 2)
    table2 = find_item(load_papers(), "fox:table2")
    assert all(f.trim and f.decimals == 2 for f in table2.formats)
    assert table2.formats[table2.index("trec")].format(62.25) == "62.25"


def test_marks_follow_each_columns_direction():
    assert marks([1.0, 2.0, 3.0, None], "lower", "best_second") == ["best", "second", None, None]
    assert marks([1.0, 3.0, 3.0, 2.0], "higher", "best_second") == [None, "best", "best", "second"]
    assert marks([1.0, 3.0, 2.0], "higher", "bold_best") == [None, "best", None]
    assert marks([1.0, 3.0], "higher", "none") == [None, None]
    assert marks([1.0, 3.0], None, "best_second") == [None, None]
    assert latex_escape("2.72×10⁹ n_layer ✓ 1×10⁻³") == r"2.72$\times 10^{9}$ n\_layer \checkmark{} 1$\times 10^{-3}$"


def test_show_csv_prints_the_published_table_exactly(run_cli, tmp_path):
    code, out, err = run_cli(["paper", "show", "fox:table2", "--format", "csv"], tmp_path)
    assert code == 0, err
    rows = list(csv.reader(io.StringIO(out)))
    items = yaml.safe_load((DATA_DIR / "fox.yaml").read_text())["items"]
    transcribed = next(i for i in items if i["id"] == "fox:table2")
    assert rows[0] == [""] + [c["group"] for c in transcribed["columns"]]
    assert rows[1] == ["Model"] + [c["label"] for c in transcribed["columns"]]
    assert rows[2:] == [[r["label"], *(v or "" for v in r["values"])] for r in transcribed["rows"]]
    assert rows[2][10] == "63.5" and rows[3][8] == "10.7" and rows[6][6] == "5.0"  # printed, not re-formatted


@pytest.mark.skipif(not REFERENCE.is_file(), reason="the engineering notes (../shared/reference/fox.md) are absent")
def test_show_csv_matches_the_engineering_notes_table(run_cli, tmp_path):
    """The transcription against the notes' own copy of Table 2 (a second source, checked cell by cell)."""
    section = REFERENCE.read_text().split("### Table 2:")[1].split("###")[0]
    noted = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| Model")]  # fmt: skip
    code, out, _ = run_cli(["paper", "show", "fox:table2", "--format", "csv"], tmp_path)
    assert list(csv.reader(io.StringIO(out)))[2:] == noted


def test_show_md_and_latex_mark_best_and_second_with_group_headers(run_cli, tmp_path):
    code, md, err = run_cli(["paper", "show", "fox:table2"], tmp_path)
    assert code == 0, err
    fox_pro = next(line for line in md.splitlines() if line.startswith("| FoX (Pro)"))
    assert "| **13.38** | <u>18.88</u> |" in fox_pro and "| 10.9 | 9.1 |" in fox_pro  # NarrativeQA best, Qasper 2nd
    assert "| **18.17** | **16.62** |" in next(line for line in md.splitlines() if line.startswith("| HGRN2"))
    assert "Column groups: Single-Document QA (NarrativeQA – MFQA); Multi-Document QA" in md
    assert "| Model | NarrativeQA ↑ |" in md
    code, tex, err = run_cli(["paper", "show", "fox:table2", "--format", "latex"], tmp_path)
    assert code == 0, err
    assert r"\multicolumn{3}{c}{Single-Document QA}" in tex and r"\cmidrule(lr){2-4}" in tex
    assert r"\multicolumn{2}{c}{Code}" in tex and r"\cmidrule(lr){14-15}" in tex
    assert r"FoX (Pro) & \textbf{13.38} & \underline{18.88}" in tex and r"NarrativeQA $\uparrow$" in tex
    assert tex.count(r"\toprule") == 1 and tex.count(r"\bottomrule") == 1


def test_show_the_check_mark_matrix(run_cli, tmp_path):
    code, md, err = run_cli(["paper", "show", "fox:table3"], tmp_path)
    assert code == 0, err
    assert "| FoX (Pro) |  | ✓ | ✓ | ✓ | ✓ | ✓ | 6.62 |" in md
    assert "| - forget gate + RoPE (i.e. Transformer (Pro)) | ✓ |  | ✓ | ✓ | ✓ | ✓ | 6.82 |" in md
    assert not any("**" in line for line in md.splitlines() if line.startswith("|"))  # Table 3 marks nothing
    code, tex, err = run_cli(["paper", "show", "fox:table3", "--format", "latex"], tmp_path)
    fox_pro = next(line for line in tex.splitlines() if line.startswith("FoX (Pro) &"))
    assert fox_pro == r"FoX (Pro) &  & " + r"\checkmark{} & " * 5 + r"6.62 \\"
    assert r"Perplexity $\downarrow$" in tex


def test_show_keeps_tex_formulas_and_multi_line_cells(run_cli, tmp_path):
    """A $TeX$ caption or cell stays TeX in LaTeX (docs/paper-tables.md "Spelling"); a cell of several lines keeps
    them; a plot whose text gives no point shows its axes and series, empty."""
    code, tex, err = run_cli(["paper", "show", "fox:table6", "--format", "latex"], tmp_path)
    assert code == 0, err
    assert r"& 2.72$\times 10^{9}$ & $2N+2n_{\text{layer}}d_{\text{model}}L$ & 27k \\" in tex
    assert r"GPUs. $N$ is the number of parameters and $L$ is the training context length.}" in tex
    code, md, err = run_cli(["paper", "show", "gca:table5"], tmp_path)
    assert "| Single NIAH | (essays)…<br>The passkey is: {tokens}.<br>What is the passkey?" in md
    code, tex, err = run_cli(["paper", "show", "gca:table5", "--format", "latex"], tmp_path)
    assert r"Single NIAH & \shortstack[l]{(essays)… \\ The passkey is: \{tokens\}. \\ What" in tex
    code, md, err = run_cli(["paper", "show", "gsa:figure3a"], tmp_path)
    assert "| GSA |  |  |  |  |" in md and "axes and series but no point" in md


def test_list_covers_every_item_of_every_paper(run_cli, tmp_path):
    extra = tmp_path / "papers"
    extra.mkdir()
    write(extra, demo_paper())
    code, out, err = run_cli(["paper", "list", "--results", tmp_path / "none", "--papers", extra], tmp_path)
    assert code == 0, err
    listed = [line.split(" | ")[0].strip("| ") for line in out.splitlines()[2:]]
    assert listed == [i.id for i in all_items(load_papers((extra,)))]
    in_files = [i["id"] for p in PAPER_ORDER for i in yaml.safe_load((DATA_DIR / f"{p}.yaml").read_text())["items"]]
    assert listed == [*in_files, "demo:table1"] and len(in_files) == 82  # every item of the four files, in order
    line = {row.split(" | ")[0].strip("| "): row for row in out.splitlines()[2:]}
    assert "| cards | 7×4 | params (1), flops (1), bench (1) | from the cards |" in line["fox:table6"]
    assert "| dataset | 7×14 | longbench (14) | none |" in line["fox:table2"]
    assert "| training | 2×2 | loss (1) | none |" in line["demo:table1"]


def test_unknown_items_and_formats_are_one_line_errors(run_cli, tmp_path):
    code, _, err = run_cli(["paper", "show", "fox:table99"], tmp_path)
    assert_one_line_error(code, err, "unknown table or figure 'fox:table99'; known: fox:figure1, fox:figure2, ")
    code, _, err = run_cli(["paper", "show", "fox:table2", "--format", "html"], tmp_path)
    assert_one_line_error(code, err, "--format must be one of md, latex, csv")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "demo.yaml").write_text("paper: demo\nitems: [\n")
    code, _, err = run_cli(["paper", "list", "--papers", bad], tmp_path)
    assert_one_line_error(code, err, "is not valid YAML")
