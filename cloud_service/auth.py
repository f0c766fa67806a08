"""Bearer-token authentication as a gRPC server interceptor."""

from __future__ import annotations

import hmac
import logging
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from configkit.log_limit import RateLimitedLog
from configkit.secrets import SecretError, SecretRef

logger = logging.getLogger(__name__)

HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"
_BEARER = "bearer "

_Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class AuthConfigError(ValueError):
    """The environment variable holding the tokens is unset or empty."""


def tokens_from_env(variable: str, environ: dict[str, str] | None = None) -> frozenset[str]:
    """The comma-separated tokens in `variable`; raise `AuthConfigError` if there are none."""
    return tokens_from_secret(SecretRef(env=variable), environ)


def tokens_from_secret(
    source: SecretRef,
    environ: dict[str, str] | None = None,
    credentials_dir: str | Path | None = None,
) -> frozenset[str]:
    """The comma-separated tokens held by `source` (env or systemd credential)."""
    try:
        value = source.resolve(environ if environ is not None else os.environ, credentials_dir)
    except SecretError as exc:
        raise AuthConfigError(f"auth is enabled but {exc}") from exc
    tokens = frozenset(t.strip() for t in value.split(",") if t.strip())
    if not tokens:
        raise AuthConfigError(f"auth is enabled but {source.describe()} holds no tokens")
    return tokens


def _abort_handler(handler: _Handler, message: str) -> _Handler:
    """A handler of the same streaming kind as `handler` that fails with UNAUTHENTICATED."""

    def abort(_request: object, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(abort)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(abort)
    return grpc.unary_unary_rpc_method_handler(abort)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without `authorization: Bearer <token>` for one of `tokens`.

    Health checks are exempt so that load balancers and kubelets can probe without a token.
    Rejections are logged at most once per 10 s (a client retrying a wrong token writes one line,
    and the next says how many were left out).
    """

    def __init__(
        self, tokens: Collection[str], exempt_prefixes: tuple[str, ...] = (HEALTH_METHOD_PREFIX,)
    ) -> None:
        if not tokens:
            raise AuthConfigError("at least one token is required")
        self._tokens = tuple(t.encode() for t in tokens)
        self._exempt_prefixes = exempt_prefixes
        self._rejection_log = RateLimitedLog(logger, logging.INFO, interval_s=10.0)

    def _authorized(self, metadata: tuple[tuple[str, str | bytes], ...] | None) -> bool:
        for key, value in metadata or ():
            if key != "authorization" or not isinstance(value, str):
                continue
            if not value.lower().startswith(_BEARER):
                continue
            presented = value[len(_BEARER) :].strip().encode()
            # Compare against every token in constant time so timing reveals nothing.
            matches = [hmac.compare_digest(presented, token) for token in self._tokens]
            if any(matches):
                return True
        return False

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        """Pass authorized and exempt calls on; answer others with UNAUTHENTICATED."""
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(self._exempt_prefixes):
            return handler
        if self._authorized(handler_call_details.invocation_metadata):
            return handler
        self._rejection_log.log("unauthenticated call to %s rejected", method)
        return _abort_handler(handler, "missing or invalid bearer token")
