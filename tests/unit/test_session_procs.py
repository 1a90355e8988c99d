"""Which processes of a run's container a session started (worker_agent/sessions/procs.py), read
from a /proc laid out in a directory: the exec's session, its descendants whatever session they
made, what carries the session's RUNPLANE_SESSION and what is in the session's own cgroup; never a
process of another container, nor one that only reuses the exec's pid. A signal reaches a listed
process only while it is still that process (a real one here: its start time is checked)."""

import os
import signal
import subprocess
from pathlib import Path

from worker_agent.sessions.procs import CGROUP_PREFIX, Proc, Procs, end_session

CID = "c0ffee" * 10 + "abcd"
OTHER = "beef" * 16


def proc(root: Path, pid: int, ppid: int, sid: int, *, state: str = "S", cid: str = CID, env: str = "") -> None:
    d = root / str(pid)
    d.mkdir()
    rest = " ".join(["0"] * 13)  # flags .. cstime, then priority, nice, threads, itrealvalue
    (d / "stat").write_text(f"{pid} (odd) name) {state} {ppid} {sid} {sid} 0 -1 {rest} 7{pid} 0\n")
    (d / "cgroup").write_text(f"12:pids:/docker/{cid}\n0::/\n")
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
    assert end_session(Procs(tmp_path), CID, 100, "r-1.0.0123abcd") == []
    assert Procs(tmp_path / "none").container(CID) == []


def test_what_is_in_the_sessions_cgroup_is_the_sessions_whatever_it_made_of_itself(tmp_path):
    sid = "r-1.0.0123abcd"
    procs, cgroups = Procs(tmp_path / "proc", tmp_path / "cgroup"), tmp_path / "cgroup"
    (tmp_path / "proc").mkdir()
    (cgroups / "pids" / "docker" / CID).mkdir(parents=True)
    proc(procs.root, 1, 0, 1)
    proc(procs.root, 100, 50, 100)  # the exec
    proc(procs.root, 101, 100, 100)  # what it started before it was confined
    proc(procs.root, 102, 1, 102)  # the run's own
    where = procs.confine(CID, 100, sid)
    assert where == cgroups / "pids" / "docker" / CID / f"{CGROUP_PREFIX}{sid}"
    # (a real cgroup file system keeps every pid written; a directory keeps the last)
    (where / "cgroup.procs").write_text("100\n101\n")
    proc(procs.root, 103, 1, 103)  # born in the cgroup, then left the session, its environment cleared
    (where / "cgroup.procs").write_text("100\n101\n103\n")
    assert {p.pid for p in procs.of_session(CID, 100, sid, where)} == {100, 101, 103}
    assert procs.of_session(CID, 100, sid) != procs.of_session(CID, 100, sid, where)


def test_no_cgroup_is_made_outside_the_agents_view_of_the_containers(tmp_path):
    procs = Procs(tmp_path / "proc", tmp_path / "cgroup")
    (tmp_path / "proc").mkdir()
    proc(procs.root, 100, 50, 100)
    (procs.root / "100" / "cgroup").write_text(f"12:pids:/../../docker/{CID}\n")
    assert procs.confine(CID, 100, "r-1.0.0123abcd") is None  # another cgroup namespace's path
    assert not (tmp_path / "cgroup").exists()


def test_a_signal_reaches_a_listed_process_only_while_it_is_still_that_process():
    procs = Procs()
    with subprocess.Popen(["sleep", "60"]) as child:
        listed = procs.stat(child.pid)
        assert listed is not None and listed.start > 0
        # as listed before its pid was taken by another process: another start time
        stale = Proc(child.pid, listed.ppid, listed.sid, listed.state, start=listed.start - 1)
        assert procs.signal(stale, "", signal.SIGKILL) is None  # "": every cgroup is the container's here
        assert child.poll() is None
        pidfd = procs.signal(listed, "", signal.SIGTERM)
        assert pidfd is not None
        os.close(pidfd)
        assert child.wait(10) == -signal.SIGTERM


class _Listed(Procs):
    """/proc as it is, but the session's processes as they were listed a moment ago."""

    def __init__(self, listed: list[Proc], cgroups: Path) -> None:
        super().__init__(cgroups=cgroups)
        self.listed = listed

    def of_session(self, container_id, exec_pid, session_id, cgroup=None):
        return self.listed


def test_a_listed_process_is_moved_into_the_sessions_cgroup_only_while_it_is_still_that_process(tmp_path):
    sid = "r-1.0.0123abcd"
    with subprocess.Popen(["sleep", "60"], start_new_session=True) as child:
        try:
            listed = Procs().stat(child.pid)
            assert listed is not None and listed.start > 0
            # "": every cgroup is the container's here; the session's goes under the child's own
            container = Procs(cgroups=tmp_path)._container_cgroup(child.pid, "")
            assert container is not None
            container.mkdir(parents=True, exist_ok=True)
            # as listed before its pid was taken by another process: another start time
            stale = Proc(child.pid, listed.ppid, listed.sid, listed.state, start=listed.start - 1)
            where = _Listed([stale], tmp_path).confine("", child.pid, sid)
            assert where == container / f"{CGROUP_PREFIX}{sid}"
            assert not (where / "cgroup.procs").exists()  # nothing was moved
            assert _Listed([listed], tmp_path).confine("", child.pid, sid) == where
            assert (where / "cgroup.procs").read_text() == str(child.pid)  # the control: still that process
        finally:
            child.kill()
