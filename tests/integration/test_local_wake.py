"""A wait for another process's commit on one machine (``Database.wait_for_change``, under a
waiting receive of the queue and a long-poll's pause): woken at once by the process's watch of the
database's log, however long it has been idle, and free while idle; where there is no watch
(``wake.INOTIFY`` False: another system, the user's inotify limits), woken by looking."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from runplane.adapters.local import wake
from runplane.adapters.local.db import Database
from runplane.adapters.local.queues import SqliteRunQueue

SEND_LATER = """
import sys, time
from runplane.adapters.local.db import Database
from runplane.adapters.local.queues import SqliteRunQueue
from runplane.domain.messages import RunMessage
queue = SqliteRunQueue(Database.at(sys.argv[1]))
time.sleep(float(sys.argv[2]))
queue.send("default", RunMessage(run_id="r-woken", attempt=0))
print(time.time(), flush=True)
"""
"""Another process: sends one hint ``argv[2]`` seconds after it opened the database, and prints when."""


def _send_later(state_dir, delay: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", SEND_LATER, str(state_dir), str(delay)], stdout=subprocess.PIPE, text=True
    )


def _sent_at(sender: subprocess.Popen[str]) -> float:
    out, _ = sender.communicate(timeout=60)
    assert sender.returncode == 0
    return float(out)


def _count_looks(db: Database) -> list[float]:
    """The looks at ``data_version`` this thread's connection makes from now on."""
    looks: list[float] = []
    db.connection().set_trace_callback(lambda sql: looks.append(time.monotonic()) if "data_version" in sql else None)
    return looks


def test_a_receive_idle_for_seconds_wakes_at_once_for_another_processs_send_without_looking_meanwhile(tmp_path):
    queue = SqliteRunQueue(Database.at(tmp_path / "state"))
    looks = _count_looks(queue.db)
    sender = _send_later(tmp_path / "state", 2.5)
    try:
        got = queue.receive("default", 1, wait_seconds=30, visibility_seconds=30)
        woken = time.time()
    finally:
        queue.db.connection().set_trace_callback(None)
        at = _sent_at(sender)
    assert [d.message.run_id for d in got] == ["r-woken"]
    assert woken - at < 1.0  # a few hundred times a wake's own cost: slack for a busy machine
    # idle for seconds without looking: a few looks at the start, a few after each wake
    # (polling every 5 ms, then 50, would be hundreds)
    assert len(looks) < 60


def test_idle_waiters_cost_nothing_and_all_wake_for_another_processs_commit(tmp_path):
    db = SqliteRunQueue(Database.at(tmp_path / "state")).db  # its tables made: the sender's first commit is its send
    woken: list[float] = []
    cpu: list[float] = []  # what each waiter's thread spent, its wake included
    looked: list[int] = []

    def waiter() -> None:
        looks = _count_looks(db)
        began = time.thread_time()
        if db.wait_for_change(60):
            woken.append(time.time())
        cpu.append(time.thread_time() - began)
        db.connection().set_trace_callback(None)
        looked.append(len(looks))

    threads = [threading.Thread(target=waiter) for _ in range(8)]
    began = time.time()
    for thread in threads:
        thread.start()
    sender = _send_later(tmp_path / "state", 5)  # 5 s idle, once it has started
    at = _sent_at(sender)
    for thread in threads:
        thread.join(20)
    assert len(woken) == len(threads) and min(woken) - began > 4.5 and max(woken) - at < 1.0
    assert sum(cpu) < 0.03  # 0.001 here; looking every 5 ms, then every 50: 0.09
    assert max(looked) < 60  # looking every 5 ms, then every 50, each would look hundreds of times


def test_without_the_watch_a_wait_looks_and_still_wakes_for_another_processs_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(wake, "INOTIFY", False)
    queue = SqliteRunQueue(Database.at(tmp_path / "state"))
    looks = _count_looks(queue.db)
    sender = _send_later(tmp_path / "state", 1.5)
    try:
        got = queue.receive("default", 1, wait_seconds=30, visibility_seconds=30)
        woken = time.time()
    finally:
        queue.db.connection().set_trace_callback(None)
        at = _sent_at(sender)
    assert [d.message.run_id for d in got] == ["r-woken"]
    assert woken - at < 1.0
    assert len(looks) >= 60  # it found the send by looking
