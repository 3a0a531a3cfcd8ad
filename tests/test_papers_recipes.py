"""Recipes: the columns computed from model cards (parameters, FLOPs by the papers' formulas, architecture flags)
against counts worked out by hand, the FoX paper's Table 6 counts of the 760M cards, how columns group into runs,
and how --models specs split and name their runs."""

import csv
import io

import pytest

from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.papers.found import scan
from evalsuite.papers.params import breakdown
from evalsuite.papers.published import find_item, load_papers
from evalsuite.papers.recipes import card_value, flops_per_token, jobs
from evalsuite.papers.render import compare, our_row
from evalsuite.papers.run import RunOptions, _longbench_task, model_name, split_models

V, D, LAYERS, HEADS, FF = 50257, 64, 2, 4, 256  # fox-pro-tiny; FF: 2/3 of 3.5 d, rounded up to a multiple of 256


def fox_pro_tiny_by_hand() -> dict[str, int]:
    """fox-pro-tiny's parameters per component, from the FoX (Pro) block's definition (arXiv:2503.02130 §3): q, k,
    v, o and the output gate are d×d; the data-dependent KV-shift mixes k and v with one gate per head from x (a d→H
    map each, no bias); the forget gate is a d→H map with a bias; the MLP is SwiGLU (gate, up: d×FF, down: FF×d);
    RMSNorm weights for the attention and MLP inputs, the per-head QK-norm (q and k: H × head dim = d each), the
    output norm, and the final norm."""
    mixer = 5 * D * D + 2 * HEADS * D + (HEADS * D + HEADS)
    norms = LAYERS * (2 * D + 3 * D) + D
    return {"input embedding": V * D, "LM head": V * D, "MLP": LAYERS * 3 * D * FF, "norms": norms,
            "token mixer": LAYERS * mixer}  # fmt: skip


def test_params_and_flops_of_a_tiny_card_match_the_hand_count():
    card = load_card("fox-pro-tiny")
    parts = fox_pro_tiny_by_hand()
    assert breakdown(card) == parts
    non_embedding = sum(parts.values()) - V * D
    assert card_value({"kind": "params", "what": "non_embedding"}, card) == non_embedding == 3_357_960
    assert card_value({"kind": "params", "what": "total"}, card) == non_embedding + V * D
    # FoX Table 6: 2N + 2 n_layer d_model L, N the non-embedding count, L the training length (2048 for the twin)
    flops = card_value({"kind": "flops", "formula": "2N + 2 n_layer d_model L"}, card)
    assert flops == 2 * non_embedding + 2 * LAYERS * D * 2048
    assert [card_value({"kind": "card", "field": f}, card) for f in ("n_layer", "d_model", "d_head")] == [2, 64, 16]
    flags = ("rope", "forget_gate", "qk_norm", "output_gate", "output_norm", "kv_shift")
    assert [card_value({"kind": "card", "field": f}, card) for f in flags] == [False, True, True, True, True, True]
    llama = load_card("transformer-llama-tiny")
    assert [card_value({"kind": "card", "field": f}, llama) for f in flags] == [True, False, False, False, False, False]


def test_the_760m_cards_give_the_fox_papers_table6_counts():
    """Table 6 prints 759M / 757M / 757M / 756M and 2.72×10⁹: our counts, cut (not rounded) to what it prints."""
    item = find_item(load_papers(), "fox:table6")
    for row in item.rows[:4]:
        card = load_card(row.model)
        params = card_value(item.columns[0].recipe, card)
        flops = card_value(item.columns[1].recipe, card)
        assert f"{int(params // 1e6)}M" == row.values[0], row.label
        assert f"{int(flops / 1e7) / 100:.2f}×10⁹" == row.values[1], row.label


def test_a_flops_formula_is_read_as_the_paper_writes_it():
    symbols = {"N": 10.0, "n_layer": 2.0, "d_model": 3.0, "d_head": 5.0, "L": 7.0, "d_state": None}
    assert flops_per_token("2N + 2 n_layer d_model L", symbols) == 20 + 84
    assert flops_per_token("2N+6 n_layer d_model d_head", symbols) == 20 + 180
    with pytest.raises(UserError, match=r"d_state is not known for this model"):
        flops_per_token("2N + 20 n_layer d_model d_state", symbols)
    with pytest.raises(UserError, match=r"cannot read FLOPs formula"):
        flops_per_token("2N + (n_layer)", symbols)


def test_the_ablation_matrix_of_our_cards_equals_the_papers_rows():
    """FoX Table 3's check marks for FoX (Pro) and Transformer (Pro) are our cards' switches: every cell '='."""
    item = find_item(load_papers(), "fox:table3")
    results = scan("no-such-folder")
    ours = [our_row(item, model, results) for model in ("fox-pro", "transformer-pro", "fox-llama")]
    _, delta, notes = compare(item, ours, results)
    assert [line.label for line in delta.lines] == ["fox-pro − FoX (Pro)",
        "transformer-pro − - forget gate + RoPE (i.e. Transformer (Pro))", "fox-llama − FoX (LLaMA)"]  # fmt: skip
    for line in delta.lines:
        assert [c.text for c in line.cells[:6]] == ["="] * 6 and line.cells[6].text == ""
    assert any("Perplexity: no results of these models for loss P(16384) on longcrawl64-heldout" in n for n in notes)
    assert any("beside the paper's row 'FoX (Pro)': 360M params, 7.5B tokens" in n for n in notes)


def test_columns_group_into_one_run_per_kind_and_settings():
    item = find_item(load_papers(), "fox:table2")
    (job,) = jobs(item)
    assert job.kind == "longbench" and job.setting("first_line") == "fox" and len(job.columns) == 14
    task = _longbench_task(job, RunOptions(longbench_data="LongBench/data", limit=2), "fox:table2")
    assert task.config.tasks == ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique",
        "gov_report", "qmsum", "multi_news", "trec", "triviaqa", "samsum", "lcc", "repobench-p"]  # fmt: skip
    assert task.config.first_line == "fox" and task.config.max_samples == 2
    table3 = find_item(load_papers(), "fox:table3")
    assert [(j.kind, j.values("length")) for j in jobs(table3)] == [("loss", [16384])]
    assert jobs(find_item(load_papers(), "fox:table6")) == []  # cards and a GPU bench: nothing for `paper run`


def test_model_specs_split_and_name_their_runs():
    assert split_models("fox-pro-tiny,openai:m,base_url=http://h:1/v1,api=completions, hf:/x/SmolLM2/") == [
        "fox-pro-tiny", "openai:m,base_url=http://h:1/v1,api=completions", "hf:/x/SmolLM2/"]  # fmt: skip
    assert split_models(None) == [] and split_models(" , ") == []
    assert model_name("fox-pro-tiny") == "fox-pro-tiny"
    assert model_name("openai:org/model-x,base_url=http://h:1/v1") == "org--model-x"
    assert model_name("hf:/models/SmolLM2-135M/") == "SmolLM2-135M"
    assert model_name("hf:/models/dir,gguf_file=smol-q8.gguf") == "smol-q8"
    with pytest.raises(UserError, match="unknown model 'no-such-card'"):
        model_name("no-such-card")


def test_the_computable_items_render_offline_in_each_columns_unit(run_cli, tmp_path):
    """The parameter items of the Lightning paper print tnl's count as each column does ("385M"; "44.65" under unit
    M; "0.35" under unit B), and FoX Table 4 our cards' sizes under its own row header."""
    total = card_value({"kind": "params", "what": "total"}, load_card("tnl"))

    def ours(item_id: str, *options) -> tuple[list[list[str]], dict[str, list[str]]]:
        code, out, err = run_cli(["paper", "render", item_id, "--format", "csv", *options], tmp_path)
        assert code == 0, err
        rows = list(csv.reader(io.StringIO(out)))
        return rows, {row[1]: row[2:] for row in rows if row[0] == "ours"}

    for item_id in ("lightning:table3", "lightning:table11"):  # the paper's rows name the tnl card
        assert ours(item_id)[1]["tnl (ours)"][0] == f"{total / 1e6:.2f}M"
    assert ours("lightning:table1", "--models", "tnl")[1]["tnl (ours)"][-1] == f"{total / 1e6:.4f}"
    assert float(ours("lightning:table2", "--models", "tnl")[1]["tnl (ours)"][0]) == pytest.approx(total / 1e9, 1e-3)
    rows, cells = ours("fox:table4", "--models", "fox-pro,transformer-llama")
    assert rows[0][:2] == ["source", "Configuration"]
    assert cells == {"fox-pro (ours)": ["24", "1536", "64", ""], "transformer-llama (ours)": ["24", "1536", "128", ""]}
