"""Lambda behind the API Gateway HTTP API."""

from typing import Any

from aws_lambda_powertools.logging import correlation_paths

from runplane.api.http import app, logger, tracer


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return app.resolve(event, context)
