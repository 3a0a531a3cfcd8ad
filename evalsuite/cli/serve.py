"""``evalsuite serve``: any adapter as an OpenAI-compatible HTTP API (:mod:`evalsuite.serve`). Registered on the app
when :mod:`evalsuite.cli.main` imports this module."""

from __future__ import annotations

from typing import Annotated

import typer

from evalsuite.cli.app import app
from evalsuite.cli.options import BackendOpt, CheckpointOpt, DeviceOpt, DtypeOpt, ModelOpt, _adapter
from evalsuite.errors import UserError


@app.command()
def serve(
    model: ModelOpt,
    host: Annotated[str, typer.Option(help="Address to listen on (127.0.0.1: this machine only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    served_name: Annotated[
        str | None, typer.Option(help="The model name clients send (default: the model's own name).")
    ] = None,
    max_batch: Annotated[int, typer.Option(help="Most requests prefilled together into one batch (1: none).")] = 8,
    batch_window_ms: Annotated[
        float, typer.Option(help="How long the first request of a batch waits for others to join it.")
    ] = 5.0,
    prefill_chunk: Annotated[
        int, typer.Option(help="Prompt tokens a batch prefills per scheduler step (0: whole prompts at once).")
    ] = 512,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level: debug, info, warning, error.")] = "info",
    access_log: Annotated[bool, typer.Option(help="Log every request (uvicorn's access log).")] = False,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    checkpoint: CheckpointOpt = None,
    attention: BackendOpt = "auto",
):
    """Serve a model as an OpenAI-compatible API: /v1/models, /v1/completions (echo+logprobs), /v1/chat/completions."""
    from evalsuite.serve import ServeConfig, require_serve
    from evalsuite.serve import serve as run_server

    require_serve()  # before the model loads
    if max_batch < 1 or batch_window_ms < 0 or prefill_chunk < 0 or not 0 <= port < 65536:
        raise UserError(
            "--max-batch must be at least 1, --batch-window-ms and --prefill-chunk at least 0, --port in 0..65535"
        )
    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise UserError(f"unknown --log-level {log_level!r}; use debug, info, warning or error")
    _check_address(host, port)  # before the model loads, and before uvicorn, which says it in several lines
    adapter = _adapter(model, device, dtype, checkpoint, attention)
    config = ServeConfig(served_name=served_name, max_batch=max_batch, batch_window_ms=batch_window_ms,
                         prefill_chunk=prefill_chunk or None)  # fmt: skip
    run_server(adapter, host, port, config, log_level=log_level, access_log=access_log)


def _check_address(host: str, port: int) -> None:
    """A UserError unless ``host:port`` can be listened on now (bound as uvicorn binds it: IPv6 for a host with a
    colon, SO_REUSEADDR; then released): a port in use, a host that is not an address of this machine, a port the
    user may not take."""
    import errno
    import socket

    if port == 0:  # any free port
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise UserError(f"--host {host!r} is not an address or host name ({e})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is in use (another server?); pick another --port") from None
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
