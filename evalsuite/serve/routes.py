"""The Starlette routes of ``evalsuite serve``: :class:`~evalsuite.serve.handlers.OpenAIServer`'s handlers mounted
as HTTP endpoints, with OpenAI-shaped errors. Starlette is the ``serve`` extra: this module is imported only by
:mod:`evalsuite.serve.app`, after it has checked that the extra is installed."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from evalsuite.errors import UserError
from evalsuite.serve.handlers import OpenAIServer
from evalsuite.serve.protocol import APIError, bad_request

log = logging.getLogger("evalsuite.serve")

Handler = Callable[[OpenAIServer, Request], Awaitable[dict | list[dict]]]


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def read_json(request: Request) -> dict:
    """The request body as a JSON object; a 400 APIError otherwise."""
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return body


def sse(chunks: list[dict]) -> StreamingResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""

    async def events():
        for chunk in chunks:
            yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def endpoint(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """``handler(server, request)`` as a Starlette endpoint: a dict is JSON, a list of chunks a stream, an
    APIError (or the adapter's UserError, a 400) its OpenAI-shaped reply; anything else is logged and a 500."""

    async def wrapped(request: Request) -> Response:
        try:
            result = await handler(request.app.state.server, request)
        except APIError as e:
            return error_response(e)
        except UserError as e:  # the adapter refused the input
            return error_response(APIError(400, str(e)))
        except Exception:  # noqa: BLE001 - logged; the server stays up
            log.exception("error while handling %s %s", request.method, request.url.path)
            return error_response(APIError(500, "internal server error (logged by the server)", "server_error"))
        return sse(result) if isinstance(result, list) else JSONResponse(result)

    return wrapped


@endpoint
async def list_models(server: OpenAIServer, request: Request):
    return server.models()


@endpoint
async def get_model(server: OpenAIServer, request: Request):
    return server.model(request.path_params["model"])


@endpoint
async def completions(server: OpenAIServer, request: Request):
    return await server.completions(await read_json(request), run_in_threadpool)


@endpoint
async def chat(server: OpenAIServer, request: Request):
    return await server.chat(await read_json(request), run_in_threadpool)


@endpoint
async def health(server: OpenAIServer, request: Request):
    return {"status": "ok", "model": server.name}


@endpoint
async def stats(server: OpenAIServer, request: Request):
    return server.engine.stats.to_dict()


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own 404/405 (and other HTTP errors) in OpenAI's error shape."""
    if exc.status_code == 405:
        e = APIError(405, f"method {request.method} is not allowed on {request.url.path}", code="method_not_allowed")
    elif exc.status_code == 404:
        e = APIError(404, f"unknown route {request.url.path}", code="not_found")
    else:
        e = APIError(exc.status_code, str(exc.detail))
    response = error_response(e)
    if exc.headers:
        response.headers.update(exc.headers)
    return response


@contextlib.asynccontextmanager
async def lifespan(app: Starlette):
    """The batching engine's worker runs while the app does."""
    await app.state.server.engine.start()
    try:
        yield
    finally:
        await app.state.server.engine.stop()


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", get_model, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat, methods=["POST"]),
    Route("/health", health, methods=["GET"]),
    Route("/stats", stats, methods=["GET"]),
]


def starlette_app(server: OpenAIServer) -> Starlette:
    """The application serving ``server``'s handlers; ``app.state.server`` is ``server``."""
    app = Starlette(routes=ROUTES, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.server = server
    return app
