"""User-facing errors: one clear line, a non-zero exit, no traceback unless --debug."""


class UserError(Exception):
    """Something the user can fix (bad input, missing file, unknown name).

    The CLI prints ``error: <message>`` and exits with status 2; library callers can catch it.
    """
