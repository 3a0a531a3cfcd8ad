"""The light core install: the core commands import no optional package, and a command whose extra is missing says
in one line which ``pip install`` fixes it (exit status 2).

A core install is simulated in a subprocess: every distribution that only the extras bring in (their requirements
followed transitively, minus what the core requirements bring in, read from pyproject.toml and this environment's
installed metadata) has its top-level modules set to ``None`` in ``sys.modules``, so importing one fails as if it
were not installed.
"""

import ast
import importlib.metadata as md
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from evalsuite.errors import UserError, require

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the dev extra installs tomli, the same parser
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRAS = PROJECT["optional-dependencies"]
CAPABILITIES = ("hf", "serve", "openai", "longbench", "lm-eval")


def closure(requirements: list[str]) -> set[str]:
    """The canonical names of ``requirements`` and everything they require, as installed here (no extras)."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = Requirement(todo.pop())
        name = canonicalize_name(req.name)
        if (req.marker is not None and not req.marker.evaluate({"extra": ""})) or name in seen or name == "evalsuite":
            continue
        seen.add(name)
        try:
            todo += md.requires(req.name) or []
        except md.PackageNotFoundError:
            pass
    return seen


def optional_modules() -> list[str]:
    """Top-level modules that a core install (no extra, no triton on a CPU torch) does not have."""
    extra_only = closure([r for k in (*CAPABILITIES, "dev") for r in EXTRAS[k]]) - closure(PROJECT["dependencies"])
    extra_only.add("triton")  # a CUDA torch requires it, a CPU torch does not: the core path must run without it
    return sorted(
        module
        for module, dists in md.packages_distributions().items()
        if {canonicalize_name(d) for d in dists} <= extra_only
    )


BLOCKED = optional_modules()


def run_core(script: str, cwd: Path) -> subprocess.CompletedProcess:
    """``script`` in a fresh interpreter where every module of :data:`BLOCKED` cannot be imported."""
    prelude = f"import sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def cli_script(*argv: str) -> str:
    """A script running ``evalsuite ARGV`` through the console entry point."""
    return f"sys.argv = ['evalsuite', *{list(argv)!r}]\nfrom evalsuite.cli import main\nmain()\n"


def test_the_simulated_core_install_lacks_every_extra():
    for module in ("transformers", "gguf", "accelerate", "starlette", "uvicorn", "openai", "rouge", "jieba",
                   "Levenshtein", "lm_eval", "fuzzywuzzy", "triton"):  # fmt: skip
        assert module in BLOCKED
    for module in ("torch", "numpy", "typer", "tiktoken", "tokenizers", "rouge_score", "matplotlib", "pandas"):
        assert module not in BLOCKED


def test_extras_by_capability():
    assert set(EXTRAS) == {*CAPABILITIES, "all", "triton", "dev"}
    assert EXTRAS["all"] == [f"evalsuite[{','.join(CAPABILITIES)}]"]
    assert "evalsuite[all]" in EXTRAS["dev"] and "triton>=3.2" in EXTRAS["dev"]
    core = {canonicalize_name(Requirement(r).name) for r in PROJECT["dependencies"]}
    for extra in CAPABILITIES:
        assert not core & {canonicalize_name(Requirement(r).name) for r in EXTRAS[extra]}, extra


def require_calls() -> list[tuple[str, str, str]]:
    """``(module, extra, where)`` of every ``require("module", "extra", ...)`` call in the package."""
    calls = []
    for path in sorted((ROOT / "evalsuite").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require":
                module, extra = (arg.value if isinstance(arg, ast.Constant) else None for arg in node.args[:2])
                calls.append((module, extra, f"{path.relative_to(ROOT)}:{node.lineno}"))
    return calls


def test_every_required_module_comes_with_the_extra_named():
    """A ``require`` call's extra exists and installs the module it guards (so its pip line fixes the error)."""
    calls = require_calls()
    assert {extra for _, extra, _ in calls} == set(CAPABILITIES)
    providers = md.packages_distributions()
    for module, extra, where in calls:
        if module is None:  # a name chosen at run time (hf.py's gguf/accelerate loop): checked by its own test
            continue
        dists = {canonicalize_name(d) for d in providers[module.split(".")[0]]}
        assert dists & closure(EXTRAS[extra]), f"{where}: {module} is not installed by the {extra!r} extra"
        assert not dists & closure(PROJECT["dependencies"]), f"{where}: {module} is a core dependency"


def test_require(tmp_path, monkeypatch):
    assert require("json", "hf", "x") is json
    # Starlette and any of its submodules an earlier test imported in this worker are hidden (a cached
    # ``starlette.routing`` would otherwise be returned without consulting ``starlette``).
    for name in {"starlette"} | {n for n in sys.modules if n.split(".")[0] == "starlette"}:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(UserError) as e:
        require("starlette.routing", "serve", "evalsuite serve")
    assert str(e.value) == "evalsuite serve needs the 'serve' extra: pip install 'evalsuite[serve]'"
    # A module the required one imports is missing: a broken install, reported as it is, not as a missing extra.
    (tmp_path / "half_installed.py").write_text("import no_such_module_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModuleNotFoundError, match="no_such_module_anywhere"):
        require("half_installed", "hf", "x")


def test_core_commands_import_no_optional_package(tmp_path):
    """--help, models, tasks (every task module imported), a tiny loss, NIAH and summarize run on a core install."""
    (tmp_path / "docs.jsonl").write_text(json.dumps({"document": "The cat sat. It slept.", "summary": "A cat."}) + "\n")
    script = """
        from evalsuite.cli import main
        for argv in (["--help"], ["models"], ["tasks"],
                     ["loss", "--model", "fox-pro-tiny", "--device", "cpu", "--length", "16", "--max-docs", "1"],
                     ["niah", "--model", "fox-pro-tiny", "--mode", "standard", "--device", "cpu", "--lengths", "300",
                      "--depths", "50", "--max-new-tokens", "4"],
                     ["summarize", "--model", "fox-pro-tiny", "--device", "cpu", "--data", "docs.jsonl",
                      "--max-new-tokens", "4"]):
            sys.argv = ["evalsuite", *argv]
            try:
                main()
            except SystemExit as e:
                assert not e.code, (argv, e.code)
            print("ok:", argv[0], flush=True)
    """
    proc = run_core(script, tmp_path)
    assert proc.returncode == 0, proc.stderr
    for command in ("--help", "models", "tasks", "loss", "niah", "summarize"):
        assert f"ok: {command}\n" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stderr


def longbench_predictions(folder: Path) -> Path:
    folder.mkdir()
    record = {"pred": "the report.", "answers": ["a report."], "all_classes": None, "length": 100}
    (folder / "gov_report.jsonl").write_text(json.dumps(record) + "\n")
    return folder


@pytest.mark.parametrize(
    "argv, who, extra",
    [
        (["serve", "--model", "fox-pro-tiny"], "evalsuite serve", "serve"),
        (["loss", "--model", "hf:some/model", "--length", "16"], "the hf: adapter", "hf"),
        (["loss", "--model", "openai:gpt-4o-mini", "--length", "16"], "model openai:gpt-4o-mini", "openai"),
        (["niah", "--model", "fox-pro-tiny", "--judge", "openai:gpt-4o"], "the judge", "openai"),
        (["lm-eval", "--model", "fox-pro-tiny", "--tasks", "arc_easy"], "evalsuite lm-eval", "lm-eval"),
        (["longbench", "score", "preds"], "LongBench's ROUGE-L", "longbench"),
        (["longbench", "--model", "fox-pro-tiny", "--data", "preds"], "evalsuite longbench", "longbench"),
    ],
)
def test_missing_extra_is_one_line(argv, who, extra, tmp_path):
    longbench_predictions(tmp_path / "preds")
    proc = run_core(cli_script(*argv), tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"error: {who} needs the '{extra}' extra: pip install 'evalsuite[{extra}]'\n"
    assert not (tmp_path / "results").exists()  # nothing ran before the check


def test_lm_eval_main_without_the_extra(tmp_path):
    proc = run_core("from evalsuite.lm_eval_main import main\nmain()\n", tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: python -m evalsuite.lm_eval_main needs the 'lm-eval' extra: pip install 'evalsuite[lm-eval]'\n"
    )


def test_gguf_model_without_its_readers(tmp_path, monkeypatch):
    """A GGUF file needs gguf and accelerate besides transformers; their absence names the hf extra too."""
    from evalsuite.adapters.hf import HFAdapter

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(UserError, match=r"^a GGUF model needs the 'hf' extra: pip install 'evalsuite\[hf\]'$"):
        HFAdapter(gguf, device="cpu")
