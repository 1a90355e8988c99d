"""The API's Powertools resolver, safe to resolve several requests at once in one process.

Powertools keeps the request being resolved on the resolver (its ``current_event`` on the router
class, the routing ``context`` on the instance): fine for Lambda, which gives each sandbox one
request at a time, but a process that serves requests on several threads (the Azure Functions
Python worker runs synchronous functions on a thread pool; ``runplane dev``'s threaded front)
would let one request read another's headers, its token among them. Here each of those is kept
per thread, so every thread resolves its own request and nothing else.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from aws_lambda_powertools.event_handler import APIGatewayHttpResolver
from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent


class _Request(threading.local):
    """What one thread's request is: its event, its Lambda context, its routing context."""

    def __init__(self) -> None:
        self.event: Any = None
        self.lambda_context: Any = None
        self.context: dict[str, Any] = {}
        self.frames: list[str] = []


class ConcurrentResolver(APIGatewayHttpResolver):
    """``APIGatewayHttpResolver`` whose request state is the calling thread's own, and whose routes
    build their middleware chain once even when their first requests come at the same moment
    (Powertools builds it on a route's first call, unguarded: built twice, it breaks the route)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._request = _Request()
        self._building = threading.Lock()
        super().__init__(*args, **kwargs)

    @property  # type: ignore[override]
    def current_event(self) -> APIGatewayProxyEventV2:
        event: APIGatewayProxyEventV2 = self._request.event
        return event

    @current_event.setter
    def current_event(self, value: APIGatewayProxyEventV2) -> None:
        self._request.event = value

    @property
    def lambda_context(self) -> Any:
        return self._request.lambda_context

    @lambda_context.setter
    def lambda_context(self, value: Any) -> None:
        self._request.lambda_context = value

    @property
    def context(self) -> dict[str, Any]:
        return self._request.context

    @context.setter
    def context(self, value: dict[str, Any]) -> None:
        self._request.context = value

    @property
    def processed_stack_frames(self) -> list[str]:
        return self._request.frames

    @processed_stack_frames.setter
    def processed_stack_frames(self, value: list[str]) -> None:
        self._request.frames = value

    def _call_route(self, route: Route, route_arguments: dict[str, str]) -> Any:
        if not route._middleware_stack_built:
            with self._building:
                if not route._middleware_stack_built:
                    route._build_middleware_stack(router_middlewares=self._router_middlewares, app=self)
        return super()._call_route(route, route_arguments)

    def resolve(self, event: Mapping[str, Any], context: Any) -> dict[str, Any]:
        raw = event.raw_event if isinstance(event, BaseProxyEvent) else event
        # the base class also sets these on the router class, for every thread: this thread's
        # own copy is what the routes read (through the properties above)
        self._request.event = self._to_proxy_event(dict(raw))
        self._request.lambda_context = context
        return super().resolve(raw, context)
