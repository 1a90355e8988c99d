"""Which processes of a run's container a session started (worker_agent/sessions/procs.py), read
from a /proc laid out in a directory: the exec's session, its descendants whatever session they
made, and what carries the session's RUNPLANE_SESSION; never a process of another container, nor
one that only reuses the exec's pid."""

from pathlib import Path

from worker_agent.sessions.procs import Procs, end_session

CID = "c0ffee" * 10 + "abcd"
OTHER = "beef" * 16


def proc(root: Path, pid: int, ppid: int, sid: int, *, state: str = "S", cid: str = CID, env: str = "") -> None:
    d = root / str(pid)
    d.mkdir()
    (d / "stat").write_text(f"{pid} (odd) name) {state} {ppid} {sid} {sid} 0 -1 0\n")
    (d / "cgroup").write_text(f"12:pids:/docker/{cid}\n")
    (d / "environ").write_bytes(b"PATH=/bin\0" + env.encode() + b"\0")


def test_a_session_is_its_exec_its_descendants_and_what_carries_its_name(tmp_path):
    sid = "r-1.0.0123abcd"
    proc(tmp_path, 1, 0, 1)  # the run's own process
    proc(tmp_path, 100, 50, 100)  # the exec, a session leader
    proc(tmp_path, 101, 100, 100)  # its child
    proc(tmp_path, 102, 101, 102)  # a grandchild that made a session of its own
    proc(tmp_path, 103, 1, 103, env=f"RUNPLANE_SESSION={sid}")  # double-forked away, reparented to 1
    proc(tmp_path, 104, 1, 104, env="RUNPLANE_SESSION=r-1.1.99999999")  # another session's
    proc(tmp_path, 105, 1, 100, cid=OTHER)  # another container's, whatever its session id
    proc(tmp_path, 106, 1, 106, env=f"RUNPLANE_SESSION={sid}x")  # a name that only begins alike
    found = {p.pid for p in Procs(tmp_path).of_session(CID, 100, sid)}
    assert found == {100, 101, 102, 103}


def test_a_pid_reused_since_the_exec_ended_is_not_the_sessions(tmp_path):
    proc(tmp_path, 1, 0, 1)
    proc(tmp_path, 100, 1, 7)  # pid 100 again, but not a session leader: not the exec
    proc(tmp_path, 7, 1, 7)
    assert Procs(tmp_path).of_session(CID, 100, "r-1.0.0123abcd") == []


def test_zombies_count_as_ended_and_gone_pids_are_no_error(tmp_path):
    proc(tmp_path, 100, 1, 100, state="Z")
    proc(tmp_path, 101, 1, 100, state="Z")
    assert end_session(Procs(tmp_path), CID, 100, "r-1.0.0123abcd", sleep=lambda _: None) == []
    assert Procs(tmp_path / "none").container(CID) == []
