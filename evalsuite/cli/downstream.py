"""The downstream-task commands, ``evalsuite longbench`` (and ``longbench score``) and ``evalsuite summarize``:
thin layers over :mod:`evalsuite.tasks.longbench`, :mod:`evalsuite.metrics.longbench` and
:mod:`evalsuite.tasks.summarize`. Registered on the app when :mod:`evalsuite.cli.main` imports this module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import app
from evalsuite.cli.options import (
    BackendOpt,
    CheckpointOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    OutOpt,
    RepairOpt,
    SeedOpt,
    _adapter,
    _csv_list,
    _note_random_weights,
    _run,
)
from evalsuite.errors import UserError

longbench_app = typer.Typer(help="LongBench v1 / LongBench-E: run a model, or score predictions made elsewhere.")
app.add_typer(longbench_app, name="longbench")


@longbench_app.callback(invoke_without_command=True)
def longbench(
    ctx: typer.Context,
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="KIND:NAME (default kind native: a card or its YAML path).")
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="Folder in the official layout: <task>.jsonl, <task>_e.jsonl.")
    ] = None,
    tasks: Annotated[
        str | None, typer.Option(help="Comma-separated tasks, or the sets fox (default: FoX's 14) and english.")
    ] = None,
    e: Annotated[bool, typer.Option("--e", help="LongBench-E: <task>_e.jsonl, scores per length bucket.")] = False,
    max_length: Annotated[
        int | None,
        typer.Option(help="Prompt token budget (middle truncation) [default: upstream's rule, 15500 at 16K]."),
    ] = None,
    first_line: Annotated[str, typer.Option(help="upstream (trec/triviaqa/samsum/lsht) or fox (every task).")] = (
        "upstream"
    ),
    chat: Annotated[
        bool, typer.Option(help="Wrap prompts in the model's chat template (not the upstream-exempt tasks).")
    ] = False,
    fuzzy: Annotated[str | None, typer.Option(help="Code similarity backend: levenshtein or difflib.")] = None,
    on_bad_record: Annotated[str, typer.Option(help="error (stop at a bad line) or skip (leave it out, noted).")] = (
        "error"
    ),
    max_samples: Annotated[int | None, typer.Option(help="At most this many records per task.")] = None,
    batch_size: Annotated[int, typer.Option(help="Prompts per generate call.")] = 1,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    out: OutOpt = None,
    repair: RepairOpt = False,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Run a model on LongBench (arXiv:2308.14508) as the official pred.py/eval.py do; write records and tables."""
    if ctx.invoked_subcommand is not None:
        return
    from evalsuite.report.longbench import write_longbench_tables
    from evalsuite.tasks.longbench import LongBenchConfig, LongBenchTask

    if model is None:
        raise UserError("evalsuite longbench needs --model (or use `evalsuite longbench score PRED_DIR`)")
    config = LongBenchConfig(
        data=data,
        tasks=_csv_list(tasks, str, "--tasks"),
        e=e,
        max_length=max_length,
        first_line=first_line,
        chat=chat,
        fuzzy=fuzzy,
        on_bad_record=on_bad_record,
        max_samples=max_samples,
        batch_size=batch_size,
    )
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    results = _run(LongBenchTask(config), adapter, out, repair)
    summary = results["summary"]
    for note in summary["skipped_records"]:
        typer.echo(f"  skipped {note}", err=True)
    run_dir = Path(results["run_dir"])
    paths = write_longbench_tables({adapter.name: summary["scores"]}, run_dir / "longbench", e=e)
    typer.echo((run_dir / "longbench.md").read_text() if (run_dir / "longbench.md").exists() else "")
    typer.echo(f"{adapter.name}: LongBench{'-E' if e else ''}, {summary['truncated']} prompts truncated")
    _note_random_weights(adapter)
    for path in paths:
        typer.echo(f"wrote {path}")
    typer.echo(f"  results: {run_dir}")


@longbench_app.command("score")
def longbench_score(
    pred_dir: Annotated[Path, typer.Argument(help="Folder of <task>.jsonl predictions in upstream's pred.py layout.")],
    e: Annotated[bool, typer.Option("--e", help="Score per LongBench-E length bucket.")] = False,
    first_line: Annotated[str, typer.Option(help="upstream (trec/triviaqa/samsum/lsht) or fox (every task).")] = (
        "upstream"
    ),
    fuzzy: Annotated[str | None, typer.Option(help="Code similarity backend: levenshtein or difflib.")] = None,
):
    """Score predictions made elsewhere (upstream pred.py, vLLM, an API): writes PRED_DIR/result.json and tables."""
    from evalsuite.metrics.longbench import DEFAULT_FUZZY, score_predictions
    from evalsuite.report.longbench import write_longbench_tables

    result = score_predictions(pred_dir, e=e, first_line=first_line, fuzzy=fuzzy or DEFAULT_FUZZY)
    typer.echo(json.dumps(result, indent=1))
    for path in write_longbench_tables({pred_dir.resolve().name: result}, pred_dir / "longbench", e=e):
        typer.echo(f"wrote {path}")


@app.command()
def summarize(
    model: ModelOpt,
    data: Annotated[str, typer.Option(help="JSONL with a document and a reference summary per line.")],
    document_field: Annotated[str, typer.Option(help="Field holding the document.")] = "document",
    summary_field: Annotated[str, typer.Option(help="Field holding the reference summary.")] = "summary",
    max_docs: Annotated[int | None, typer.Option(help="The first N documents.")] = None,
    template: Annotated[str, typer.Option(help="drt (`<document>|Summary:`) or chat (the model's chat template).")] = (
        "drt"
    ),
    max_new_tokens: Annotated[int, typer.Option(help="Tokens generated per summary.")] = 128,
    temperature: Annotated[float, typer.Option(help="0: greedy; else seeded sampling.")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass (with --temperature > 0).")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest tokens (DRT: 2); 0: no cut.")] = 0,
    bpe_rouge: Annotated[bool, typer.Option(help="Also ROUGE over the model's tokens (DRT's flavour, labelled).")] = (
        False
    ),
    lead_baseline: Annotated[bool, typer.Option(help="Score the lead-1 baseline with the same code.")] = True,
    batch_size: Annotated[int, typer.Option(help="Documents per generate call.")] = 4,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    seed: SeedOpt = 0,
    out: OutOpt = None,
    repair: RepairOpt = False,
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Summarise documents and score ROUGE-1/2/L/Lsum (rouge-score, stemming) with seeded bootstrap intervals."""
    from evalsuite.tasks.summarize import SummarizeConfig, SummarizeTask

    config = SummarizeConfig(
        data=data,
        document_field=document_field,
        summary_field=summary_field,
        max_docs=max_docs,
        template=template,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        bpe_rouge=bpe_rouge,
        lead_baseline=lead_baseline,
        batch_size=batch_size,
        seed=seed,
    )
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    results = _run(SummarizeTask(config), adapter, out, repair)
    summary = results["summary"]
    rows = [(adapter.name, summary["metrics"])]
    if summary.get("lead_baseline"):
        rows.append(("lead-1 baseline", summary["lead_baseline"]))
    typer.echo(f"{adapter.name}: {summary['documents']} documents ({summary['truncated']} truncated), x100, 95% CI")
    for name, metrics in rows:
        cells = [
            f"{m} {100 * metrics[m]['mean']:.2f} [{100 * metrics[m]['low']:.2f}, {100 * metrics[m]['high']:.2f}]"
            for m in ("rouge1", "rouge2", "rougeL", "rougeLsum")
            if m in metrics
        ]
        typer.echo(f"  {name}: " + "; ".join(cells))
    _note_random_weights(adapter)
    typer.echo(f"  results: {results['run_dir']}")


@app.command("train-lm")
def train_lm_cmd(
    corpus: Annotated[str, typer.Option(help="Training text: a file or folder (.txt, .jsonl[.xz]).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Run folder: checkpoint/, train.json.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Card (or its YAML path) whose architecture to train.")
    ] = None,
    preset: Annotated[
        str | None, typer.Option(help="Train a preset's cards alike instead (tasks/train-lm.yaml: zoo).")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, help="With --preset: runs trained at once.")] = 1,
    heldout: Annotated[str | None, typer.Option(help="Held-out text (default: the corpus's last windows).")] = None,
    seq_len: Annotated[int, typer.Option(help="Training length in tokens.")] = 1024,
    batch_size: Annotated[int, typer.Option(min=1)] = 32,
    steps: Annotated[int, typer.Option(min=0, help="Pre-training steps.")] = 3000,
    finetune_steps: Annotated[int, typer.Option(min=0, help="Then steps on DRT passkey/2-hop rows (0: none).")] = 300,
    finetune_loss: Annotated[
        str, typer.Option(help="Fine-tuning loss over 'all' sample tokens (the released data) or the 'answer' only.")
    ] = "all",
    init: Annotated[Path | None, typer.Option(help="Start from this checkpoint (e.g. a run's pretrained/).")] = None,
    pretrain_retrieval_rows: Annotated[
        int, typer.Option(min=0, help="Rows of each pre-training batch that are passkey/2-hop rows (0: none).")
    ] = 0,
    lr: Annotated[float, typer.Option(help="Peak learning rate (warmup, then cosine), per stage.")] = 1e-3,
    min_lr_ratio: Annotated[float, typer.Option(help="The cosine's floor / peak (the GCA paper: 0.2).")] = 0.2,
    max_tokens: Annotated[int | None, typer.Option(help="Read at most this many corpus tokens.")] = None,
    device: DeviceOpt = "auto",
    seed: SeedOpt = 0,
):
    """Train a small LM from scratch (or from --init) on a corpus, then fine-tune it on the DRT retrieval tests (GCA
    paper §4.2); or, with --preset, train a preset's cards alike (the zoo: every seed family, two seeds each)."""
    from evalsuite.cards import load_card
    from evalsuite.runtime import resolve_device
    from evalsuite.training.lm_train import LMTrainConfig, train_lm

    if (model is None) == (preset is None):
        raise UserError("give either --model or --preset")
    if preset is not None:
        from evalsuite.training.zoo import load_preset, train_preset

        summary = train_preset(load_preset(preset), corpus, out, device=str(resolve_device(device)), workers=workers,
                               max_tokens=max_tokens, log=typer.echo)  # fmt: skip
        typer.echo(f"{len(summary['members'])} runs trained; wrote {out}/zoo.json")
        return
    config = LMTrainConfig(corpus=corpus, seq_len=seq_len, batch_size=batch_size, steps=steps,
                           finetune_steps=finetune_steps, lr=lr, min_lr_ratio=min_lr_ratio, seed=seed,
                           max_tokens=max_tokens, finetune_loss=finetune_loss,
                           pretrain_retrieval_rows=pretrain_retrieval_rows)  # fmt: skip
    summary = train_lm(load_card(model), config, out, device=resolve_device(device), heldout=heldout, init=init)
    final = summary["final_eval"]
    retrieval = ""
    if "retrieval_first_accuracy" in final:
        retrieval = (f", held-out passkey/2-hop answers: first-token accuracy {final['retrieval_first_accuracy']:.3f}"
                     f", token accuracy {final['retrieval_accuracy']:.3f}")  # fmt: skip
    typer.echo(f"{summary['model']}: {summary['steps']} steps in {summary['seconds']:.0f} s, held-out loss "
               f"{final['loss']:.3f}, next-token accuracy {final['accuracy']:.3f}{retrieval}; "
               f"wrote {out}/checkpoint")  # fmt: skip
