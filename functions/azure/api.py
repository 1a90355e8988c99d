"""The HTTP API: one catch-all route for every method; the API does its own bearer-token auth and
answers unknown paths and methods itself, as behind API Gateway."""

import azure.functions as func

from runplane.api import azure_front

bp = func.Blueprint()  # type: ignore[no-untyped-call]


@bp.function_name("api")
@bp.route(route="v1/{*path}", auth_level=func.AuthLevel.ANONYMOUS)  # every method, as API Gateway's ANY
def http_api(req: func.HttpRequest) -> func.HttpResponse:
    return azure_front.handle(req)


@bp.function_name("ui")
@bp.route(route="ui/{*path}", auth_level=func.AuthLevel.ANONYMOUS)  # the dashboard's files (runplane/api/ui.py)
def http_ui(req: func.HttpRequest) -> func.HttpResponse:
    return azure_front.handle(req)
