"""The Starlette routes of ``evalsuite serve``: :class:`~evalsuite.serve.handlers.OpenAIServer`'s handlers mounted
as HTTP endpoints, with OpenAI-shaped errors. Starlette is the ``serve`` extra: this module is imported only by
:mod:`evalsuite.serve.app`, after it has checked that the extra is installed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from evalsuite.errors import UserError
from evalsuite.serve.handlers import OpenAIServer
from evalsuite.serve.protocol import APIError, bad_request

log = logging.getLogger("evalsuite.serve")

Handler = Callable[[OpenAIServer, Request], Awaitable[dict | Response | AsyncIterator[dict]]]


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


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone (the request body is read by then, so ``receive`` waits for that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(work: Awaitable, receive: Receive):
    """``work``'s result; when the client disconnects first, ``work`` is cancelled -- and with it its generation in
    the model thread -- and :class:`ClientGone` raised."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        return task.result()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientGone


class ClientGone(Exception):
    """The client disconnected before its reply was ready."""


class EventStream(StreamingResponse):
    """Server-sent events as they are made: ``data: {chunk}`` per chunk of ``chunks``, then ``data: [DONE]``; an error
    midway is sent as a ``data: {"error": ...}`` event. When the client goes away the chunks' iterator is closed, which
    takes its generation out of the running batch. ``done(status)`` is called once the stream has ended."""

    def __init__(self, chunks: AsyncIterator[dict], done: Callable[[int], None]):
        self.chunks, self.done = chunks, done
        super().__init__(self._events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def _events(self):
        try:
            async for chunk in self.chunks:
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
        except (APIError, UserError) as e:
            yield f"data: {json.dumps(_api_error(e).body(), ensure_ascii=False)}\n\n"
        except Exception:  # noqa: BLE001 - logged; the stream ends with an error event
            log.exception("error while streaming")
            yield f"data: {json.dumps(INTERNAL.body())}\n\n"
        yield "data: [DONE]\n\n"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 499  # nginx's "client closed request", counted when the client leaves midway
        try:
            await until_disconnect(self.stream_response(send), receive)
            status = 200
        except (ClientGone, OSError):
            pass
        finally:
            await self.chunks.aclose()
            self.done(status)


INTERNAL = APIError(500, "internal server error (logged by the server)", "server_error")


def _api_error(e: Exception) -> APIError:
    return e if isinstance(e, APIError) else APIError(400, str(e))  # a UserError: the adapter refused the input


def endpoint(handler: Handler, name: str | None = None) -> Callable[[Request], Awaitable[Response]]:
    """``handler(server, request)`` as a Starlette endpoint: a dict is JSON, an async iterator of chunks a live event
    stream, an APIError (or the adapter's UserError, a 400) its OpenAI-shaped reply; anything else is logged and a
    500. A client that disconnects while its reply is made cancels the handler (and its generations). ``name``:
    the endpoint's label in ``/metrics``."""

    async def wrapped(request: Request) -> Response:
        server: OpenAIServer = request.app.state.server
        start = time.monotonic()

        def done(status: int) -> None:
            if name:
                server.engine.metrics.request_done(name, status, time.monotonic() - start)

        try:
            await request.body()  # read (and kept) before the disconnect watch takes over the receive channel
            result = await until_disconnect(handler(server, request), request.receive)
        except ClientGone:
            done(499)
            return Response(status_code=499)
        except (APIError, UserError) as e:
            done(_api_error(e).status)
            return error_response(_api_error(e))
        except Exception:  # noqa: BLE001 - logged; the server stays up
            log.exception("error while handling %s %s", request.method, request.url.path)
            done(500)
            return error_response(INTERNAL)
        if isinstance(result, Response):
            done(200)
            return result
        if isinstance(result, dict | list):
            done(200)
            return JSONResponse(result)
        return EventStream(result, done)

    return wrapped


def named(name: str):
    return lambda handler: endpoint(handler, name)


@endpoint
async def list_models(server: OpenAIServer, request: Request):
    return server.models()


@endpoint
async def get_model(server: OpenAIServer, request: Request):
    return server.model(request.path_params["model"])


@named("completions")
async def completions(server: OpenAIServer, request: Request):
    return await server.completions(await read_json(request), run_in_threadpool)


@named("chat")
async def chat(server: OpenAIServer, request: Request):
    return await server.chat(await read_json(request), run_in_threadpool)


@endpoint
async def health(server: OpenAIServer, request: Request):
    return {"status": "ok", "model": server.name}


@endpoint
async def stats(server: OpenAIServer, request: Request):
    return server.engine.metrics.stats()


@endpoint
async def metrics(server: OpenAIServer, request: Request):
    return PlainTextResponse(server.engine.metrics.prometheus(), media_type="text/plain; version=0.0.4")


@named("tokenize")
async def tokenize(server: OpenAIServer, request: Request):
    return await run_in_threadpool(server.tokenize, await read_json(request))


@named("detokenize")
async def detokenize(server: OpenAIServer, request: Request):
    return await run_in_threadpool(server.detokenize, await read_json(request))


@endpoint
async def tokenizer_info(server: OpenAIServer, request: Request):
    return server.tokenizer_info()


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
    Route("/metrics", metrics, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
]


def starlette_app(server: OpenAIServer) -> Starlette:
    """The application serving ``server``'s handlers; ``app.state.server`` is ``server``."""
    app = Starlette(routes=ROUTES, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.server = server
    return app
