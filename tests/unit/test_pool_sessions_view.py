"""Who may open sessions into a pool's runs, as GET /v1/pools and ``runplane pools`` show it: its
settings as they are; the CLI says nothing of a pool as by default (owners may, admins may not), and
one line of a pool that allows none or lets admins in."""

from runplane.api.models import PoolView
from runplane.api.views import pool_view
from runplane.cli.fleet import pool_sessions
from runplane.client import PoolSessions
from runplane.domain.pools import Pool
from runplane.domain.workers import PoolRecord
from runplane.settings import StackSettings


def _view(**settings: object) -> PoolView:
    pool = Pool.model_validate({"name": "gpu", "cpus": 1, "memory": 1024**3, "default_image": "x", **settings})
    return pool_view(pool, 0, {}, PoolRecord(pool="gpu"), StackSettings().kept())


def test_the_pool_view_says_who_may_open_sessions_and_the_cli_what_is_not_the_default() -> None:
    plain = _view()
    assert isinstance(plain.sessions, PoolSessions)  # the SDK's name for it
    assert plain.sessions.model_dump() == {"allow_exec": True, "allow_admin_exec": False, "max_sessions_per_run": 4}
    assert pool_sessions(plain) is None
    closed = _view(allow_exec=False, max_sessions_per_run=0)
    assert closed.sessions is not None and not closed.sessions.allow_exec
    assert pool_sessions(closed) == "gpu: no sessions into its runs (allow_exec: false)"
    admins = _view(allow_admin_exec=True)
    assert pool_sessions(admins) == "gpu: admins may open sessions into users' runs (allow_admin_exec: true)"


def test_a_pool_view_of_a_server_before_sessions_is_read_without_them() -> None:
    older = _view().model_dump(mode="json")
    del older["sessions"]
    view = PoolView.model_validate(older)
    assert view.sessions is None and pool_sessions(view) is None
