"""``python -m evalsuite.cli``: the ``evalsuite`` command."""

from evalsuite.cli.main import main

main()
