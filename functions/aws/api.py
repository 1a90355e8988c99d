"""Lambda behind the API Gateway HTTP API."""

import warnings
from typing import Any

from aws_lambda_powertools.logging import correlation_paths

from runplane.api.http import app, logger, metrics, tracer

# Most routes publish no metric; that is expected, not worth a warning per request.
warnings.filterwarnings("ignore", message="No application metrics to publish")


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracer.capture_lambda_handler
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return app.resolve(event, context)
