"""The ``evalsuite`` command line: a thin layer over library functions (one small function per command).

:mod:`.app` holds the Typer app, :mod:`.options` what the commands share, one module per command group registers
its commands, and :mod:`.main` is the console entry point.
"""

from evalsuite.cli.main import app, main

__all__ = ["app", "main"]
