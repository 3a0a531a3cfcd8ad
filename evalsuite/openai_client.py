"""One client for every OpenAI-compatible endpoint the suite talks to: the NIAH judge and the ``openai:`` adapter.

It wraps the ``openai`` SDK (its own retries off) and owns the retry policy: 429, 408, 409, every 5xx, timeouts,
dropped connections and malformed replies (a body that is not a JSON object, or one that fails the caller's
``check``) are retried with exponential backoff (``backoff * 2**(attempt - 1)``, capped at ``max_backoff``),
honouring the server's ``Retry-After`` (seconds or an HTTP date; ``retry-after-ms`` too). A connection that cannot
be made at all (refused: nothing listens at that address; or a host name that does not exist) is tried
``unreachable_attempts`` times with short waits (``unreachable_backoff``, doubled), enough to ride out a server's
restart, so a wrong URL or a server that is not up fails in seconds, not after minutes of backoff. After the last
attempt :class:`RequestFailed` is raised; other HTTP errors (bad key, unknown model, bad request) raise
:class:`RequestRejected` at once: retrying cannot fix them. Every attempt is reported to ``on_attempt`` (the
adapter's request log), with its status and latency. Connecting is bounded by ``connect_timeout`` seconds, reading
a reply by ``timeout``.

The endpoint is ``$OPENAI_BASE_URL`` (unset: api.openai.com) and the key ``$OPENAI_API_KEY`` (or another variable
named by the caller), unless given; an endpoint that is not an ``http(s)://HOST`` URL is a UserError. The SDK client
is thread-safe: one :class:`OpenAIClient` serves a thread pool.
"""

from __future__ import annotations

import email.utils
import json
import os
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from evalsuite.errors import UserError, require

RETRY_STATUS = {408, 409, 429}  # plus every 5xx
ENDPOINTS = ("chat", "completions")  # /chat/completions, /completions
NO_KEY = "none"  # sent to a local server that needs no key (the SDK insists on one)


class RequestFailed(Exception):
    """Every attempt failed with a transient error; ``str(self)`` says how many and the last error."""

    def __init__(self, message: str, attempts: int):
        super().__init__(message)
        self.attempts = attempts


class RequestRejected(Exception):
    """The server refused the request with a status that retrying cannot fix (4xx other than 408/409/429)."""

    def __init__(self, status: int | None, message: str):
        super().__init__(f"({status}): {message}")
        self.status, self.message = status, message


class BadResponse(Exception):
    """A reply that is not a JSON object, or not the shape the caller expects (retried like a 5xx)."""


@dataclass
class Reply:
    """A successful reply: the parsed JSON body, the attempt that got it, and its latency in seconds."""

    data: dict
    attempts: int
    latency: float


def short(error: Exception | str, limit: int = 300) -> str:
    """One line of at most ``limit`` characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class OpenAIClient:
    """POSTs to ``/chat/completions`` or ``/completions`` of an OpenAI-compatible endpoint, with retries.

    Args:
        api_key / base_url: default to ``$<api_key_env>`` / ``$OPENAI_BASE_URL``. A missing key is a UserError
            naming ``purpose`` when ``require_key`` (the default); otherwise the key ``none`` is sent.
        max_attempts: tries per request; backoff / max_backoff: the first retry delay in seconds, doubled per retry,
            capped (``Retry-After`` is capped too); timeout: seconds per attempt; sleep: tests pass a recorder.
        unreachable_attempts / unreachable_backoff: tries (at most ``max_attempts``) and the first wait when no
            connection can be made; connect_timeout: seconds to connect (at most ``timeout``).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        require_key: bool = True,
        purpose: str = "this endpoint",
        max_attempts: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        timeout: float = 120.0,
        unreachable_attempts: int = 4,
        unreachable_backoff: float = 0.25,
        connect_timeout: float = 10.0,
        env: Mapping[str, str] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        openai = require("openai", "openai", purpose)
        env = os.environ if env is None else env
        key = api_key or env.get(api_key_env) or None
        if not key and require_key:
            raise UserError(
                f"{purpose} needs an API key: set {api_key_env} (and OPENAI_BASE_URL for a non-OpenAI endpoint)"
            )
        if max_attempts < 1:
            raise UserError(f"{purpose}: max_attempts must be at least 1")
        self._openai = openai
        self.base_url = base_url or env.get("OPENAI_BASE_URL") or None
        if self.base_url is not None:
            check_url(self.base_url, purpose)
        self.max_attempts, self.backoff, self.max_backoff = max_attempts, backoff, max_backoff
        self.unreachable_attempts = min(unreachable_attempts, max_attempts)
        self.unreachable_backoff = unreachable_backoff
        self._sleep = sleep
        # The SDK's own retries are off: ours count attempts, log them and honour the caller's policy.
        limits = openai.Timeout(timeout, connect=min(timeout, connect_timeout))
        self.client = openai.OpenAI(api_key=key or NO_KEY, base_url=self.base_url, max_retries=0, timeout=limits)

    @property
    def endpoint(self) -> str:
        """The base URL requests go to (the SDK's default when none was given)."""
        return str(self.client.base_url).rstrip("/")

    # -- the retry policy ----------------------------------------------------------------------------------------

    def delay(self, attempt: int, error: Exception | None, unreachable: int = 0) -> float:
        """Seconds to wait before the next try: the server's ``Retry-After`` if it sent one, else exponential (from
        ``unreachable_backoff`` after the ``unreachable``-th failed connection, from ``backoff`` otherwise)."""
        if unreachable:
            return min(self.unreachable_backoff * 2 ** (unreachable - 1), self.max_backoff)
        response = getattr(error, "response", None)
        headers = response.headers if response is not None else {}
        wait = _retry_after(headers)
        if wait is not None:
            return min(max(wait, 0.0), self.max_backoff)
        return min(self.backoff * 2 ** (attempt - 1), self.max_backoff)

    def retryable(self, error: Exception) -> bool:
        openai = self._openai
        if isinstance(error, BadResponse | openai.APITimeoutError | openai.APIConnectionError):
            return True
        if isinstance(error, openai.APIStatusError):
            return error.status_code in RETRY_STATUS or error.status_code >= 500
        return False

    # -- requests ------------------------------------------------------------------------------------------------

    def _send(self, endpoint: str, body: dict) -> str:
        if endpoint == "chat":
            raw = self.client.chat.completions.with_raw_response.create(**body)
        elif endpoint == "completions":
            raw = self.client.completions.with_raw_response.create(**body)
        else:
            raise ValueError(f"unknown endpoint {endpoint!r}; use one of {ENDPOINTS}")
        return raw.text

    def post(
        self,
        endpoint: str,
        body: dict,
        *,
        check: Callable[[dict], None] | None = None,
        on_attempt: Callable[[dict], None] | None = None,
    ) -> Reply:
        """POST ``body`` to ``endpoint`` (``chat`` or ``completions``) until a well-formed reply comes back.

        ``check(data)`` raises ValueError (or KeyError, TypeError, IndexError) for a reply of the wrong shape, which
        then counts as a failed attempt. ``on_attempt`` gets ``{attempt, status, latency_s, error, data}`` after
        every attempt (status: the HTTP status, or ``timeout``, ``connection_error``, ``bad_response``).
        Raises :class:`RequestRejected` (not retryable) or :class:`RequestFailed` (every attempt failed, or no
        connection could be made ``unreachable_attempts`` times).
        """
        last_error, unreachable = "", 0
        for attempt in range(1, self.max_attempts + 1):
            start = time.perf_counter()
            status: int | str = 200
            try:
                text = self._send(endpoint, body)
                data = _parse(text, check)
            except (self._openai.OpenAIError, BadResponse) as e:
                latency = time.perf_counter() - start
                status = _status_of(e, self._openai)
                if on_attempt is not None:
                    on_attempt({"attempt": attempt, "status": status, "latency_s": latency, "error": short(e),
                                "data": None})  # fmt: skip
                if not self.retryable(e):
                    raise RequestRejected(getattr(e, "status_code", None), short(e)) from None
                last_error = f"{type(e).__name__}: {short(e)}"
                cause = unreachable_cause(e)
                unreachable = unreachable + 1 if cause is not None else 0
                if unreachable >= self.unreachable_attempts:
                    raise RequestFailed(
                        f"could not be reached ({cause}; {unreachable} attempts): is the server up and the URL right?",
                        attempt,
                    ) from None
                if attempt < self.max_attempts:
                    self._sleep(self.delay(attempt, e, unreachable))
                continue
            latency = time.perf_counter() - start
            if on_attempt is not None:
                on_attempt({"attempt": attempt, "status": status, "latency_s": latency, "error": None, "data": data})
            return Reply(data, attempt, latency)
        raise RequestFailed(f"gave up after {self.max_attempts} attempts: {last_error}", self.max_attempts)


def check_url(url: str, purpose: str) -> None:
    """A UserError unless ``url`` is ``http(s)://HOST[:PORT][/PATH]`` (a bad URL would be retried as a failed
    connection)."""
    try:
        parts = urllib.parse.urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and (parts.port is None or parts.port > 0)
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise UserError(f"{purpose}: base_url {url!r} is not an http(s) URL (e.g. http://127.0.0.1:8000/v1)")


def unreachable_cause(error: BaseException) -> str | None:
    """The OS error, as one line, when ``error`` (or one it was raised from) says no connection could be made:
    refused (nothing listens at that address) or an unknown host name. None for anything else, a name lookup
    that failed for now (EAI_AGAIN) included."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, ConnectionRefusedError) or (
            isinstance(error, socket.gaierror) and error.errno == socket.EAI_NONAME
        ):
            return short(error, 120)
        error = error.__cause__ or error.__context__
    return None


def _parse(text: str, check: Callable[[dict], None] | None) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        raise BadResponse(f"malformed JSON in the reply: {short(text, 120)!r}") from None
    if not isinstance(data, dict):
        raise BadResponse(f"the reply is not a JSON object: {short(text, 120)!r}")
    if check is not None:
        try:
            check(data)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise BadResponse(f"unexpected reply ({type(e).__name__}: {short(e, 120)}): {short(text, 120)!r}") from None
    return data


def _status_of(error: Exception, openai) -> int | str:
    if isinstance(error, BadResponse):
        return "bad_response"
    if isinstance(error, openai.APITimeoutError):
        return "timeout"
    if isinstance(error, openai.APIConnectionError):
        return "connection_error"
    return getattr(error, "status_code", None) or type(error).__name__


def _retry_after(headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (a number, or an HTTP date); None when absent or bad."""
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return float(ms) / 1000
    except (TypeError, ValueError):
        pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return when.timestamp() - time.time() if when is not None else None
