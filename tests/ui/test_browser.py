"""``nestegg ui`` end to end: a real server process, a real headless Chromium."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest

from tests.cli.conftest import Filled, fill
from tests.ui.browser import ROOT, Server, child_env, launch_chromium, run_apart, stop, ui_server
from tests.ui.pipelines import GATE_ENV

pytestmark = pytest.mark.browser

LIVE_SECONDS = 2.0
"""A step committed by another process shows on the open page within this."""
SCREENSHOT_ENV = "NESTEGG_UI_SCREENSHOT"
"""Where to save a screenshot of a run page (docs/ui-run.png is made this way)."""
LIVE_CHILD = """
import asyncio, sys
from nestegg.checkpoint import CheckpointConfig, CheckpointPolicy
from nestegg.checkpoint.stores import open_store
from tests.ui.pipelines import live_pipeline

policy = CheckpointPolicy(keep_latest=None)
config = CheckpointConfig(storage=open_store(sys.argv[1]), policy=policy)
asyncio.run(live_pipeline(config).run({"name": "live"}, run_id="live", timeout=60))
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium for the module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_chromium(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def store(tmp_path: Path) -> tuple[str, Filled]:
    """A SQLite store with a completed, a failed and an interrupted run."""
    url = f"sqlite:///{tmp_path / 'ui.db'}"
    return url, run_apart(fill(url))


@pytest.fixture
def server(tmp_path: Path, store: tuple[str, Filled]) -> Iterator[Server]:
    """``nestegg ui`` on that store, writes allowed, the test pipeline as its Clutch."""
    app = "tests.cli.pipeline_app:pipeline"
    with ui_server(tmp_path / "home", "--store", store[0], "--allow-writes", "--app", app) as s:
        yield s


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser page (its own storage)."""
    context = browser.new_context(viewport={"width": 1000, "height": 720})
    opened = context.new_page()
    yield opened
    context.close()


def _agents(page: Any) -> list[str]:
    return [text.strip() for text in page.locator("#steps td.agent").all_inner_texts()]


def test_open_the_runs_page_then_a_run_and_see_its_steps(
    server: Server, store: tuple[str, Filled], page: Any
) -> None:
    page.goto(server.base + "/")
    assert page.locator("table.runs tbody tr").count() == 3
    assert page.locator("tr.flagged").count() == 1  # the interrupted run
    page.click(f"a[href='/runs/{store[1].ok}']")
    page.wait_for_selector("#steps")
    assert _agents(page) == ["fetch", "enrich", "report"]
    page.locator("tr.step[data-seq='2'] button.calls").click()
    page.wait_for_selector("table.journal")
    assert "tests.cli.pipeline_app.ask_size" in page.inner_text("table.journal")
    assert page.inner_text("table.journal td.how") == "executed"
    assert re.fullmatch(r"\d+(µs|ms)", page.inner_text("table.journal td.call-dur"))


def test_a_step_committed_by_another_process_appears_without_reload(
    server: Server, store: tuple[str, Filled], page: Any, tmp_path: Path
) -> None:
    page.goto(server.base + "/")
    page.evaluate("window.notReloaded = true")
    env = child_env(tmp_path / "home", **{GATE_ENV: str(tmp_path)})
    child = subprocess.Popen([sys.executable, "-c", LIVE_CHILD, store[0]], cwd=ROOT, env=env)
    try:
        page.wait_for_selector("a[href='/runs/live']", timeout=20_000)  # the table is live too
        assert page.evaluate("window.notReloaded") is True
        page.click("a[href='/runs/live']")
        page.wait_for_selector("#steps td.agent")
        assert _agents(page) == ["first"]
        page.evaluate("window.notReloaded = true")
        (tmp_path / "go").touch()
        started = time.monotonic()
        page.wait_for_selector("#steps td.agent:text-is('second')", timeout=LIVE_SECONDS * 1000)
        shown = time.monotonic() - started
        print(f"step shown {shown * 1000:.0f} ms after it was let through")
        assert page.evaluate("window.notReloaded") is True
        page.wait_for_selector("#status.completed", timeout=10_000)
        assert _agents(page) == ["first", "second"]
        assert page.inner_text("#range") == "steps 1\N{EN DASH}2 of 2"
        first_bar = str(page.locator("tr[data-seq='1'] .bar").get_attribute("style"))
        assert float(first_bar.split(":")[1].strip(" %;")) < 50  # rescaled to the longer step
        assert child.wait(30) == 0
    finally:
        stop(child)


def test_resume_an_interrupted_run_from_its_page(
    server: Server, store: tuple[str, Filled], page: Any
) -> None:
    gone = store[1].gone
    page.on("dialog", lambda dialog: dialog.accept())  # "Resume this run?"
    page.goto(f"{server.base}/runs/{gone}?token={server.token}")
    assert page.inner_text("#status") == "interrupted"
    assert _agents(page) == ["fetch"]
    assert page.inner_text("tr.pending td.pending-agent") == "enrich"  # started, not committed
    page.click("button.act:text-is('resume')")
    page.wait_for_selector("#status.completed", timeout=15_000)  # live, no reload
    assert _agents(page) == ["fetch", "enrich", "report"]
    assert page.locator("tr.pending").count() == 0  # step 2 was committed: no longer pending
    incidents = page.locator("tr.incident").all_inner_texts()
    assert any("step 2 (enrich) failed" in text for text in incidents)
    assert any("crash or takeover" in text for text in incidents)
    page.locator("tr.step[data-seq='2'] button.calls").click()
    page.wait_for_selector("table.journal")
    # recorded by the attempt that failed, replayed by the resume: the first call's duration
    assert page.inner_text("table.journal td.how") == "replayed"
    assert re.fullmatch(r"\d+(µs|ms)", page.inner_text("table.journal td.call-dur"))
    if target := os.environ.get(SCREENSHOT_ENV):
        page.screenshot(path=str(ROOT / target), full_page=True)


def test_diff_two_checkpoints(server: Server, store: tuple[str, Filled], page: Any) -> None:
    page.goto(f"{server.base}/runs/{store[1].ok}")
    ids = [str(link.get_attribute("href")).rsplit("/", 1)[1] for link in page.locator("a.cp").all()]
    page.fill("#diff-form input[name=old]", ids[0])
    page.fill("#diff-form input[name=new]", ids[2])
    page.click("#diff-form button")
    page.wait_for_selector("table.diff")
    rows = page.locator("table.diff tr").all_inner_texts()
    assert any(r.startswith("+") and "data.items" in r for r in rows)
    assert any(r.startswith("+") and "data.report" in r for r in rows)
    page.goto(f"{server.base}/checkpoints/{ids[2]}")
    page.click("#diff-previous")
    page.wait_for_selector("table.diff")
    assert any("data.report" in r for r in page.locator("table.diff tr").all_inner_texts())


def test_fork_with_edited_data_and_a_write_without_the_token_is_refused(
    server: Server, store: tuple[str, Filled], page: Any
) -> None:
    ok = store[1].ok
    delete = "async ([url, headers]) => (await fetch(url, {method: 'DELETE', headers})).status"
    target = f"{server.base}/api/runs/{ok}"
    page.goto(server.base + "/")
    assert page.evaluate(delete, [target, {}]) == 403  # this page, but no token
    page.goto("data:text/html,<p>another site</p>")
    with pytest.raises(Exception, match="Failed to fetch"):  # another origin: blocked
        page.evaluate(delete, [target, {"X-Nestegg-Token": server.token}])
    page.goto(f"{server.base}/?token={server.token}")  # kept by the page, dropped from the URL
    assert "token" not in page.url
    page.goto(f"{server.base}/runs/{ok}")
    assert _agents(page) == ["fetch", "enrich", "report"]  # the refused delete changed nothing
    second = str(page.locator("a.cp").nth(1).get_attribute("href"))
    page.goto(server.base + second)
    editor = page.locator("#fork-data")
    editor.fill('{"name": "Forked", "items": [')
    assert page.locator("#fork").is_disabled()
    assert "not valid JSON" in page.inner_text("#fork-error")
    editor.fill('{"name": "Forked", "items": [7], "tags": {"size": "s"}, "page": "p"}')
    assert page.locator("#fork").is_enabled()
    page.click("#fork")
    page.wait_for_url(f"{server.base}/runs/*")
    assert page.url != f"{server.base}/runs/{ok}"
    page.wait_for_selector("#status.completed", timeout=15_000)
    assert "Forked: 1 items" in page.inner_text("#summary")
    assert page.locator(f"section.family a[href='/runs/{ok}']").count() == 1
    page.goto(server.base + second)  # the codec's form, an int JSON.parse would round
    editor.fill('{"$ne": "map", "v": [[1, "a"], ["name", "N"], ["items", [9007199254740993]]]}')
    page.click("#fork")
    page.wait_for_url(f"{server.base}/runs/*")
    page.wait_for_selector("#status.completed", timeout=15_000)
    assert '[1,"a"]' in page.inner_text("#result")
    assert "[9007199254740993]" in page.inner_text("#result")


def test_fork_is_not_offered_from_a_checkpoint_of_another_pipelines_run(
    tmp_path: Path, store: tuple[str, Filled], page: Any
) -> None:
    app = "tests.ui.pipelines:waiting_app"  # the pipeline "waiting", not the filled runs'
    with ui_server(tmp_path / "home", "--store", store[0], "--allow-writes", "--app", app) as s:
        page.goto(f"{s.base}/runs/{store[1].ok}?token={s.token}")
        second = str(page.locator("a.cp").nth(1).get_attribute("href"))
        page.goto(s.base + second)
        fork = page.locator("#fork")
        assert fork.is_disabled()
        checkpoint = second.rsplit("/", 1)[1]
        why = f"checkpoint '{checkpoint}' belongs to pipeline 'cli-test', not 'waiting'"
        assert page.inner_text("#fork-refused") == why
        assert fork.get_attribute("title") == why
        assert page.locator("#fork-data").count() == 0  # no editor to fill in vain


def test_markup_is_shown_as_text_and_never_runs(tmp_path: Path, browser: Any) -> None:
    from tests.ui.pipelines import HOSTILE_AGENT, HOSTILE_RUN_ID, hostile_pipeline

    url = f"sqlite:///{tmp_path / 'h.db'}"

    async def run() -> None:
        from nestegg.checkpoint.stores import open_store

        opened = open_store(url)
        try:
            await hostile_pipeline(opened).run({"x": 1}, run_id=HOSTILE_RUN_ID)
        finally:
            await opened.close()

    run_apart(run())
    context = browser.new_context()
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    try:
        with ui_server(tmp_path / "home", "--store", url) as server:
            page.goto(server.base + "/")
            assert HOSTILE_RUN_ID in page.inner_text("table.runs")
            page.locator("table.runs a").first.click()
            page.wait_for_selector("#steps")
            assert page.inner_text("h1.run-id") == HOSTILE_RUN_ID
            assert _agents(page) == [HOSTILE_AGENT]
            assert page.locator("img").count() == 0
    finally:
        context.close()
    assert dialogs == []


def test_a_long_value_is_cut_and_shown_whole_on_demand(tmp_path: Path, page: Any) -> None:
    from nestegg.checkpoint.stores import open_store
    from tests.ui.pipelines import hostile_pipeline

    url = f"sqlite:///{tmp_path / 'long.db'}"
    long_text = "y" * 400

    async def run() -> None:
        opened = open_store(url)
        try:
            await hostile_pipeline(opened).run({"text": long_text}, run_id="long-value")
        finally:
            await opened.close()

    run_apart(run())
    with ui_server(tmp_path / "home", "--store", url) as server:
        page.goto(f"{server.base}/runs/long-value")
        page.click("a.cp")
        holder = page.locator("#state-tree span.val").first
        shown = holder.inner_text()
        assert long_text not in shown and "show all (402 chars)" in shown
        holder.locator("button.expand").click()
        assert page.locator("#state-tree").inner_text().count(long_text) == 1


def _left_waiting(url: str, *run_ids: str) -> None:
    """Runs of the waiting pipeline in the store at ``url``, left waiting for its signal."""
    from nestegg.checkpoint.stores import open_store
    from tests.ui.pipelines import start_waiting

    async def wait() -> None:
        opened = open_store(url)
        try:
            for run_id in run_ids:
                await start_waiting(opened, run_id, nap=False)
        finally:
            await opened.close()

    run_apart(wait())


def test_a_waiting_run_is_flagged_in_the_table_and_on_its_page(
    server: Server, store: tuple[str, Filled], page: Any
) -> None:
    _left_waiting(store[0], "approve-me")
    page.goto(server.base + "/")
    row = page.locator("tr.run", has=page.locator("a[href='/runs/approve-me']"))
    assert "flagged" in str(row.get_attribute("class"))
    assert row.locator(".status").inner_text() == "waiting"
    assert row.locator(".flag").inner_text() == "⚑ waits for signal “approval”, no deadline"
    assert page.locator("tr.flagged").count() == 2  # and the interrupted run
    page.click("a[href='/runs/approve-me']")
    page.wait_for_selector("#flag")
    assert page.inner_text("#status") == "waiting"
    assert "waits for signal “approval”, no deadline" in page.inner_text("#flag")
    assert "nestegg signal approve-me approval VALUE" in page.inner_text("#flag")
    assert page.inner_text("tr.pending td.pending-agent") == "approve"  # the step that waits


def _nestegg(home: Path, *args: str) -> None:
    """``nestegg ARGS`` in a process of its own, which must succeed."""
    command = [sys.executable, "-m", "nestegg.cli", *args]
    done = subprocess.run(command, cwd=ROOT, env=child_env(home), capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_waiting_runs_page_shows_a_signal_sent_from_elsewhere_without_reload(
    tmp_path: Path, store: tuple[str, Filled], page: Any
) -> None:
    from nestegg.ui.resumes import WAIT_NOT_OVER
    from tests.ui.pipelines import SIGNAL

    _left_waiting(store[0], "stored", "resumed")
    home, url = tmp_path / "home", store[0]
    app = "tests.ui.pipelines:waiting_app"
    resume = page.locator("button:text-is('resume')")
    with ui_server(home, "--store", url, "--allow-writes", "--app", app) as s:
        # Only stored (no --app): the run still waits, but its wait is over.
        page.goto(f"{s.base}/runs/stored?token={s.token}")
        assert "waits for signal “approval”" in page.inner_text("#flag")
        assert page.inner_text("#resume-refused") == WAIT_NOT_OVER
        page.evaluate("window.notReloaded = true")
        _nestegg(home, "signal", "stored", SIGNAL, '"yes"', "--store", url)
        received = f"#flag:has-text('signal “{SIGNAL}” received: resume it')"
        page.wait_for_selector(received, timeout=LIVE_SECONDS * 1000)
        assert resume.is_enabled()
        assert page.inner_text("#status") == "waiting"
        assert page.evaluate("window.notReloaded") is True
        # Sent with --app: another process resumes the run and completes it.
        page.goto(f"{s.base}/runs/resumed")
        page.evaluate("window.notReloaded = true")
        _nestegg(home, "signal", "resumed", SIGNAL, '"yes"', "--store", url, "--app", app)
        page.wait_for_selector("#status.completed", timeout=LIVE_SECONDS * 1000)
        assert page.evaluate("window.notReloaded") is True
        assert page.locator("#flag").count() == 0
        assert '"approved":"yes"' in page.inner_text("#result")
        assert _agents(page) == ["approve"]


def _first_event(url: str, seconds: float) -> str | None:
    """The kind of the first event a stream sends within ``seconds`` (None: none)."""
    try:
        with urlopen(url, timeout=seconds) as stream:
            for line in stream:
                if line.startswith(b"event: "):
                    return str(line[7:].strip().decode())
    except TimeoutError:
        return None
    return None


def test_the_runs_table_shows_a_signal_sent_from_elsewhere_without_reload(
    tmp_path: Path, store: tuple[str, Filled], page: Any
) -> None:
    from tests.ui.pipelines import SIGNAL

    _left_waiting(store[0], "stored")
    home, url = tmp_path / "home", store[0]
    row = "tr.run:has(a[href='/runs/stored']) .flag"
    with ui_server(home, "--store", url) as s:
        page.goto(s.base + "/")
        assert page.inner_text(row) == "⚑ waits for signal “approval”, no deadline"
        page.evaluate("window.notReloaded = true")
        time.sleep(1.5)  # the table's stream has read the store once
        _nestegg(home, "signal", "stored", SIGNAL, '"yes"', "--store", url)
        received = f"{row}:has-text('signal “{SIGNAL}” received: resume it')"
        page.wait_for_selector(received, timeout=LIVE_SECONDS * 1000)
        assert page.evaluate("window.notReloaded") is True
        # A table shown before the signal came, whose stream opens after: its first read
        # says so (?waits=, what the table shows); one that shows it: nothing to say.
        from nestegg.ui.queries import waits_token

        before, after = waits_token([]), waits_token(["stored"])
        assert _first_event(f"{s.base}/events/runs?waits={before}", 5) == "change"
        assert _first_event(f"{s.base}/events/runs?waits={after}", 2.5) is None


def test_resume_is_offered_only_for_runs_the_app_resumes_now(
    tmp_path: Path, store: tuple[str, Filled], page: Any
) -> None:
    from nestegg.checkpoint.stores import open_store
    from nestegg.ui.resumes import WAIT_NOT_OVER
    from tests.ui.pipelines import SIGNAL, start_waiting, waiting_pipeline

    async def wait() -> None:
        opened = open_store(store[0])
        try:
            for run_id in ("still", "signalled"):
                await start_waiting(opened, run_id, nap=False)
            await waiting_pipeline(opened).signal("signalled", SIGNAL, "yes", resume=False)
        finally:
            await opened.close()

    run_apart(wait())
    resume = page.locator("button:text-is('resume')")
    app = "tests.ui.pipelines:waiting_app"  # the pipeline "waiting", not the filled runs'
    page.on("dialog", lambda dialog: dialog.accept())  # "Resume this run?"
    with ui_server(tmp_path / "home", "--store", store[0], "--allow-writes", "--app", app) as s:
        failed = store[1].bad  # failed, so resumable: by its own pipeline's Clutch only
        for run_id, why in (
            (failed, f"run '{failed}' belongs to pipeline 'cli-test', not 'waiting'"),
            ("still", WAIT_NOT_OVER),
        ):
            page.goto(f"{s.base}/runs/{run_id}?token={s.token}")
            assert resume.is_disabled()
            assert page.inner_text("#resume-refused") == why
        page.goto(f"{s.base}/runs/{store[1].ok}")
        assert resume.count() == 0  # completed: nothing to resume
        page.goto(f"{s.base}/runs/signalled")
        assert resume.is_enabled()
        page.evaluate("window.notReloaded = true")
        resume.click()
        page.wait_for_selector("#notice:text-is('resumed')")
        page.wait_for_selector("#status.completed", timeout=15_000)  # followed, no reload
        assert page.evaluate("window.notReloaded") is True
        assert page.locator("#flag").count() == 0  # no longer waiting
        assert resume.count() == 0


def test_a_write_from_the_page_without_the_token_asks_for_it_and_shows_the_refusal(
    server: Server, store: tuple[str, Filled], page: Any
) -> None:
    ok = store[1].ok
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.type)
        if dialog.type == "prompt":
            dialog.accept("not-the-token")  # a wrong token, as a new user might paste
        else:
            dialog.accept()  # "Delete this run ...?"

    page.on("dialog", answer)
    page.goto(f"{server.base}/runs/{ok}")  # opened without ?token=
    page.click("button.act:text-is('delete')")
    page.wait_for_selector("#notice.bad")
    assert asked == ["confirm", "prompt"]
    assert page.inner_text("#notice") == (
        "refused: missing or wrong X-Nestegg-Token header (printed at start-up)"
    )
    assert page.evaluate("localStorage.getItem('nestegg-token')") is None  # asked again next
    page.goto(f"{server.base}/runs/{ok}")
    assert _agents(page) == ["fetch", "enrich", "report"]  # nothing was deleted


def test_a_resumed_failed_run_shows_its_new_state_without_reload(
    server: Server, store: tuple[str, Filled], page: Any
) -> None:
    bad = store[1].bad
    page.on("dialog", lambda dialog: dialog.accept())  # "Resume this run?"
    page.goto(f"{server.base}/runs/{bad}?token={server.token}")
    assert page.inner_text("#status") == "failed"
    assert _agents(page) == ["fetch"]
    page.evaluate("window.notReloaded = true")
    page.click("button.act:text-is('resume')")
    page.wait_for_selector("#status.completed", timeout=15_000)
    assert page.evaluate("window.notReloaded") is True
    assert _agents(page) == ["fetch", "enrich", "report"]
    assert page.locator("#result").count() == 1
    assert page.locator("#summary .error").count() == 0  # the old error is gone
    assert page.locator("button:text-is('resume')").count() == 0


def test_cancel_a_running_run_from_its_page(
    server: Server, store: tuple[str, Filled], page: Any, tmp_path: Path
) -> None:
    asked: list[str] = []

    def answer(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.on("dialog", answer)
    page.goto(f"{server.base}/runs/{store[1].ok}?token={server.token}")
    cancel = page.locator("button.act:text-is('cancel')")
    assert cancel.count() == 0  # completed: nothing to cancel
    env = child_env(tmp_path / "home", **{GATE_ENV: str(tmp_path)})
    child = subprocess.Popen(
        [sys.executable, "-c", LIVE_CHILD, store[0]], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        page.goto(server.base + "/")
        page.click("a[href='/runs/live']", timeout=20_000)  # once the table shows it
        pending = "tr.pending td.pending-agent:text-is('second')"  # held at the gate
        page.wait_for_selector(pending, timeout=20_000)
        assert page.inner_text("#status") == "running"
        page.evaluate("window.notReloaded = true")
        cancel.click()
        page.wait_for_selector("#status.cancelled", timeout=LIVE_SECONDS * 1000)  # no reload
        assert asked == ["Cancel this run? It stops at its next commit; resume continues it."]
        assert re.fullmatch(
            r"run live cancelled \(was running after 1 step; its owner, pid \d+ on \S+, "
            r"stops at its next commit\)",
            page.inner_text("#notice"),
        )
        assert page.evaluate("window.notReloaded") is True
        assert cancel.count() == 0
        (tmp_path / "go").touch()  # the owner's next commit finds the run taken: it stops
        output, _ = child.communicate(timeout=30)
        assert child.returncode != 0
        assert "StaleOwnerError: run 'live' was cancelled from outside" in output
        page.goto(f"{server.base}/runs/live")
        assert page.inner_text("#status") == "cancelled"
        assert _agents(page) == ["first"]  # the step under way was not recorded
    finally:
        stop(child)
