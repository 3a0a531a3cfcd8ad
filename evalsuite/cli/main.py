"""The console entry point: the app with every command registered, and how errors, Ctrl-C and torchrun are met."""

from __future__ import annotations

import sys

import typer

# Each command module registers its commands on the app (or one of its groups) when imported.
from evalsuite.cli import bench, core, downstream, lmeval, mqar, niah, serve  # noqa: F401
from evalsuite.cli.app import app
from evalsuite.errors import UserError

# The commands that share their work among torchrun's ranks (`torchrun --nproc-per-node N -m evalsuite CMD ...`).
SHARDED_COMMANDS = ("loss", "niah", "mqar", "longbench", "summarize", "run")


def main() -> None:
    """Console entry point: one line on stderr for every error; status 2 for bad input, 130 for Ctrl-C."""
    from evalsuite.runs import distributed

    click = sys.modules[typer.BadParameter.__module__]  # click's exceptions (typer may ship its own click)
    rank = 0
    debug = debug_requested(sys.argv[1:])
    try:
        rank = _torchrun_checks(sys.argv[1:])
        rc = app(standalone_mode=False)
    except distributed.PeerFailed as e:  # rank 0 reports it; this rank leaves quietly
        sys.exit(2 if e.user_error else 1)
    except UserError as e:
        if debug:
            raise
        typer.echo(f"error: {f'[rank {rank}] ' if rank else ''}{e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _interrupted(rank)
    except click.NoArgsIsHelpError as e:
        e.show()  # the help text
        sys.exit(0)
    except click.ClickException as e:  # usage errors: bad option values, unknown options
        typer.echo(f"error: {' '.join(e.format_message().split())}", err=True)
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        _interrupted(rank)
    except SystemExit:
        raise
    except Exception as e:
        if debug:
            raise
        where = f"[rank {rank}] " if rank else ""
        typer.echo(f"error: {where}{type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
        sys.exit(1)
    finally:
        distributed.teardown()
    if rc == 130:  # typer turns Ctrl-C into Exit(130), which standalone_mode=False returns instead of raising
        _interrupted(rank)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _torchrun_checks(args: list[str]) -> int:
    """Under torchrun: this process's rank; stdout muted on ranks other than 0 (rank 0 alone prints); a command
    that does not share its work refused on several ranks (N copies would each do all of it). 0 otherwise."""
    import os

    from evalsuite.runs import distributed

    world = distributed.env_world()
    if world is None:
        return 0
    if world.rank:
        sys.stdout = open(os.devnull, "w")  # for the life of the process
    command = next((a for a in args if not a.startswith("-")), None)
    if world.size > 1 and command is not None and (command not in SHARDED_COMMANDS or command == "longbench"
                                                    and "score" in args):  # fmt: skip
        if world.rank:
            sys.exit(2)  # rank 0 says why
        raise UserError(
            f"`evalsuite {command}{' score' if command == 'longbench' else ''}` does not share its work among "
            f"ranks; run it without torchrun (commands that do: {', '.join(SHARDED_COMMANDS)})"
        )
    return world.rank


def _interrupted(rank: int = 0) -> None:
    if not rank:  # one line, not one per rank
        typer.echo("interrupted: finished items are saved; rerun the same command to resume", err=True)
    sys.exit(130)


def debug_requested(args: list[str]) -> bool:
    """``--debug`` among the root options (those before the command's name)."""
    for arg in args:
        if arg == "--debug":
            return True
        if not arg.startswith("-"):
            return False
    return False
