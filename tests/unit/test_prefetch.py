"""A new worker's prefetch as its item and the waiting reason show it: the progress summed over a
pull's layers, the words, and where the waiting reason says it."""

from runplane.domain.pools import Pool, RegistryLogin
from runplane.domain.units import format_progress
from runplane.domain.wire import stored, written
from runplane.domain.workers import Pulling, Worker
from runplane.services.dispatch import explain_wait
from worker_agent.prefetch import PullProgress

G = 1024**3
POOL = Pool(name="gpu", cpus=4, memory=8 * G, default_image="x", max_workers=2)


def worker(wid: str, free_slots: int, pulling: Pulling | None = None) -> Worker:
    status = "idle" if pulling is None else "starting"
    return Worker(
        id=wid, pool="gpu", status=status, free_slots=free_slots, started_at=0, heartbeat_at=0, pulling=pulling
    )


def test_the_progress_of_a_pull_is_the_sum_over_its_layers_downloading_and_done():
    progress = PullProgress("lab/train:1")
    events = [
        {"status": "Pulling from lab/train", "id": "1"},
        {"status": "Already exists", "id": "aaa"},  # on the worker: nothing to download
        {"status": "Pulling fs layer", "id": "bbb"},
        {"status": "Downloading", "id": "bbb", "progressDetail": {"current": 100, "total": 1000}},
        {"status": "Downloading", "id": "ccc", "progressDetail": {"current": 50, "total": 500}},
        {"status": "Downloading", "id": "bbb", "progressDetail": {"current": 400, "total": 1000}},
        {"status": "Download complete", "id": "ccc"},
        {"status": "Extracting", "id": "ccc", "progressDetail": {"current": 10, "total": 900}},  # unpacking: done
        {"status": "Downloading", "id": "ddd", "progressDetail": {"current": "x", "total": None}},  # unreadable
    ]
    seen = []
    for event in events:
        progress.add(event)
        seen.append((progress.pulling().done, progress.pulling().total))
    assert seen[3] == (100, 1000)
    assert seen[5] == (400 + 50, 1500)
    assert seen[6] == seen[7] == seen[8] == (400 + 500, 1500)
    progress.add({"status": "Pull complete", "id": "bbb"})
    assert progress.pulling() == Pulling(image="lab/train:1", done=1500, total=1500)


def test_the_words_of_a_pull():
    assert format_progress(int(1.2 * G), int(4.5 * G)) == "1.2 of 4.5 GiB"
    assert format_progress(300 * 1024**2, 900 * 1024**2) == "300.0 of 900.0 MiB"
    assert format_progress(10, 500) == "10 of 500 bytes"
    pulling = Pulling(image="lab/train:1", done=int(1.2 * G), total=int(4.5 * G))
    assert pulling.describe() == "worker pulling image lab/train:1 (1.2 of 4.5 GiB)"
    assert Pulling(image="lab/train:1").describe() == "worker pulling image lab/train:1"  # no layer announced yet


def test_a_run_waiting_for_a_worker_that_pulls_says_which_image_and_how_far():
    pulling = Pulling(image="lab/train:1", done=int(1.2 * G), total=int(4.5 * G))
    # the pulling worker's slots are not free yet, however many it reports
    assert explain_wait(POOL, [worker("w-1", 1, pulling)], None) == "worker pulling image lab/train:1 (1.2 of 4.5 GiB)"
    assert explain_wait(POOL, [worker("w-1", 1, pulling), worker("w-2", 0)], None).startswith("worker pulling image")
    # a free slot elsewhere takes it first
    assert explain_wait(POOL, [worker("w-1", 1, pulling), worker("w-2", 1)], None).startswith("1 free slot(s)")


def test_the_pulling_field_is_left_out_while_unset_and_read_back():
    plain = worker("w-1", 1)
    assert "pulling" not in written(plain)  # what the previous release reads
    pulling = worker("w-1", 1, Pulling(image="lab/train:1", done=5, total=10))
    assert stored(Worker, written(pulling)).pulling == Pulling(image="lab/train:1", done=5, total=10)
    later = {**written(pulling), "pulling": {**written(pulling)["pulling"], "layers": 3}}  # a later release's
    read = stored(Worker, later).pulling
    assert read is not None and (read.image, read.done, read.total) == ("lab/train:1", 5, 10)


def test_a_pools_ecr_and_acr_registries_get_the_workers_own_logins():
    from worker_agent.acr import AcrLogins
    from worker_agent.ecr import EcrLogins
    from worker_agent.main import cloud_logins

    def pool(*registries: dict[str, object]) -> Pool:
        return POOL.model_copy(update={"registries": [RegistryLogin.model_validate(r) for r in registries]})

    assert cloud_logins(pool()) == {}
    assert cloud_logins(pool({"server": "ghcr.io", "secret": "lab/ghcr"})) == {}
    both = cloud_logins(
        pool(
            {"server": "123456789012.dkr.ecr.us-east-1.amazonaws.com", "ecr": True},
            {"server": "lab.azurecr.io", "acr": True},
        )
    )
    assert isinstance(both["ecr"], EcrLogins) and isinstance(both["acr"], AcrLogins)


def test_the_workers_view_says_what_it_pulls():
    from runplane.api.models import PullingView, WorkerList
    from runplane.api.views import worker_view
    from runplane.domain.wire import shown_json

    pulling = worker_view(worker("w-1", 1, Pulling(image="lab/train:1", done=5, total=10)))
    assert pulling.pulling == PullingView(image="lab/train:1", done=5, total=10)
    shown = shown_json(WorkerList(workers=[pulling, worker_view(worker("w-2", 1))]))
    assert '"pulling":{"image":"lab/train:1","done":5,"total":10}' in shown
