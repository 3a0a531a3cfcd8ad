"""``python -m evalsuite``: the ``evalsuite`` command, also as ``torchrun -m evalsuite`` runs it on every rank."""

from evalsuite.cli import main

if __name__ == "__main__":
    main()
