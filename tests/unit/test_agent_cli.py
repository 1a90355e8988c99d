"""``runplane-agent``'s command line: every field of ``AgentSettings`` is a flag and a variable
RUNPLANE_AGENT_<FLAG> (a flag beats its variable, which beats the default), and every bad value
is one line naming the flag, with exit status 2."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

from runplane.domain.pools import Pool
from runplane.domain.units import format_bytes, parse_bytes
from worker_agent.main import agent_config, shape_shortfalls
from worker_agent.resources import Allocator
from worker_agent.run_config import AgentConfig, ExecutorConfig
from worker_agent.settings import AgentSettings, UsageError, env_name, flag_name, parse

CORE = min(os.sched_getaffinity(0))
SWITCHES = [name for name, field in AgentSettings.model_fields.items() if field.annotation is bool]
# a value of each flag other than its default, as given, and as the settings hold it
SAMPLES = {
    "pool": ("gpu", "gpu"),
    "id": ("w-7", "w-7"),
    "slots": ("3", 3),
    "tag": ("a100-box", "a100-box"),
    "group": ("vision-lab", "vision-lab"),
    "cpuset": (str(CORE), (CORE,)),
    "gpuset": ("0,GPU-abc", ("0", "GPU-abc")),
    "gpu_mode": ("devices", "devices"),
    "gpu_driver_dir": ("/opt/nvidia", "/opt/nvidia"),
    "memory": ("8g", 8 * 2**30),
    "disk": ("200g", 200 * 2**30),
    "shm_size": ("1g", "1g"),
    "work_dir": ("/srv/runplane", "/srv/runplane"),
    "max_work_dir_size": ("100g", 100 * 2**30),
    "max_image_cache_size": ("20g", 20 * 2**30),
    "idle_seconds": ("5m", 300.0),
    "exit_after_num_runs": ("4", 4),
    "preemption_watch": ("azure", "azure"),
    "metadata_url": ("http://127.0.0.1:9", "http://127.0.0.1:9"),
    "heartbeat_seconds": ("2", 2.0),
    "lease_seconds": ("60", 60.0),
    "poll_seconds": ("1", 1.0),
    "kill_poll_seconds": ("0.5", 0.5),
    "upload_deadline_seconds": ("30", 30.0),
    "stop_budget_seconds": ("60", 60.0),
    "live_interval": ("1m", 60.0),
    "live_max_files": ("10", 10),
    "live_max_file_bytes": ("1m", 2**20),
    "live_bytes_per_minute": ("8m", 8 * 2**20),
    "live_max_total_bytes": ("10g", 10 * 2**30),
    "prefetch_stall_seconds": ("60", 60.0),
    "prefetch_limit_seconds": ("600", 600.0),
    "network_mode": ("none", "none"),
    "pull": ("never", "never"),
    "run_user": ("1000:1000", "1000:1000"),
    "docker_log_size": ("1m", "1048576"),
    "log_upload_prefix": ("agents", "agents"),
    "metrics_port": ("9464", 9464),
    "metrics_address": ("0.0.0.0", "0.0.0.0"),
    "log_level": ("debug", "DEBUG"),
} | {name: (None, True) for name in SWITCHES}
NEEDS = {"tag_exclusive": ["--tag", "a100-box"]}  # flags a sample needs beside it
POOL = ["--pool", "p"]
# what the configs hold resolved: the worker's own directory under --work-dir, the pool's memory
# and disk, and every core this process may use when --memory, --disk or --cpuset is not given
RESOLVED = {"work_dir", "memory", "disk", "cpuset"}


def agent(*args, env=None, timeout=60):
    return subprocess.run(
        [sys.executable, "-m", "worker_agent", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "10000", **(env or {})},
    )


def test_every_setting_has_a_sample():
    assert set(SAMPLES) == set(AgentSettings.model_fields)


@pytest.mark.parametrize("name", list(AgentSettings.model_fields))
def test_every_setting_is_a_flag_and_a_variable(name):
    text, expected = SAMPLES[name]
    base = [*POOL, *NEEDS.get(name, [])] if name != "pool" else []
    assert getattr(AgentSettings(pool="p"), name) != expected  # the sample is not the default
    by_flag = parse([*base, flag_name(name), *([text] if text is not None else [])], environ={})
    by_variable = parse(base, environ={env_name(name): text if text is not None else "1"})
    assert getattr(by_flag, name) == getattr(by_variable, name) == expected


def test_help_lists_every_flag_with_its_variable():
    """Each flag's entry: its help text, then its variable (install.sh looks for "env NAME]")."""
    proc = agent("--help")
    assert proc.returncode == 0, proc.stderr
    options = proc.stdout[proc.stdout.index("\noptions:\n") :]
    entries = {entry.split()[0]: " ".join(entry.split()) for entry in re.split(r"\n(?=  -)", options)[1:]}
    assert set(entries) == {"-h,"} | {flag_name(name) for name in AgentSettings.model_fields}
    for name, field in AgentSettings.model_fields.items():
        assert field.description and field.description in entries[flag_name(name)], name
        assert entries[flag_name(name)].endswith(f"[env {env_name(name)}]"), name


def test_a_flag_beats_its_variable_which_beats_the_default():
    assert parse(POOL, environ={}).slots == 1
    assert parse(POOL, environ={"RUNPLANE_AGENT_SLOTS": "3"}).slots == 3
    assert parse([*POOL, "--slots", "4"], environ={"RUNPLANE_AGENT_SLOTS": "3"}).slots == 4
    assert parse([*POOL, "--preemptible"], environ={"RUNPLANE_AGENT_PREEMPTIBLE": "false"}).preemptible
    assert not parse(POOL, environ={"RUNPLANE_AGENT_PREEMPTIBLE": "0"}).preemptible
    assert parse([], environ={"RUNPLANE_AGENT_POOL": "gpu"}).pool == "gpu"
    assert parse(["--pool", "cpu"], environ={"RUNPLANE_AGENT_POOL": "gpu"}).pool == "cpu"


def test_an_empty_variable_counts_as_unset():
    settings = parse([], environ={"RUNPLANE_AGENT_POOL": "p", "RUNPLANE_AGENT_TAG": "", "RUNPLANE_AGENT_SLOTS": ""})
    assert (settings.tag, settings.slots) == (None, 1)


def test_the_real_environment_is_read(monkeypatch):
    monkeypatch.setenv("RUNPLANE_AGENT_POOL", "gpu")
    monkeypatch.setenv("RUNPLANE_AGENT_IDLE_SECONDS", "5m")
    monkeypatch.setenv("RUNPLANE_AGENT_TAG_EXCLUSIVE", "1")
    settings = parse(["--tag", "a100-box", "--memory", "8g"])
    assert (settings.pool, settings.idle_seconds, settings.memory) == ("gpu", 300, 8 * 2**30)
    assert (settings.tag, settings.tag_exclusive, settings.group) == ("a100-box", True, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--pool is required (or set RUNPLANE_AGENT_POOL)"),
        ([*POOL, "--slots", "0"], "--slots: must be at least 1"),
        ([*POOL, "--slots", "two"], "--slots: 'two' is not a whole number"),
        ([*POOL, "--exit-after-num-runs", "1.5"], "--exit-after-num-runs: '1.5' is not a whole number"),
        ([*POOL, "--poll-seconds", "soon"], "--poll-seconds: 'soon' is not a number"),
        ([*POOL, "--pull", "always"], "--pull: must be 'missing' or 'never'"),
        ([*POOL, "--log-level", "loud"], "--log-level: must be 'DEBUG', 'INFO', 'WARNING' or 'ERROR'"),
        ([*POOL, "--run-user", "root"], "--run-user: must be nobody, image, or UID[:GID]"),
        ([*POOL, "--lease-seconds", "3", "--heartbeat-seconds", "2"], "--lease-seconds must be at least twice"),
        ([*POOL, "--idle-seconds", "forever"], "--idle-seconds: cannot read duration 'forever'"),
        ([*POOL, "--memory", "lots"], "--memory: cannot read size 'lots'"),
        ([*POOL, "--docker-log-size", "lots"], "--docker-log-size: cannot read size 'lots'"),
        ([*POOL, "--tag-exclusive"], "--tag-exclusive needs --tag"),
        ([*POOL, "--tag", "A100 box"], "--tag: 'A100 box' is not a valid name"),
        ([*POOL, "--group", "Vision"], "--group: 'Vision' is not a valid name"),
        ([*POOL, "--upload-deadline-seconds", "0"], "--upload-deadline-seconds: must be positive"),
        ([*POOL, "--upload-deadline-seconds", "-5"], "--upload-deadline-seconds: must be positive"),
        ([*POOL, "--kill-poll-seconds", "0"], "--kill-poll-seconds: must be positive"),
        ([*POOL, "--preemption-watch", "gcp"], "--preemption-watch: must be ec2, azure or an http(s) URL"),
        ([*POOL, "--cpuset", "x"], "--cpuset: 'x' is not an index"),
        ([*POOL, "--cpuset", "0-4095"], "--cpuset: cores "),
        ([*POOL, "--cpuset", "GPU-1"], "--cpuset: 'GPU-1' is not a core index"),
        ([*POOL, "--gpuset", "3-1"], "--gpuset: range '3-1' runs backwards"),
        ([*POOL, "--gpu-mode", "vulkan"], "--gpu-mode: "),
        ([*POOL, "--metrics-port", "70000"], "--metrics-port: must be at most 65535"),
        ([*POOL, "--metrics-port", "-1"], "--metrics-port: must be at least 0"),
        ([*POOL, "--metrics-port", "http"], "--metrics-port: 'http' is not a whole number"),
        ([*POOL, "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--pool"], "argument --pool: expected one argument"),
    ],
)
def test_bad_flags_are_one_clear_line(argv, message):
    with pytest.raises(UsageError) as caught:
        parse(argv, environ={})
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("RUNPLANE_AGENT_SLOTS", "x", "--slots (RUNPLANE_AGENT_SLOTS): 'x' is not a whole number"),
        ("RUNPLANE_AGENT_PREEMPTIBLE", "maybe", "--preemptible (RUNPLANE_AGENT_PREEMPTIBLE): 'maybe' is not a switch"),
        ("RUNPLANE_AGENT_MEMORY", "5x", "--memory (RUNPLANE_AGENT_MEMORY): cannot read size '5x'"),
        ("RUNPLANE_AGENT_CPUSET", "0-4095", "--cpuset (RUNPLANE_AGENT_CPUSET): cores "),
    ],
)
def test_bad_variables_name_the_flag_and_the_variable(variable, value, message):
    with pytest.raises(UsageError) as caught:
        parse(POOL, environ={variable: value})
    assert str(caught.value).startswith(message)


def test_bad_flag_exits_2_with_one_line():
    proc = agent(*POOL, "--slots", "0")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "runplane-agent: error: --slots: must be at least 1"


def test_bad_variable_exits_2_with_one_line():
    proc = agent(*POOL, env={"RUNPLANE_AGENT_UPLOAD_DEADLINE_SECONDS": "-1"})
    assert proc.returncode == 2
    expected = "--upload-deadline-seconds (RUNPLANE_AGENT_UPLOAD_DEADLINE_SECONDS): must be positive"
    assert proc.stderr.strip() == f"runplane-agent: error: {expected}"


def test_unknown_flag_exits_2_with_one_line():
    proc = agent(*POOL, "--slot", "2", "--no-such-flag")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "runplane-agent: error: unrecognized arguments: --no-such-flag (see --help)"


def test_the_configs_default_to_the_flags_defaults(tmp_path):
    """AgentConfig and ExecutorConfig built without settings (in tests) behave like an agent
    started with no flags."""
    settings = AgentSettings(pool="p")
    for config in (AgentConfig(pool="p", worker_id="w", work_dir=tmp_path), ExecutorConfig("w", tmp_path)):
        shared = [f.name for f in dataclasses.fields(config) if f.name in AgentSettings.model_fields.keys() - RESOLVED]
        assert len(shared) >= 6
        for name in shared:
            value = getattr(config, name)
            if name == "docker_log_size":
                value = str(parse_bytes(value))
            assert value == getattr(settings, name), name


def test_the_agent_config_carries_the_settings(tmp_path):
    argv = [*POOL, "--tag", "a100-box"]
    for name, (text, _) in SAMPLES.items():
        if name not in ("pool", "tag", "preemption_watch", "prepare_work_dir"):
            argv += [flag_name(name), *([text] if text is not None else [])]
    settings = parse(argv, environ={})
    pool = Pool(
        name="p", cpus=1, memory=2**30, default_image="img", allow_root=True, max_output_files=7, max_log_size=2**20
    )
    config = agent_config(settings, "w-7", tmp_path / "w-7", (), pool, "stack1", tmp_path / "view")
    executor = config.executor
    assert executor is not None
    for part in (config, executor):
        for field in dataclasses.fields(part):
            if field.name in AgentSettings.model_fields.keys() - RESOLVED:
                assert getattr(part, field.name) == getattr(settings, field.name), field.name
    assert (config.worker_id, config.work_dir) == ("w-7", tmp_path / "w-7")
    assert (config.memory, config.disk, config.cpuset) == (8 * 2**30, 200 * 2**30, (CORE,))
    assert (executor.worker_id, executor.work_dir, executor.stack_id) == ("w-7", tmp_path / "w-7", "stack1")
    assert (executor.allow_root, executor.max_output_files, executor.max_log_size) == (True, 7, 2**20)
    assert executor.inputs_view == tmp_path / "view"
    # what is not given is found: the pool's memory and disk, and every core this process may use
    default = agent_config(parse(POOL, environ={}), "w-1", tmp_path, (), pool, "s", None)
    assert (default.memory, default.disk) == (2**30, pool.disk) and default.cpuset == tuple(
        sorted(os.sched_getaffinity(0))
    )


def test_a_worker_started_without_sizes_takes_the_largest_run_its_pool_admits(tmp_path):
    """The API admits runs up to the pool's shape: a worker given no --memory or --disk offers the
    pool's, even on a machine that reports less memory than the pool says (a 64g pool's instance
    shows about 62.6g), and says so once at start rather than bouncing such runs forever."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    pool = Pool(name="p", cpus=1, memory=machine + 2**30, disk=2**50, default_image="img")
    config = agent_config(parse(POOL, environ={}), "w-1", tmp_path, (), pool, "s", None)
    assert (config.memory, config.disk) == (pool.memory, pool.disk)
    allocator = Allocator(list(config.cpuset), [], config.memory, config.disk)
    assert allocator.fits_at_all(pool.cpus, pool.gpus, pool.memory, pool.disk) is None
    assert allocator.allocate("r-largest", pool.cpus, pool.gpus, pool.memory, pool.disk) is not None
    (said,) = shape_shortfalls(config, pool, machine)
    assert said.startswith(f"this machine has {format_bytes(machine)} of memory, less than the ")
    assert f"the {format_bytes(pool.memory)} its runs may set aside" in said


def test_a_worker_smaller_than_its_pool_says_what_it_lacks(tmp_path):
    pool = Pool(name="big", cpus=4, gpus=1, memory=64 * 2**30, disk=500 * 2**30, default_image="img")
    small = parse([*POOL, "--cpuset", str(CORE), "--memory", "32g"], environ={})
    config = agent_config(small, "w-1", tmp_path, (), pool, "s", None)
    (said,) = shape_shortfalls(config, pool, 128 * 2**30)
    assert said == (
        "this worker offers less than pool big's shape (cpus 1 of 4, gpus 0 of 1, memory 32g of 64g): a run that "
        "asks more than it has is never taken here; it waits for a worker of the pool that has it"
    )
    fitting = pool.model_copy(update={"cpus": 1, "gpus": 0, "memory": 32 * 2**30})
    assert shape_shortfalls(agent_config(small, "w-1", tmp_path, (), fitting, "s", None), fitting, 2**40) == []


def test_bad_pools_setting_is_one_line(tmp_path):
    env = {"RUNPLANE_POOLS": str(tmp_path / "missing.yaml"), "HOME": str(tmp_path)}
    proc = agent(*POOL, env=env)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("runplane-agent: error:") and "missing.yaml" in proc.stderr
