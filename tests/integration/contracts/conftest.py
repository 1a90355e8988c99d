"""The contract suites run against every implementation of a port. Each implementation is a
fixture param: the AWS adapters on a moto server and the Azure adapters on Azurite; for writes
that race, the AWS adapters' tables on dynalite instead (see ``racing_stack``)."""

import base64

import pytest

from runplane.adapters.aws import sqs

IMPLEMENTATIONS = ["aws-moto", "azure-azurite", "local-sqlite"]
_STACKS = {"aws-moto": "aws_stack", "azure-azurite": "azure_stack", "local-sqlite": "local_stack"}
RACING_IMPLEMENTATIONS = ["aws-dynalite", "azure-azurite", "local-sqlite"]
_RACING_STACKS = {"aws-dynalite": "aws_dynalite_stack", "azure-azurite": "azure_stack", "local-sqlite": "local_stack"}


@pytest.fixture(params=IMPLEMENTATIONS)
def stack(request):
    return request.getfixturevalue(_STACKS[request.param])


@pytest.fixture
def send_raw(request, stack):
    """Put a raw body on a pool's queue, past the adapter (as a foreign producer would)."""
    if request.node.callspec.params["stack"] == "aws-moto":

        def send(pool, body):
            stack.queue.client.send_message(
                QueueUrl=stack.queue._url(sqs.pool_queue_name(stack.settings.prefix, pool)), MessageBody=body
            )

    elif request.node.callspec.params["stack"] == "local-sqlite":
        from runplane.adapters.local.queues import pool_queue

        def send(pool, body):
            stack.queue._send(pool_queue(pool), body)

    else:
        from runplane.adapters.azure.queues import pool_queue_name

        def send(pool, body):
            queue = stack.queue.client.get_queue_client(pool_queue_name(stack.settings.prefix, pool))
            queue.send_message(body)

    return send


@pytest.fixture
def dead_letters(request, stack):
    """The bodies (as sent) of the messages a pool's queue set aside: SQS's dead-letter queue,
    the Storage Queue's poison queue."""
    if request.node.callspec.params["stack"] == "aws-moto":

        def read(pool):
            url = stack.queue._url(sqs.dead_letter_queue_name(sqs.pool_queue_name(stack.settings.prefix, pool)))
            got = stack.queue.client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            return [m["Body"] for m in got.get("Messages", [])]

    elif request.node.callspec.params["stack"] == "local-sqlite":
        from runplane.adapters.local.queues import pool_queue

        def read(pool):
            return stack.queue.dead_letters(pool_queue(pool))

    else:
        from runplane.adapters.azure.queues import poison_queue_name, pool_queue_name

        def read(pool):
            name = poison_queue_name(pool_queue_name(stack.settings.prefix, pool))
            messages = stack.queue.client.get_queue_client(name).receive_messages(max_messages=32)
            return [base64.b64decode(m.content).decode() for m in messages]

    return read


@pytest.fixture(params=RACING_IMPLEMENTATIONS)
def racing_stack(request):
    """The stack, for tests of writes that race each other; on AWS its tables are on dynalite, its
    queues and bucket on the moto server. moto's DynamoDB checks a write's condition and applies it
    without a lock while its server handles requests in threads, so two racing conditional writes
    can both succeed inside it; dynalite, like DynamoDB, applies each item's writes atomically."""
    return request.getfixturevalue(_RACING_STACKS[request.param])
