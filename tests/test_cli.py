"""The command line as a user meets it: listings, help, one-line errors, the loss→plot→table path."""

import subprocess
import sys
import venv
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    "args, message",
    [
        (["loss", "--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["loss", "--model", "fox-pro-tiny", "--length", "100000"], "exceed model fox-pro-tiny's max_length"),
        (["loss", "--model", "fox-pro-tiny", "--data", "/nonexistent"], "does not exist"),
        (["loss", "--model", "fox-pro", "--device", "cpu"], "weights not found locally"),
        (["loss", "--model", "fox-pro-tiny", "--dtype", "int8"], "unknown dtype"),
        (["table", "/nonexistent"], "does not exist"),
        (["bench", "attention", "--out", "b"], "needs a CUDA GPU"),
    ],
)
def test_errors_are_one_line(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    out = cli(*args, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.startswith("error: ") and message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_debug_shows_traceback(tmp_path):
    out = cli("--debug", "loss", "--model", "no-such-model", cwd=tmp_path)
    assert out.returncode != 0 and "Traceback" in out.stderr


def test_non_utf8_corpus(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe broken")
    out = cli("loss", "--model", "fox-llama-tiny", "--data", str(tmp_path / "bad.txt"), "--length", "8", cwd=tmp_path)
    assert out.returncode == 2 and "not valid UTF-8" in out.stderr


def test_loss_plot_table_end_to_end(tmp_path):
    runs = []
    for model in ("fox-pro-tiny", "transformer-llama-tiny"):
        run = tmp_path / model
        out = cli("loss", "--model", model, "--length", "256", "--max-docs", "2", "--device", "cpu", "--out", str(run))
        assert out.returncode == 0, out.stderr
        assert "P(l)" in out.stdout and (run / "results.json").exists()
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
