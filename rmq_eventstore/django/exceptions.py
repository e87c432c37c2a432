"""Errors of the Django face, and the middleware that turns a version conflict into HTTP 409."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from ..client import ConcurrencyError as ClientConcurrencyError


class ConcurrencyError(Exception):
    """An expected-version append found another version: someone else appended to the stream first.

    ``stream``, ``expected_version`` and ``current_version`` say what was found; ``status_code`` is 409, and
    `ConcurrencyErrorMiddleware` (or a view) answers it as HTTP 409 Conflict. Nothing was appended."""

    status_code = 409

    def __init__(self, message: str, stream: str, expected_version: int | None,
                 current_version: int | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.expected_version = expected_version
        self.current_version = current_version

    @classmethod
    def from_client(cls, e: ClientConcurrencyError) -> ConcurrencyError:
        return cls(str(e), e.stream, e.expected_version, e.current_version)

    def as_dict(self) -> dict[str, Any]:
        return {"error": "conflict", "detail": str(self), "stream": self.stream,
                "expected_version": self.expected_version, "current_version": self.current_version}


class ConcurrencyErrorMiddleware:
    """Answers `ConcurrencyError` raised by a view with 409 Conflict (JSON for requests that accept it,
    plain text otherwise). Add ``"rmq_eventstore.django.exceptions.ConcurrencyErrorMiddleware"`` to
    ``MIDDLEWARE``."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, ConcurrencyError):
            return None
        if "json" in request.headers.get("Accept", "") or request.content_type == "application/json":
            return JsonResponse(exception.as_dict(), status=409)
        return HttpResponse(str(exception), status=409, content_type="text/plain; charset=utf-8")
