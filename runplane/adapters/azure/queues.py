"""Storage Queue adapter: a queue per pool, each with a poison queue, and the dispatcher's event queue.

Bodies are the message's JSON, base64-encoded: the Azure Functions queue trigger decodes base64
by default, so a function reads these messages as they are. A message received more than
``MAX_DEQUEUES`` times moves to ``<queue>-poison`` (the name the Functions host uses) instead of
being delivered again, like SQS's redrive to a dead-letter queue; so does a message that cannot
be read. Storage Queues have no long poll: ``receive`` polls with a growing pause (injected
``sleep`` and ``clock``) and returns as soon as something arrives.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import time
from collections.abc import Callable

from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueMessage, QueueServiceClient
from pydantic import ValidationError

from runplane.adapters.azure.errors import error_code
from runplane.adapters.records import record, written_json
from runplane.domain.errors import BackendError, NotFound
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.ports import Delivery

log = logging.getLogger(__name__)

MAX_DEQUEUES = 5
"""Deliveries of one message before it moves to the poison queue (the Functions host's default)."""
FIRST_PAUSE = 0.05  # seconds between empty polls at first, doubling up to MAX_PAUSE
MAX_PAUSE = 1.0
MESSAGE_TTL = 14 * 24 * 3600
MAX_VISIBILITY = 7 * 24 * 3600
_BATCH = 32  # the most messages one Get Messages call returns
_GONE = ("MessageNotFound", "PopReceiptMismatch", "QueueNotFound")


def queue_name(raw: str) -> str:
    """``raw`` under the Storage Queue (and Blob container) naming rules: 3-63 characters,
    lowercase letters, digits and single hyphens, starting and ending with a letter or digit."""
    name = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]", "-", raw.lower())).strip("-")
    if len(name) > 63 or len(name) < 3:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        name = f"{name[:54].rstrip('-')}-{digest}".lstrip("-")
    return name


def pool_queue_name(prefix: str, pool: str) -> str:
    return queue_name(f"{prefix}-pool-{pool}")


def events_queue_name(prefix: str) -> str:
    return queue_name(f"{prefix}-events")


def poison_queue_name(name: str) -> str:
    return queue_name(f"{name}-poison")


def encode(body: str) -> str:
    return base64.b64encode(body.encode()).decode()


class StorageQueueRunQueue:
    def __init__(
        self,
        prefix: str,
        client: QueueServiceClient,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.client = client
        self.sleep = sleep
        self.clock = clock
        self._queues: dict[str, QueueClient] = {}

    def _queue(self, name: str) -> QueueClient:
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = self.client.get_queue_client(name)
        return queue

    def _send(self, name: str, body: str, delay_seconds: int = 0) -> None:
        delay = min(max(0, delay_seconds), MAX_VISIBILITY)
        try:
            self._queue(name).send_message(encode(body), time_to_live=MESSAGE_TTL, visibility_timeout=delay or None)
        except ResourceNotFoundError as e:
            raise NotFound(f"queue {name} does not exist; was the stack provisioned?") from e
        except AzureError as e:
            raise BackendError(f"send to {name}: {error_code(e) or e.message}") from e

    def send(self, pool: str, message: RunMessage) -> None:
        self._send(pool_queue_name(self.prefix, pool), written_json(message))

    def notify(self, event: DispatchEvent, delay_seconds: int = 0) -> None:
        self._send(events_queue_name(self.prefix), written_json(event), delay_seconds)

    def receive(self, pool: str, max_messages: int, wait_seconds: float, visibility_seconds: int) -> list[Delivery]:
        deadline = self.clock() + max(0.0, wait_seconds)
        pause = FIRST_PAUSE
        while True:
            deliveries = self._receive_once(pool, max(1, min(_BATCH, max_messages)), visibility_seconds)
            left = deadline - self.clock()
            if deliveries or left <= 0:
                return deliveries
            self.sleep(min(pause, left))
            pause = min(pause * 2, MAX_PAUSE)

    def _receive_once(self, pool: str, count: int, visibility_seconds: int) -> list[Delivery]:
        name = pool_queue_name(self.prefix, pool)
        try:
            messages = list(
                self._queue(name).receive_messages(
                    messages_per_page=count,
                    max_messages=count,
                    visibility_timeout=max(1, min(MAX_VISIBILITY, visibility_seconds)),
                )
            )
        except ResourceNotFoundError as e:
            raise NotFound(f"queue {name} does not exist; was the stack provisioned?") from e
        except AzureError as e:
            raise BackendError(f"receive from pool {pool}: {error_code(e) or e.message}") from e
        deliveries = []
        for msg in messages:
            if msg.dequeue_count is not None and msg.dequeue_count > MAX_DEQUEUES:
                self._to_poison(name, msg, f"received {msg.dequeue_count} times")
                continue
            try:
                message = record(RunMessage, base64.b64decode(str(msg.content), validate=True))
            except (ValueError, ValidationError):  # not base64, not JSON or not a RunMessage
                self._to_poison(name, msg, "unreadable")
                continue
            deliveries.append(Delivery(message, f"{msg.id} {msg.pop_receipt}", msg.dequeue_count or 1))
        return deliveries

    def _to_poison(self, name: str, msg: QueueMessage, why: str) -> None:
        """Move a message aside. A failure leaves it where it is: it comes back after its
        visibility timeout and is moved then."""
        poison = poison_queue_name(name)
        log.warning("moving message %s of %s to %s (%s): %.200s", msg.id, name, poison, why, msg.content)
        try:
            self._queue(poison).send_message(msg.content, time_to_live=MESSAGE_TTL)
            self._queue(name).delete_message(msg.id, msg.pop_receipt)
        except AzureError as e:
            log.warning("could not move message %s to %s: %s", msg.id, poison, error_code(e) or e.message)

    def delete(self, pool: str, delivery: Delivery) -> None:
        message_id, _, receipt = delivery.receipt.partition(" ")
        try:
            self._queue(pool_queue_name(self.prefix, pool)).delete_message(message_id, receipt)
        except AzureError as e:
            if error_code(e) in _GONE:
                return  # deleted already, or received again by another worker
            raise BackendError(f"pool {pool}: cannot delete message: {error_code(e) or e.message}") from e

    def release(self, pool: str, delivery: Delivery, delay_seconds: int) -> None:
        message_id, _, receipt = delivery.receipt.partition(" ")
        try:
            self._queue(pool_queue_name(self.prefix, pool)).update_message(
                message_id, receipt, visibility_timeout=max(0, min(MAX_VISIBILITY, delay_seconds))
            )
        except AzureError as e:
            if error_code(e) in _GONE:
                return
            raise BackendError(f"pool {pool}: cannot release message: {error_code(e) or e.message}") from e
