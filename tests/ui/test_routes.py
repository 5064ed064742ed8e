"""The pages of ``nestegg ui`` on every store, through Starlette's test client."""

from __future__ import annotations

import asyncio
import html
import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.codec import seal
from nestegg.checkpoint.ownership import host_id
from nestegg.checkpoint.records import Commit, JournalRecord
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.cli import reading
from nestegg.cli.render import seconds
from nestegg.ui import UISettings
from nestegg.ui.queries import RunsWatch
from tests.cli.conftest import (
    alter,
    damage_newest_event_batch,
    fill,
    leave_waiting,
    store_url_for,
)
from tests.cli.pipeline_app import POLICY, build, pipeline
from tests.cli.selector_app import fail_in_the_selector
from tests.ui.conftest import TOKEN, Ui, call_cells, client_for
from tests.ui.pipelines import SIGNAL, start_waiting, waiting_pipeline

CHECKPOINT_LINK = re.compile(r'class="cp" href="/checkpoints/([^"?]+)"')
"""A checkpoint of the timeline (taken after a step)."""


def _row(html: str, run_id: str) -> str:
    """The runs table's row of ``run_id``."""
    pattern = r'<tr class="run[^"]*">\s*<td><a href="/runs/' + re.escape(run_id) + '">.*?</tr>'
    match = re.search(pattern, html, re.S)
    assert match, f"no row for {run_id}"
    return match.group(0)


def test_the_runs_table_shows_every_run_with_its_status_and_flags(ui: Ui) -> None:
    page = ui.client.get("/")
    assert page.status_code == 200
    ok, bad, gone = (_row(page.text, r) for r in (ui.filled.ok, ui.filled.bad, ui.filled.gone))
    assert ">completed<" in ok and ">3<" in ok and "flagged" not in ok
    assert ">failed<" in bad and ">1<" in bad
    assert ">interrupted<" in gone and "flagged" in gone and "⚑" in gone
    assert "@3" in ok  # its last checkpoint, after step 3


def _listed(html: str, run_id: str) -> bool:
    return f'href="/runs/{run_id}"' in html


def test_the_runs_table_filters_by_status_and_pipeline(ui: Ui) -> None:
    ok, bad, gone = ui.filled.ok, ui.filled.bad, ui.filled.gone
    failed = ui.client.get("/", params={"status": "failed"}).text
    assert _listed(failed, bad) and not _listed(failed, ok)
    interrupted = ui.client.get("/", params={"status": "interrupted"}).text
    assert _listed(interrupted, gone) and not _listed(interrupted, bad)
    other = ui.client.get("/", params={"pipeline": "no-such-pipeline"}).text
    assert "no runs" in other and not _listed(other, ok)
    mine = ui.client.get("/", params={"pipeline": "cli-test", "fragment": "rows"}).text
    assert _listed(mine, ok) and "<html" not in mine
    refused = ui.client.get("/", params={"status": "sleeping"})
    assert refused.status_code == 400 and "unknown status" in refused.text


def test_a_run_queued_for_workers_is_shown_and_filtered_as_queued(ui: Ui) -> None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    run_id = f"queued-{uuid.uuid4().hex[:8]}"

    async def queue() -> None:
        clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
        await clutch.checkpointed_runs().create_queued({"name": "Queued"}, run_id)

    ui.client.portal.call(queue)  # type: ignore[union-attr]
    try:
        row = _row(ui.client.get("/").text, run_id)
        assert ">queued<" in row and "flagged" not in row
        queued = ui.client.get("/", params={"status": "queued"}).text
        assert _listed(queued, run_id) and not _listed(queued, ui.filled.gone)
        interrupted = ui.client.get("/", params={"status": "interrupted"}).text
        assert _listed(interrupted, ui.filled.gone) and not _listed(interrupted, run_id)
        page = ui.client.get(f"/runs/{run_id}").text
        assert 'class="status queued">queued<' in page
        # a worker takes it: no resume offered, as for an interrupted run
        assert ">resume</button>" not in page
        assert ">resume</button>" in ui.client.get(f"/runs/{ui.filled.gone}").text
        ui.client.portal.call(  # type: ignore[union-attr]
            lambda: build("cli-test", CheckpointConfig(storage=store)).cancel(run_id)
        )
        by = f"{host_id().split('#')[0]}:{os.getpid()}"
        assert f"<dd>- (cancelled by {by})</dd>" in ui.client.get(f"/runs/{run_id}").text
    finally:
        assert ui.write("DELETE", f"/api/runs/{run_id}").status_code == 200  # type: ignore[attr-defined]


def test_waiting_runs_are_flagged_with_what_they_wait_for(ui: Ui) -> None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    signal_run, nap_run = (f"waits-{uuid.uuid4().hex[:8]}" for _ in range(2))

    async def start() -> None:
        await start_waiting(store, signal_run, nap=False)
        await start_waiting(store, nap_run, nap=True)

    ui.client.portal.call(start)  # type: ignore[union-attr]
    try:
        table = ui.client.get("/", params={"status": "waiting"}).text
        signal_row, nap_row = _row(table, signal_run), _row(table, nap_run)
        assert "flagged" in signal_row and ">waiting<" in signal_row
        assert "waits for signal “approval”, no deadline" in signal_row
        assert "flagged" in nap_row and "waits for a timer until 20" in nap_row
        page = ui.client.get(f"/runs/{signal_run}").text
        assert 'id="flag"' in page and "waits for signal “approval”" in page
        pending = re.search(r'<tr class="pending waiting" data-pending="1".*?</tr>', page, re.S)
        assert pending and "approve" in pending.group(0)  # the step that waits, not committed
        assert "1 call journaled" in pending.group(0)  # the wait's deadline
        # the whole command: without --app it would only store the signal
        assert f"nestegg signal {signal_run} approval VALUE --app MODULE:CLUTCH" in page
        ui.client.portal.call(  # type: ignore[union-attr]
            lambda: waiting_pipeline(store).signal(signal_run, SIGNAL, "yes", resume=False)
        )
        table = ui.client.get("/", params={"status": "waiting"}).text
        received = "signal “approval” received: resume it"
        assert received in _row(table, signal_run) and "no deadline" not in _row(table, signal_run)
        page = ui.client.get(f"/runs/{signal_run}").text
        assert received in page and "nestegg signal" not in page  # sent: not asked for again
    finally:
        for run_id in (signal_run, nap_run):
            assert ui.write("DELETE", f"/api/runs/{run_id}").status_code == 200  # type: ignore[attr-defined]


def test_a_run_page_shows_summary_timeline_and_checkpoints(ui: Ui) -> None:
    page = ui.client.get(f"/runs/{ui.filled.ok}")
    assert page.status_code == 200
    agents = re.findall(r'<td class="agent">([^<]*)</td>', page.text)
    assert agents == ["fetch", "enrich", "report"]
    assert "Acme: 3 items" in page.text  # the result
    assert "steps 1\N{EN DASH}3 of 3" in page.text
    assert len(CHECKPOINT_LINK.findall(page.text)) == 3
    failed = ui.client.get(f"/runs/{ui.filled.bad}").text
    assert "RuntimeError: enrich broke" in failed and "step 2 (enrich) failed" in failed


def test_a_failed_step_shows_the_duration_nestegg_show_prints(ui: Ui) -> None:
    # The failed step's row gives how long its attempt ran, as the command's timeline does,
    # from the run's stored error; not the mark of an unknown duration.
    page = ui.client.get(f"/runs/{ui.filled.bad}").text
    row = re.search(r'<tr class="pending failed" data-pending="2".*?</tr>', page, re.S)
    assert row, page
    cell = re.search(r'<td class="dur"><span class="t">([^<]*)</span>', row.group(0))
    assert cell, row.group(0)
    if ui.kind != "memory":
        details = asyncio.run(_run_details(ui.filled.url, ui.filled.bad))
        assert cell.group(1) == seconds(details["failed_step"]["duration"])
    assert re.fullmatch(r"\d+(µs|ms|\.\d+s|s)", cell.group(1)), cell.group(1)


async def _run_details(url: str, run_id: str) -> dict[str, Any]:
    store = open_store(url, read_only=True)
    try:
        return await reading.run_details(store, run_id, None, time.time())
    finally:
        await store.close()


def test_a_step_the_selector_failed_names_the_selector() -> None:
    store = MemoryCheckpointStorage()
    asyncio.run(fail_in_the_selector(store, "picked"))
    with client_for(UISettings(store=store)) as client:
        page = client.get("/runs/picked").text
    assert "step 2 (selector) failed: LookupError: no route at n=1" in page
    assert 'no route at n=1 <span class="muted">(step 2, selector)</span>' in page


def test_a_step_shows_its_journaled_calls_with_their_durations(ui: Ui) -> None:
    detail = ui.client.get(f"/runs/{ui.filled.ok}/steps/2")
    assert detail.status_code == 200
    [(function, how, took)] = call_cells(detail.text)
    assert (function, how) == ("tests.cli.pipeline_app.ask_size", "executed")
    assert re.fullmatch(r"\d+(µs|ms)", took), took  # measured: ask_size returns at once
    assert "&#34;big&#34;" in detail.text
    assert "no journaled calls" in ui.client.get(f"/runs/{ui.filled.ok}/steps/1").text


def test_a_call_journaled_before_durations_were_recorded_shows_none(ui: Ui) -> None:
    old = seal(b'{"function":"mod.old_call","args":"abc123","result":"kept"}')
    store = ui.client.app.state.store  # type: ignore[attr-defined]

    async def add_old_entry() -> None:
        run = await store.get_run(ui.filled.ok)
        await store.commit(
            Commit(run.run_id, run.fence, journal=[JournalRecord(run.run_id, 1, 0, old)])
        )

    ui.client.portal.call(add_old_entry)  # type: ignore[union-attr]
    detail = ui.client.get(f"/runs/{ui.filled.ok}/steps/1")
    assert call_cells(detail.text) == [("mod.old_call", "executed", "\N{EM DASH}")]


def test_a_checkpoint_shows_its_state_and_the_diff_with_the_previous(ui: Ui) -> None:
    page = ui.client.get(f"/runs/{ui.filled.ok}").text
    first, second, _ = CHECKPOINT_LINK.findall(page)
    state = ui.client.get(f"/checkpoints/{second}")
    assert state.status_code == 200
    assert '<span class="key">items</span>' in state.text and "after step 2" in state.text
    assert f"/diff?old={first}&amp;new={second}" in state.text
    part = ui.client.get(f"/checkpoints/{second}", params={"path": "data.tags"}).text
    assert '<span class="key">size</span>' in part and '<span class="key">items</span>' not in part
    assert ui.client.get(f"/checkpoints/{second}", params={"path": "data.nope"}).status_code == 404
    diff = ui.client.get("/diff", params={"old": first, "new": second})
    assert diff.status_code == 200
    assert re.search(r'<tr class="added">.*?data\.items', diff.text, re.S)
    assert re.search(r'<tr class="added">.*?data\.tags', diff.text, re.S)
    same = ui.client.get("/diff", params={"old": second, "new": second}).text
    assert "no differences" in same


def test_unknown_things_are_404_and_bad_input_400(ui: Ui) -> None:
    missing = ui.client.get("/runs/no-such-run")
    assert missing.status_code == 404 and "no run &#39;no-such-run&#39;" in missing.text
    assert ui.client.get("/checkpoints/no-such-checkpoint").status_code == 404
    assert ui.client.get("/diff", params={"old": "x"}).status_code == 400
    assert ui.client.get(f"/runs/{ui.filled.ok}", params={"before": "x"}).status_code == 400
    stream = ui.client.get(f"/events/runs/{ui.filled.ok}", params={"since": "x"})
    assert stream.status_code == 400 and "since must be a whole number" in stream.json()["error"]
    assert ui.client.get("/events/runs/no-such-run").status_code == 404
    huge = ui.client.get(f"/events/runs/{ui.filled.ok}", params={"since": 2**63})
    assert huge.status_code == 400 and "since must be at most" in huge.json()["error"]
    wait = ui.client.get(f"/events/runs/{ui.filled.ok}", params={"wait": "done"})
    assert wait.status_code == 400 and "wait must be 'over' or 'on'" in wait.json()["error"]
    runs = ui.client.get("/events/runs", params={"status": "sleeping"})
    assert runs.status_code == 400 and "unknown status 'sleeping'" in runs.json()["error"]


NOT_UTF8 = "%ED%A0%80"
"""Bytes that are not UTF-8 (an encoded lone surrogate), as an address carries them."""


def test_an_id_or_filter_the_command_refuses_is_400_saying_why(ui: Ui) -> None:
    # A NUL filter was echoed into the page (200); bytes that are not UTF-8 were read as
    # U+FFFD, a run no store has (404 "no run '\ufffd\ufffd\ufffd'").
    nul = ui.client.get("/", params={"pipeline": "a\0b"})
    assert nul.status_code == 400 and "\0" not in nul.text
    assert _error_text(nul) == (
        "pipeline name 'a\\x00b' holds a NUL character (U+0000) at index 1: no store can "
        "keep it with the runs"
    )
    stream = ui.client.get("/events/runs", params={"pipeline": "\0"})
    assert stream.status_code == 400 and "holds a NUL character" in stream.json()["error"]
    pruned: Any = ui.write("POST", "/api/prune", json={"keep": 1, "pipeline": "\0"})
    assert pruned.status_code == 400 and "holds a NUL character" in pruned.json()["error"]
    query = ui.client.get(f"/?pipeline={NOT_UTF8}")
    assert query.status_code == 400
    assert _error_text(query).startswith("?pipeline= '\\udced\\udca0\\udc80' is not valid")
    lone = "'\\udced\\udca0\\udc80' is not valid Unicode text (a lone surrogate at character 0"
    for path in (f"/runs/{NOT_UTF8}", f"/runs/{NOT_UTF8}/steps/1", f"/checkpoints/{NOT_UTF8}"):
        page = ui.client.get(path)
        assert page.status_code == 400, path
        assert lone in _error_text(page) and "\ufffd" not in page.text
    for method, path in (
        ("GET", f"/events/runs/{NOT_UTF8}"),
        ("POST", f"/api/runs/{NOT_UTF8}/resume"),
    ):
        answer: Any = ui.write(method, path)
        assert answer.status_code == 400 and f"run id {lone}" in answer.json()["error"], path
    nowhere = ui.client.get(f"/nowhere/{NOT_UTF8}")
    assert nowhere.status_code == 404
    assert _error_text(nowhere) == "no page at /nowhere/\\udced\\udca0\\udc80"
    assert len(CHECKPOINT_LINK.findall(ui.client.get(f"/runs/{ui.filled.ok}").text)) == 3


NOT_ALLOWED = "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"


def test_an_id_with_an_encoded_slash_is_400_as_the_command_refuses_it(ui: Ui) -> None:
    # The server decodes %2F before routing: /runs/a%2Fb was /runs/a/b, "no page" (404).
    ok = ui.filled.ok
    slash = f"contains a path separator '/' at index 1 {NOT_ALLOWED}"
    for path, message in (
        ("/runs/a%2Fb", f"run id 'a/b' {slash}"),
        ("/runs/..%2Fx", f"run id '../x' contains '..' at index 0 {NOT_ALLOWED}"),
        ("/runs/a%2fb/steps/1", f"run id 'a/b' {slash}"),
        (f"/runs/{ok}/steps/1%2F2", f"step '1/2' {slash}"),
        ("/checkpoints/a%2Fb", f"checkpoint id 'a/b' {slash}"),
    ):
        page = ui.client.get(path)
        assert (page.status_code, _error_text(page)) == (400, message), path
    for method, path, named in (
        ("GET", "/runs/a%2Fb/live", "run id"),
        ("GET", "/events/runs/a%2Fb", "run id"),
        ("POST", "/api/runs/a%2Fb/resume", "run id"),
        ("POST", "/api/runs/a%2Fb/cancel", "run id"),
        ("DELETE", "/api/runs/a%2Fb", "run id"),
        ("POST", "/api/checkpoints/a%2Fb/fork", "checkpoint id"),
    ):
        answer: Any = ui.write(method, path)
        refused = (answer.status_code, answer.json())
        assert refused == (400, {"error": f"{named} 'a/b' {slash}"}), (method, path)
    # An address that takes no id there is no page, as the segments sent unencoded are.
    for path in ("/nowhere/a%2Fb", "/runs/a/b", f"/runs/{ok}/steps/1/2"):
        missing = ui.client.get(path)
        assert missing.status_code == 404, path
    assert _error_text(ui.client.get("/nowhere/a%2Fb")) == "no page at /nowhere/a/b"


def _address(route: Route, run_id: str, checkpoint_id: str) -> tuple[str, str]:
    """A method and a path that ``route`` serves, on the given run and checkpoint."""
    path = route.path.replace("{run_id:str}", run_id).replace("{seq:str}", "1")
    method = "GET" if "GET" in (route.methods or ()) else next(iter(route.methods or ()))
    return method, path.replace("{checkpoint_id:str}", checkpoint_id)


def test_every_address_refuses_a_parameter_it_does_not_take(ui: Ui) -> None:
    ok = ui.filled.ok
    checkpoint = CHECKPOINT_LINK.findall(ui.client.get(f"/runs/{ok}").text)[0]
    routes = [r for r in ui.client.app.routes if isinstance(r, Route)]  # type: ignore[attr-defined]
    assert len(routes) == 13
    for route in routes:
        method, path = _address(route, ok, checkpoint)
        response: Any = ui.write(method, path, params={"bogus": "1"}, json={"dry_run": False})
        assert response.status_code == 400, (method, path)
        as_json = response.headers["content-type"] == "application/json"
        message = response.json()["error"] if as_json else _error_text(response)
        assert message.startswith("unknown parameter 'bogus'; this address takes "), path
    # Writes given a parameter they do not take did nothing: a prune with ?keep=1 too.
    pruned: Any = ui.write("POST", "/api/prune", params={"keep": "1"}, json={"keep": 1})
    assert pruned.status_code == 400
    assert len(CHECKPOINT_LINK.findall(ui.client.get(f"/runs/{ok}").text)) == 3
    assert "unknown parameter 'token'" in ui.client.get(f"/runs/{ok}/live?token=t").json()["error"]


def _error_text(response: Any) -> str:
    """The message of an error page."""
    match = re.search(r'<p class="error" id="error">(.*?)</p>', response.text, re.S)
    assert match, response.text
    return html.unescape(match.group(1))


def test_each_bad_address_gets_a_page_saying_what_was_wrong(ui: Ui) -> None:
    ok = ui.filled.ok
    cases = {
        f"/runs/{ok}/steps/0": (404, f"run '{ok}' has no step 0: its steps are 1\N{EN DASH}3"),
        f"/runs/{ok}/steps/4": (404, f"run '{ok}' has no step 4: its steps are 1\N{EN DASH}3"),
        f"/runs/{ok}/steps/-1": (404, f"run '{ok}' has no step -1: its steps are 1\N{EN DASH}3"),
        f"/runs/{ok}/steps/two": (
            404, f"run '{ok}' has no step 'two': its steps are 1\N{EN DASH}3"
        ),
        f"/runs/{ok}/steps/1.5": (
            404, f"run '{ok}' has no step '1.5': its steps are 1\N{EN DASH}3"
        ),
        **{  # int() takes them all; only the number as the page writes it names a step
            f"/runs/{ok}/steps/{address}": (
                404, f"run '{ok}' has no step {shown!r}: its steps are 1\N{EN DASH}3"
            )
            for address, shown in (("01", "01"), ("+1", "+1"), ("%201", " 1"), ("1_0", "1_0"))
        },
        f"/runs/{ok}/steps/{'1' * 5000}": (  # more digits than int() reads: no step either
            404, f"run '{ok}' has no step {'1' * 5000}: its steps are 1\N{EN DASH}3"
        ),
        "/runs/no-such-run/steps/-1": (404, "no run 'no-such-run' in the store"),
        f"/runs/{ok}?before=-5": (400, "before must be a whole number >= 1, got '-5'"),
        **{  # int() takes them all; only a number as the pages write it is one
            f"/runs/{ok}?before={given}": (
                400, f"before must be a whole number >= 1, got {shown!r}"
            )
            for given, shown in (("01", "01"), ("%2B1", "+1"), ("%201", " 1"), ("1_0", "1_0"))
        },
        "/?before=garbage": (
            400, "before must be the cursor of a next-page link (CREATED:RUN_ID), got 'garbage'"
        ),
        "/?limit=abc": (
            400, "unknown parameter 'limit'; this address takes status, pipeline, before, "
            "fragment, token"
        ),
        "/?status=failed&status=running": (400, "status is given 2 times; give it once"),
        "/?fragment=table": (400, "unknown fragment 'table'; one of rows"),
        f"/runs/{ok}?before=99999999999999999999": (
            400, "before must be at most 9223372036854775807, got '99999999999999999999'"
        ),
        f"/runs/{ok}?before={'9' * 5000}": (  # more digits than int() reads
            400, f"before must be at most 9223372036854775807, got '{'9' * 5000}'"
        ),
        f"/runs/{ok}/steps/1?seq=2": (400, "unknown parameter 'seq'; this address takes token"),
        "/diff?a=1&b=2&a=3": (
            400, "unknown parameters 'a', 'b'; this address takes old, new, token"
        ),
        "/runs/a/b": (404, "no page at /runs/a/b"),  # a slash sent unencoded: no such page
        "/no/such/page": (404, "no page at /no/such/page"),
    }  # fmt: skip
    for path, (status, message) in cases.items():
        response = ui.client.get(path)
        assert (response.status_code, _error_text(response)) == (status, message), path
    # A failed run's failed step has its journal too (one past the committed steps).
    assert "ask_size" in ui.client.get(f"/runs/{ui.filled.bad}/steps/2").text


def test_the_step_an_unfinished_run_started_and_did_not_commit_shows_with_its_calls(
    ui: Ui,
) -> None:
    page = ui.client.get(f"/runs/{ui.filled.gone}").text
    pending = re.search(r'<tr class="pending interrupted" data-pending="2".*?</tr>', page, re.S)
    assert pending, page
    assert '<td class="pending-agent">enrich</td>' in pending.group(0)
    assert "1 call journaled" in pending.group(0)
    assert f'data-url="/runs/{ui.filled.gone}/steps/2"' in pending.group(0)
    assert 'class="pending' not in ui.client.get(f"/runs/{ui.filled.ok}").text
    api = ui.client.get("/api/no-such-endpoint")
    assert api.status_code == 404 and api.json() == {"error": "no page at /api/no-such-endpoint"}


def test_the_live_stream_of_a_finished_run_sends_its_changes_and_ends(ui: Ui) -> None:
    stream = ui.client.get(f"/events/runs/{ui.filled.ok}", params={"since": 2})
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = re.findall(r"event: (\w+)\ndata: (.*)\n", stream.text)
    assert [kind for kind, _ in events] == ["change", "end"]
    assert '"status":"completed"' in events[0][1] and '"steps":3' in events[0][1]
    live = ui.client.get(f"/runs/{ui.filled.ok}/live", params={"after": 1}).json()
    assert live["high"] == 3 and live["status"] == "completed"
    assert re.findall(r'<td class="agent">([^<]*)</td>', live["rows"]) == ["enrich", "report"]


def test_requests_for_another_host_are_refused(ui: Ui) -> None:
    # A page of another site whose name resolves to 127.0.0.1 (DNS rebinding) gets nothing.
    page = ui.client.get("/", headers={"Host": "evil.example:8765"})
    assert page.status_code == 400


def test_pages_run_only_their_own_script_and_cannot_be_framed(ui: Ui) -> None:
    headers = ui.client.get("/").headers
    policy = headers["content-security-policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("path", ["/static/app.js", "/static/app.css", "/static/favicon.svg"])
def test_static_files_are_served_from_the_package(ui: Ui, path: str) -> None:
    assert ui.client.get(path).status_code == 200


def test_every_page_names_its_icon_among_the_static_files(ui: Ui) -> None:
    # else a browser asks for /favicon.ico, a 404 in its console on every page
    ok = ui.filled.ok
    icon = '<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">'
    cp = CHECKPOINT_LINK.findall(ui.client.get(f"/runs/{ok}").text)[0]
    for path in ("/", f"/runs/{ok}", f"/checkpoints/{cp}", f"/diff?old={cp}&new={cp}", "/no/such"):
        assert icon in ui.client.get(path).text, path
    served = ui.client.get("/static/favicon.svg")
    assert served.headers["content-type"] == "image/svg+xml"
    assert served.text.startswith("<svg ")


@pytest.mark.server
def test_a_store_that_refuses_the_inspectors_settings_is_a_503_saying_so(redis_url: str) -> None:
    """The store's server is at fault, not the request: 503, as for a store unavailable."""
    from urllib.parse import urlsplit

    from nestegg.checkpoint import open_store
    from nestegg.ui import UISettings
    from tests.ui.conftest import client_for

    server = urlsplit(redis_url)
    store = open_store(f"redis://nobody:wrong@{server.netloc}{server.path}")
    with client_for(UISettings(store=store)) as client:
        page = client.get("/")
    assert page.status_code == 503
    assert "refused the store&#39;s settings" in page.text and "wrong" not in page.text


def test_a_cancelled_run_whose_event_log_is_torn_is_still_listed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = next(store_url_for("sqlite", request, tmp_path))
    filled = asyncio.run(fill(url))
    settings = UISettings(store_url=url, clutch=pipeline, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        cancel = client.post(f"/api/runs/{filled.gone}/cancel", headers={"X-Nestegg-Token": TOKEN})
        assert cancel.status_code == 200
        damage_newest_event_batch(url, filled.gone, lambda body: body[: len(body) // 2])
        page = client.get("/")
        assert page.status_code == 200
        assert ">cancelled<" in _row(page.text, filled.gone)
        assert all(_listed(page.text, run_id) for run_id in (filled.ok, filled.bad))


def test_runs_whose_event_log_is_torn_are_listed_and_shown(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = next(store_url_for("sqlite", request, tmp_path))
    filled = asyncio.run(fill(url))
    leave_waiting(url, "w1")
    for run_id in ("w1", filled.gone):
        damage_newest_event_batch(url, run_id, lambda body: body[: len(body) // 2])
    why = "the event log of run {!r} is damaged (a torn batch)"
    settings = UISettings(store_url=url, clutch=pipeline, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        page = client.get("/")
        assert page.status_code == 200
        row = html.unescape(_row(page.text, "w1"))
        assert f"waits for something unknown (its event log is damaged: {why.format('w1')})" in row
        assert all(_listed(page.text, run_id) for run_id in (filled.ok, filled.bad, filled.gone))
        for run_id, shown in (("w1", "waiting"), (filled.gone, "interrupted")):
            run = client.get(f"/runs/{run_id}")
            assert run.status_code == 200, run.text
            text, damage = html.unescape(run.text), why.format(run_id)
            assert f'id="events-damage">unreadable: {damage}<' in text
            assert f"step in flight unreadable: {damage}<" in text
            assert f'id="status" class="status {shown}"' in text
        gone = client.get(f"/runs/{filled.gone}").text
        assert 'data-seq="1"' in gone and '"gone"' in html.unescape(gone)  # step, input
        live = client.get(f"/runs/{filled.gone}/live")
        assert live.status_code == 200 and "step in flight unreadable" in live.json()["rows"]
        for seq in (1, 2):  # a committed step, the one in flight
            step = client.get(f"/runs/{filled.gone}/steps/{seq}")
            assert step.status_code == 200, step.text
            unreadable = f'id="events-damage">events unreadable: {why.format(filled.gone)};'
            assert unreadable in html.unescape(step.text)
        # the run page's stream: the wait the page shows (over) is not over by its deadline
        params = {"since": "99", "wait": "over"}
        with client.stream("GET", "/events/runs/w1", params=params) as stream:
            first = [line for _, line in zip(range(2), stream.iter_lines(), strict=False)]
        assert first == [
            "event: change",
            'data: {"seq":99,"kinds":[],"steps":0,"wait":"on","status":"waiting"}',
        ]

    async def watched() -> list[tuple[Any, ...]]:  # what the runs table's stream polls
        store = open_store(url)
        try:
            return await RunsWatch(store, status=None, pipeline=None).signature(time.time())
        finally:
            await store.close()

    assert {entry[0]: entry[-1] for entry in asyncio.run(watched())}["w1"] is False


def test_a_wait_whose_event_is_damaged_shows_as_unknown_not_as_a_timer(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # a timer's run_waiting event altered: the table and the page said "waits for a timer"
    url = next(store_url_for("sqlite", request, tmp_path))

    async def start() -> None:
        store = open_store(url)
        try:
            await start_waiting(store, "nap", nap=True)
        finally:
            await store.close()

    asyncio.run(start())
    damage_newest_event_batch(url, "nap", alter)
    with client_for(UISettings(store_url=url)) as client:
        row = html.unescape(_row(client.get("/").text, "nap"))
        page = html.unescape(client.get("/runs/nap").text)
    for shown in (row, page):
        assert "waits for something unknown until 20" in shown
        assert "(its event log is damaged: event " in shown
        assert "of run 'nap' is torn or not a nestegg record)" in shown
        assert "timer" not in shown
