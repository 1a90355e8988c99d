"""The pause of a waiting read on one machine (``Ports.sleep`` of a local stack): it ends at a
commit to the stack's database, made by any process, for every thread pausing, and otherwise
lasts what it was asked."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from runplane.adapters.local.db import DB_FILE, state_path


def test_a_commit_of_another_process_ends_every_pause_and_none_ends_without_one(local_stack):
    sleep = local_stack.ports.sleep
    began = time.monotonic()
    sleep(0.2)
    assert time.monotonic() - began >= 0.2  # nothing committed: the whole pause
    lasted: list[float] = []

    def pause() -> None:
        began = time.monotonic()
        sleep(30)
        lasted.append(time.monotonic() - began)

    threads = [threading.Thread(target=pause) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.2)
    assert not lasted
    write = "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('CREATE TABLE probe (x)'); c.commit()"
    subprocess.run([sys.executable, "-c", write, str(state_path(local_stack.settings.state_dir) / DB_FILE)], check=True)
    for thread in threads:
        thread.join(20)
    assert len(lasted) == len(threads) and max(lasted) < 20
