"""The entry points of ``evalsuite serve``: the application (:func:`build_app`) and the uvicorn server (:func:`serve`).

Both need the ``serve`` extra (Starlette and uvicorn) and say so in one line when it is missing; the rest of
:mod:`evalsuite.serve` (protocol, handlers, engine) imports without it.
"""

from __future__ import annotations

from evalsuite.adapters.base import TextAdapter
from evalsuite.errors import require
from evalsuite.serve.handlers import OpenAIServer
from evalsuite.serve.protocol import ServeConfig


def require_serve() -> None:
    """A UserError naming the ``serve`` extra unless Starlette and uvicorn import."""
    for module in ("starlette", "uvicorn"):
        require(module, "serve", "evalsuite serve")


def build_app(adapter: TextAdapter, config: ServeConfig | None = None):
    """The Starlette application serving ``adapter`` (see :mod:`evalsuite.serve`)."""
    require_serve()
    from evalsuite.serve.routes import starlette_app

    return starlette_app(OpenAIServer(adapter, config))


def serve(adapter: TextAdapter, host: str = "127.0.0.1", port: int = 8000, config: ServeConfig | None = None,
          log_level: str = "info", access_log: bool = False) -> None:  # fmt: skip
    """Serve ``adapter`` until interrupted (Ctrl-C)."""
    app = build_app(adapter, config)  # checks the serve extra, uvicorn included
    import uvicorn

    name = app.state.server.name
    print(f"serving {name} at http://{host}:{port}/v1 (Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log)
