"""The command reference in docs/commands/ matches the command line it documents.

Walks the Typer app as click sees it and checks that
1. every command has a Markdown heading naming it (``### `evalsuite bench attention` ``) on a page of docs/commands/;
2. every long option of a command (hidden ones excepted) is mentioned on the page that heads it;
3. every ``evalsuite …`` command line in a fenced shell block of README.md and docs/ names a command that exists,
   with options that command has; so does every heading that names a command;
4. docs/commands/README.md links every page beside it.
Each test collects all its problems and reports them together, each with the file and line to fix.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COMMANDS_DIR = ROOT / "docs" / "commands"
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console", "zsh"}


@dataclass
class Command:
    """One command of the CLI: its path (``evalsuite bench attention``), its long option names, its subcommands."""

    path: str
    options: list[tuple[str, ...]]  # per option: its long names (--roll, --no-roll); one must be mentioned
    subcommands: dict[str, Command] = field(default_factory=dict)
    runnable: bool = True  # a group that only dispatches (`evalsuite plot`) is not documented on its own

    def long_names(self) -> set[str]:
        return {name for names in self.options for name in names} | {"--help"}

    def __repr__(self) -> str:  # short, for pytest's failure reports
        return f"Command({self.path!r}, {len(self.subcommands)} subcommands)"


def _command_tree() -> Command:
    import typer

    from evalsuite.cli import app

    def convert(cmd, path: str) -> Command:
        # typer may ship its own copy of click, so the classes are checked by what they have, not by isinstance
        options = [
            tuple(n for n in (*p.opts, *p.secondary_opts) if n.startswith("--"))
            for p in cmd.params
            if p.param_type_name == "option" and not getattr(p, "hidden", False)
        ]
        node = Command(path, [names for names in options if names])
        subs = getattr(cmd, "commands", None)
        if subs is not None:
            node.runnable = bool(getattr(cmd, "invoke_without_command", False)) or bool(node.options)
            for name, sub in subs.items():
                if not getattr(sub, "hidden", False):
                    node.subcommands[name] = convert(sub, f"{path} {name}")
        return node

    return convert(typer.main.get_command(app), "evalsuite")


def _all_commands(node: Command) -> list[Command]:
    out = [node]
    for sub in node.subcommands.values():
        out.extend(_all_commands(sub))
    return out


def _doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _headings(path: Path) -> list[tuple[int, str]]:
    """(line number, heading text) of every ATX heading outside fenced code."""
    out, fence = [], None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            marker = stripped[:3]
            fence = None if fence == marker else (fence or marker)
            continue
        if fence is None and re.match(r"#{1,6}\s", line):
            out.append((number, line.lstrip("#").strip()))
    return out


def _shell_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, logical line) of every line in a fenced shell block; backslash continuations joined."""
    out, fence, language, pending = [], None, "", None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(("```", "~~~")):
            if fence is None:
                fence, language = stripped[:3], stripped[3:].strip().lower()
            elif stripped[:3] == fence:
                fence, pending = None, None
            continue
        if fence is None or language not in SHELL_LANGUAGES:
            continue
        start, text = pending if pending else (number, "")
        text = f"{text} {line.rstrip()}" if text else line.rstrip()
        if text.endswith("\\"):
            pending = (start, text[:-1])
        else:
            pending = None
            out.append((start, text.lstrip("$ ")))
    return out


def _invocations(line: str) -> list[list[str]]:
    """The words after each ``evalsuite`` that runs as a command in a shell line (``evalsuite``, ``-m evalsuite``)."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:  # an unbalanced quote: the line is prose, or broken in a way the reader will see
        words = line.split()
    out, current = [], None
    for i, word in enumerate(words):
        if word in ("&&", "||", ";", "|") or word.endswith(";"):
            current = None
            continue
        before = words[i - 1] if i else "&&"
        starts = word == "evalsuite" and (
            before in ("&&", "||", ";", "|", "-m", "exec", "time")
            or before.endswith(";")
            or re.fullmatch(r"[A-Za-z_]\w*=\S*", before)
        )
        if starts:
            current = []
            out.append(current)
        elif current is not None:
            current.append(word)
    return out


def _resolve(root: Command, words: list[str]) -> tuple[Command | None, list[str], str | None]:
    """(command, its arguments, problem): walk subcommand names from the root, root options allowed first."""
    node, rest = root, list(words)
    while rest and rest[0].startswith("--") and rest[0].split("=")[0] in root.long_names():
        rest.pop(0)  # `evalsuite --debug loss ...`
    while rest and node.subcommands and not rest[0].startswith("-"):
        name = rest[0]
        if name not in node.subcommands:
            if node.runnable and node is not root:
                break  # a group that runs itself takes arguments (no group does; kept general)
            known = ", ".join(sorted(node.subcommands))
            return None, rest, f"`{node.path} {name}` is not a command (`{node.path}` has: {known})"
        node = node.subcommands[rest.pop(0)]
    if not node.runnable:
        if not rest or rest[0] in ("--help", "-h"):
            return node, rest, None
        known = ", ".join(sorted(node.subcommands))
        return None, rest, f"`{node.path}` needs a subcommand ({known})"
    return node, rest, None


def _mentions(text: str, option: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


def _heading_commands(root: Command, heading: str) -> list[tuple[Command | None, str, str | None]]:
    """The commands a heading names: each code span starting with ``evalsuite``, e.g. `evalsuite plot loss RUN…`."""
    out = []
    for span in re.findall(r"`([^`]+)`", heading):
        words = span.split()
        if words and words[0] == "evalsuite":
            command, _, problem = _resolve(root, words[1:])
            out.append((command, span, problem))
    return out


@pytest.fixture(scope="module")
def tree() -> Command:
    return _command_tree()


def _headed_commands(tree: Command) -> dict[str, Path]:
    """Command path -> the docs/commands page whose heading names it."""
    headed: dict[str, Path] = {}
    for page in sorted(COMMANDS_DIR.glob("*.md")):
        for _, heading in _headings(page):
            for command, _, _ in _heading_commands(tree, heading):
                if command is not None:
                    headed.setdefault(command.path, page)
    return headed


def test_every_command_has_a_heading_in_docs_commands(tree):
    headed = _headed_commands(tree)
    missing = [c.path for c in _all_commands(tree) if c.runnable and c is not tree and c.path not in headed]
    assert not missing, "commands without a heading in docs/commands/*.md:\n" + "\n".join(
        f"  {path}: add a heading such as  ### `{path}`  to the page of its command group" for path in missing
    )


def test_every_option_is_mentioned_on_its_commands_page(tree):
    headed = _headed_commands(tree)
    headed["evalsuite"] = COMMANDS_DIR / "README.md"  # the root's own options (--debug) are on the index
    problems = []
    for command in _all_commands(tree):
        page = headed.get(command.path)
        if page is None or not command.runnable and command is not tree:
            continue  # a missing heading is the test above's report
        text = page.read_text()
        for names in command.options:
            if not any(_mentions(text, name) for name in names):
                problems.append(f"  {_rel(page)}: `{command.path}` option {'/'.join(names)} is not mentioned")
    assert not problems, "options the command reference does not mention:\n" + "\n".join(problems)


def test_command_lines_and_headings_name_real_commands(tree):
    problems, checked = [], 0
    for path in _doc_files():
        for number, heading in _headings(path):
            for _, span, problem in _heading_commands(tree, heading):
                if problem:
                    problems.append(f"  {_rel(path)}:{number}: heading `{span}`: {problem}")
        for number, line in _shell_lines(path):
            for words in _invocations(line):
                checked += 1
                command, args, problem = _resolve(tree, words)
                if problem:
                    problems.append(f"  {_rel(path)}:{number}: {problem}\n      {line.strip()}")
                    continue
                for arg in args:
                    name = arg.split("=", 1)[0]
                    if name.startswith("--") and name not in command.long_names():
                        problems.append(
                            f"  {_rel(path)}:{number}: `{command.path}` has no option {name}\n      {line.strip()}"
                        )
    assert checked > 10, f"only {checked} evalsuite command lines found in README.md and docs/: is the parser broken?"
    assert not problems, "command lines or headings that do not match the CLI:\n" + "\n".join(problems)


def test_the_index_links_every_page():
    index = (COMMANDS_DIR / "README.md").read_text()
    pages = sorted(p.name for p in COMMANDS_DIR.glob("*.md") if p.name != "README.md")
    assert pages, "docs/commands/ has no pages"
    unlinked = [name for name in pages if f"]({name})" not in index]
    assert not unlinked, f"docs/commands/README.md does not link: {', '.join(unlinked)}"


def test_the_checks_catch_a_missing_option_and_an_unknown_command(tree):
    """The helpers the tests above rely on: a made-up command and option are reported, real ones are not."""
    assert _invocations("pip install -e . && evalsuite loss --model m --length 8") == [
        ["loss", "--model", "m", "--length", "8"]
    ]
    assert _invocations("torchrun --nproc-per-node 2 -m evalsuite niah --model m") == [["niah", "--model", "m"]]
    assert _invocations("python -m evalsuite.lm_eval_main --model evalsuite") == []
    command, args, problem = _resolve(tree, ["bench", "attention", "--seq-lens", "1024"])
    assert problem is None and command.path == "evalsuite bench attention" and "--seq-lens" in command.long_names()
    assert _resolve(tree, ["bench", "nonesuch"])[2] is not None
    assert _resolve(tree, ["plot"])[0] is not None  # `evalsuite plot` alone prints its help
    assert _resolve(tree, ["plot", "--out", "x"])[2] is not None
    assert _resolve(tree, ["--debug", "loss"])[0].path == "evalsuite loss"
    assert "--no-such-option" not in _resolve(tree, ["loss"])[0].long_names()
    assert _mentions("use `--max-length` here", "--max-length") and not _mentions("`--max-length`", "--max")


def test_the_python_page_runs(tmp_path, monkeypatch):
    """docs/commands/python.md's code runs as written (in a scratch folder: it writes a run directory)."""
    page = (ROOT / "docs" / "commands" / "python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks, "docs/commands/python.md has no python block"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "docs/commands/python.md", "exec"), namespace)  # noqa: S102 - the page's own example
    assert namespace["results"]["records"] and (tmp_path / "results" / "runs" / "demo" / "results.json").is_file()
