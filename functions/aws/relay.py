"""Lambda behind the API Gateway WebSocket API of sessions: its $connect, $default and $disconnect."""

from typing import Any

from aws_lambda_powertools import Logger

from runplane import bootstrap
from runplane.adapters.aws.relay_routes import RelayRoutes

logger = Logger(service="runplane-relay")


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    stack = bootstrap.stack()
    return RelayRoutes.of(stack.sessions, stack.relay, stack.clock).handle(event)
