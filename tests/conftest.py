"""Shared test helpers: the CLI run in this process."""

import sys

import pytest


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``run_cli(args, cwd) -> (exit status, stdout, stderr)``: the console entry point, in this process."""
    from evalsuite import cli as cli_module

    def run(args, cwd):
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["evalsuite", *map(str, args)])
        monkeypatch.setitem(cli_module._state, "debug", False)
        capsys.readouterr()
        try:
            cli_module.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def assert_one_line_error(code: int, err: str, message: str) -> None:
    """Exit status 2 and exactly one stderr line, ``error: ...`` containing ``message``."""
    assert code == 2, err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
