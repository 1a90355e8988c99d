import subprocess
import sys

import pytest

from worker_agent.main import UsageError, parse


def test_flags_and_env(monkeypatch):
    monkeypatch.setenv("RUNPLANE_AGENT_POOL", "gpu")
    monkeypatch.setenv("RUNPLANE_AGENT_IDLE_SECONDS", "5m")
    args = parse(["--slots", "2", "--memory", "8g", "--pass-down-termination"])
    assert (args.pool, args.slots, args.idle_seconds, args.memory) == ("gpu", 2, 300, 8 * 2**30)
    assert args.pass_down_termination
    assert (args.tag, args.tag_exclusive, args.group) == (None, False, None)
    monkeypatch.setenv("RUNPLANE_AGENT_TAG_EXCLUSIVE", "1")
    args = parse(["--tag", "a100-box", "--group", "vision-lab"])
    assert (args.tag, args.tag_exclusive, args.group) == ("a100-box", True, "vision-lab")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--pool is required"),
        (["--pool", "p", "--slots", "0"], "--slots must be at least 1"),
        (["--pool", "p", "--slots", "two"], "is not a valid int"),
        (["--pool", "p", "--pull", "always"], "--pull must be"),
        (["--pool", "p", "--lease-seconds", "3", "--heartbeat-seconds", "2"], "at least twice"),
        (["--pool", "p", "--idle-seconds", "forever"], "cannot read duration"),
        (["--pool", "p", "--tag-exclusive"], "--tag-exclusive needs --tag"),
        (["--pool", "p", "--tag", "A100 box"], "--tag: 'A100 box' is not a valid name"),
        (["--pool", "p", "--group", "Vision"], "--group: 'Vision' is not a valid name"),
        (["--pool", "p", "--upload-deadline-seconds", "0"], "--upload-deadline-seconds must be positive"),
        (["--pool", "p", "--upload-deadline-seconds", "-5"], "--upload-deadline-seconds must be positive"),
    ],
)
def test_bad_flags_are_one_clear_line(argv, message, monkeypatch):
    monkeypatch.delenv("RUNPLANE_AGENT_POOL", raising=False)
    with pytest.raises(UsageError, match=message):
        parse(argv)


def test_bad_flag_exits_2_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "worker_agent", "--pool", "p", "--slots", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "runplane-agent: error: --slots must be at least 1"


def test_cpuset_and_gpuset_flags():
    import os

    cores = sorted(os.sched_getaffinity(0))
    args = parse(["--pool", "p", "--cpuset", f"{cores[0]}", "--gpuset", "0,GPU-abc"])
    assert args.cpuset == [cores[0]]
    assert args.gpuset == ["0", "GPU-abc"]
    with pytest.raises(UsageError, match="not available here"):
        parse(["--pool", "p", "--cpuset", "0-4095"])
    with pytest.raises(UsageError, match="--cpuset"):
        parse(["--pool", "p", "--cpuset", "x"])


def test_bad_pools_setting_is_one_line(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "RUNPLANE_POOLS": str(tmp_path / "missing.yaml"), "HOME": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "worker_agent", "--pool", "p"], capture_output=True, text=True, timeout=60, env=env
    )
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("runplane-agent: error:") and "missing.yaml" in proc.stderr
