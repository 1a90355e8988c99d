"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against the local
stack (``runplane dev``'s) with real runs on the real Docker engine. One browser for the module;
each test gets a fresh tab signed in the way a user is: by the link ``runplane dev`` prints."""

from __future__ import annotations

import os
import re
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from runplane import bootstrap
from runplane.cli.dev import dashboard_link
from runplane.client import Client
from runplane.domain.checkpoints import CheckpointStatus
from runplane.domain.expect import Expect
from runplane.domain.retention import RunRetention
from runplane.domain.workers import Pulling, Worker
from tests.conftest import TERMINAL, wait_state
from worker_agent.checkpoints import sync

pytestmark = pytest.mark.docker

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000
CHECKPOINT_FILES = 120
"""More files than the checkpoint route answers in one page."""
SHOTS = os.environ.get("RUNPLANE_DASHBOARD_SHOTS")
"""A folder to save each page's picture in (docs/ keeps them as docs/dashboard-*.png)."""


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh --test installs Debian's chromium")
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield chromium
        chromium.close()


class Tab:
    """A browser tab on the stack, with what the page said went wrong, every URL it asked for and
    every question it asked (``confirm``), answered with ``answer``."""

    def __init__(self, browser, base: str, width: int = 1280, height: int = 800) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.urls: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        self.page.on("request", lambda r: self.urls.append(r.url))
        self.dialogs: list[str] = []
        self.answer = True
        self.page.on("dialog", self._dialog)

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        if self.answer:
            dialog.accept()
        else:
            dialog.dismiss()

    def sign_in(self, token: str, route: str = "/runs") -> None:
        self.page.goto(dashboard_link(self.base, token))  # the link `runplane dev` prints
        self.page.wait_for_url(re.compile(r"#/runs$"))
        self.page.get_by_role("button", name=re.compile(r"^Sign in as ")).click()  # the one click it asks
        expect(self.page.locator("#who")).not_to_be_empty()
        if route != "/runs":
            self.go(route)

    def go(self, route: str) -> None:
        """Follows ``#route``, back once the page has drawn it (the app draws on ``hashchange``)."""
        self.page.evaluate(
            """route => new Promise(done => {
                if (location.hash === route) return done();
                addEventListener("hashchange", () => setTimeout(done), { once: true });
                location.hash = route;
            })""",
            f"#{route}",
        )

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser, devstack):
    opened: list[Tab] = []

    def open_tab(base: str | None = None, **kwargs) -> Tab:
        t = Tab(browser, base or devstack.api_url, **kwargs)
        opened.append(t)
        return t

    yield open_tab
    for t in opened:
        # the token never travels in a URL a server sees, and the page did nothing wrong
        assert not [u for u in t.urls if re.search(r"token=|-token", u.split("#")[0])], t.urls
        # nothing but the stack itself (no CDN, no font, no other host)
        assert not [u for u in t.urls if not u.startswith((f"{t.base}/", "data:"))], t.urls
        assert t.errors == [], t.errors
        t.close()


def unique(prefix: str) -> str:
    return f"ui-{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module", autouse=True)
def _no_run_left_waiting(devstack):
    """The runs these tests leave queued (on the pool that never gets a worker) are killed after
    them, so that no other test of the session meets them."""
    yield
    for token in ("alice-token", "bob-token"):
        client = Client(devstack.api_url, token)
        page = client.request("GET", "/v1/runs", query={"state": "queued", "queue": "parked", "limit": 500})
        for run in page["runs"]:
            if (run["name"] or "").startswith("ui-"):
                client.request("POST", f"/v1/runs/{run['id']}/kill")


def row(page, run_id):
    return page.locator(f'tr[data-run="{run_id}"]')


def test_the_printed_link_signs_in_and_a_run_appears_changes_state_and_its_log_arrives(tab, alice):
    t = tab()
    t.sign_in("alice-token")
    page = t.page
    assert "alice-token" not in page.url  # taken out of the address bar at once
    assert page.evaluate("history.length") <= 2  # replaced in the history too, not pushed after it
    assert page.evaluate("sessionStorage.getItem('runplane.token')") == "alice-token"
    expect(page.locator("#who")).to_contain_text("alice")

    name = unique("web")
    run = alice.request(
        "POST",
        "/v1/runs",
        {"command": "echo first-line; sleep 1; echo second-line; echo 42 > answer", "name": name},
    )
    line = row(page, run["id"])
    expect(line).to_be_visible()  # the table refreshes by itself
    expect(line.locator(".state")).to_have_text(re.compile("preparing|running|uploading|succeeded"))
    line.get_by_role("link", name=name).click()
    page.wait_for_url(re.compile(f"#/runs/{run['id']}$"))
    expect(page.get_by_role("heading", level=1)).to_contain_text(name)
    stdout = page.get_by_label("stdout of the run")
    expect(stdout).to_contain_text("first-line")
    expect(stdout).to_contain_text("second-line")  # arrives while the page is open
    expect(page.locator("h1 .state")).to_have_text("succeeded")
    expect(page.get_by_role("button", name="Retry")).to_be_disabled()  # nothing to try again
    expect(page.get_by_role("link", name="answer")).to_have_attribute("href", re.compile("^https?://.*answer"))
    expect(page.locator("svg.waterfall g.bar")).not_to_have_count(0)
    expect(page.locator("svg.waterfall")).to_contain_text("running")

    page.get_by_label("Search").first.fill("second")
    expect(stdout).to_have_text("second-line")


def test_a_running_run_is_killed_from_its_page(tab, alice):
    run = alice.request("POST", "/v1/runs", {"command": "sleep 60", "name": unique("doomed")})
    wait_state(alice, run["id"], {"running"})
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")
    page = t.page
    expect(page.locator("h1 .state")).to_have_text("running")
    page.get_by_role("button", name="Kill").click()
    expect(page.locator("h1 .state")).to_have_text("killed")
    assert alice.request("GET", f"/v1/runs/{run['id']}")["state"] == "killed"
    expect(page.get_by_role("button", name="Kill")).to_be_disabled()
    expect(page.get_by_role("button", name="Retry")).to_be_enabled()  # it ended without succeeding
    expect(page.locator("main")).to_contain_text("not linked to the original")


def test_a_running_runs_page_offers_a_shell_to_whoever_may_open_one(tab, alice):
    run = alice.request("POST", "/v1/runs", {"command": "sleep 60", "name": unique("shell")})
    run_id = run["id"]
    wait_state(alice, run_id, {"running"})
    t = tab()
    t.sign_in("alice-token", f"/runs/{run_id}")
    commands = t.page.locator("section.sessions code")
    expect(commands).to_have_text(
        [
            f"runplane shell {run_id}",
            f"runplane exec {run_id} -- sh -c 'ls -la \"$RUNPLANE_OUTPUT\"'",
            f"runplane port-forward {run_id} 8000",
        ]
    )
    expect(t.page.get_by_role("button", name=f"Copy: runplane shell {run_id}")).to_be_visible()
    # an admin, on a pool that lets no admin in (the API would answer 404): none offered
    admin = tab()
    with admin.page.expect_response(lambda answer: answer.url.endswith("/v1/pools")):
        admin.sign_in("admin-token", f"/runs/{run_id}")
    expect(admin.page.locator("h1 .state")).to_have_text("running")
    expect(admin.page.locator("section.sessions")).to_have_count(0)
    # who is offered one, by the pool's settings
    offered = admin.page.evaluate(
        """async (id) => {
            const { sessionCommands } = await import("/ui/sessions.js");
            const run = { id, state: "running", owner: "alice", queue: "default" };
            const pool = (exec, admins, most = 4) => ({ name: "default", sessions: { allow_exec: exec,
                                                    allow_admin_exec: admins, max_sessions_per_run: most } });
            const alice = { user: "alice", scopes: ["runs:read", "runs:write"] };
            const root = { user: "root", scopes: ["admin"] };
            return [
                sessionCommands(run, alice, pool(true, false)),
                sessionCommands(run, root, pool(true, false)),
                sessionCommands(run, root, pool(true, true)),
                sessionCommands(run, alice, pool(false, true)),
                sessionCommands(run, root, pool(false, true)),
                sessionCommands({ ...run, state: "uploading" }, alice, pool(true, false)),
                sessionCommands(run, alice, { name: "default", sessions: null }),
                sessionCommands(run, alice, null),
                sessionCommands(run, alice, pool(true, false, 0)),
                sessionCommands({ ...run, spec: { interactive: true } }, alice, pool(true, false)),
            ].map((found) => found.map(([what]) => what).join(","));
        }""",
        run_id,
    )
    all_ = "Open a shell,Exec,Port-forward"
    assert offered == [all_, "", all_, "", "", "", all_, "", "", f"Attach,{all_}"]
    alice.request("POST", f"/v1/runs/{run_id}/kill")
    expect(t.page.locator("section.sessions")).to_have_count(0)  # no longer running


def test_a_run_tried_twice_shows_each_attempts_logs(tab, alice):
    run = alice.request(
        "POST",
        "/v1/runs",
        {
            "command": "echo attempt-$RUNPLANE_ATTEMPT; exit 1",
            "name": unique("twice"),
            "retry": {"attempts": 2, "on": ["nonzero_exit"]},
        },
    )
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")  # open while it is tried: "latest" follows
    page = t.page
    stdout = page.get_by_label("stdout of the run")
    expect(page.locator("h1 .state")).to_have_text("failed")
    expect(stdout).to_have_text("attempt-2\n")
    page.get_by_label("Attempt").select_option("1")
    expect(stdout).to_have_text("attempt-1\n")


def test_filters_live_in_the_url_and_choose_the_rows(tab, alice):
    ok = alice.request("POST", "/v1/runs", {"command": "true", "name": unique("fine")})
    bad = alice.request("POST", "/v1/runs", {"command": "exit 3", "name": unique("broken")})
    for r in (ok, bad):
        wait_state(alice, r["id"], TERMINAL)
    t = tab()
    t.sign_in("alice-token")
    page = t.page
    expect(row(page, bad["id"])).to_be_visible()
    page.get_by_label("State").select_option("succeeded")
    page.wait_for_url(re.compile(r"#/runs\?state=succeeded$"))
    expect(row(page, ok["id"])).to_be_visible()
    expect(row(page, bad["id"])).to_have_count(0)
    assert set(page.locator("tbody tr").evaluate_all("rows => rows.map(r => r.dataset.state)")) == {"succeeded"}

    t.go("/runs?failed=1")  # a shared view opens as it was left
    expect(page.get_by_label("Failed only")).to_be_checked()
    expect(row(page, bad["id"])).to_contain_text("nonzero_exit")
    expect(row(page, ok["id"])).to_have_count(0)
    name = page.get_by_label("Name", exact=True)
    name.fill(bad["name"])
    name.press("Enter")
    page.wait_for_url(re.compile(f"name={bad['name']}"))
    # the address changes before the page redraws for it (on hashchange), and a page still loading
    # shows one row too ("Loading…"): the row counted is a run's, once the page has drawn its answer
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    expect(row(page, bad["id"])).to_be_visible()
    # select-all takes the one row in sight, not the page's runs the filters hide
    t.answer = False
    page.get_by_label("Select every run shown").check()
    page.get_by_role("button", name="Retry selected (1)").click()
    assert len(t.dialogs) == 1
    assert t.dialogs[0].startswith("Retry 1 run(s) selected on page 1"), t.dialogs
    assert f'name containing "{bad["name"]}"' in t.dialogs[0] and "failed only" in t.dialogs[0]
    assert "not linked to the original" in t.dialogs[0]


def test_a_run_is_kept_and_let_go_from_its_page(tab, alice):
    run = alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique("kept")})
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")
    facts = t.page.locator("dl.facts")
    expect(facts).to_contain_text("Retentionkept for good")
    t.page.get_by_role("button", name="Keep").click()
    expect(facts).to_contain_text("Retentionkept, until you let it go")
    assert alice.request("GET", f"/v1/runs/{run['id']}")["retention"]["kept"] is True
    t.answer = False  # letting go asks first, and a no changes nothing
    t.page.get_by_role("button", name="Let go").click()
    assert t.dialogs == [
        f"Let run {run['id']} go? Its pool's retention keeps it for good: nothing of it will be deleted."
    ]
    assert alice.request("GET", f"/v1/runs/{run['id']}")["retention"]["kept"] is True
    t.answer = True
    t.page.get_by_role("button", name="Let go").click()
    expect(t.page.get_by_role("button", name="Keep")).to_be_visible()
    assert alice.request("GET", f"/v1/runs/{run['id']}")["retention"]["kept"] is False


def test_a_run_retention_emptied_says_so_and_letting_it_go_names_what_goes_and_when(tab, alice):
    run = alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique("swept")})
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    store = bootstrap.stack().store
    past, ahead = datetime(2025, 12, 29, 23, 30, tzinfo=UTC).timestamp(), datetime(2100, 1, 1, tzinfo=UTC).timestamp()
    # as the retention sweep leaves a run whose outputs and logs it deleted, its record due later
    dated = RunRetention(checked_at=past, outputs_at=past, logs_at=past, record_at=ahead, deleted=["outputs", "logs"])
    store.update(store.get(run["id"]), Expect(), {"retention": dated, "kept": True})
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")
    expect(t.page.locator("dl.facts")).to_contain_text(
        "Retentionkept, until you let it go (outputs and logs already deleted)"
    )
    expect(t.page.get_by_text("Outputs deleted by retention on 2025-12-29 23:30 UTC.")).to_be_visible()
    expect(t.page.locator(".logbox .hint").first).to_have_text("Logs deleted by retention on 2025-12-29 23:30 UTC.")
    t.answer = False
    t.page.get_by_role("button", name="Let go").click()
    assert t.dialogs == [
        f"Let run {run['id']} go? Its pool's retention then deletes its record on 2100-01-01 00:00 UTC."
    ]
    store.update(store.get(run["id"]), Expect(), {"retention": dated.model_copy(update={"deleted": ["outputs"]})})
    t.page.reload()
    t.page.get_by_role("button", name="Let go").click()
    assert t.dialogs[1] == (
        f"Let run {run['id']} go? Its pool's retention then deletes its logs now, record on 2100-01-01 00:00 UTC."
    )
    expect(t.page.locator("dl.facts")).to_contain_text("(outputs already deleted)")
    assert store.get(run["id"]).kept  # each answered no


def test_every_matching_run_is_killed_at_once_and_a_queued_run_says_why_it_waits(tab, alice):
    prefix = unique("parked")
    waiting = [
        alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": f"{prefix}-{i}"})
        for i in range(3)
    ]
    t = tab()
    t.sign_in("alice-token", f"/runs/{waiting[0]['id']}")
    page = t.page
    why = alice.request("GET", f"/v1/runs/{waiting[0]['id']}")["waiting_reason"]
    assert why
    expect(page.locator("p.reason")).to_have_text(why)

    # select-all then kill acts on the rows shown only, and says so before
    t.go(f"/runs?queue=parked&name={prefix}-1")
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    expect(row(page, waiting[1]["id"])).to_be_visible()
    page.get_by_label("Select every run shown").check()
    page.get_by_role("button", name="Kill selected (1)").click()
    expect(page.locator(".notice")).to_contain_text("Kill: 1 done")
    assert t.dialogs[-1].startswith("Kill 1 run(s) selected on page 1"), t.dialogs
    assert f'queue parked, name containing "{prefix}-1"' in t.dialogs[-1]
    states = [alice.request("GET", f"/v1/runs/{run['id']}")["state"] for run in waiting]
    assert states == ["queued", "killed", "queued"]

    t.go(f"/runs?queue=parked&name={prefix}")
    expect(page.locator("tbody tr[data-run]")).to_have_count(3)
    page.get_by_role("button", name="Kill all matching").click()
    expect(page.locator(".notice")).to_contain_text("Kill: 2 done")
    assert t.dialogs[-1].startswith("Kill 2 run(s) that have not ended"), t.dialogs
    for run in waiting:
        assert alice.request("GET", f"/v1/runs/{run['id']}")["state"] == "killed"
    expect(page.locator("tbody tr[data-state=killed]")).to_have_count(3)


def test_what_a_run_waits_for_and_its_inputs_are_links(tab, alice):
    first = alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique("first")})
    then = alice.request(
        "POST",
        "/v1/runs",
        {
            "command": "cat /inputs/data",
            "queue": "parked",
            "name": unique("then"),
            "after": [first["id"]],
            "inputs": {"data": f"run:{first['id']}/answer"},
        },
    )
    t = tab()
    t.sign_in("alice-token", f"/runs/{then['id']}")
    page = t.page
    inputs = page.locator("section", has=page.get_by_role("heading", name="Inputs and dependencies"))
    expect(inputs).to_contain_text("Still waiting on")
    expect(page.locator(".logbox").first).to_contain_text("waiting for the run to start")
    assert not [u for u in t.urls if f"/v1/runs/{then['id']}/logs" in u]  # a queued run has none yet
    expect(inputs.get_by_role("link", name=f"run:{first['id']}")).to_be_visible()
    inputs.get_by_role("link", name=first["id"], exact=True).first.click()
    page.wait_for_url(re.compile(f"#/runs/{first['id']}$"))
    expect(page.get_by_role("heading", level=1)).to_contain_text(first["name"])


HOSTILE_NAME = "<img src=x onerror=window.pwned=3>.pt"


def test_a_run_page_shows_its_checkpoint_and_lists_its_files_as_download_links(tab, alice, tmp_path):
    rule = {"interval": "10m", "signal": "SIGUSR1", "grace": "60s", "exit_code": 85}
    run = alice.request(
        "POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique("ckpt"), "checkpoint": rule}
    )
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")
    panel = t.page.locator("section.checkpoint")
    expect(panel).to_contain_text("No checkpoint synced yet.")
    expect(panel).not_to_contain_text("Piece")  # killed before it ran: it went in none
    expect(panel).to_contain_text(
        "synced every 10 m 0 s and whenever the command exits · on a stop: SIGUSR1, then up to 1 m 0 s to exit"
    )

    # a checkpoint as a worker syncs and records it: more files than one page, one named as markup
    directory = tmp_path / "checkpoint"
    (directory / "step").mkdir(parents=True)
    (directory / HOSTILE_NAME).write_bytes(b"weights")
    for i in range(CHECKPOINT_FILES - 1):
        (directory / "step" / f"{i:03d}.txt").write_text(f"step {i}\n")
    stack = bootstrap.stack()
    made = sync(stack.objects, run["id"], directory, None, attempt=2)
    status = CheckpointStatus(
        seq=made.seq, attempt=2, files=len(made.files), bytes=made.total_bytes, synced_at=made.created_at
    )
    stack.store.update(stack.store.get(run["id"]), Expect(), {"checkpoint": status, "pieces": 2})
    t.page.reload()
    expect(panel).to_contain_text(f"Number{made.seq}")
    expect(panel).to_contain_text(f"Files{CHECKPOINT_FILES} ({made.total_bytes} B)")
    expect(panel).to_contain_text("Synced byattempt 2")
    expect(panel).to_contain_text("Pieceswent in 3")  # two pieces ended by exit 85, the third its last
    files = panel.locator("ul.checkpoint-files li")
    expect(files).not_to_have_count(0)
    shown = files.count()
    assert shown < CHECKPOINT_FILES  # a page at a time
    while panel.get_by_role("button", name="More files").is_visible():
        panel.get_by_role("button", name="More files").click()
        expect(files).not_to_have_count(shown)
        shown = files.count()
    expect(files).to_have_count(CHECKPOINT_FILES)
    # the hostile name is text, its link downloads its bytes
    link = panel.get_by_role("link", name=HOSTILE_NAME)
    expect(link).to_have_attribute("download", HOSTILE_NAME)
    assert urllib.request.urlopen(link.get_attribute("href"), timeout=10).read() == b"weights"
    assert t.page.evaluate("window.pwned") is None
    assert t.page.locator("main img").count() == 0
    expect(panel.get_by_role("link", name="step/007.txt")).to_be_visible()


def test_a_run_page_shows_the_pools_it_may_run_on_and_which_one_it_waits_on(tab, alice):
    run = alice.request(
        "POST",
        "/v1/runs",
        {"command": "true", "queue": ["parked", "default"], "fallback_after": "1h", "name": unique("chain")},
    )
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")
    chain = t.page.get_by_role("list", name="Pools in order")
    expect(chain.locator("li")).to_have_text(["parked (now)", "default"])
    expect(chain.locator("li[aria-current=true]")).to_have_text("parked (now)")
    expect(t.page.locator("dl.facts")).to_contain_text("moves to the next pool if not started within 1 h 0 m")
    why = alice.request("GET", f"/v1/runs/{run['id']}")["waiting_reason"]
    assert "; falls back to pool default at " in why
    # as the API said it at the page's read: how long is left changes from one read to the next
    expect(t.page.locator("p.reason")).to_have_text(re.compile(re.escape(why.rsplit(" (in ", 1)[0]) + r" \(in .+\)$"))
    # once moved on: the pool it left is marked so, the timeline has the move
    moved = t.page.evaluate(
        """async () => {
            const { poolChain } = await import("/ui/run.js");
            const spec = { queue: "spot", fallback: ["ondemand", "reserved"], fallback_after_preemptions: 2 };
            const drawn = poolChain({ queue: "ondemand", spec });
            const single = poolChain({ queue: "default", spec: { queue: null, fallback: [] } });
            const at = "2026-11-23T10:42:05Z";
            const waiting = poolChain({ queue: "spot", state: "queued", preemptions: 1, fallback_at: at, spec });
            return [[...drawn.querySelectorAll("li")].map((li) => li.className + ":" + li.textContent),
                    drawn.textContent, single, waiting.textContent, waiting.querySelector("time").dateTime];
        }"""
    )
    assert moved[0] == ["left:spot (left)", "now:ondemand (now)", "next:reserved"]
    assert moved[1].endswith("moves to the next pool after 2 preemption(s) there")
    assert moved[2] == "default"
    assert "; preempted 1 of 2 time(s) on spot" in moved[3] and "next move at " in moved[3]
    assert moved[4] == "2026-11-23T10:42:05Z"
    timeline = t.page.locator("ul.timeline li")
    expect(timeline.first).to_contain_text("queued")


def test_the_runs_table_refreshes_without_moving_the_page_or_the_focus(tab, alice):
    for i in range(3):
        alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique(f"filler{i}")})
    t = tab(width=1280, height=300)
    t.sign_in("alice-token")
    page = t.page
    expect(page.locator("tbody tr[data-run]")).not_to_have_count(0)
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    box = page.locator("tbody tr[data-run] input[type=checkbox]").last
    box.focus()
    scrolled = page.evaluate("window.scrollY")
    assert scrolled > 0
    before = page.locator(".status-line").inner_text()
    expect(page.locator(".status-line")).not_to_have_text(before)  # refreshed since
    assert page.evaluate("window.scrollY") == scrolled
    expect(box).to_be_focused()  # the keyboard keeps its place

    # an API that is unwell: the loop waits as long as it asks (Retry-After), and the error is
    # put on the page once, not announced again on every refresh
    asked: list[float] = []

    def unwell(route):
        asked.append(time.monotonic())
        route.fulfill(status=503, headers={"Retry-After": "3"}, json={"error": {"code": "busy", "message": "busy"}})

    runs = re.compile(r"/v1/runs\?")
    page.route(runs, unwell)
    alert = page.locator(".status-line [role=alert]")
    expect(alert).to_have_text("busy")
    alert.evaluate("el => { el.dataset.first = 'yes'; }")
    with page.expect_request(runs, timeout=10_000):
        pass
    expect(alert).to_have_count(1)
    expect(alert).to_have_attribute("data-first", "yes")  # the same message, not a new one
    assert len(asked) == 2 and asked[1] - asked[0] >= 2.9, asked  # not before the server said
    page.unroute(runs)
    t.errors.clear()  # the browser logs each 503 it was answered


def test_an_admin_sees_a_users_runs_with_their_owner(tab, alice, bob):
    run = alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique("owned")})
    theirs = bob.request(
        "POST", "/v1/sweeps", {"run": {"command": "true", "queue": "parked", "name": unique("bobs")}, "count": 1}
    )
    t = tab()
    t.sign_in("admin-token", "/runs?owner=alice")
    page = t.page
    expect(page.locator("#who")).to_contain_text("admin")
    expect(page.get_by_role("columnheader", name="Owner")).to_be_visible()
    expect(row(page, run["id"])).to_contain_text("alice")
    expect(page.get_by_label("Owner")).to_have_value("alice")
    expect(page.locator("#f-users option[value=bob]")).to_have_count(1)  # users to choose from

    # a sweep is read whole (the API takes no owner or queue with it): the page says so and
    # shows no owner filter it does not apply
    t.go(f"/runs?owner=alice&queue=parked&sweep={theirs['id']}")
    expect(page.locator(".notice")).to_contain_text("cannot be combined with owner or queue")
    assert page.evaluate("location.hash") == f"#/runs?sweep={theirs['id']}"
    expect(page.get_by_label("Owner")).to_have_value("")
    expect(page.get_by_label("Owner")).to_be_disabled()
    expect(page.get_by_label("Queue")).to_be_disabled()
    expect(page.locator("tbody tr[data-run]")).to_have_count(1)
    expect(page.locator("tbody tr[data-run]")).to_contain_text("bob")
    bob.request("POST", f"/v1/sweeps/{theirs['id']}/kill")

    # one refresh loop, however often the list is asked to read again
    t.go("/sweeps")
    expect(page.get_by_text("Loading…")).to_have_count(0)
    page.evaluate("""() => { const owner = document.getElementById("s-owner");
        for (let i = 0; i < 5; i += 1) owner.dispatchEvent(new Event("change")); }""")
    page.wait_for_timeout(500)  # the five reads are answered
    count = len([u for u in t.urls if "/v1/sweeps?" in u])
    page.wait_for_timeout(6500)  # two periods of the sweeps' refresh
    assert len([u for u in t.urls if "/v1/sweeps?" in u]) - count <= 3


def test_an_admin_never_retries_another_users_runs_as_the_admins(tab, alice, devstack):
    """A retry submits the spec again as a run of whoever asks (their quota, groups and outputs): an
    admin's page leaves another user's runs to their owner, says so, and submits nothing."""
    name = unique("theirs")
    run = alice.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": name})
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    sweep = alice.request(
        "POST", "/v1/sweeps", {"run": {"command": "true", "queue": "parked", "name": name}, "count": 1}
    )
    alice.request("POST", f"/v1/sweeps/{sweep['id']}/kill")
    t = tab()
    t.sign_in("admin-token", f"/runs?owner=alice&name={name}")
    page = t.page
    expect(row(page, run["id"])).to_contain_text("killed")
    expect(page.get_by_role("button", name="Retry all matching")).to_be_disabled()
    page.get_by_label("Select every run shown").click()
    expect(page.get_by_role("button", name="Retry selected (0)")).to_be_disabled()

    t.go(f"/runs?sweep={sweep['id']}")  # a sweep is listed whole, whoever owns it
    expect(page.locator("tbody tr[data-run]")).to_contain_text("killed")
    page.get_by_role("button", name="Retry all matching").click()
    expect(page.locator(".notice")).to_contain_text("1 matching run(s) of other users are left alone")
    t.go(f"/runs/{run['id']}")
    expect(page.get_by_role("button", name="Retry", exact=True)).to_be_disabled()
    expect(page.get_by_text("Only its owner can retry")).to_be_visible()
    assert t.dialogs == []
    made = Client(devstack.api_url, "admin-token").request("GET", "/v1/runs", query={"limit": 100})
    assert [r for r in made["runs"] if r["name"] == name] == []


def test_a_sweep_shows_its_failures_and_retries_them(tab, alice):
    # odd members fail on their first try only
    first_try = '[ "$RUNPLANE_RUN_ID" != "$RUNPLANE_SWEEP_ID-$RUNPLANE_SWEEP_INDEX" ]'
    name = unique("grid")
    sweep = alice.submit_sweep(f"{first_try} || [ $((RUNPLANE_SWEEP_INDEX % 2)) -eq 0 ]", count=2, sweep_name=name)
    sweep.wait(timeout=120, poll=0.3)
    t = tab()
    t.sign_in("alice-token", "/sweeps")
    page = t.page
    page.get_by_role("link", name=name).click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(name)
    expect(page.locator("section", has=page.get_by_role("heading", name="Failures by reason"))).to_contain_text(
        "nonzero_exit"
    )
    expect(page.locator(".grid .cell.state-failed")).to_have_count(1)
    colour = "el => getComputedStyle(el).backgroundColor"
    failed = page.locator(".grid .cell.state-failed").first.evaluate(colour)
    assert failed != page.locator(".grid .cell.state-succeeded").first.evaluate(colour)  # coloured by state
    page.get_by_role("button", name="Retry failed members").click()
    expect(page.locator(".notice")).to_contain_text("1 member(s) run again")
    expect(page.locator(".grid .cell.state-succeeded")).to_have_count(2, timeout=90_000)
    assert sweep.refresh().view.counts == {"succeeded": 2}


def test_a_run_page_is_told_of_a_change_by_a_waiting_read(tab, alice):
    """The page of a run that goes holds a read open (wait, since) that the run's change answers."""
    run = alice.request("POST", "/v1/runs", {"command": "echo hi", "queue": "parked", "name": unique("watched")})
    t = tab()
    t.sign_in("alice-token", f"/runs/{run['id']}")
    expect(t.page.locator("h1 .state")).to_have_text("queued")
    watched = re.compile(rf"/v1/runs/{run['id']}\?wait=20&since=[0-9a-f]{{16}}$")
    deadline = time.monotonic() + 30
    while not any(watched.search(u) for u in t.urls) and time.monotonic() < deadline:
        t.page.wait_for_timeout(100)
    assert any(watched.search(u) for u in t.urls), [u for u in t.urls if run["id"] in u]
    alice.request("POST", f"/v1/runs/{run['id']}/kill")
    expect(t.page.locator("h1 .state")).to_have_text("killed")


def test_another_users_run_is_not_found(tab, bob):
    theirs = bob.request("POST", "/v1/runs", {"command": "true", "queue": "parked", "name": unique("bobs")})
    t = tab()
    t.sign_in("alice-token", f"/runs/{theirs['id']}")
    expect(t.page.get_by_role("heading", level=1)).to_have_text("Run not found")
    t.go("/sweeps/..%2F..%2Fv1%2Fme")
    expect(t.page.get_by_role("heading", level=1)).to_have_text("Sweep not found")
    t.errors.clear()  # the browser logs each 404 it was answered


def test_a_page_without_a_token_asks_for_one(tab):
    t = tab()
    page = t.page
    page.goto(f"{t.base}/ui/#/runs")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("Token").fill("not-a-token")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("refused")
    assert page.evaluate("sessionStorage.getItem('runplane.token')") is None
    page.get_by_label("Token").fill("alice-token")
    page.get_by_label("Token").press("Enter")
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    t.errors.clear()  # the browser logs the 401 it was answered

    # a link with another token says whom it signs in as, and changes nothing unless told to
    page.goto(dashboard_link(t.base, "bob-token"))
    expect(page.locator("#link-user")).to_have_text("bob")
    expect(page.locator(".signin")).to_contain_text("This tab is signed in as alice")
    page.get_by_role("button", name="Stay signed in as alice").click()
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.locator("#who")).to_contain_text("alice")
    assert page.evaluate("sessionStorage.getItem('runplane.token')") == "alice-token"
    page.goto(dashboard_link(t.base, "bob-token"))
    page.get_by_role("button", name="Sign in as bob").click()
    expect(page.locator("#who")).to_contain_text("bob")
    assert page.evaluate("sessionStorage.getItem('runplane.token')") == "bob-token"
    page.goto(dashboard_link(t.base, "bob-token"))  # the same token: nothing to ask
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    expect(page.locator("#link-user")).to_have_count(0)
    assert t.dialogs == []

    # a link whose token cannot be read (cut mid-escape) asks for the token instead
    page.goto(f"{t.base}/ui#token=%E0%A4%A")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.get_by_role("alert")).to_contain_text("not valid")
    assert "token=" not in page.url


def test_a_link_opened_in_a_fresh_tab_signs_in_only_when_told_whom_as(tab):
    """A link someone else sent (login CSRF) must not sign a fresh tab in as its token's user: the
    page says whom it signs in as, and keeps nothing until that is accepted."""
    t = tab()
    page = t.page
    page.goto(dashboard_link(t.base, "bob-token"))
    expect(page.locator("#link-user")).to_have_text("bob")
    assert "token=" not in page.url
    assert page.evaluate("sessionStorage.getItem('runplane.token')") is None
    expect(page.locator("#nav")).to_be_hidden()
    assert not [u for u in t.urls if "/v1/" in u and "/v1/me" not in u]  # nothing read as bob
    page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('runplane.token')") is None

    page.goto(dashboard_link(t.base, "not-a-token"))
    expect(page.get_by_role("alert")).to_contain_text("The link's token was refused")
    assert page.evaluate("sessionStorage.getItem('runplane.token')") is None
    t.errors.clear()  # the browser logs the 401 it was answered

    page.goto(dashboard_link(t.base, "bob-token"))
    page.get_by_role("button", name="Sign in as bob").click()
    expect(page.locator("#who")).to_contain_text("bob")
    assert page.evaluate("sessionStorage.getItem('runplane.token')") == "bob-token"


def test_only_web_addresses_become_links_and_errors_make_the_page_wait_longer(tab):
    t = tab()
    t.sign_in("alice-token")
    links, waits = t.page.evaluate(
        """async () => {
            const dom = await import("/ui/dom.js");
            const api = await import("/ui/api.js");
            const links = ["javascript:alert(1)", "JaVaScRiPt:alert(1)", "data:text/html,x", "/v1/me", "vbscript:x",
                           "https://bucket.example/out?sig=1", "http://127.0.0.1/x", "#/runs/r1"].map(dom.safeHref);
            const every = 1000;
            const waits = [
                dom.backoff({ status: 503 }, every, 1), dom.backoff({ status: 503 }, every, 3),
                dom.backoff({ status: 0 }, every, 30), dom.backoff({ status: 429, retryAfter: 20000 }, every, 1),
                dom.backoff({ status: 400 }, every, 5), api.retryAfterMs("7"), api.retryAfterMs("soon"),
            ];
            return [links, waits];
        }"""
    )
    assert links == [None] * 5 + ["https://bucket.example/out?sig=1", "http://127.0.0.1/x", "#/runs/r1"]
    assert waits == [2000, 8000, 60_000, 20_000, 1000, 7000, None]

    # three reads started at once (a user paging fast), answered last first: only the last one's
    # reply is drawn, and only it arms the next read, so one loop goes on
    drawn, reads = t.page.evaluate(
        """async () => {
            const { refresher } = await import("/ui/dom.js");
            const answers = [];
            const drawn = [];
            let reads = 0;
            const loop = refresher(async (current) => {
                const n = ++reads;
                await new Promise((done) => answers.push(done));
                if (current()) drawn.push(n);
            }, { every: 30 });
            loop.now(); loop.now(); loop.now();
            for (const answer of [...answers].reverse()) answer();
            await new Promise((done) => setTimeout(done, 300));
            loop.stop();
            return [drawn, reads];
        }"""
    )
    assert (drawn, reads) == ([3], 4)


def test_markup_in_a_run_name_and_its_log_is_shown_as_text(tab, alice):
    name = "<img src=x onerror=window.pwned=1>"
    run = alice.request(
        "POST", "/v1/runs", {"command": "echo '<script>window.pwned=2</script><b>bold</b>'", "name": name}
    )
    wait_state(alice, run["id"], TERMINAL)
    t = tab()
    t.sign_in("alice-token")
    page = t.page
    expect(row(page, run["id"])).to_contain_text(name)
    t.go(f"/runs/{run['id']}")
    expect(page.get_by_label("stdout of the run")).to_have_text("<script>window.pwned=2</script><b>bold</b>\n")
    assert page.evaluate("window.pwned") is None
    assert page.locator("main img, main script, pre b").count() == 0


def test_the_secrets_page_lists_names_and_no_page_holds_a_value(tab, alice):
    """The Secrets page (from the navigation) lists the secrets alice may use; it and the page of a
    run that uses one show references only: the value's bytes are in no page and no answer the
    page read."""
    value = f"sekrit-{uuid.uuid4().hex}"
    ref = unique("key")
    alice.request("PUT", f"/v1/secrets/{ref}", {"value": value})
    run = alice.request(
        "POST",
        "/v1/runs",
        {
            "command": "true",
            "name": unique("secret"),
            "queue": "parked",
            "secrets": {"TOKEN": ref},
            "image_pull_secret": ref,
        },
    )
    try:
        t = tab()
        answers: list = []
        t.page.on("response", lambda r: "/v1/" in r.url and answers.append(r))
        t.sign_in("alice-token")
        page = t.page
        page.get_by_role("link", name="Secrets").click()
        page.wait_for_url(re.compile("#/secrets$"))
        listed = page.locator(f'tr[data-ref="{ref}"]')
        expect(listed).to_contain_text("user alice")
        expect(listed.locator("th")).to_have_text(ref)
        expect(page.get_by_role("link", name="Secrets")).to_have_attribute("aria-current", "page")
        assert value not in page.content()
        t.go(f"/runs/{run['id']}")
        expect(page.locator("ul.secrets li")).to_have_text([f"TOKEN → {ref}"])
        expect(page.locator("main")).to_contain_text(f"Image pulled with the login in {ref}")
        assert value not in page.content()
        assert answers and all(value not in r.text() for r in answers if r.ok and r.request.method == "GET")
    finally:
        alice.request("POST", f"/v1/runs/{run['id']}/kill")
        alice.request("DELETE", f"/v1/secrets/{ref}")


def test_a_run_page_shows_its_upload_inputs_and_working_directory(tab, alice, tmp_path):
    (tmp_path / "train.py").write_text(f"print({uuid.uuid4().hex!r})\n")
    run = alice.submit("true", queue="parked", uploads={"code": tmp_path}, workdir="/inputs/code")
    try:
        sha = run.view.spec.inputs["code"].removeprefix("upload:")
        t = tab()
        t.sign_in("alice-token", f"/runs/{run.id}")
        facts = t.page.locator("dl.facts")
        expect(facts).to_contain_text("Working directory/inputs/code")
        expect(t.page.locator("section[aria-labelledby=h-in] li")).to_have_text(
            [f"code ← upload {sha[:12]}…, read-only"]
        )
    finally:
        run.kill()


def test_the_workers_table_says_which_image_a_starting_worker_pulls_and_how_far(tab, devstack):
    """The worker's item as a prefetching agent writes it (worker_agent/prefetch.py), in the pool that
    never gets a worker, so that no run waits on it."""
    now = time.time()
    worker = Worker(
        id=unique("w-pull"),
        pool="parked",
        status="starting",
        pulling=Pulling(image="registry.example/lab/train:3", done=858993459, total=1932735283),
        started_at=now,
        heartbeat_at=now,
    )
    workers = bootstrap.stack().workers
    workers.put(worker)
    try:
        t = tab()
        t.sign_in("alice-token", "/pools")
        row = t.page.locator(f'tr[data-worker="{worker.id}"]')
        expect(row).to_contain_text("starting")
        expect(row).to_contain_text("pulling registry.example/lab/train:3 (819.2 MiB of 1.8 GiB)")
    finally:
        workers.delete(worker.id)


def test_every_page_reads_at_desktop_and_phone_width_and_by_keyboard(tab, alice, devstack):
    run = alice.request("POST", "/v1/runs", {"command": "echo shown; echo 1 > out", "name": unique("shot")})
    wait_state(alice, run["id"], TERMINAL)
    sweeps = alice.request("GET", "/v1/sweeps", query={"limit": 1})["sweeps"]
    pages = {"runs": "/runs", "run": f"/runs/{run['id']}", "pools": "/pools", "usage": "/usage", "secrets": "/secrets"}
    if sweeps:
        pages["sweep"] = f"/sweeps/{sweeps[0]['id']}"
    for width, height, suffix in ((1280, 800, ""), (390, 844, "-phone")):
        t = tab(width=width, height=height)
        t.sign_in("alice-token")
        for name, route in pages.items():
            t.go(route)
            expect(t.page.get_by_text("Loading…")).to_have_count(0)  # every part has drawn its answer
            expect(t.page.locator(".msg-error")).to_have_count(0)
            if name == "pools":  # the pool that ran the run, and the worker that ran it
                expect(t.page.locator('tr[data-pool="default"]')).to_contain_text("local")
                worker = alice.request("GET", f"/v1/runs/{run['id']}")["worker_id"]
                expect(t.page.locator(f'tr[data-worker="{worker}"]')).to_contain_text("default")
            if name == "usage":
                expect(t.page.get_by_role("table", name="Usage by pool")).to_contain_text("default")
            wide = t.page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert wide <= 0, f"{name} at {width}px is {wide}px wider than the window"
            if SHOTS and (not suffix or name in ("runs", "run")):
                t.page.screenshot(path=str(Path(SHOTS) / f"dashboard-{name}{suffix}.png"))
    # keyboard: the skip link, then the pages by Tab and Enter, focus drawn
    t = tab()
    t.sign_in("alice-token")
    page = t.page
    page.reload()  # a signed-in tab as it loads, focus nowhere yet (the sign-in took a click)
    expect(page.get_by_role("heading", name="Runs")).to_be_visible()
    page.locator("body").focus()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Runs", exact=True)).to_be_focused()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(re.compile("#/sweeps$"))
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline == "solid"


def test_the_azure_front_serves_the_same_page(tab, azure_devstack):
    alice = Client(azure_devstack.api_url, "alice-token")
    run = alice.request("POST", "/v1/runs", {"command": "echo from-azure", "name": unique("azure")})
    t = tab(azure_devstack.api_url)
    t.sign_in("alice-token")
    expect(row(t.page, run["id"])).to_be_visible()
    row(t.page, run["id"]).get_by_role("link").click()
    expect(t.page.get_by_label("stdout of the run")).to_have_text("from-azure\n")
    expect(t.page.locator("h1 .state")).to_have_text("succeeded")
    for route in ("/sweeps", "/pools", "/secrets", "/usage"):  # every other page draws on this front too
        t.go(route)
        expect(t.page.get_by_text("Loading…")).to_have_count(0)
        expect(t.page.locator(".msg-error")).to_have_count(0)
    expect(t.page.get_by_role("table", name="Usage by pool")).to_contain_text("default")
