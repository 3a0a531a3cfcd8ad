"""The benchmark commands, ``evalsuite bench attention|linear|gca|generate|throughput|tune|profile-decode|
loss-window|drt-memory|step-time|train|saved-memory``: thin layers over :mod:`evalsuite.bench` (the kernel-level
``srmsnorm``, ``sass`` and ``profile-ops``: :mod:`evalsuite.cli.bench_kernels`). Registered on the ``bench`` group
when :mod:`evalsuite.cli.main` imports this module."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evalsuite.cli.app import bench_app
from evalsuite.cli.options import DeviceOpt, RepairOpt, _csv_list
from evalsuite.errors import UserError

RoundsOpt = Annotated[
    int, typer.Option(help="Rounds of the interleaved timing (A B A B ...): one ours/peer ratio pair each.")
]


def _check_rounds(rounds: int) -> None:
    if rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {rounds}")


LinearOpsOpt = Annotated[str, typer.Option("--ops", help="Comma-separated: gsa, lightning.")]
AutoDtypeOpt = Annotated[
    str | None, typer.Option(help="float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 on CPU).")
]


def _check_dtype(dtype: str | None) -> None:
    """A UserError for a ``--dtype`` outside :data:`evalsuite.runtime.DTYPES` (None: the device's default)."""
    from evalsuite.runtime import DTYPES

    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"unknown --dtype {dtype!r}; use {', '.join(DTYPES)}")


def _check_choices(chosen: dict[str, list[str]], allowed: dict[str, tuple[str, ...]]) -> None:
    """A UserError naming the first option with a value outside its ``allowed`` choices."""
    for option, values in chosen.items():
        bad = [v for v in values if v not in allowed[option]]
        if bad:
            raise UserError(f"unknown {option} value(s) {', '.join(bad)}; choose from {', '.join(allowed[option])}")


@bench_app.command("attention")
def bench_attention_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, PNG).")] = Path(
        "results/runs/bench/attention"
    ),
    seq_lens: Annotated[str, typer.Option(help="Comma-separated T values.")] = "1024,2048,4096,8192,16384,32768,65536",
    head_dims: Annotated[str, typer.Option(help="Comma-separated head dims.")] = "64,128",
    providers: Annotated[
        str, typer.Option(help="Comma-separated: fox_triton, triton_causal, sdpa_causal, fla_forgetting.")
    ] = "fox_triton,triton_causal,sdpa_causal,fla_forgetting",
    n_heads: Annotated[int, typer.Option(help="Heads per call.")] = 16,
    tokens_per_call: Annotated[int, typer.Option(help="B*T, fixed across T.")] = 65536,
    dtype: Annotated[str, typer.Option(help="bfloat16 or float16.")] = "bfloat16",
    parity_seq_lens: Annotated[str, typer.Option(help="Comma-separated T for the parity check ('' to skip).")] = (
        "1024,2048,4096,8192,16384"
    ),
    tune: Annotated[bool, typer.Option(help="Sweep block configs first and use the best.")] = False,
    rounds: RoundsOpt = 10,
):
    """Time our Forgetting Attention kernel against SDPA causal (and fla when installed), interleaved: fwd, fwd+bwd,
    memory."""
    from evalsuite.bench.attention import PROVIDERS, bench_attention

    chosen = _csv_list(providers, str, "--providers")
    bad = [p for p in chosen if p not in PROVIDERS]
    if bad or dtype not in ("bfloat16", "float16"):
        raise UserError(f"unknown provider(s) {', '.join(bad)}" if bad else "--dtype must be bfloat16 or float16")
    _check_rounds(rounds)
    bench_attention(
        out,
        seq_lens=_csv_list(seq_lens, int, "--seq-lens"),
        head_dims=_csv_list(head_dims, int, "--head-dims"),
        providers=chosen,
        n_heads=n_heads,
        tokens_per_call=tokens_per_call,
        dtype=dtype,
        parity_seq_lens=_csv_list(parity_seq_lens, int, "--parity-seq-lens", allow_empty=True),
        tune=tune,
        rounds=rounds,
    )
    typer.echo(f"wrote {out}/attention_bench.json and .png")


@bench_app.command("linear")
def bench_linear_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, PNG, summary).")] = Path(
        "results/runs/bench/linear"
    ),
    seq_lens: Annotated[str, typer.Option(help="Comma-separated T values.")] = "1024,2048,4096,8192,16384,32768,65536",
    ops: LinearOpsOpt = "gsa,lightning",
    providers: Annotated[
        str | None,
        typer.Option(help="Comma-separated [default: Triton + fla + SDPA on CUDA, the chunked twins on CPU]."),
    ] = None,
    modes: Annotated[str, typer.Option(help="Comma-separated: fwd, fwdbwd, bwd, decode, memory.")] = (
        "fwd,fwdbwd,decode,memory"
    ),
    rounds: RoundsOpt = 10,
    batch: Annotated[
        int | None, typer.Option(help="Fixed batch B at every T [default: B = 65536 // T, fixed tokens per call].")
    ] = None,
    parity_t: Annotated[
        int, typer.Option("--parity-T", help="T of the parity check of ours vs fla, fwd + bwd (0: skip).")
    ] = 4096,
):
    """Time Gated Slot and Lightning Attention against fla, interleaved (fwd, fwd+bwd, bwd, decode step), and
    decode-state memory."""
    from evalsuite.bench import linear

    chosen = {"--ops": _csv_list(ops, str, "--ops"), "--providers": _csv_list(providers, str, "--providers") or [],
              "--modes": _csv_list(modes, str, "--modes")}  # fmt: skip
    _check_choices(chosen, {"--ops": linear.OPS, "--providers": linear.PROVIDERS, "--modes": linear.MODES})
    _check_rounds(rounds)
    if batch is not None and batch < 1:
        raise UserError(f"--batch must be at least 1, got {batch}")
    if parity_t < 0:
        raise UserError(f"--parity-T must be 0 (skip) or a length, got {parity_t}")
    linear.bench_linear(out, seq_lens=_csv_list(seq_lens, int, "--seq-lens"), ops=chosen["--ops"],
                        providers=chosen["--providers"] or None, modes=chosen["--modes"], rounds=rounds,
                        batch=batch, parity_T=parity_t or None)  # fmt: skip
    typer.echo(f"wrote {out}/{linear.JSON_NAME}, .png and .md")


@bench_app.command("gca")
def bench_gca_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown, PNG).")] = Path(
        "results/runs/bench/gca"
    ),
    seq_lens: Annotated[str, typer.Option(help="Comma-separated T values (C = T / 64 chunks).")] = "4096,16384,65536",
    batches: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,4",
    providers: Annotated[
        str, typer.Option(help="Comma-separated: gca_triton, gca_reference, sdpa_chunks.")
    ] = "gca_triton,gca_reference,sdpa_chunks",
    modes: Annotated[str, typer.Option(help="Comma-separated: fwd, fwdbwd.")] = "fwd,fwdbwd",
    softmax_one: Annotated[str, typer.Option(help="Comma-separated: off, on (SDPA emulates on).")] = "off,on",
    dtype: Annotated[str, typer.Option(help="bfloat16, float16 or float32.")] = "bfloat16",
    parity_t: Annotated[
        int, typer.Option("--parity-T", help="T of the parity check vs the reference (0: skip).")
    ] = 4096,
):
    """Time our Triton GCA kernel against its reference and per-chunk SDPA (K = 8, 64-token chunks, H = 12, D = 64)."""
    from evalsuite.bench import gca

    chosen = {"--providers": _csv_list(providers, str, "--providers"), "--modes": _csv_list(modes, str, "--modes"),
              "--softmax-one": _csv_list(softmax_one, str, "--softmax-one")}  # fmt: skip
    _check_choices(chosen, {"--providers": gca.PROVIDERS, "--modes": gca.MODES, "--softmax-one": ("off", "on")})
    if dtype not in ("bfloat16", "float16", "float32"):
        raise UserError("--dtype must be bfloat16, float16 or float32")
    one = [s == "on" for s in chosen["--softmax-one"]]
    gca.bench_gca(out, seq_lens=_csv_list(seq_lens, int, "--seq-lens"), batches=_csv_list(batches, int, "--batches"),
                  providers=chosen["--providers"], modes=chosen["--modes"], softmax_one=one, dtype=dtype,
                  parity_T=parity_t or None)  # fmt: skip
    typer.echo(f"wrote {out}/{gca.JSON_NAME}, .md and .png")


@bench_app.command("generate")
def bench_generate_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown, PNG); a rerun resumes.")] = (
        Path("results/runs/bench/generate")
    ),
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="A card or hf:DIR; repeatable (default: fox-pro, 760M shapes)."),
    ] = None,
    lengths: Annotated[str, typer.Option(help="Comma-separated prompt lengths.")] = (
        "1024,2048,4096,8192,16384,32768,65536"
    ),
    batches: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,8,32",
    new_tokens: Annotated[int, typer.Option(help="Tokens per timed generate call.")] = 128,
    paths: Annotated[
        str, typer.Option(help="Comma-separated decode paths: eager, static, graph, compiled.")
    ] = "eager,graph",
    sampling: Annotated[
        str, typer.Option(help="Comma-separated: greedy, sampled (temperature 0.8, top-k 50, top-p 0.9, seeded).")
    ] = "greedy",
    device: DeviceOpt = "auto",
    dtype: AutoDtypeOpt = None,
    weights: Annotated[str, typer.Option(help="random (the cards' shapes, seed 0) or card (the cards' weights).")] = (
        "random"
    ),
    copy_mib: Annotated[
        int | None, typer.Option(help="MiB of the bandwidth copy (default: 1024 on CUDA, 256 on CPU).", min=1)
    ] = None,
    warmup: Annotated[bool, typer.Option(help="One untimed call per cell first (compiles, autotunes).")] = True,
    repeats: Annotated[int, typer.Option(help="Timed repeats of each call; the medians count.", min=1)] = 3,
    call_tokens: Annotated[
        str, typer.Option(help="Comma-separated new-token counts also timed as whole calls (at most --new-tokens).")
    ] = "",
    repair: RepairOpt = False,
):
    """Prefill and decode tokens/s of generate calls per path, length and batch, against the bandwidth bound."""
    from evalsuite.bench import generate as gen

    _check_dtype(dtype)
    gen.bench_generate(out, models=model or list(gen.DEFAULT_MODELS), lengths=_csv_list(lengths, int, "--lengths"),
                       batches=_csv_list(batches, int, "--batches"), new_tokens=new_tokens,
                       paths=_csv_list(paths, str, "--paths"), samplings=_csv_list(sampling, str, "--sampling"),
                       device=device, dtype=dtype, weights=weights, copy_mib=copy_mib, warmup=warmup,
                       repeats=repeats, repair=repair,
                       call_tokens=_csv_list(call_tokens, int, "--call-tokens", allow_empty=True))  # fmt: skip
    typer.echo(f"wrote {out}/{gen.JSON_NAME}, .md and .png")


@bench_app.command("throughput")
def bench_throughput_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown); a rerun resumes.")] = (
        Path("results/runs/bench/throughput")
    ),
    model: Annotated[
        list[str] | None,
        typer.Option("--model", "-m", help="A card; repeatable or comma-separated (default: the two 7B cards)."),
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="The model the tokens/s ratios divide by (default: the first).")
    ] = None,
    length: Annotated[int, typer.Option(help="Prompt tokens of every call.", min=1)] = 512,
    new_tokens: Annotated[int, typer.Option(help="New tokens of every call (EOS off).", min=1)] = 1024,
    attempts: Annotated[int, typer.Option(help="Timed calls at the batch found.", min=1)] = 20,
    batch_limit: Annotated[int, typer.Option(help="The largest batch the search tries.", min=1)] = 4096,
    batch_tolerance: Annotated[
        int, typer.Option(help="Bisect until the last fit and the first failure are this close (1: exact).", min=1)
    ] = 1,
    path: Annotated[
        str, typer.Option(help="Decode path: auto (graph on CUDA, eager on CPU), eager, static, graph, compiled.")
    ] = "auto",
    device: DeviceOpt = "auto",
    dtype: AutoDtypeOpt = None,
    repair: RepairOpt = False,
):
    """Generated tokens/s at the largest batch that fits, per model, against a baseline (Lightning paper Fig. 5)."""
    from evalsuite.bench import throughput

    _check_dtype(dtype)
    models = [m for spec in model or [] for m in _csv_list(spec, str, "--model")] or list(throughput.DEFAULT_MODELS)
    throughput.bench_throughput(out, models=models, baseline=baseline, length=length, new_tokens=new_tokens,
                                attempts=attempts, batch_limit=batch_limit, batch_tolerance=batch_tolerance,
                                path=path, device=device, dtype=dtype, repair=repair)  # fmt: skip
    typer.echo(f"wrote {out}/{throughput.JSON_NAME} and .md")


@bench_app.command("tune")
def bench_tune_cmd(
    kernel: Annotated[
        str, typer.Argument(help="forgetting, forgetting-decode, forgetting-tma, gsa, lightning, gca or fla.")
    ],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Folder for tune_<kernel>.json.")] = None,
    seq_len: Annotated[int | None, typer.Option(help="T of the sweep (forgetting, lightning, gca).", min=1)] = None,
    head_dims: Annotated[str | None, typer.Option(help="Comma-separated head dims (forgetting, -tma).")] = None,
    shape: Annotated[str | None, typer.Option(help="B,T,H,D of the sweep (gsa; dk = dv = m = D).")] = None,
    configs: Annotated[str | None, typer.Option(help="JSON list of GPU_CONFIG overrides to time (gsa).")] = None,
    lengths: Annotated[str | None, typer.Option(help="Comma-separated cache lengths (forgetting-decode).")] = None,
    seq_lens: Annotated[str | None, typer.Option(help="Comma-separated T values (fla, forgetting-tma).")] = None,
    batches: Annotated[str | None, typer.Option(help="Comma-separated batches (forgetting-decode, fla).")] = None,
    parts: Annotated[
        str | None, typer.Option(help="Comma-separated forward, backward-gate, backward-no-gate (forgetting-tma).")
    ] = None,
):
    """Sweep a Triton kernel's launch configs on this GPU (or warm fla's autotuning); print the best, write JSON."""
    import json

    from evalsuite.bench.tune import run_tune

    options = {"seq_len": seq_len, "head_dims": _csv_list(head_dims, int, "--head-dims"),
               "lengths": _csv_list(lengths, int, "--lengths"), "seq_lens": _csv_list(seq_lens, int, "--seq-lens"),
               "batches": _csv_list(batches, int, "--batches"), "parts": _csv_list(parts, str, "--parts")}  # fmt: skip
    if shape is not None:
        options["shape"] = tuple(_csv_list(shape, int, "--shape"))
        if len(options["shape"]) != 4:
            raise UserError("--shape takes B,T,H,D")
    if configs is not None:
        try:
            options["configs"] = json.loads(configs)
        except ValueError:
            raise UserError(f"--configs takes a JSON list of objects, got {configs!r}") from None
    report = run_tune(kernel, out, **{k: v for k, v in options.items() if v is not None})
    if "path" in report:
        typer.echo(f"wrote {report['path']}")


@bench_app.command("profile-decode")
def bench_profile_decode_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (.txt and .json).")],
    card: Annotated[str, typer.Option(help="A model card (random weights of its shapes).")] = "fox-pro",
    path: Annotated[str, typer.Option(help="Decode path: eager, static, graph or compiled.")] = "compiled",
    length: Annotated[int, typer.Option(help="Prompt tokens before the profiled steps.", min=1)] = 4096,
    batch: Annotated[int, typer.Option(help="Sequences per step.", min=1)] = 1,
    steps: Annotated[int, typer.Option(help="Steps timed, then steps profiled.", min=1)] = 64,
    device: DeviceOpt = "cuda",
    other_capacity: Annotated[
        bool, typer.Option(help="First step a decoder of another cache size (recompiles the compiled step).")
    ] = False,
):
    """Profile one decode step of a model: ms per step, device kernel time and the kernels it runs."""
    from evalsuite.bench.profile_decode import profile_decode

    profile_decode(out, card=card, path=path, length=length, batch=batch, steps=steps, device=device,
                   other_capacity=other_capacity)  # fmt: skip


@bench_app.command("loss-window")
def bench_loss_window_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (loss_window.json and .md).")],
    models: Annotated[
        str, typer.Option("--models", help="Comma-separated CARD or CARD:BACKEND (random weights of its shapes).")
    ] = "fox-pro,transformer-pro:sdpa",
    length: Annotated[int, typer.Option(help="Window tokens.", min=2)] = 65536,
    batch: Annotated[int, typer.Option(help="Windows per call.", min=1)] = 1,
    rounds: Annotated[int, typer.Option(help="Timed calls of every model, taken in turns.", min=1)] = 3,
    device: DeviceOpt = "cuda",
    compile: Annotated[
        str, typer.Option(help="off, on (forwards through torch.compile) or both (each model twice).")
    ] = "off",
):
    """Seconds a per-token-loss window takes (the loss task's own call), and its kernels by group."""
    from evalsuite.bench.loss_window import bench_loss_window

    bench_loss_window(out, _csv_list(models, str, "--models"), length=length, batch=batch, rounds=rounds,
                      device=device, compile=compile)  # fmt: skip
    typer.echo(f"wrote {out}/loss_window.json and .md")


@bench_app.command("drt-memory")
def bench_drt_memory_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown).")],
    lengths: Annotated[str, typer.Option(help="Comma-separated context lengths.")] = "16384,65536,262144",
    new_tokens: Annotated[int, typer.Option(help="Tokens decoded after the prefill.", min=1)] = 128,
    model: Annotated[str, typer.Option(help="A DRT card (drt-tiny for a CPU run).")] = "drt",
    base: Annotated[
        str, typer.Option(help="Its Base LM card (drt-base-lm-tiny beside drt-tiny), or 'none' for DRT alone.")
    ] = "drt-base-lm",
    device: DeviceOpt = "cuda",
    rounds: Annotated[int, typer.Option(help="Timed rounds of every row, taken in turns (ratios: their median).")] = 5,
):
    """DRT's decode speed and memory, chunk store on the device vs in CPU RAM, and their ratios to the Base LM."""
    from evalsuite.bench.drt_memory import JSON_NAME, drt_memory

    drt_memory(out, lengths=_csv_list(lengths, int, "--lengths"), new_tokens=new_tokens, model=model,
               base=None if base == "none" else base, device=device, rounds=rounds)  # fmt: skip
    typer.echo(f"wrote {out}/{JSON_NAME} and .md")


@bench_app.command("step-time")
def bench_step_time_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="JSON file, rewritten after every combination.")],
    models: Annotated[str, typer.Option(help="Comma-separated model names of the preset.")] = (
        "fox-pro,fox-llama,transformer-llama,transformer-pro,gsa,tnl"
    ),
    preset: Annotated[str, typer.Option(help="The MQAR preset whose first cell is timed.")] = "gsa-paper",
    d_model: Annotated[int, typer.Option(help="Model width.", min=1)] = 128,
    amp: Annotated[str, typer.Option(help="Comma-separated: none, tf32, auto.")] = "none,auto",
    attention: Annotated[str, typer.Option(help="Comma-separated backends (skipped where not offered).")] = "auto",
    graph: Annotated[str, typer.Option(help="Comma-separated: eager, graph, compile.")] = "eager,graph",
    cells: Annotated[str, typer.Option(help="Comma-separated numbers of cells training at once.")] = "1",
    steps: Annotated[int, typer.Option(help="Timed steps per cell.", min=1)] = 30,
    warmup: Annotated[int, typer.Option(help="Steps before the timing.", min=1)] = 5,
    profile: Annotated[int, typer.Option(help="Record the N kernels with most GPU time.", min=0)] = 0,
    stack: Annotated[bool, typer.Option(help="Cells at once as one stacked model (else in threads).")] = False,
):
    """Milliseconds per MQAR training step per model, precision, backend, CUDA graph and cells at once."""
    from evalsuite.bench.step_time import step_time

    step_time(out, models=_csv_list(models, str, "--models"), preset=preset, d_model=d_model,
              amps=_csv_list(amp, str, "--amp"), attention=_csv_list(attention, str, "--attention"),
              graphs=_csv_list(graph, str, "--graph"), cells=_csv_list(cells, int, "--cells"), steps=steps,
              warmup=warmup, profile=profile, stack=stack)  # fmt: skip
    typer.echo(f"wrote {out}")


@bench_app.command("train")
def bench_train_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown); a rerun resumes.")] = Path(
        "results/runs/bench/train"
    ),
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model",
            "-m",
            help="A card (its shapes, random weights), NAME@BACKEND for an attention "
            "backend of its own (e.g. transformer-llama@sdpa); repeatable or comma-separated.",
        ),
    ] = None,
    shape: Annotated[
        list[str] | None,
        typer.Option(help="LENGTHxBATCH; repeatable or comma-separated (default: 2048x8,4096x4,8192x2,16384x1)."),
    ] = None,
    baseline: Annotated[
        str | None, typer.Option(help="The model each round's tokens/s ratios divide by (default: the first).")
    ] = None,
    rounds: RoundsOpt = 10,
    attention: Annotated[str, typer.Option(help="Attention backend (auto: the model's default).")] = "auto",
    checkpoint: Annotated[
        bool, typer.Option(help="Recompute every block in the backward (activation checkpointing), for long shapes.")
    ] = False,
    amp: Annotated[str, typer.Option(help="auto (bf16 autocast on CUDA), bf16 or none.")] = "auto",
    one_at_a_time: Annotated[
        bool, typer.Option(help="Build one model at a time (no interleaving), even where they fit together.")
    ] = False,
    device: DeviceOpt = "auto",
    repair: RepairOpt = False,
):
    """Training tokens/s, ms/step and peak memory of whole models, timed interleaved against a baseline."""
    from evalsuite.bench import train_speed

    _check_rounds(rounds)
    models = [m for spec in model or [] for m in _csv_list(spec, str, "--model")] or list(train_speed.DEFAULT_MODELS)
    shapes = [train_speed.parse_shape(s) for spec in shape or [] for s in _csv_list(spec, str, "--shape")]
    train_speed.bench_train(out, models=models, shapes=shapes or train_speed.DEFAULT_SHAPES, baseline=baseline,
                            rounds=rounds, device=device, attention=attention, checkpoint=checkpoint, amp=amp,
                            together=False if one_at_a_time else None, repair=repair)  # fmt: skip
    typer.echo(f"wrote {out}/{train_speed.JSON_NAME} and .md")


@bench_app.command("saved-memory")
def bench_saved_memory_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output folder (JSON, Markdown).")],
    model: Annotated[list[str], typer.Option("--model", "-m", help="A card; repeatable or comma-separated.")],
    layers: Annotated[int, typer.Option(help="Layers built (the card's shapes otherwise).", min=1)] = 1,
    lengths: Annotated[str, typer.Option(help="Two comma-separated lengths; the slope between them is per token.")] = (
        "1024,2048"
    ),
    batch: Annotated[int, typer.Option(help="Rows at each length.", min=1)] = 1,
    tokens: Annotated[int, typer.Option(help="Tokens a step that the table scales to.", min=1)] = 16384,
    attention: Annotated[
        str, typer.Option(help="Attention backend (auto: the model's default; triton under TRITON_INTERPRET=1).")
    ] = "auto",
    device: DeviceOpt = "auto",
):
    """What a training step keeps for the backward, by module class and dtype, per token and layer."""
    from evalsuite.bench.saved_memory import saved_memory

    models = [m for spec in model for m in _csv_list(spec, str, "--model")]
    saved_memory(out, models, layers=layers, lengths=tuple(_csv_list(lengths, int, "--lengths")), batch=batch,
                 tokens=tokens, device=device, attention=attention)  # fmt: skip
    typer.echo(f"wrote {out}/saved_memory.json and .md")
