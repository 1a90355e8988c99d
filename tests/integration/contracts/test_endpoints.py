"""Where the AWS stack of the racing tests keeps what: its tables on dynalite, through
``RUNPLANE_DYNAMODB_ENDPOINT_URL``, and its queues and bucket on the moto server."""

from runplane.bootstrap import aws_clients
from runplane.settings import StackSettings


def test_the_dynamodb_endpoint_setting_moves_the_tables_alone():
    settings = StackSettings.from_env(
        {
            "RUNPLANE_AWS_ENDPOINT_URL": "http://127.0.0.1:9001",
            "RUNPLANE_DYNAMODB_ENDPOINT_URL": "http://127.0.0.1:9002",
        }
    )
    clients = aws_clients(settings)
    assert clients["dynamodb"].meta.endpoint_url == "http://127.0.0.1:9002"
    assert clients["sqs"].meta.endpoint_url == clients["s3"].meta.endpoint_url == "http://127.0.0.1:9001"
    # agents of stacks whose runs tables are on different servers never share containers
    same_prefix = StackSettings(aws_endpoint_url="http://127.0.0.1:9001")
    assert settings.stack_id() != same_prefix.stack_id()
    unset = StackSettings.from_env({"RUNPLANE_AWS_ENDPOINT_URL": "http://x:1", "RUNPLANE_DYNAMODB_ENDPOINT_URL": ""})
    assert unset.dynamodb_endpoint_url is None
    assert aws_clients(unset)["dynamodb"].meta.endpoint_url == "http://x:1"


def test_the_racing_aws_stack_keeps_its_tables_on_dynalite(aws_dynalite_stack, dynalite_endpoint, moto_endpoint):
    stack = aws_dynalite_stack
    assert stack.store.client.meta.endpoint_url == dynalite_endpoint != moto_endpoint
    assert stack.queue.client.meta.endpoint_url == stack.objects.client.meta.endpoint_url == moto_endpoint
    tables = stack.store.client.list_tables()["TableNames"]
    assert stack.store.table in tables and stack.pool_states.table in tables
