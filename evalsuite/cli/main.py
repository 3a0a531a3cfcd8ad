"""The console entry point: the app with every command registered, and how errors, signals and torchrun are met.

SIGINT (Ctrl-C) and SIGTERM (what schedulers send before SIGKILL) raise :class:`~evalsuite.errors.Interrupted`
from :func:`main`'s first line on, before torch is imported (only Python's own start and the import of this module,
a few tenths of a second, come before it): a run unwinds as from an error (records are appended as they finish, so
nothing is lost), prints one line saying what its run directory kept and how to resume, and exits with 128 + the
signal's number (130, 143). A second signal takes the default action at once.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator

import typer

# Each command module registers its commands on the app (or one of its groups) when imported.
from evalsuite.cli import bench, bench_kernels, core, downstream, lmeval, mqar, niah, paper, serve  # noqa: F401
from evalsuite.cli.app import app
from evalsuite.errors import Interrupted, UserError

CAUGHT = (signal.SIGINT, signal.SIGTERM)


def main() -> None:
    """Console entry point: one line on stderr for every error; status 2 for bad input (a full disk included), 130
    for Ctrl-C, 143 for SIGTERM."""
    replaced = _raise_on_signals()
    try:
        _main()
    finally:
        for signum, handler in replaced.items():
            signal.signal(signum, handler)


def _raise_on_signals() -> dict:
    """Make SIGINT and SIGTERM raise :class:`Interrupted` in this (the main) thread; returns the handlers replaced.
    A signal ignored when the command starts stays ignored (the shell's way of sparing a background job Ctrl-C)."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def interrupted(signum, frame):
        for caught in CAUGHT:  # a second signal, during the unwinding, ends the process at once
            signal.signal(caught, signal.SIG_DFL)
        raise Interrupted(signum)

    return {s: signal.signal(s, interrupted) for s in CAUGHT if signal.getsignal(s) is not signal.SIG_IGN}


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back (blocked, so the kernel keeps them pending) while torch is imported: an
    exception raised inside a C extension's import may be swallowed there (torch's NumPy set-up turns any into a
    warning), which would lose the signal. One that came meanwhile is met just after."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, CAUGHT)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _main() -> None:
    click = sys.modules[typer.BadParameter.__module__]  # click's exceptions (typer may ship its own click)
    rank = 0
    debug = debug_requested(sys.argv[1:])
    try:
        with _signals_held():
            from evalsuite.runs import distributed  # noqa: F401 - torch, imported under the handlers above

        rank = _torchrun_checks(sys.argv[1:])
        rc = app(standalone_mode=False)
    except Interrupted as e:
        if not rank:  # one line, not one per rank
            typer.echo(str(e), err=True)
        sys.exit(e.status)
    except UserError as e:
        if debug:
            raise
        typer.echo(f"error: {f'[rank {rank}] ' if rank else ''}{e}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:  # raised by code rather than a signal (the handlers above turn those into Interrupted)
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
        _failed(e, rank, debug)
    finally:
        if "evalsuite.runs.distributed" in sys.modules:
            sys.modules["evalsuite.runs.distributed"].teardown()
    if rc == 130:  # typer turns a KeyboardInterrupt into Exit(130), which standalone_mode=False returns
        _interrupted(rank)
    if isinstance(rc, int) and rc:
        sys.exit(rc)


def _failed(e: Exception, rank: int, debug: bool) -> None:
    """Exit after an exception the command did not expect: 2 and one line naming the file for a write that found no
    room (a full disk is the environment, not a bug), 1 and one line for anything else, the traceback with --debug."""
    from evalsuite.runs import distributed
    from evalsuite.runs.store import NO_ROOM, no_room

    where = f"[rank {rank}] " if rank else ""
    if isinstance(e, distributed.PeerFailed):  # rank 0 reports it; this rank leaves quietly
        sys.exit(2 if e.user_error else 1)
    if isinstance(e, OSError) and e.errno in NO_ROOM:
        typer.echo(f"error: {where}{no_room(e.filename or 'a file', e)}", err=True)
        sys.exit(2)
    if debug:
        raise e
    typer.echo(f"error: {where}{type(e).__name__}: {e} (rerun with --debug for the traceback)", err=True)
    sys.exit(1)


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
    path = command_path(args)
    if world.size > 1 and path:
        _refuse_unless_shared(path, world.rank)
    return world.rank


def _refuse_unless_shared(path: tuple[str, ...], rank: int) -> None:
    """A UserError on rank 0 (the others exit quietly) when the command ``path`` does not share its work."""
    sharing = sharing_commands()
    if " ".join(path) in sharing:
        return
    if rank:
        sys.exit(2)  # rank 0 says why
    # the shortest form that does not share: `bench`, but `longbench score` (`longbench` itself does)
    refused = next(" ".join(path[:n]) for n in range(1, len(path) + 1) if " ".join(path[:n]) not in sharing)
    raise UserError(
        f"`evalsuite {refused}` does not share its work among ranks; run it without torchrun (commands that do: "
        f"{', '.join(sharing)})"
    )


def command_path(args: list[str]) -> tuple[str, ...]:
    """The command ``args`` name: its name, and a subcommand's when it is a group (``bench gca``, ``longbench
    score``); empty when there is none. The root takes only flags, so its first word is the command."""
    words = [a for a in args if not a.startswith("-")]
    if not words:
        return ()
    command = typer.main.get_command(app).commands.get(words[0])
    if hasattr(command, "commands"):  # a group
        sub = next((w for w in words[1:] if w in command.commands), None)
        return (words[0], sub) if sub is not None else (words[0],)
    return (words[0],)


def sharing_commands() -> list[str]:
    """The commands that share their work among torchrun's ranks: those of the tasks that do (the task registry
    says which command runs each), and ``run``, whose runner refuses a task that does not, naming it."""
    from evalsuite.tasks.base import TASKS

    return sorted({cls.command for _, cls in TASKS.items() if cls.shards and cls.command}) + ["run"]


def _interrupted(rank: int = 0) -> None:
    if not rank:  # one line, not one per rank
        typer.echo("interrupted; rerun the same command to resume", err=True)
    sys.exit(130)


def debug_requested(args: list[str]) -> bool:
    """``--debug`` among the root options (those before the command's name)."""
    for arg in args:
        if arg == "--debug":
            return True
        if not arg.startswith("-"):
            return False
    return False
