"""A pool's retention as GET /v1/pools and ``runplane pools`` show it: its fields over the stack's,
in seconds, null for good; the CLI's line says it, and says nothing of a pool that keeps all for good."""

from runplane.api.views import pool_view
from runplane.cli.fleet import pool_retention
from runplane.client import PoolRetention
from runplane.domain.pools import Pool
from runplane.domain.workers import PoolRecord
from runplane.settings import StackSettings

DAY = 86400


def _view(retention, stack):
    pool = Pool(name="gpu", cpus=1, memory=1024**3, default_image="x", retention=retention)
    return pool_view(pool, 0, {}, PoolRecord(pool="gpu"), StackSettings(retention=stack).kept())


def test_the_pool_view_shows_its_retention_over_the_stacks():
    view = _view({"outputs": "7d", "runs": "forever"}, '{"outputs": "30d", "logs": "30d", "runs": "180d"}')
    assert isinstance(view.retention, PoolRetention)  # the SDK's name for it
    assert view.retention.model_dump() == {"outputs": 7 * DAY, "logs": 30 * DAY, "runs": None}
    assert pool_retention(view) == "gpu: keeps outputs 7d, logs 30d and run records for good after a run ends"
    kept = _view(None, "")
    assert kept.retention is not None and kept.retention.model_dump() == {"outputs": None, "logs": None, "runs": None}
    assert pool_retention(kept) is None
