"""The pure parts of run containment: who a run runs as (from passwd/group text, an image's
tar stream), its HOME, the work dir's mounts (from mountinfo text), the walks that size, upload
and remove what a run wrote (on files the test makes), and the container request."""

import io
import os
import tarfile
from pathlib import Path

import pytest
from docker.types import DriverConfig, Mount

from runplane.domain.runs import Run, RunSpec
from worker_agent.container_spec import CAPABILITIES, container_spec, image_volumes
from worker_agent.disk import disk_interval
from worker_agent.outputs import collect, upload_dir
from worker_agent.run_config import ExecutorConfig
from worker_agent.trees import MAX_DEPTH, remove_tree
from worker_agent.usage import walk
from worker_agent.users import (
    NOBODY,
    RUN_HOME,
    PathInfo,
    RunAs,
    UnknownUser,
    choose,
    first_member,
    home_for,
    parse_groups,
    parse_passwd,
    resolve,
)
from worker_agent.workdir import WorkDir, WorkDirError, covering, parse_mountinfo, prepare

PASSWD = parse_passwd(
    """root:x:0:0:root:/root:/bin/sh
# a comment
toor:x:0:0:another root:/root:/bin/sh
daemon:x:1:1::/usr/sbin:/usr/sbin/nologin
app:x:1000:1000::/home/app:/bin/sh
wheelie:x:1001:0::/home/wheelie:/bin/sh
broken:x:notanumber:1::/:/bin/sh
short:x:5
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
)
GROUPS = parse_groups("root:x:0:\nstaff:x:50:app\napp:x:1000:\nwheel:x:0:app\nbad:x:x:\n")


def test_parse_passwd_and_group():
    assert [a.name for a in PASSWD] == ["root", "toor", "daemon", "app", "wheelie", "nobody"]
    assert PASSWD[3].home == "/home/app"
    assert GROUPS == {"root": 0, "staff": 50, "app": 1000, "wheel": 0}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", (0, 0)),
        ("0", (0, 0)),
        ("0000", (0, 0)),
        ("+0", (0, 0)),
        ("root", (0, 0)),
        ("toor", (0, 0)),
        ("0:0", (0, 0)),
        ("app", (1000, 1000)),
        ("1000", (1000, 1000)),
        ("app:staff", (1000, 50)),
        ("app:50", (1000, 50)),
        ("4242", (4242, None)),  # no passwd entry: runc would give gid 0
        ("4242:7", (4242, 7)),
    ],
)
def test_resolve_reads_user_as_runc_does(spec, expected):
    uid, gid, _entry = resolve(spec, PASSWD, GROUPS)
    assert (uid, gid) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ghost", "user 'ghost' is not in the image's /etc/passwd"),
        ("app:nogroup", "group 'nogroup' is not in the image's /etc/group"),
        ("-1", "uid '-1' is not a valid id"),
        ("99999999999", "is not a valid id"),
        ("0_0", "user '0_0' is not in"),  # not a number to runc either: a name
    ],
)
def test_resolve_refuses_what_the_image_does_not_have(spec, message):
    with pytest.raises(UnknownUser, match=message):
        resolve(spec, PASSWD, GROUPS)


@pytest.mark.parametrize(
    ("setting", "image_user", "allow_root", "expected"),
    [
        # uid 0 in any spelling is nobody unless the pool allows root
        ("nobody", "", False, (NOBODY, NOBODY)),
        ("nobody", "0000", False, (NOBODY, NOBODY)),
        ("nobody", "root", False, (NOBODY, NOBODY)),
        ("nobody", "toor", False, (NOBODY, NOBODY)),
        ("nobody", "0:0", False, (NOBODY, NOBODY)),
        ("image", "0000", False, (NOBODY, NOBODY)),
        ("0:0", "app", False, (NOBODY, NOBODY)),
        # nobody never runs root; image and a fixed 0 do where the pool allows it
        ("nobody", "root", True, (NOBODY, NOBODY)),
        ("image", "toor", True, (0, 0)),
        ("image", "", True, (0, 0)),
        ("0:0", "app", True, (0, 0)),
        # the image's own user, never with group root
        ("nobody", "app", False, (1000, 1000)),
        ("nobody", "1000", False, (1000, 1000)),
        ("nobody", "4242", False, (4242, NOBODY)),
        ("image", "4242", False, (4242, NOBODY)),
        ("nobody", "wheelie", False, (1001, NOBODY)),
        ("nobody", "app:0", False, (1000, NOBODY)),
        ("nobody", "app:wheel", False, (1000, NOBODY)),
        # fixed numbers
        ("1234:5678", "app", False, (1234, 5678)),
        ("1000", "", False, (1000, 1000)),
        ("4242", "", False, (4242, NOBODY)),
    ],
)
def test_choose(setting, image_user, allow_root, expected):
    assert choose(setting, image_user, PASSWD, GROUPS, allow_root) == expected


def test_choose_refuses_an_unknown_user():
    with pytest.raises(UnknownUser, match="ghost"):
        choose("nobody", "ghost", PASSWD, GROUPS, False)


def _stat(paths):
    return lambda path: paths.get(path)


def test_home_kept_where_the_user_can_write_it():
    paths = {
        "/home/app": PathInfo(True, 1000, 1000, 0o755),
        "/srv/shared": PathInfo(True, 0, 0, 0o1777),
        "/nonexistent": None,
        "/": PathInfo(True, 0, 0, 0o755),
        "/root": PathInfo(True, 0, 0, 0o700),
    }
    assert home_for(1000, 1000, [], PASSWD, _stat(paths)) is None
    assert home_for(1000, 1000, ["HOME=/srv/shared"], PASSWD, _stat(paths)) is None
    assert home_for(NOBODY, NOBODY, [], PASSWD, _stat(paths)) == RUN_HOME  # /nonexistent
    assert home_for(4242, NOBODY, [], PASSWD, _stat(paths)) == RUN_HOME  # no entry: "/", root's
    assert home_for(NOBODY, NOBODY, ["HOME=/root"], PASSWD, _stat(paths)) == RUN_HOME
    assert home_for(0, 0, ["HOME=/root"], PASSWD, _stat(paths)) is None


MOUNTINFO = r"""22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
43 27 254:0 /srv/work /srv/work rw,nosuid,nodev,relatime - ext4 /dev/vda rw
44 43 254:0 /srv/work/x /srv/work/x rw,relatime - ext4 /dev/vda rw
45 27 254:0 /my\040dir /my\040dir rw,nosuid,nodev - ext4 /dev/vda rw
"""


def test_covering_mount_from_mountinfo():
    mounts = parse_mountinfo(MOUNTINFO)
    assert covering(mounts, Path("/srv/work/a/runs")).options >= {"nosuid", "nodev"}
    assert "nosuid" not in covering(mounts, Path("/srv/work/x/runs")).options  # a deeper mount wins
    assert covering(mounts, Path("/srv/workshop")).mount_point == "/"
    assert covering(mounts, Path("/my dir/runs")).mount_point == "/my dir"


def test_prepare_finds_a_safe_mount_and_makes_private_dirs(tmp_path):
    made = []
    info = f"27 1 254:0 / / rw - ext4 /dev/vda rw\n43 27 254:0 / {tmp_path} rw,nosuid,nodev - ext4 /dev/vda rw\n"
    work = prepare(
        tmp_path / "w", tmp_path / "cache", why_not=None, mountinfo=lambda: info, mount=lambda *a: made.append(a)
    )
    assert [m[1] for m in made] == [tmp_path / "w" / "inputs"]  # only the inputs view was made
    assert made[0][2] is True  # read-only
    assert work.inputs_view == tmp_path / "w" / "inputs"
    for path in (tmp_path / "w", tmp_path / "w" / "runs", tmp_path / "cache"):
        assert path.stat().st_mode & 0o777 == 0o700


def test_prepare_makes_the_mount_or_refuses_in_one_line(tmp_path):
    info = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
    made = []
    work = prepare(
        tmp_path / "w", tmp_path / "c", why_not=None, mountinfo=lambda: info, mount=lambda *a: made.append(a)
    )
    assert made[0] == (tmp_path / "w" / "runs", tmp_path / "w" / "runs", False)
    assert work.made == [tmp_path / "w" / "runs", tmp_path / "w" / "inputs"]
    with pytest.raises(
        WorkDirError,
        match=r"not on a nosuid,nodev mount and this agent cannot make one \(it runs as uid 1000, not root\)",
    ) as e:
        prepare(tmp_path / "w2", tmp_path / "c", why_not="it runs as uid 1000, not root", mountinfo=lambda: info)
    assert "\n" not in str(e.value)
    assert "not on a nosuid,nodev mount" in str(e.value)
    assert "uid 1000" in str(e.value)
    assert "--allow-suid-work-dir" in str(e.value)

    def refused(*_):
        raise PermissionError(1, "mount: Operation not permitted")

    with pytest.raises(WorkDirError, match="Operation not permitted"):
        prepare(tmp_path / "w3", tmp_path / "c", why_not=None, mountinfo=lambda: info, mount=refused)
    accepted = prepare(tmp_path / "w4", tmp_path / "c", why_not="no", allow_suid=True, mountinfo=lambda: info)
    assert accepted.warning and accepted.inputs_view is None


def test_release_removes_only_what_is_this_workers():
    work = WorkDir(Path("/w/runs"), Path("/c"), made=[Path("/w/runs"), Path("/w/inputs")])
    gone = []
    work.release(gone.append)
    assert gone == [Path("/w/inputs"), Path("/w/runs")]
    assert work.made == []


def test_walk_counts_apparent_size_and_entries(tmp_path):
    (tmp_path / "sparse").touch()
    with (tmp_path / "sparse").open("r+b") as f:
        f.truncate(200 * 1024**2)  # 200m that take no blocks
    (tmp_path / "d").mkdir()
    for i in range(5):
        (tmp_path / "d" / f"f{i}").write_bytes(b"x" * 10)
    (tmp_path / "link").symlink_to("sparse")
    tree = walk(tmp_path)
    assert tree.size == 200 * 1024**2 + 50 + len("sparse")
    assert (tree.entries, tree.stopped) == (8, False)
    assert walk(tmp_path, max_entries=3).stopped
    assert walk(tmp_path, max_size=1024).stopped
    assert walk(tmp_path / "absent") == walk(tmp_path / "absent", 0, 0)  # nothing there: nothing counted


def _nest(top: Path, names: list[str]) -> int:
    """Directories ``names`` nested under ``top``, made through descriptors (their path may be
    longer than PATH_MAX); the deepest one's descriptor."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for name in names:
        os.mkdir(name, dir_fd=fd)
        inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    return fd


def test_walk_counts_a_file_whose_path_is_longer_than_path_max(tmp_path):
    """By path strings, the walk met ENAMETOOLONG and counted the 1 TiB file as nothing."""
    fd = _nest(tmp_path, ["d" * 250] * 20)  # 5,000 characters of path
    try:
        big = os.open("big", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)
        os.ftruncate(big, 2**40)
        os.close(big)
    finally:
        os.close(fd)
    tree = walk(tmp_path)
    assert (tree.size, tree.entries, tree.unreadable) == (2**40, 21, None)  # directories count no size
    assert walk(tmp_path, max_size=2**30).stopped


def test_a_tree_too_deep_to_walk_is_unreadable_not_empty(tmp_path):
    os.close(_nest(tmp_path, ["d"] * (MAX_DEPTH + 5)))
    tree = walk(tmp_path)
    assert tree.unreadable is not None and f"deeper than {MAX_DEPTH} directories" in tree.unreadable
    os.close(_nest(tmp_path / "d", []))
    assert walk(tmp_path / "d" / ("d/" * (MAX_DEPTH - 10)).rstrip("/")).unreadable is None


def test_a_tree_a_thousand_deep_is_collected_and_removed_without_recursion(tmp_path):
    """shutil.rmtree and os.walk recurse: on such a tree they raised RecursionError, which
    escaped the run's cleanup and kept its worker slot for ever."""
    run_dir = tmp_path / "runs" / "r-1-1"
    (run_dir / "output").mkdir(parents=True)
    (run_dir / "output" / "kept").write_bytes(b"x")
    fd = _nest(run_dir / "output", ["d"] * 1100)
    os.close(os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd))
    os.symlink("/etc", "etc", dir_fd=fd)
    os.close(fd)
    files, skipped = collect(run_dir / "output")
    assert files == ["kept"]
    assert len(skipped) == 1 and f"deeper than {MAX_DEPTH} directories (not read)" in skipped[0]
    assert remove_tree(run_dir) is None
    assert list((tmp_path / "runs").iterdir()) == []  # nothing left beside it either
    assert Path("/etc/passwd").exists()  # the symlink was removed, not followed


class _Recorder:
    """An object store that keeps what it is given; ``before(key)`` runs as an upload starts."""

    def __init__(self, before=lambda key: None):
        self.objects: dict[str, bytes] = {}
        self.before = before

    def put_file(self, key, path):
        self.before(key)
        self.objects[key] = Path(path).read_bytes()


def test_upload_never_leaves_the_output_dir_even_when_it_changes_meanwhile(tmp_path):
    """A run still going (or anything else) swaps a directory it listed for a symlink out of
    it between the listing and the upload: the file uploaded is never the one outside."""
    out, secret = tmp_path / "out", tmp_path / "elsewhere"
    (out / "d").mkdir(parents=True)
    secret.mkdir()
    (secret / "f").write_bytes(b"host secret")
    (out / "a").write_bytes(b"a")
    (out / "d" / "f").write_bytes(b"own")
    (out / "real").write_bytes(b"ok")
    (out / "inside").symlink_to("real")
    (out / "pw").symlink_to("/etc/passwd")
    os.mkfifo(out / "fifo")

    def swap(key):
        if key == "p/a":  # files go one at a time here, in order: "a" before "d/f"
            (out / "d" / "f").unlink()
            (out / "d").rmdir()
            (out / "d").symlink_to(secret)

    store = _Recorder(swap)
    report = upload_dir(store, out, "p/", 30, workers=1)
    assert store.objects == {"p/a": b"a", "p/inside": b"ok", "p/real": b"ok"}
    assert sorted(report.skipped) == [
        "d/f (symlink out of the output directory)",
        "fifo (not a regular file)",
        "pw (symlink out of the output directory)",
    ]
    assert (report.files, report.bytes, report.error) == (3, 5, None)


def test_disk_checks_are_spaced_by_their_cost_but_never_far_apart(tmp_path):
    """A run that makes each walk long (many empty files) put its next check spent / share
    away: a 10 s walk meant 200 s unchecked."""
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)  # 2 s, 5 %, at most 10 s
    assert disk_interval(0.001, config) == 2.0
    assert disk_interval(0.2, config) == 4.0
    assert disk_interval(10.0, config) == 10.0  # walks follow each other; the file count caps them
    assert disk_interval(10.0, ExecutorConfig(worker_id="w", work_dir=tmp_path, usage_seconds=30)) == 30.0


def _tar(*members: tuple[tarfile.TarInfo, bytes], fmt: int = tarfile.PAX_FORMAT) -> list[bytes]:
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w", format=fmt) as tar:
        for info, content in members:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    raw = data.getvalue()
    return [raw[i : i + 700] for i in range(0, len(raw), 700)]  # as the engine streams it, in pieces


def _member(name: str, kind: bytes = tarfile.REGTYPE, **attrs: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in attrs.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
def test_the_first_member_behind_extended_headers(fmt):
    """An image's file with an extended header first (an xattr, a long name, a long link
    target) read as missing when only the first 512-byte header was parsed."""
    passwd = b"app:x:1000:1000::/home/app:/bin/sh\n"
    xattr = {"SCHILY.xattr.user.note": "x"} if fmt == tarfile.PAX_FORMAT else {}
    info, data = first_member(_tar((_member("passwd", pax_headers=xattr, uid=7), passwd), fmt=fmt), 1 << 20)
    assert (info.name, info.isfile(), info.uid, data) == ("passwd", True, 7, passwd)
    assert first_member(_tar((_member("passwd"), passwd), fmt=fmt), 4)[1] == b"app:"  # at most the limit
    target = "/" + "t" * 150 + "/passwd"
    link, _ = first_member(_tar((_member("passwd", tarfile.SYMTYPE, linkname=target), b""), fmt=fmt), 1 << 20)
    assert (link.issym(), link.linkname) == (True, target)
    home, _ = first_member(_tar((_member("h" * 120, tarfile.DIRTYPE, uid=1000, mode=0o755), b""), fmt=fmt), 0)
    assert (home.isdir(), home.uid, home.mode) == (True, 1000, 0o755)


def _run(**env):
    return Run(
        id="r-1",
        owner="u",
        queue="q",
        attempt=1,
        created_at=0,
        spec=RunSpec(command="true", image="img", env=env, resources={"memory": "64m"}),
    )


def test_spec_runs_in_numbers_with_no_capabilities_and_a_capped_docker_log(tmp_path):
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path, docker_log_size="1048576")
    spec = container_spec(_run(), "img", config, Path("/o"), None, {}, RunAs(1000, 1000))
    assert spec["user"] == "1000:1000"
    assert (spec["cap_drop"], spec["cap_add"]) == (["ALL"], [])
    assert spec["security_opt"] == ["no-new-privileges"]
    assert spec["log_config"] == {"Type": "json-file", "Config": {"max-size": "1048576", "max-file": "2"}}
    assert "HOME" not in spec["environment"]
    root = container_spec(_run(), "img", config, Path("/o"), None, {}, RunAs(0, 0))
    assert (root["user"], root["cap_add"]) == ("0:0", CAPABILITIES)


def test_an_interactive_runs_container_has_its_stdin_open_and_a_terminal_if_asked(tmp_path):
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    batch = container_spec(_run(), "img", config, Path("/o"), None, {})
    assert ("stdin_open" not in batch, "tty" not in batch, batch["detach"]) == (True, True, True)
    for tty in (True, False):
        run = _run()
        run.spec = run.spec.model_copy(update={"interactive": True, "tty": tty})
        spec = container_spec(run, "img", config, Path("/o"), None, {})
        # without a terminal, not detached: the engine's StdinOnce ends its input with the agent's attach's
        assert (spec["stdin_open"], spec["tty"], spec["detach"]) == (True, tty, tty)


def test_spec_gives_a_writable_home_unless_the_run_sets_one(tmp_path):
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    run_as = RunAs(NOBODY, NOBODY, RUN_HOME)
    spec = container_spec(_run(), "img", config, Path("/o"), None, {}, run_as, Path("/r/home"))
    assert spec["environment"]["HOME"] == RUN_HOME
    assert spec["mounts"] == [Mount("/runplane/output", "/o", type="bind"), Mount(RUN_HOME, "/r/home", type="bind")]
    own = container_spec(_run(HOME="/data"), "img", config, Path("/o"), None, {}, run_as, Path("/r/home"))
    assert own["environment"]["HOME"] == "/data"
    assert own["mounts"] == [Mount("/runplane/output", "/o", type="bind")]
    assert "volumes" not in own


def test_spec_binds_inputs_from_the_read_only_view_without_a_remount(tmp_path):
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    inputs = {"data": Path("/w/inputs/k/content")}
    plain = container_spec(_run(), "img", config, Path("/o"), None, inputs)
    assert plain["mounts"][1] == Mount("/inputs/data", "/w/inputs/k/content", type="bind", read_only=True)
    viewed = container_spec(_run(), "img", config, Path("/o"), None, inputs, inputs_on_safe_mount=True)
    assert viewed["mounts"][1] == Mount("/inputs/data", "/w/inputs/k/content", type="bind", read_only=False)


def test_two_inputs_of_one_source_are_two_mounts(tmp_path):
    """Mounts keyed by their source collapsed these into one: the run missed an input."""
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    same = Path("/w/inputs/k/content")
    spec = container_spec(_run(), "img", config, Path("/o"), None, {"a": same, "b": same})
    assert [(m["Target"], m["Source"], m["ReadOnly"]) for m in spec["mounts"][1:]] == [
        ("/inputs/a", str(same), True),
        ("/inputs/b", str(same), True),
    ]


def test_an_images_volumes_are_bound_from_the_run_directory_where_nothing_else_is_mounted(tmp_path):
    """Each VOLUME path is an anonymous volume of the local driver bound to its directory in the
    run directory (counted, removed with it); one at a path mounted already, in any spelling,
    is left to that mount, and two spellings of one path make one mount."""
    config = ExecutorConfig(worker_id="w", work_dir=tmp_path)
    volumes = {
        "/scratch": Path("/r/volumes/0"),
        "/scratch/": Path("/r/volumes/1"),
        "/runplane/output/": Path("/r/volumes/2"),
        "/inputs/data": Path("/r/volumes/3"),
    }
    spec = container_spec(_run(), "img", config, Path("/o"), None, {"data": Path("/c")}, volumes=volumes)
    made = [m for m in spec["mounts"] if m["Type"] == "volume"]
    assert made == [
        Mount(
            "/scratch",
            None,
            type="volume",
            driver_config=DriverConfig("local", {"type": "none", "o": "bind", "device": "/r/volumes/0"}),
        )
    ]
    assert [m["Target"] for m in spec["mounts"]] == ["/runplane/output", "/inputs/data", "/scratch"]


def test_an_images_volumes_are_read_in_order():
    assert image_volumes({"Config": {"Volumes": {"/b": {}, "/a": {}}}}) == ["/a", "/b"]
    assert image_volumes({"Config": {"Volumes": None}}) == image_volumes({}) == []


def test_a_dead_agents_mounts_are_swept_and_a_live_ones_kept(tmp_path):
    root = tmp_path / "work"
    alive = prepare(root / "alive", root / "cache", why_not="test", allow_suid=True, mountinfo=lambda: "")
    (root / "dead").mkdir()
    (root / "dead" / ".agent.lock").touch()  # its agent died holding nothing
    info = "".join(
        f"{n} 1 254:0 / {root / w / d} rw,nosuid,nodev - ext4 /dev/vda rw\n"
        for n, (w, d) in enumerate([("alive", "runs"), ("dead", "runs"), ("dead", "inputs")], start=50)
    )
    gone = []
    me = prepare(root / "me", root / "cache", why_not=None, mountinfo=lambda: info, mount=lambda *a: None,
                 unmount_=gone.append)  # fmt: skip
    assert gone == [root / "dead" / "runs", root / "dead" / "inputs"]
    with pytest.raises(WorkDirError, match="another agent with this worker id"):
        prepare(root / "alive", root / "cache", why_not="x", allow_suid=True, mountinfo=lambda: "", lock_wait=0.1)
    alive.release()
    me.release(lambda p: None)
