"""Object URLs of a state directory answered on loopback by the stack's own front
(runplane/devstack/front.py) handing each request to ``object_urls.serve``, as the local stack's
front does: for tests of the object store without a whole stack."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from runplane.adapters.local.object_urls import PUT_LIMITS, PutLimits, serve
from runplane.devstack.cloud import FrontRequest, FrontResponse
from runplane.devstack.front import FrontServer


class ObjectsOnly:
    """What the front calls of a cloud, answering object URLs alone. ``secret``: the stack's
    secret, which a test sets once its token store exists; ``limits``: what a PUT keeps to,
    which a test may make tighter."""

    def __init__(self, root: Path, secret: Callable[[], bytes] | None = None) -> None:
        self.root = root
        self.secret = secret or (lambda: b"")
        self.limits: PutLimits = PUT_LIMITS

    def http(self, request: FrontRequest) -> FrontResponse:
        answer = serve(
            self.root,
            self.secret,
            request.method,
            request.path,
            request.query,
            headers=request.headers,
            body=request.stream,
            limits=self.limits,
        )
        return FrontResponse(answer.status, answer.headers, answer.body, answer.file)


@contextlib.contextmanager
def objects_front(root: Path, secret: Callable[[], bytes] | None = None) -> Iterator[tuple[str, ObjectsOnly]]:
    """The front's URL (http://127.0.0.1:<port>) and what it calls, for the state directory ``root``."""
    cloud = ObjectsOnly(root, secret)
    server = FrontServer(("127.0.0.1", 0), cloud)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, name="objects-front", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", cloud
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
