"""The server's errors, in the JSON shape each API's clients parse.

TEI's routes answer `{"error": message, "error_type": kind}` (text-embeddings-inference's `ErrorResponse`, its
`ErrorType` names); the OpenAI route answers `{"error": {"message", "type", "param", "code"}}` as api.openai.com does
(the `openai` client reads `error.message`); the Jina/Cohere rerank routes answer `{"message": ...}` as Cohere does.
The status codes are TEI's, except where issue #66 asks for a more precise one: 413 for a payload or a text over a
limit (TEI: 422) and 422 for an empty input (TEI: 400).
"""

from __future__ import annotations

from typing import Any

# TEI's `ErrorType`, as serde writes its variants.
VALIDATION = "Validation"
EMPTY = "Empty"
OVERLOADED = "Overloaded"
BACKEND = "Backend"
UNHEALTHY = "Unhealthy"
TOKENIZER = "Tokenizer"
# Not TEI's: the kinds its HTTP layer answers without a JSON body.
UNAUTHORIZED = "Unauthorized"
TOO_LARGE = "PayloadTooLarge"
NOT_FOUND = "NotFound"
METHOD_NOT_ALLOWED = "MethodNotAllowed"

OPENAI_ROUTES = ("/v1/embeddings",)
COHERE_ROUTES = ("/v1/rerank", "/v2/rerank")
# OpenAI's `type` of an error, by status.
OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    424: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class ServeError(Exception):
    """A request the server refuses or cannot answer: the HTTP `status`, a message naming the field or limit, and
    TEI's `error_type`."""

    def __init__(self, status: int, message: str, error_type: str = VALIDATION) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type


def validation(message: str) -> ServeError:
    """422: a request whose JSON is well-formed but whose values are not (a wrong type, an empty input, too many)."""
    return ServeError(422, message, VALIDATION)


def too_large(message: str) -> ServeError:
    """413: a payload over `--payload-limit`, or a text over the model's length with truncation off."""
    return ServeError(413, message, VALIDATION)


def overloaded(limit: int) -> ServeError:
    """429: the bounded queue is full."""
    return ServeError(
        429, f"Model is overloaded: {limit} requests in flight (--max-concurrent-requests); retry later", OVERLOADED
    )


def error_body(path: str, error: ServeError) -> dict[str, Any]:
    """The JSON body of `error` on the route `path`, in that API's shape (see the module docstring)."""
    if path in OPENAI_ROUTES:
        return {
            "error": {
                "message": error.message,
                "type": OPENAI_TYPES.get(error.status, "invalid_request_error"),
                "param": None,
                "code": error.status,
            }
        }
    if path in COHERE_ROUTES:
        return {"message": error.message}
    return {"error": error.message, "error_type": error.error_type}
