"""SQS adapter: a queue (with a dead-letter queue) per pool, and the dispatcher's event queue."""

from __future__ import annotations

import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from runplane.adapters.aws.clients import error_code
from runplane.adapters.records import record, written_json
from runplane.domain.errors import BackendError, NotFound
from runplane.domain.messages import DispatchEvent, RunMessage
from runplane.ports import MAX_NOTIFY_DELAY, Delivery

log = logging.getLogger(__name__)


def pool_queue_name(prefix: str, pool: str) -> str:
    return f"{prefix}-pool-{pool}"


def events_queue_name(prefix: str) -> str:
    return f"{prefix}-events"


def dead_letter_queue_name(name: str) -> str:
    """The queue SQS moves a message of queue ``name`` to after ``MAX_RECEIVES`` receives."""
    return f"{name}-dlq"


class SqsRunQueue:
    def __init__(self, prefix: str, client: Any) -> None:
        self.prefix = prefix
        self.client = client
        self._urls: dict[str, str] = {}

    def _url(self, name: str) -> str:
        url = self._urls.get(name)
        if url is None:
            try:
                url = str(self.client.get_queue_url(QueueName=name)["QueueUrl"])
            except ClientError as e:
                if "NonExistentQueue" in error_code(e):
                    raise NotFound(f"queue {name} does not exist; was the stack provisioned?") from e
                raise BackendError(f"find queue {name}: {e}") from e
            except BotoCoreError as e:
                raise BackendError(f"find queue {name}: {e}") from e
            self._urls[name] = url
        return url

    def _send(self, name: str, body: str, delay_seconds: int = 0) -> None:
        delay = {"DelaySeconds": min(delay_seconds, MAX_NOTIFY_DELAY)} if delay_seconds > 0 else {}
        try:
            self.client.send_message(QueueUrl=self._url(name), MessageBody=body, **delay)
        except (ClientError, BotoCoreError) as e:
            raise BackendError(f"send to {name}: {e}") from e

    def send(self, pool: str, message: RunMessage) -> None:
        self._send(pool_queue_name(self.prefix, pool), written_json(message))

    def notify(self, event: DispatchEvent, delay_seconds: int = 0) -> None:
        self._send(events_queue_name(self.prefix), written_json(event), delay_seconds)

    def receive(self, pool: str, max_messages: int, wait_seconds: float, visibility_seconds: int) -> list[Delivery]:
        url = self._url(pool_queue_name(self.prefix, pool))
        try:
            resp = self.client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=max(1, min(10, max_messages)),
                WaitTimeSeconds=max(0, min(20, int(wait_seconds))),
                VisibilityTimeout=visibility_seconds,
                MessageSystemAttributeNames=["ApproximateReceiveCount"],
            )
        except (ClientError, BotoCoreError) as e:
            raise BackendError(f"receive from pool {pool}: {e}") from e
        deliveries = []
        for msg in resp.get("Messages", []):
            try:
                message = record(RunMessage, msg["Body"])
            except ValidationError:
                log.warning("dropping unreadable message on pool %s: %.200s", pool, msg["Body"])
                self.client.delete_message(QueueUrl=url, ReceiptHandle=msg["ReceiptHandle"])
                continue
            count = int(msg.get("Attributes", {}).get("ApproximateReceiveCount", 1))
            deliveries.append(Delivery(message, msg["ReceiptHandle"], count))
        return deliveries

    def delete(self, pool: str, delivery: Delivery) -> None:
        try:
            self.client.delete_message(
                QueueUrl=self._url(pool_queue_name(self.prefix, pool)), ReceiptHandle=delivery.receipt
            )
        except ClientError as e:
            if error_code(e) in ("ReceiptHandleIsInvalid", "AWS.SimpleQueueService.NonExistentQueue"):
                return
            raise BackendError(f"pool {pool}: cannot delete message: {e}") from e
        except BotoCoreError as e:
            raise BackendError(f"pool {pool}: cannot delete message: {e}") from e

    def release(self, pool: str, delivery: Delivery, delay_seconds: int) -> None:
        try:
            self.client.change_message_visibility(
                QueueUrl=self._url(pool_queue_name(self.prefix, pool)),
                ReceiptHandle=delivery.receipt,
                VisibilityTimeout=max(0, min(43200, delay_seconds)),
            )
        except ClientError as e:
            if error_code(e) in ("ReceiptHandleIsInvalid", "MessageNotInflight", "InvalidParameterValue"):
                return
            raise BackendError(f"pool {pool}: cannot release message: {e}") from e
        except BotoCoreError as e:
            raise BackendError(f"pool {pool}: cannot release message: {e}") from e
