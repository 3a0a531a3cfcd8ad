"""The command line as a user meets it: listings, help, one-line errors, the loss→plot→table path."""

import json
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
PAPER_MODELS = ["fox-pro", "fox-llama", "transformer-pro", "transformer-llama"]


def cli(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def test_models_lists_paper_models_and_tiny_twins():
    out = cli("models")
    assert out.returncode == 0, out.stderr
    for name in PAPER_MODELS:
        assert f" {name} " in out.stdout and f" {name}-tiny " in out.stdout
    assert "759.4M" in out.stdout and "16384" in out.stdout


@pytest.mark.parametrize("cmd", [[], ["models"], ["loss"], ["plot", "loss"], ["table"], ["bench", "attention"]])
def test_help_everywhere(cmd):
    out = cli(*cmd, "--help")
    assert out.returncode == 0 and "Usage" in out.stdout


def write_card(path: Path, **fields) -> Path:
    body = {"architecture": "fox-pro", "tokenizer": "gpt2-json", "weights": {"source": "random"}, "max_length": 4096}
    body["config"] = {"hidden_size": 32, "num_layers": 1, "num_heads": 2}
    body.update(fields)
    path.write_text(json.dumps(body))  # JSON is YAML
    return path


@pytest.mark.parametrize(
    "args, message",
    [
        (["loss", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["loss", "--model", "fox-pro-tiny", "--length", "100000"], "exceed model fox-pro-tiny's max_length"),
        (["loss", "--model", "fox-pro-tiny", "--length", "0"], "--length must be at least 2, got 0"),
        (["loss", "--model", "fox-pro-tiny", "--length", "abc"], "'--length'"),
        (["loss", "--model", "fox-pro-tiny", "--data", "/nonexistent"], "does not exist"),
        (["loss", "--model", "fox-pro", "--device", "cpu"], "weights not found locally"),
        (["loss", "--model", "fox-pro-tiny", "--dtype", "int8"], "unknown dtype"),
        (["loss", "--model", "fox-pro-tiny", "--attention", "flash"], "choose from auto, triton, reference, dense"),
        (["loss", "--model", "hf-nope:x"], "unknown model 'hf-nope:x'"),
        (["loss", "--model", "fox-pro-tiny", "--bogus"], "No such option"),
        (["table", "/nonexistent"], "does not exist"),
        (["bench", "attention", "--out", "b"], "needs a CUDA GPU"),
        (["run", "no-such-task"], "unknown task 'no-such-task'"),
        (["run", "loss", "--set", "lenght=5"], "unknown option(s) lenght"),
        (["run", "loss", "--set", "length"], "--set takes KEY=VALUE"),
        (["niah", "--model", "fox-pro-tiny", "--batch-size", "0"], "--batch-size must be a positive integer or 'auto'"),
        (["passkey", "--model", "fox-pro-tiny", "--batch-size", "auto"], "the DRT tests take no"),
    ],
)
def test_errors_are_one_line(args, message, tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    code, _, err = run_cli(args, tmp_path)
    assert_one_line_error(code, err, message)


def test_bad_files_are_one_line(tmp_path, run_cli):
    """Every bad input names the file or option: corrupt arrays, states, results, cards, ids."""
    base = ["loss", "--model", "fox-pro-tiny", "--device", "cpu", "--length", "16"]
    (tmp_path / "noise.npy").write_bytes(bytes(range(256)) * 4)
    code, _, err = run_cli([*base, "--data", tmp_path / "noise.npy"], tmp_path)
    assert_one_line_error(code, err, "noise.npy: cannot read as .npy")
    np.save(tmp_path / "big.npy", np.full((1, 32), 60000, dtype=np.int64))  # beyond GPT-2's 50257 ids
    code, _, err = run_cli([*base, "--data", tmp_path / "big.npy"], tmp_path)
    assert_one_line_error(code, err, "token ids must lie in [0, 50257)")
    np.save(tmp_path / "ok.npy", np.arange(64, dtype=np.int64)[None])
    run = tmp_path / "run"
    run.mkdir()
    (run / "state.npz").write_bytes(b"PK\x03\x04 not really a zip")
    code, _, err = run_cli([*base, "--data", tmp_path / "ok.npy", "--out", run], tmp_path)
    assert_one_line_error(code, err, "state.npz is corrupt")
    (run / "state.npz").unlink()
    (run / "results.json").write_text('{"task": "loss", ')
    code, _, err = run_cli([*base, "--data", tmp_path / "ok.npy", "--out", run], tmp_path)
    assert_one_line_error(code, err, f"{run / 'results.json'} is corrupt")
    bad_type = write_card(tmp_path / "typed.yaml", train_length="long")
    code, _, err = run_cli(["loss", "--model", bad_type], tmp_path)
    assert_one_line_error(code, err, "'train_length' must be int or null, got str 'long'")
    (tmp_path / "broken.yaml").write_text("architecture: fox-pro\nconfig: {hidden_size: [1,\n tokenizer: x\n")
    code, _, err = run_cli(["loss", "--model", tmp_path / "broken.yaml"], tmp_path)
    assert_one_line_error(code, err, "broken.yaml is not valid YAML (line")
    (tmp_path / "file").write_text("")
    code, _, err = run_cli([*base, "--data", tmp_path / "ok.npy", "--out", tmp_path / "file" / "x"], tmp_path)
    assert_one_line_error(code, err, "is not a directory")


@pytest.mark.parametrize("model", ["fox-pro-tiny", "gsa-tiny", "tnl-tiny"])
def test_attention_triton_without_triton(tmp_path, monkeypatch, run_cli, model):
    import evalsuite.models.base as model_base

    monkeypatch.setattr(model_base, "triton_installed", lambda: False)
    args = ["loss", "--model", model, "--attention", "triton", "--length", "16"]
    code, _, err = run_cli(args, tmp_path)
    assert_one_line_error(code, err, "--attention triton needs the 'triton' package")


def test_attention_triton_on_a_cpu_needs_a_gpu(tmp_path):
    """Outside the interpreter (a user's shell) the Triton kernels cannot run on a CPU: one line, before any work.
    Under TRITON_INTERPRET=1 (this process) the same request builds, as the kernel tests need it to."""
    import os

    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = ["loss", "--model", "fox-pro-tiny", "--attention", "triton", "--device", "cpu", "--length", "16"]
    out = subprocess.run([sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)  # fmt: skip
    assert_one_line_error(out.returncode, out.stderr, "--attention triton needs a CUDA GPU, not cpu")
    assert not (tmp_path / "results").exists()
    interpreted = NativeAdapter(load_card("gsa-tiny"), device="cpu", attention_backend="triton")
    assert interpreted.model.attention_backend == "triton"


NOISE = bytes(range(128, 256)) * 8  # no byte of it starts a UTF-8 character: any text reader fails at byte 0


@pytest.fixture
def bad_inputs(tmp_path):
    """Files of the wrong kind under tmp_path (the commands below run there): noise as a card, as a checkpoint and
    as JSONL; a folder; a card whose width is a word."""
    for name in ("noise.yaml", "noise.jsonl", "weights.bin"):
        (tmp_path / name).write_bytes(NOISE)
    (tmp_path / "folder").mkdir()
    write_card(tmp_path / "words.yaml", config={"hidden_size": "sixty-four", "num_layers": 1, "num_heads": 2})
    return tmp_path


@pytest.mark.parametrize(
    "args, message",
    [
        (["loss", "--model", "noise.yaml"], "model card noise.yaml is not UTF-8 text (byte 0)"),
        (["summarize", "--model", "fox-pro-tiny", "--data", "noise.jsonl"], "noise.jsonl:1: not UTF-8 text"),
        (["loss", "--model", "fox-pro-tiny", "--checkpoint", "weights.bin"], "checkpoint weights.bin is a file"),
        (["loss", "--model", "folder"], "model folder is a directory, not a model card"),
        (["loss", "--model", "./folder"], "for a Hugging Face model directory give hf:./folder"),
        (["loss", "--model", "foo:bar"], "'foo' is not a model kind (--model KIND:NAME with KIND one of native, hf"),
        (["loss", "--model", "words.yaml"], "hidden_size must be int, got str 'sixty-four'"),
        (["niah", "--model", "fox-pro-tiny", "--depths", ""], "--depths needs at least one"),
        (["niah", "--model", "fox-pro-tiny", "--lengths", ","], "--lengths needs at least one"),
        (["mqar", "--d-model", "0"], "d_models must be positive integers, got 0"),
        (["mqar", "--lr", "-1"], "lrs must be positive learning rates, got -1.0"),
    ],
)
def test_bad_inputs_name_the_problem(args, message, bad_inputs, run_cli):
    code, _, err = run_cli(args, bad_inputs)
    assert_one_line_error(code, err, message)
    assert not (bad_inputs / "results").exists()


def test_cards_folder_that_is_not_one(tmp_path, monkeypatch, run_cli):
    monkeypatch.setenv("EVALSUITE_CARDS", str(tmp_path / "nonexistent"))
    code, _, err = run_cli(["models"], tmp_path)
    assert_one_line_error(code, err, f"$EVALSUITE_CARDS names {tmp_path / 'nonexistent'}, which is not a directory")


def test_weights_not_local_without_internet(tmp_path):
    """No network (the hub's endpoint refuses connections; HF_HUB_OFFLINE unset): one line saying the weights are
    not here and how to give them, as with HF_HUB_OFFLINE=1."""
    import os

    from conftest import free_port

    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    env.pop("HF_HUB_OFFLINE", None)
    out = subprocess.run([sys.executable, "-m", "evalsuite.cli", "niah", "--model", "fox-pro", "--device", "cpu"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)  # fmt: skip
    assert_one_line_error(out.returncode, out.stderr, "model fox-pro: weights not found locally and the download of")
    assert "pass --checkpoint DIR" in out.stderr and "Connection refused" in out.stderr


def test_serve_on_a_busy_port(tmp_path):
    """A second server on a port in use: one line, before the model loads and before anything says "serving"."""
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = cli("serve", "--model", "fox-pro-tiny", "--port", str(port), "--device", "cpu", cwd=tmp_path)
    assert_one_line_error(out.returncode, out.stderr, f"port {port} on 127.0.0.1 is in use")
    assert "serving" not in out.stdout


def test_failed_validation_leaves_no_run_directory(tmp_path, run_cli):
    (tmp_path / "short.txt").write_text("far too short")
    args = ["loss", "--model", "fox-pro-tiny", "--length", "64", "--data", tmp_path / "short.txt"]
    code, _, err = run_cli([*args, "--out", tmp_path / "run"], tmp_path)
    assert_one_line_error(code, err, "no document has at least 64 tokens")
    assert not (tmp_path / "run").exists()
    code, _, err = run_cli(["niah", "--model", "fox-pro-tiny", "--lengths", "99999"], tmp_path)
    assert_one_line_error(code, err, "every length of the grid exceeds")
    assert not (tmp_path / "results").exists()


def test_ctrl_c_exits_130_with_a_resume_hint(tmp_path, monkeypatch, run_cli):
    from evalsuite.adapters.native import NativeAdapter

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(NativeAdapter, "token_nll", interrupt)
    code, _, err = run_cli(["loss", "--model", "fox-pro-tiny", "--length", "16"], tmp_path)
    assert code == 130 and len(err.strip().splitlines()) == 1 and "rerun the same command to resume" in err


def test_unexpected_errors_are_one_line_with_a_debug_hint(tmp_path, monkeypatch, run_cli):
    """A bug (not bad input) exits 1 with one line naming the exception and --debug."""
    from evalsuite.adapters.native import NativeAdapter

    def broken(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(NativeAdapter, "token_nll", broken)
    code, _, err = run_cli(["loss", "--model", "fox-pro-tiny", "--length", "16"], tmp_path)
    assert code == 1 and err.strip() == "error: RuntimeError: kaboom (rerun with --debug for the traceback)"


def test_exit_status_and_stderr_in_a_real_process(tmp_path):
    """One subprocess: the console entry point's status and stderr as a shell sees them, and --debug."""
    out = cli("loss", "--model", "no-such-model", cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: unknown model") and not out.stdout
    assert len(out.stderr.strip().splitlines()) == 1
    out = cli("--debug", "loss", "--model", "no-such-model", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_non_utf8_corpus(tmp_path, run_cli):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe broken")
    args = ["loss", "--model", "fox-llama-tiny", "--data", tmp_path / "bad.txt", "--length", "8"]
    code, _, err = run_cli(args, tmp_path)
    assert_one_line_error(code, err, "not valid UTF-8")


def test_loss_plot_table_end_to_end(tmp_path):
    runs = []
    for model, plot in (("fox-pro-tiny", "--plot"), ("transformer-llama-tiny", "--no-plot")):
        run = tmp_path / model
        out = cli("loss", "--model", model, "--length", "256", "--max-docs", "2", "--device", "cpu", "--out", str(run),
                  plot)  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert "P(l)" in out.stdout and (run / "results.json").exists()
        # a run draws its plot into its run directory and prints the path, unless told not to
        assert (run / "loss.png").is_file() == (f"plot: {run / 'loss.png'}" in out.stdout) == (plot == "--plot")
        runs.append(str(run))
    out = cli("plot", "loss", *runs, "--out", str(tmp_path / "fig"), "--window", "11")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "fig.png").stat().st_size > 0 and (tmp_path / "fig.pdf").stat().st_size > 0
    out = cli("table", str(tmp_path), "--out", str(tmp_path / "tab"))
    assert out.returncode == 0, out.stderr
    csv = (tmp_path / "tab.csv").read_text()
    assert "fox-pro-tiny" in csv and "transformer-llama-tiny" in csv and "perplexity" in csv
    assert (tmp_path / "tab.md").exists() and (tmp_path / "tab.tex").exists()


def test_wheel_carries_cards(tmp_path):
    """A non-editable install (built wheel, fresh venv) still finds the model cards."""
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr
    wheel = next((tmp_path / "dist").glob("evalsuite-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    inst = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert inst.returncode == 0, inst.stderr
    # Dependencies come from this environment's site-packages (PYTHONPATH does not run .pth files, so the
    # editable install of evalsuite stays invisible); evalsuite itself comes from the fresh venv.
    site = next(p for p in sys.path if p.endswith("site-packages"))
    env = {"PYTHONPATH": site, "PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run(
        [str(py), "-c", "import evalsuite; print(evalsuite.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert str(env_dir) in where.stdout, where.stdout + where.stderr
    out = subprocess.run(
        [str(env_dir / "bin" / "evalsuite"), "models"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    for name in PAPER_MODELS:
        assert f" {name}-tiny " in out.stdout
    # task specs ship too: the NIAH grids and MQAR presets load from the installed package
    code = (
        "import evalsuite.cards as c, evalsuite.tasks.niah as n, evalsuite.tasks.mqar as m; "
        "print(c.builtin_dir('tasks')); print(sorted(n.load_presets())); print(m.load_preset('ci').models)"
    )
    specs = subprocess.run([str(py), "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert specs.returncode == 0, specs.stderr
    assert str(env_dir) in specs.stdout and "'cpu'" in specs.stdout and "'fox'" in specs.stdout
