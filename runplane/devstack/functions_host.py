"""What the Azure Functions host does with a function app, for the triggers runplane uses: it
indexes the app's functions, resolves ``%SETTING%`` binding expressions against the app settings,
routes HTTP requests (host.json ``routePrefix``), feeds queue messages to queue triggers as
host.json ``extensions.queues`` says (batch size, retries through ``visibilityTimeout``, the
``<queue>-poison`` queue after ``maxDequeueCount``, ``messageEncoding``) and calls timer functions.

Azure Functions Core Tools cannot run here, so the local stack hosts the app with this; the
deployed app runs on the real host with the same function_app.py and host.json.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote

import azure.functions as func
from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.functions.queue import QueueMessage
from azure.functions.timer import TimerRequest
from azure.storage.queue import QueueClient

log = logging.getLogger(__name__)
_SETTING = re.compile(r"%([^%]+)%")
_TIMESPAN = re.compile(r"(?:(\d+)\.)?(\d+):(\d+):(\d+(?:\.\d+)?)")


def timespan_seconds(value: str) -> float:
    """Seconds of a host.json time span, ``[d.]hh:mm:ss[.fff]``."""
    match = _TIMESPAN.fullmatch(value.strip())
    if match is None:
        raise ValueError(f"not a time span: {value!r}")
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours) * 3600 + int(minutes) * 60 + float(seconds)


@dataclass(frozen=True)
class HostOptions:
    """The parts of host.json the local host honours (defaults are the real host's)."""

    route_prefix: str = "api"
    batch_size: int = 16
    max_dequeue_count: int = 5
    visibility_timeout: float = 0.0
    max_polling_interval: float = 60.0
    message_encoding: str = "base64"

    @classmethod
    def from_host_json(cls, path: Path) -> HostOptions:
        data = json.loads(path.read_text())
        ext = data.get("extensions", {})
        queues = ext.get("queues", {})
        interval = queues.get("maxPollingInterval", "00:01:00")
        return cls(
            route_prefix=ext.get("http", {}).get("routePrefix", "api"),
            batch_size=int(queues.get("batchSize", 16)),
            max_dequeue_count=int(queues.get("maxDequeueCount", 5)),
            visibility_timeout=timespan_seconds(queues.get("visibilityTimeout", "00:00:00")),
            # a number is milliseconds, a string a time span
            max_polling_interval=interval / 1000 if isinstance(interval, int | float) else timespan_seconds(interval),
            message_encoding=queues.get("messageEncoding", "base64"),
        )


def route_pattern(prefix: str, route: str) -> re.Pattern[str]:
    """A regex for a route template such as ``v1/{*path}`` (``{name}`` one segment, ``{*name}``
    the rest, possibly empty) under the host's route prefix."""
    parts = [p for p in (prefix.strip("/"), route.strip("/")) if p]
    regex = ""
    for segment in "/".join(parts).split("/"):
        catch_all = re.fullmatch(r"\{\*(\w+)\}", segment)
        one = re.fullmatch(r"\{(\w+)(?::[^}]*)?\}", segment)
        if catch_all:
            regex += f"(?:/(?P<{catch_all.group(1)}>.*))?"
        elif one:
            regex += f"/(?P<{one.group(1)}>[^/]+)"
        else:
            regex += "/" + re.escape(segment)
    return re.compile(regex + "/?", re.IGNORECASE)


@dataclass(frozen=True)
class QueueTrigger:
    queue: str
    connection: str
    function: Callable[..., Any]


class FunctionsHost:
    """Hosts ``app`` with ``settings`` (the app settings) and host.json's ``options``.

    Raises ValueError, as the real host refuses to start, when a binding names a setting that
    is not set.
    """

    def __init__(self, app: func.FunctionApp, options: HostOptions, settings: Mapping[str, str]) -> None:
        self.options = options
        self.settings = settings
        self.routes: list[tuple[re.Pattern[str], set[str], Callable[..., Any]]] = []
        self.queue_triggers: list[QueueTrigger] = []
        self.timers: dict[str, Callable[..., Any]] = {}
        for function in app.get_functions():
            name = function.get_function_name() or function.get_user_function().__name__
            bindings = function.get_bindings_dict()["bindings"]
            trigger = next(b for b in bindings if str(b["type"]).endswith("Trigger"))
            kind, user_function = trigger["type"], function.get_user_function()
            if kind == "httpTrigger":
                methods = {str(getattr(m, "value", m)).upper() for m in trigger.get("methods") or []}
                pattern = route_pattern(options.route_prefix, self.resolve(str(trigger.get("route") or name)))
                self.routes.append((pattern, methods, user_function))
            elif kind == "queueTrigger":
                queue = self.resolve(trigger["queueName"])
                self.queue_triggers.append(QueueTrigger(queue, self._setting(trigger["connection"]), user_function))
            elif kind == "timerTrigger":
                self.resolve(trigger["schedule"])
                self.timers[name] = user_function
            else:
                raise ValueError(f"function {name}: trigger {kind} is not hosted locally")
        self._backoff = 0.0
        self._clients: dict[tuple[str, str], QueueClient] = {}

    def _queue(self, connection: str, name: str) -> QueueClient:
        key = (connection, name)
        if key not in self._clients:  # one client (and connection pool) per queue, as the host keeps
            self._clients[key] = QueueClient.from_connection_string(connection, name)
        return self._clients[key]

    def _setting(self, name: str) -> str:
        value = self.settings.get(name)
        if not value:
            raise ValueError(f"app setting {name} is not set")
        return value

    def resolve(self, expression: str) -> str:
        """``%NAME%`` binding expressions replaced by app settings."""
        return _SETTING.sub(lambda m: self._setting(m.group(1)), expression)

    # ---- HTTP ---------------------------------------------------------------------------------

    def http(
        self, method: str, url: str, path: str, query: str, headers: dict[str, str], body: bytes
    ) -> func.HttpResponse:
        """The response of the function whose route and methods match; 404 with no body when none does."""
        for pattern, methods, function in self.routes:
            match = pattern.fullmatch(path)
            if match is None or (methods and method.upper() not in methods):
                continue
            request = func.HttpRequest(
                method=method.upper(),
                url=url,
                headers=headers,
                params=dict(parse_qsl(query, keep_blank_values=True)),
                route_params={k: unquote(v) for k, v in match.groupdict().items() if v is not None},
                body=body,
            )
            response: func.HttpResponse = function(request)
            return response
        return func.HttpResponse(status_code=404)

    # ---- queues -------------------------------------------------------------------------------

    def poll_queues(self, wait: Callable[[float], bool]) -> int:
        """One round over the queue triggers: each gets up to ``batchSize`` messages, one call per
        message; success deletes it, failure makes it visible again after ``visibilityTimeout``
        or, on the last allowed try, moves it to ``<queue>-poison``. When nothing came, waits
        (``wait(seconds)``) with the host's backoff, up to ``maxPollingInterval``. Returns how
        many messages were handled."""
        handled = 0
        for trigger in self.queue_triggers:
            client = self._queue(trigger.connection, trigger.queue)
            page = client.receive_messages(messages_per_page=self.options.batch_size, visibility_timeout=600)
            for message in next(page.by_page(), []):
                self._deliver(client, trigger, message)
                handled += 1
        if handled:
            self._backoff = 0.0
        else:
            self._backoff = min(self.options.max_polling_interval, max(0.1, self._backoff * 2))
            wait(self._backoff)
        return handled

    def _deliver(self, client: QueueClient, trigger: QueueTrigger, message: Any) -> None:
        content = message.content if isinstance(message.content, bytes) else str(message.content).encode()
        try:
            if self.options.message_encoding == "base64":
                content = base64.b64decode(content, validate=True)
            trigger.function(
                QueueMessage(  # type: ignore[no-untyped-call]
                    id=message.id,
                    body=content,
                    dequeue_count=message.dequeue_count,
                    pop_receipt=message.pop_receipt,
                    insertion_time=message.inserted_on,
                    expiration_time=message.expires_on,
                    time_next_visible=message.next_visible_on,
                )
            )
        except Exception:  # whatever the function raises is a failed try, as for the host
            log.exception(
                "function failed on message %s of queue %s (try %s)", message.id, trigger.queue, message.dequeue_count
            )
            self._failed(client, trigger, message)
            return
        with contextlib.suppress(ResourceNotFoundError):  # gone already: its visibility ran out
            client.delete_message(message)

    def _failed(self, client: QueueClient, trigger: QueueTrigger, message: Any) -> None:
        if (message.dequeue_count or 1) >= self.options.max_dequeue_count:
            poison = self._queue(trigger.connection, f"{trigger.queue}-poison")
            with contextlib.suppress(ResourceExistsError):
                poison.create_queue()
            poison.send_message(message.content)
            client.delete_message(message)
            log.warning("message %s moved to %s-poison", message.id, trigger.queue)
            return
        client.update_message(message, visibility_timeout=int(self.options.visibility_timeout))

    # ---- timers -------------------------------------------------------------------------------

    def fire_timers(self) -> dict[str, BaseException | None]:
        """Call every timer function once; what each raised (None for success)."""
        results: dict[str, BaseException | None] = {}
        for name, function in self.timers.items():
            try:
                function(TimerRequest(past_due=False))
                results[name] = None
            except Exception as e:
                log.exception("timer function %s failed", name)
                results[name] = e
        return results
