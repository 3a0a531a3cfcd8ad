"""The Starlette application of ``evalsuite serve`` and the uvicorn entry point."""

from __future__ import annotations

import json
import logging

from evalsuite.adapters.base import TextAdapter
from evalsuite.errors import UserError
from evalsuite.serve.handlers import OpenAIServer
from evalsuite.serve.protocol import APIError, ServeConfig, bad_request

log = logging.getLogger("evalsuite.serve")


def _starlette():
    try:
        import starlette  # noqa: F401
    except ImportError:
        raise UserError("evalsuite serve needs starlette and uvicorn: pip install starlette uvicorn") from None


def build_app(adapter: TextAdapter, config: ServeConfig | None = None):
    """The Starlette application serving ``adapter`` (see the module docstring)."""
    _starlette()
    import contextlib

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    server = OpenAIServer(adapter, config)

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def tokenize(fn, *args):
        return await run_in_threadpool(fn, *args)

    async def read_json(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise bad_request(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        return body

    def sse(chunks: list[dict]):
        async def events():
            for chunk in chunks:
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def endpoint(handler):
        async def wrapped(request: Request):
            try:
                result = await handler(request)
            except APIError as e:
                return error(e)
            except UserError as e:  # the adapter refused the input
                return error(APIError(400, str(e)))
            except Exception:  # noqa: BLE001 - logged; the server stays up
                log.exception("error while handling %s %s", request.method, request.url.path)
                return error(APIError(500, "internal server error (logged by the server)", "server_error"))
            if isinstance(result, list):
                return sse(result)
            return JSONResponse(result)

        return wrapped

    @endpoint
    async def list_models(request: Request):
        return server.models()

    @endpoint
    async def get_model(request: Request):
        return server.model(request.path_params["model"])

    @endpoint
    async def completions(request: Request):
        body = await read_json(request)
        return await server.completions(body, tokenize)

    @endpoint
    async def chat(request: Request):
        body = await read_json(request)
        return await server.chat(body, tokenize)

    @endpoint
    async def health(request: Request):
        return {"status": "ok", "model": server.name}

    @endpoint
    async def stats(request: Request):
        return server.engine.stats.to_dict()

    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 405:
            e = APIError(
                405, f"method {request.method} is not allowed on {request.url.path}", code="method_not_allowed"
            )
        elif exc.status_code == 404:
            e = APIError(404, f"unknown route {request.url.path}", code="not_found")
        else:
            e = APIError(exc.status_code, str(exc.detail))
        response = error(e)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.engine.start()
        try:
            yield
        finally:
            await server.engine.stop()

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.server = server
    return app


def serve(adapter: TextAdapter, host: str = "127.0.0.1", port: int = 8000, config: ServeConfig | None = None,
          log_level: str = "info", access_log: bool = False) -> None:  # fmt: skip
    """Serve ``adapter`` until interrupted (Ctrl-C)."""
    _starlette()
    import uvicorn

    app = build_app(adapter, config)
    name = app.state.server.name
    print(f"serving {name} at http://{host}:{port}/v1 (Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log)
