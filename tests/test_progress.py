"""Progress reporting off a terminal: periodic plain lines a log file can show (background GPU runs)."""

import contextlib
import io
import time

from evalsuite.runs import progress


def test_log_lines_off_a_terminal():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), progress.progress_bar(8, "train tiny", log_every_s=0.05) as bar:
        for _ in range(8):
            time.sleep(0.03)
            bar.advance()
    lines = err.getvalue().splitlines()
    assert 2 <= len(lines) <= 5  # one line per 0.05 s, not one per step
    assert lines[0].startswith("train tiny: ") and "/8 (" in lines[0] and ", eta " in lines[0]
    counts = [int(line.split(": ")[1].split("/")[0]) for line in lines]
    assert counts == sorted(counts) and counts[-1] <= 8


def test_disabled_is_silent():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), progress.progress_bar(3, "x", enabled=False) as bar:
        bar.advance(3)
    assert err.getvalue() == ""
