"""Writes from the page on every store: refused without --allow-writes or the token,
done with them; nothing changes when refused."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import html
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from starlette.testclient import TestClient

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.codec import unseal_value
from nestegg.checkpoint.ownership import host_id, owner_payload
from nestegg.checkpoint.records import Owner, RunRecord
from nestegg.checkpoint.stores import open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.errors import ConfigurationError
from nestegg.testing.builders import make_checkpoint, make_commit
from nestegg.ui import UISettings, create_app
from nestegg.ui.resumes import WAIT_NOT_OVER
from tests.cli.conftest import GONE_PID, Filled, damage_newest_event_batch, fill, tear
from tests.cli.pipeline_app import FAIL_ENV, POLICY, build, without_enrich
from tests.ui.conftest import BASE_URL, TOKEN, Ui, call_cells, client_for
from tests.ui.pipelines import SIGNAL, start_waiting, waiting_pipeline

WAIT_SECONDS = 20


def _status(ui: Ui, run_id: str) -> str | None:
    """The status the live endpoint gives, or None when the run is gone."""
    response = ui.client.get(f"/runs/{run_id}/live")
    return response.json()["status"] if response.status_code == 200 else None


def _wait_for(ui: Ui, run_id: str, status: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while _status(ui, run_id) != status:
        assert time.monotonic() < deadline, f"run {run_id} never became {status}"
        time.sleep(0.05)


def resume_button(page: str) -> str | None:
    """The run page's resume button: None when there is none, "resumes" when it is
    enabled, else the reason shown beside it disabled."""
    if ">resume</button>" not in page:
        return None
    disabled = r'id="resume" disabled [^>]*>resume</button> <span [^>]*id="resume-refused">([^<]*)<'
    refused = re.search(disabled, page)
    return html.unescape(refused.group(1)) if refused else "resumes"


def fork_form(page: str) -> str | None:
    """The state page's fork form: None when there is none, "forks" when its editor and
    button are offered, else the reason shown beside its disabled button."""
    if 'id="fork"' not in page:
        return None
    disabled = r'id="fork" disabled [^>]*>fork</button> <span [^>]*id="fork-refused">([^<]*)<'
    refused = re.search(disabled, page)
    if refused:
        assert 'id="fork-data"' not in page  # no editor for a fork that would be refused
        return html.unescape(refused.group(1))
    assert 'id="fork-data"' in page
    return "forks"


def _checkpoints(ui: Ui, run_id: str) -> list[str]:
    page = ui.client.get(f"/runs/{run_id}").text
    return re.findall(r'class="cp" href="/checkpoints/([^"?]+)"', page)


def test_a_write_without_the_token_is_refused_and_changes_nothing(ui: Ui) -> None:
    for token in (None, "wrong"):
        refused: Any = ui.write("DELETE", f"/api/runs/{ui.filled.ok}", token=token)
        assert refused.status_code == 403
        assert "X-Nestegg-Token" in refused.json()["error"]
        fork: Any = ui.write("POST", "/api/checkpoints/x/fork", token=token, json={})
        assert fork.status_code == 403
    assert _status(ui, ui.filled.ok) == "completed"
    assert len(_checkpoints(ui, ui.filled.ok)) == 3


def test_writes_are_refused_without_allow_writes() -> None:
    from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage

    settings = UISettings(store=MemoryCheckpointStorage(), token="t")
    with client_for(settings) as client:
        response = client.delete("/api/runs/x", headers={"X-Nestegg-Token": "t"})
        assert response.status_code == 403 and "--allow-writes" in response.json()["error"]
        cancel = client.post("/api/runs/x/cancel", headers={"X-Nestegg-Token": "t"})
        assert cancel.status_code == 403 and "--allow-writes" in cancel.json()["error"]
        page = client.get("/").text
        assert "prune-form" not in page and "writes allowed" not in page


def test_delete_removes_a_finished_run(ui: Ui) -> None:
    deleted: Any = ui.write("DELETE", f"/api/runs/{ui.filled.bad}")
    assert deleted.status_code == 200 and deleted.json() == {"deleted": ui.filled.bad}
    assert ui.client.get(f"/runs/{ui.filled.bad}").status_code == 404
    again: Any = ui.write("DELETE", f"/api/runs/{ui.filled.bad}")
    assert again.status_code == 404


def cancel_button(page: str) -> bool:
    """Whether the run page (or its live summary) offers a cancel."""
    return 'id="cancel"' in page


def _stored(ui: Ui, run_id: str) -> tuple[RunRecord | None, list[Any]]:
    """The run's record and events as stored."""
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    run = ui.client.portal.call(store.get_run, run_id)  # type: ignore[union-attr]
    events = ui.client.portal.call(store.read_events, run_id)  # type: ignore[union-attr]
    return run, events


def test_cancel_stores_an_interrupted_or_waiting_run_cancelled_once(ui: Ui) -> None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    gone, waiting = ui.filled.gone, f"waiting-{uuid.uuid4().hex[:8]}"
    ui.client.portal.call(lambda: start_waiting(store, waiting, nap=False))  # type: ignore[union-attr]
    try:
        for run_id, previous, was in (
            (gone, "interrupted", "interrupted after 1 step"),
            (waiting, "waiting", "waiting after 0 steps"),
        ):
            assert cancel_button(ui.client.get(f"/runs/{run_id}").text)
            assert cancel_button(ui.client.get(f"/runs/{run_id}/live").json()["summary"])
            (before, _) = _stored(ui, run_id)
            assert before is not None
            done: Any = ui.write("POST", f"/api/runs/{run_id}/cancel")
            assert done.status_code == 200
            assert done.json() == {
                "run_id": run_id,
                "status": "cancelled",
                "cancelled": True,
                "previous": previous,
                "previous_owner": owner_payload(before.owner),
                "steps": before.step_seq,
                "message": f"run {run_id} cancelled (was {was})",
            }  # what nestegg cancel --json prints, and the line it prints
            after, events = _stored(ui, run_id)
            assert after is not None and after.status == "cancelled"
            assert after.fence == before.fence + 1  # claimed, as any process claims a run
            assert events[-1].kind == "run_cancelled"
            page = ui.client.get(f"/runs/{run_id}").text
            assert not cancel_button(page)
            assert _status(ui, run_id) == "cancelled"
            again: Any = ui.write("POST", f"/api/runs/{run_id}/cancel")
            assert again.status_code == 200
            assert (again.json()["cancelled"], again.json()["message"]) == (
                False,
                f"run {run_id} is cancelled already; nothing was changed",
            )
            assert _stored(ui, run_id) == (after, events)
        # Left to a resume, which the app's Clutch offers for its own pipeline's run.
        assert resume_button(ui.client.get(f"/runs/{gone}").text) == "resumes"
    finally:
        ui.write("DELETE", f"/api/runs/{waiting}")


def test_cancel_of_a_finished_unknown_or_bad_run_is_refused_and_changes_nothing(ui: Ui) -> None:
    runs = (ui.filled.ok, ui.filled.bad, ui.filled.gone)
    before = [_stored(ui, run_id) for run_id in runs]
    for run_id, status in ((ui.filled.ok, "completed"), (ui.filled.bad, "failed")):
        assert not cancel_button(ui.client.get(f"/runs/{run_id}").text)
        refused: Any = ui.write("POST", f"/api/runs/{run_id}/cancel")
        assert (refused.status_code, refused.json()) == (
            409,
            {
                "error": f"run {run_id!r} is {status}: only a running or waiting run can be "
                "cancelled; nothing was changed"  # as nestegg cancel says it
            },
        )
    unknown: Any = ui.write("POST", "/api/runs/ghost/cancel")
    assert (unknown.status_code, unknown.json()) == (404, {"error": "no run 'ghost' in the store"})
    bad: Any = ui.write("POST", "/api/runs/a..b/cancel")
    assert bad.status_code == 400
    assert bad.json()["error"] == (
        "run id 'a..b' contains '..' at index 1 "
        "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)"
    )
    nul: Any = ui.write("POST", "/api/runs/a%00b/cancel")
    assert (nul.status_code, nul.json()["error"]) == (
        400,
        "run id 'a\\x00b' contains a NUL (U+0000) at index 1 "
        "(a path separator, '..', a NUL, a line feed or a carriage return is not allowed)",
    )
    gone = ui.filled.gone
    for token in (None, "wrong"):
        without: Any = ui.write("POST", f"/api/runs/{gone}/cancel", token=token)
        assert without.status_code == 403
        assert "X-Nestegg-Token" in without.json()["error"]
    asked: Any = ui.write("POST", f"/api/runs/{gone}/cancel?force=1")
    assert asked.status_code == 400
    assert asked.json()["error"].startswith("unknown parameter 'force'")
    got: Any = ui.client.get(f"/api/runs/{gone}/cancel")
    assert got.status_code == 405
    assert [_stored(ui, run_id) for run_id in runs] == before


def test_fork_with_edited_data_starts_a_new_run(ui: Ui) -> None:
    _, second, _ = _checkpoints(ui, ui.filled.ok)
    bad: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", content=b"{not json")
    assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    misspelt: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", json={"dta": {}})
    assert misspelt.status_code == 400
    assert misspelt.json()["error"].startswith('unknown field "dta" in the fork request')
    missing: Any = ui.write("POST", "/api/checkpoints/nope/fork", json={})
    assert missing.status_code == 404
    edited = {"name": "Forked", "items": [9], "tags": {"size": "small"}, "page": "p"}
    fork: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", json={"data": edited})
    assert fork.status_code == 201
    run_id = fork.json()["run_id"]
    try:
        _wait_for(ui, run_id, "completed")
        page = ui.client.get(f"/runs/{run_id}").text
        assert "Forked: 1 items" in page  # report ran on the edited data
        assert f'href="/runs/{ui.filled.ok}"' in page  # its parent, in the family tree
        parent = ui.client.get(f"/runs/{ui.filled.ok}").text
        assert f'href="/runs/{run_id}"' in parent  # and the child in the parent's
    finally:
        ui.write("DELETE", f"/api/runs/{run_id}")


TAGGED = {
    "$ne": "map",
    "v": [
        [1, "a"],
        ["1", "b"],
        ["name", "Forked"],
        ["items", [2**63 - 1]],
        ["own", {"$ne": "map", "v": [["$ne", "mine"], ["v", 2]]}],
    ],
}
"""Fork data in the codec's form: int and string keys alike, an int JSON.parse would round,
and a dict of the user's own with the keys "$ne" and "v"."""
REBUILT = {1: "a", "1": "b", "name": "Forked", "items": [2**63 - 1], "own": {"$ne": "mine", "v": 2}}


def _result(ui: Ui, run_id: str) -> Any:
    """The run's result as stored, rebuilt."""
    run, _ = _stored(ui, run_id)
    assert run is not None and run.result is not None
    return unseal_value(run.result, "result")


def _editor_text(ui: Ui, checkpoint_id: str) -> str:
    """What the checkpoint page's fork editor holds."""
    page = ui.client.get(f"/checkpoints/{checkpoint_id}").text
    found = re.search(r'<textarea id="fork-data"[^>]*>(.*?)</textarea>', page, re.S)
    assert found is not None
    return html.unescape(found.group(1))


def test_a_fork_takes_the_codecs_form_and_an_unedited_editor_forks_the_same_data(
    ui: Ui,
) -> None:
    _, second, _ = _checkpoints(ui, ui.filled.ok)
    fork: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", json={"data": TAGGED})
    assert fork.status_code == 201
    first = fork.json()["run_id"]
    forks = [first]
    try:
        _wait_for(ui, first, "completed")
        assert _result(ui, first) == {**REBUILT, "report": "Forked: 1 items"}
        forked_at = _checkpoints(ui, first)[-2]  # the edited data, before report
        text = _editor_text(ui, forked_at)
        assert orjson.loads(text) == TAGGED  # shown as the codec stores it
        again: Any = ui.write(
            "POST", f"/api/checkpoints/{forked_at}/fork", content=f'{{"data": {text}}}'
        )
        assert again.status_code == 201
        forks.append(again.json()["run_id"])
        _wait_for(ui, forks[1], "completed")
        assert _result(ui, forks[1]) == _result(ui, first)  # int keys and all, exactly
    finally:
        for run_id in forks:
            ui.write("DELETE", f"/api/runs/{run_id}")


def test_a_fork_refuses_a_tag_the_codec_does_not_write(ui: Ui) -> None:
    _, second, _ = _checkpoints(ui, ui.filled.ok)
    before = _run_ids(ui)
    for data, says in (
        (
            {"x": {"$ne": "bogus", "v": 1}},
            '{"$ne":"bogus","v":1} at data.x, which is not a value the '
            'codec writes (unknown tag "bogus"; one of datetime, date, ',
        ),
        (
            [{"$ne": "map", "v": 5}],
            '{"$ne":"map","v":5} at data[0], which is not a value the codec writes (its '
            "value is not a list of [key, value] pairs)",
        ),
        (  # an enum key of a module not imported: its plain value could be another key
            {"$ne": "map", "v": [[{"$ne": "enum", "v": ["json.tool:Tone", "low"]}, 1]]},
            'the key {"$ne":"enum","v":["json.tool:Tone","low"]}, whose enum json.tool:Tone '
            "is of no module this process has imported",
        ),
    ):
        refused: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", json={"data": data})
        assert refused.status_code == 400
        assert refused.json()["error"].startswith(f"the fork's data holds {says}")
    assert _run_ids(ui) == before  # nothing started


def test_a_fork_refuses_a_key_or_an_item_given_twice(ui: Ui) -> None:
    _, second, _ = _checkpoints(ui, ui.filled.ok)
    before = _run_ids(ui)
    once = "has each {0} once; give each {0} once"
    for body, says in (
        (
            '{"data": {"x": [{"a": 1, "a": 2}]}}',
            'the fork\'s data holds a dict at data.x[0] with one key twice ("a" is there '
            "twice): a dict " + once.format("key"),
        ),
        ('{"data": {"x": 1}, "data": {"x": 2}}', 'the request body has the field "data" twice: '
         "give it once"),
        (
            '{"data": {"$ne": "frozenset", "v": [1, 1]}}',
            "the fork's data holds a frozenset at data with one item twice (1 is there "
            "twice): a frozenset " + once.format("item"),
        ),
    ):  # fmt: skip
        refused: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", content=body)
        assert (refused.status_code, refused.json()["error"]) == (400, says)
    assert _run_ids(ui) == before  # nothing started


def test_a_fork_whose_data_breaks_a_step_starts_and_fails_on_its_page(ui: Ui) -> None:
    _, second, _ = _checkpoints(ui, ui.filled.ok)
    fork: Any = ui.write("POST", f"/api/checkpoints/{second}/fork", json={"data": "a string"})
    assert fork.status_code == 201  # it started: the agent that fails on it shows where
    run_id = fork.json()["run_id"]
    try:
        _wait_for(ui, run_id, "failed")
        assert "(step 3, agent report)" in ui.client.get(f"/runs/{run_id}").text
    finally:
        ui.write("DELETE", f"/api/runs/{run_id}")


def test_resume_finishes_an_interrupted_run(ui: Ui) -> None:
    locked: Any = ui.write("POST", "/api/runs/no-such-run/resume")
    assert locked.status_code == 404
    assert resume_button(ui.client.get(f"/runs/{ui.filled.gone}").text) == "resumes"
    assert resume_button(ui.client.get(f"/runs/{ui.filled.ok}").text) is None
    done: Any = ui.write("POST", f"/api/runs/{ui.filled.ok}/resume")
    assert done.status_code == 400
    assert done.json()["error"].startswith(f"run '{ui.filled.ok}' is completed: there is nothing")
    started: Any = ui.write("POST", f"/api/runs/{ui.filled.gone}/resume")
    assert started.status_code == 202
    _wait_for(ui, ui.filled.gone, "completed")
    page = ui.client.get(f"/runs/{ui.filled.gone}").text
    assert "3 items" in page
    # It failed at step 2, then its owner vanished while it was marked running: both show
    # before step 2, where they happened.
    assert "step 2 (enrich) failed" in page
    assert "crash or takeover: resumed by another owner after step 1" in page
    # Step 2 ran again: its call, recorded by the attempt that failed, was replayed and
    # shows the duration it took then.
    [(function, how, took)] = call_cells(ui.client.get(f"/runs/{ui.filled.gone}/steps/2").text)
    assert (function, how) == ("tests.cli.pipeline_app.ask_size", "replayed")
    assert re.fullmatch(r"\d+(µs|ms)", took), took


def test_a_resume_with_a_body_it_does_not_take_is_refused_and_starts_nothing(ui: Ui) -> None:
    # {"x": 1} was answered 202 and the run resumed; a body that is not JSON was ignored
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    before = ui.client.portal.call(store.get_run, ui.filled.gone)  # type: ignore[union-attr]
    long = b"[" + b"1," * 40 + b"1]"  # shown cut
    for body, error in (
        (
            b'{"x": 1}',
            'unknown field "x" in the resume request: it takes no field (send no body, or {})',
        ),
        (b"resume", "the request body is not JSON: "),
        (  # orjson's words were "str is not valid UTF-8: surrogates not allowed"
            '{"x": "caf\u00e9"}'.encode("latin-1"),
            "the request body is not UTF-8 JSON: byte 10 (0xe9) is not UTF-8",
        ),
        (b"\xff\xfe{\x00}\x00", "the request body is not UTF-8 JSON: byte 0 (0xff) is not UTF-8"),
        (b"[]", "the request body must be a JSON object, got a JSON array: []"),
        (b"42", "the request body must be a JSON object, got a number: 42"),
        (b'"go"', 'the request body must be a JSON object, got a JSON string: "go"'),
        (b"null", "the request body must be a JSON object, got null: null"),
        (b"true", "the request body must be a JSON object, got true or false: true"),
        (
            long,
            f"the request body must be a JSON object, got a JSON array: {long[:60].decode()}...",
        ),
    ):
        refused: Any = ui.write("POST", f"/api/runs/{ui.filled.gone}/resume", content=body)
        assert refused.status_code == 400, body
        assert refused.json()["error"].startswith(error)
        if body != b"resume":  # the rest of that one is orjson's
            assert refused.json()["error"] == error, body
        assert _untouched(ui, ui.filled.gone, before)
    started: Any = ui.write("POST", f"/api/runs/{ui.filled.gone}/resume", json={})
    assert started.status_code == 202
    _wait_for(ui, ui.filled.gone, "completed")


def _untouched(ui: Ui, run_id: str, before: RunRecord) -> bool:
    """Whether nothing was started for ``run_id``: no run in the background, and its
    record (status, owner, events) as it was."""
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    after = ui.client.portal.call(store.get_run, run_id)  # type: ignore[union-attr]
    idle = not ui.client.app.state.background  # type: ignore[attr-defined]
    return idle and after == before


async def _fail_elsewhere(store: CheckpointStorage, run_id: str) -> None:
    """A failed run of the test pipeline under another name (``elsewhere``)."""
    clutch = build("elsewhere", CheckpointConfig(storage=store, policy=POLICY))
    with pytest.raises(RuntimeError, match="enrich broke"):
        await clutch.run({"name": run_id}, run_id=run_id)


def test_resume_of_a_run_of_another_pipeline_is_refused_and_not_offered(
    ui: Ui, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    tag = uuid.uuid4().hex[:8]
    waiting, failed = f"other-{tag}", f"failed-{tag}"
    monkeypatch.setenv(FAIL_ENV, "1")
    ui.client.portal.call(lambda: start_waiting(store, waiting, nap=False))  # type: ignore[union-attr]
    ui.client.portal.call(lambda: _fail_elsewhere(store, failed))  # type: ignore[union-attr]
    try:
        for run_id, pipeline in ((failed, "elsewhere"), (waiting, "waiting")):
            before = ui.client.portal.call(store.get_run, run_id)  # type: ignore[union-attr]
            why = f"run '{run_id}' belongs to pipeline '{pipeline}', not 'cli-test'"
            assert resume_button(ui.client.get(f"/runs/{run_id}").text) == why  # disabled
            live = ui.client.get(f"/runs/{run_id}/live").json()["summary"]
            assert resume_button(live) == why
            refused: Any = ui.write("POST", f"/api/runs/{run_id}/resume")
            assert refused.status_code == 400
            assert refused.json() == {"error": why}
            assert _untouched(ui, run_id, before)
    finally:
        for run_id in (waiting, failed):
            ui.write("DELETE", f"/api/runs/{run_id}")


@contextlib.contextmanager
def _waiting_ui(tmp_path: Path, **naps: bool) -> Iterator[tuple[Ui, CheckpointStorage, Clutch]]:
    """The inspector, writes allowed, with the waiting pipeline as its Clutch, over a
    SQLite store holding a waiting run of it by each id of ``naps`` (True: on its timer)."""
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    clutch = waiting_pipeline(store)
    settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        for run_id, nap in naps.items():
            client.portal.call(partial(start_waiting, store, run_id, nap=nap))  # type: ignore[union-attr]
        yield Ui(client, Filled(str(tmp_path), "", "", ""), "sqlite"), store, clutch
    asyncio.run(store.close())


def test_resume_of_a_run_that_still_waits_is_refused_until_its_signal_is_stored(
    tmp_path: Path,
) -> None:
    with _waiting_ui(tmp_path, signal=False, nap=True) as (ui, store, clutch):
        client = ui.client
        for run_id, message in (
            ("signal", "run 'signal' waits for signal 'approval': send it with "
                       "signal('signal', 'approval', value)"),
            ("nap", "run 'nap' waits for its timer until 20"),
        ):  # fmt: skip
            before = client.portal.call(store.get_run, run_id)  # type: ignore[union-attr]
            assert resume_button(client.get(f"/runs/{run_id}").text) == WAIT_NOT_OVER
            refused: Any = ui.write("POST", f"/api/runs/{run_id}/resume")
            assert refused.status_code == 409
            assert refused.json()["error"].startswith(message)
            assert _untouched(ui, run_id, before)
        sent = client.portal.call(  # type: ignore[union-attr]
            lambda: clutch.signal("signal", SIGNAL, "yes", resume=False)
        )
        assert sent is None
        assert resume_button(client.get("/runs/signal").text) == "resumes"
        assert resume_button(client.get("/runs/nap").text) == WAIT_NOT_OVER
        started: Any = ui.write("POST", "/api/runs/signal/resume")
        assert started.status_code == 202
        _wait_for(ui, "signal", "completed")


def test_a_fork_or_resume_whose_run_waits_is_logged_as_a_wait_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # it was logged "warning: fork of checkpoint '...' failed: run '...' waits for signal"
    caplog.set_level(logging.INFO, logger="nestegg.ui")
    with _waiting_ui(tmp_path, signal=False) as (ui, _, clutch):
        checkpoints = ui.client.portal.call(clutch.list_checkpoints, "signal")  # type: ignore[union-attr]
        forked: Any = ui.write("POST", f"/api/checkpoints/{checkpoints[0].checkpoint_id}/fork")
        assert forked.status_code == 201, forked.text
        run_id = forked.json()["run_id"]
        _wait_for(ui, run_id, "waiting")
        assert ui.write("POST", "/api/runs/signal/cancel").status_code == 200
        resumed: Any = ui.write("POST", "/api/runs/signal/resume")
        assert resumed.status_code == 202, resumed.text
        _wait_for(ui, "signal", "waiting")
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "nestegg.ui"]
    waits = f"waits for signal {SIGNAL!r}"
    assert [level for level, _ in logged] == [logging.INFO, logging.INFO], logged
    assert logged[0][1].startswith(
        f"fork of checkpoint {checkpoints[0].checkpoint_id!r}: run {run_id!r} {waits}"
    )
    assert logged[1][1].startswith(f"resume of run 'signal': run 'signal' {waits}")


LOST_ENRICH = (
    "run 'broke': the checkpoint continues with agent 'enrich' (position 1 of the order), "
    "which this pipeline no longer has"
)


def _broke_in_enrich(store: CheckpointStorage, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run ``broke`` of ``cli-test`` that failed in ``enrich``: its newest checkpoint
    continues with ``enrich``."""
    monkeypatch.setenv(FAIL_ENV, "1")
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    with pytest.raises(RuntimeError, match="enrich broke"):
        asyncio.run(clutch.run({"name": "broke"}, run_id="broke"))
    monkeypatch.delenv(FAIL_ENV)


async def _broke_in_report(store: CheckpointStorage) -> None:
    """A run ``late`` of ``cli-test`` that failed in ``report``: a fork of a completed run
    after ``enrich``, on data ``report`` cannot take; its newest checkpoint continues with
    ``report``."""
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    await clutch.run({"name": "full"}, run_id="full")
    after_enrich = (await clutch.list_checkpoints("full"))[1].checkpoint_id
    with pytest.raises(TypeError):
        await clutch.fork(after_enrich, "a string", run_id="late")


def _refused_and_untouched(ui: Ui, run_id: str, status: int, why: str) -> None:
    """The run page and its live summary show ``run_id``'s resume button disabled with
    ``why``; the endpoint refuses it with ``status`` and ``why``, and starts nothing."""
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    before = ui.client.portal.call(store.get_run, run_id)  # type: ignore[union-attr]
    assert resume_button(ui.client.get(f"/runs/{run_id}").text) == why
    assert resume_button(ui.client.get(f"/runs/{run_id}/live").json()["summary"]) == why
    refused: Any = ui.write("POST", f"/api/runs/{run_id}/resume")
    assert (refused.status_code, refused.json()) == (status, {"error": why})
    assert _untouched(ui, run_id, before)


@contextlib.contextmanager
def _broken_runs_ui(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **clutch_options: Any
) -> Iterator[Ui]:
    """The inspector, writes allowed, over a store holding run ``broke`` (failed in
    ``enrich``) and ``late`` (failed in ``report``), with the Clutch that lost ``enrich``
    (``clutch_options``: its other arguments)."""
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    _broke_in_enrich(store, monkeypatch)
    asyncio.run(_broke_in_report(store))
    clutch = without_enrich(store, **clutch_options)
    settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        yield Ui(client, Filled(str(tmp_path), "", "", ""), "sqlite")  # none of the filled runs
    asyncio.run(store.close())


def test_resume_of_a_run_that_continues_with_a_lost_agent_is_refused_and_not_offered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _broken_runs_ui(tmp_path, monkeypatch) as ui:
        _refused_and_untouched(ui, "broke", 409, LOST_ENRICH)
        # A run that continues with an agent the Clutch still has is offered.
        assert resume_button(ui.client.get("/runs/late").text) == "resumes"


def test_resume_by_a_clutch_whose_definition_does_not_hold_is_refused_and_not_offered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _broken_runs_ui(tmp_path, monkeypatch, order=["fetch", "enrich", "report"]) as ui:
        why = (
            "order= names agent 'enrich', which is not registered on Clutch 'cli-test' "
            "(known: ['fetch', 'report'])"
        )
        for run_id in ("broke", "late"):  # whatever agent it continues with
            _refused_and_untouched(ui, run_id, 400, why)


def test_resume_of_a_fork_without_a_valid_checkpoint_is_refused_and_not_offered(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    asyncio.run(_broke_in_report(store))
    late = asyncio.run(store.get_run("late"))
    assert late is not None and late.parent_checkpoint is not None
    # What a process killed between a fork's two writes leaves: the run, owned by the
    # gone process (interrupted), no checkpoint.
    gone = Owner(host=host_id(), pid=GONE_PID, started="gone")
    torn = dataclasses.replace(
        late, run_id="torn", status="running", owner=gone, lease_until=None, error=None,
        step_seq=0, event_seq=0,
    )  # fmt: skip
    asyncio.run(store.create_run(torn))
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        ui = Ui(client, Filled(str(tmp_path), "", "", ""), "sqlite")  # none of the filled runs
        why = (
            f"run 'torn' is a fork of run 'full' at checkpoint '{late.parent_checkpoint}' "
            "and has no valid checkpoint to start from (its writing stopped before its first "
            "checkpoint was stored): delete_run('torn') and fork again"
        )
        _refused_and_untouched(ui, "torn", 500, why)
    asyncio.run(store.close())


def _run_ids(ui: Ui) -> list[str]:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    runs = ui.client.portal.call(store.list_runs)  # type: ignore[union-attr]
    return sorted(run.run_id for run in runs)


def test_fork_from_a_checkpoint_of_another_pipeline_is_refused_and_not_offered(
    ui: Ui, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    failed = f"failed-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(FAIL_ENV, "1")
    ui.client.portal.call(lambda: _fail_elsewhere(store, failed))  # type: ignore[union-attr]
    try:
        own = _checkpoints(ui, ui.filled.bad)[0]  # failed too, but of the app's pipeline
        assert fork_form(ui.client.get(f"/checkpoints/{own}").text) == "forks"
        checkpoints = _checkpoints(ui, failed)
        assert checkpoints
        runs = _run_ids(ui)
        for checkpoint in checkpoints:
            why = f"checkpoint '{checkpoint}' belongs to pipeline 'elsewhere', not 'cli-test'"
            assert fork_form(ui.client.get(f"/checkpoints/{checkpoint}").text) == why
            refused: Any = ui.write("POST", f"/api/checkpoints/{checkpoint}/fork", json={})
            assert refused.status_code == 400
            assert refused.json() == {"error": why}
            assert not ui.client.app.state.background  # type: ignore[attr-defined]
        assert _run_ids(ui) == runs  # no run was stored
    finally:
        ui.write("DELETE", f"/api/runs/{failed}")


class CountsStepReads(MemoryCheckpointStorage):
    """A memory store that counts its reads of step records, which loading a checkpoint's
    state makes."""

    def __init__(self) -> None:
        super().__init__()
        self.step_reads = 0

    async def load_steps(self, *args: Any, **kwargs: Any) -> Any:
        self.step_reads += 1
        return await super().load_steps(*args, **kwargs)


def test_fork_from_a_checkpoint_of_another_pipeline_is_refused_before_its_state_is_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = CountsStepReads()
    monkeypatch.setenv(FAIL_ENV, "1")
    asyncio.run(_fail_elsewhere(store, "failed"))
    run = asyncio.run(store.get_run("failed"))
    assert run is not None
    damaged = make_checkpoint("failed", run.step_seq)._replace(body=b"no state")
    asyncio.run(store.commit(make_commit(run, checkpoints=[damaged])))
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        ui = Ui(client, Filled("", "", "", ""), "memory")
        checkpoints = _checkpoints(ui, "failed")
        assert damaged.checkpoint_id in checkpoints and len(checkpoints) > 1
        store.step_reads = 0
        for checkpoint in checkpoints:  # the damaged one refused as another pipeline's too
            why = f"checkpoint '{checkpoint}' belongs to pipeline 'elsewhere', not 'cli-test'"
            refused: Any = ui.write("POST", f"/api/checkpoints/{checkpoint}/fork", json={})
            assert (refused.status_code, refused.json()) == (400, {"error": why})
        assert store.step_reads == 0
        assert _run_ids(ui) == ["failed"]


def test_fork_from_a_checkpoint_that_continues_with_a_lost_agent_is_refused(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    config = CheckpointConfig(storage=store, policy=POLICY)
    asyncio.run(build("cli-test", config).run({"name": "full"}, run_id="full"))
    settings = UISettings(store=store, clutch=without_enrich(store), allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        ui = Ui(client, Filled(str(tmp_path), "", "", ""), "sqlite")  # none of the filled runs
        after_fetch, after_enrich, final = _checkpoints(ui, "full")
        why = (
            "run 'full': the checkpoint continues with agent 'enrich' (position 1 of the "
            "order), which this pipeline no longer has"
        )
        assert fork_form(client.get(f"/checkpoints/{after_fetch}").text) == why
        refused: Any = ui.write("POST", f"/api/checkpoints/{after_fetch}/fork", json={})
        assert refused.status_code == 409
        assert refused.json() == {"error": why}
        assert _run_ids(ui) == ["full"]
        for offered in (after_enrich, final):  # they continue with report, or with none
            assert fork_form(client.get(f"/checkpoints/{offered}").text) == "forks"
        forked: Any = ui.write("POST", f"/api/checkpoints/{after_enrich}/fork", json={})
        assert forked.status_code == 201
        _wait_for(ui, forked.json()["run_id"], "completed")
    asyncio.run(store.close())


def test_prune_dry_run_lists_and_prune_deletes(ui: Ui) -> None:
    body = {"keep": 1, "pipeline": "cli-test", "dry_run": True}
    plan: Any = ui.write("POST", "/api/prune", json=body)
    assert plan.status_code == 200
    assert len(plan.json()["checkpoints"][ui.filled.ok]) == 2
    assert len(_checkpoints(ui, ui.filled.ok)) == 3
    done: Any = ui.write("POST", "/api/prune", json={**body, "dry_run": False})
    assert done.status_code == 200 and done.json()["deleted_checkpoints"] >= 2
    assert len(_checkpoints(ui, ui.filled.ok)) == 1
    refused: Any = ui.write("POST", "/api/prune", json={"older_than": "soon"})
    assert refused.status_code == 400 and "bad duration" in refused.json()["error"]
    assert ui.write("POST", "/api/prune", json={}).status_code == 400  # type: ignore[attr-defined]


PRUNE_REFUSALS = [
    ({"dryrun": True}, 'unknown field "dryrun" in the prune request: it takes keep, '),
    ({"dry_run": "yes"}, 'dry_run must be true or false, got "yes"'),
    ({"dry_run": None}, "dry_run must be true or false, got null"),
    ({"pipeline": 5}, "pipeline must be a string, got 5"),
    ({"older_than": False}, "older_than must be a string, got false"),
    ({"status": ["failed"]}, 'status must be a string, got ["failed"]'),
    ({"status": "done"}, 'unknown status "done"; one of '),
    ({"older_than": "soon"}, 'bad duration "soon": use a number (digits 0-9) and a unit'),
    ({"older_than": "9999999999d"}, 'bad duration "9999999999d": the longest taken is 999999999d'),
]
WHOLE_PRUNE_REFUSALS = [
    # as JSON writes them, a bool or a float named as what it is
    ({"keep": True}, "keep must be a whole number >= 1, got true (a bool, not a number)"),
    ({"keep": "2"}, 'keep must be a whole number >= 1, got "2"'),
    ({"keep": 1e29}, "keep must be a whole number >= 1, got 1e+29 (a float, not an integer)"),
    ({"keep": 2.0}, "keep must be a whole number >= 1, got 2.0 (a float, not an integer)"),
]


def test_a_prune_with_a_field_it_does_not_take_is_refused_and_deletes_nothing(ui: Ui) -> None:
    for body, error in PRUNE_REFUSALS + WHOLE_PRUNE_REFUSALS:  # a misspelt dry_run must not prune
        refused: Any = ui.write("POST", "/api/prune", json={"keep": 1, **body})
        assert refused.status_code == 400, body
        assert refused.json()["error"].startswith(error)
        if (body, error) in WHOLE_PRUNE_REFUSALS:
            assert refused.json() == {"error": error}
        assert len(_checkpoints(ui, ui.filled.ok)) == 3


def test_a_prune_names_a_bad_status_first_as_the_command_does(ui: Ui) -> None:
    # it said "prune needs keep and/or older_than", where nestegg prune names the status
    refused: Any = ui.write("POST", "/api/prune", json={"status": "bogus"})
    assert refused.status_code == 400
    error = 'unknown status "bogus"; one of running, completed, failed, cancelled, waiting'
    assert refused.json() == {"error": error}


def test_a_prune_of_a_pipeline_with_no_run_says_so(ui: Ui) -> None:
    # it answered empty lists and no word, where nestegg prune says there is no such run
    for dry_run in (True, False):
        body = {"pipeline": "nosuch", "older_than": "1s", "dry_run": dry_run}
        done: Any = ui.write("POST", "/api/prune", json=body)
        assert done.status_code == 200, done.text
        assert done.json()["note"] == "no runs of pipeline 'nosuch'"
        assert done.json()["runs"] == [] and done.json()["checkpoints"] == {}
    body = {"pipeline": "cli-test", "older_than": "1000d", "dry_run": True}
    known: Any = ui.write("POST", "/api/prune", json=body)
    assert known.status_code == 200 and "note" not in known.json()
    assert len(_checkpoints(ui, ui.filled.ok)) == 3


def test_a_prune_of_the_pipeline_named_empty_leaves_the_other_pipelines(ui: Ui) -> None:
    done: Any = ui.write("POST", "/api/prune", json={"keep": 1, "pipeline": ""})
    assert done.status_code == 200, done.text  # the pipeline "" (a Clutch may be named so)
    assert done.json()["deleted_checkpoints"] == 0
    assert len(_checkpoints(ui, ui.filled.ok)) == 3  # not every pipeline's runs


def test_a_prune_older_than_the_longest_duration_is_refused_and_deletes_nothing(ui: Ui) -> None:
    runs = _run_ids(ui)
    assert ui.filled.ok in runs
    for older_than, dry_run in (("99999999999d", True), ("1000000000d", False)):
        body = {"older_than": older_than, "dry_run": dry_run}
        refused: Any = ui.write("POST", "/api/prune", json=body)
        assert refused.status_code == 400, refused.text
        error = f'bad duration "{older_than}": the longest taken is 999999999d'
        assert refused.json() == {"error": error}
    assert _run_ids(ui) == runs
    assert len(_checkpoints(ui, ui.filled.ok)) == 3


def test_a_store_given_to_the_app_is_left_open(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")

    async def runs() -> int:
        return len(await store.list_runs())

    with client_for(UISettings(store=store)) as client:
        assert client.get("/").status_code == 200
    assert asyncio.run(runs()) == 0  # still usable: the app did not close it
    asyncio.run(store.close())


class SlowClaims(MemoryCheckpointStorage):
    """A memory store whose claims take a while, as a busy database's may."""

    async def claim_run(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.3)
        return await super().claim_run(*args, **kwargs)


@contextlib.contextmanager
def _resuming(store: MemoryCheckpointStorage) -> Iterator[tuple[TestClient, Filled]]:
    """The application, writes allowed, the test pipeline its Clutch, on ``store`` holding
    the three runs of tests/cli/conftest.py."""
    filled = asyncio.run(fill("memory://", "", store))
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        yield client, filled


def test_a_resume_answers_once_the_run_is_claimed() -> None:
    # The page follows the run from the answer on: a run still shown failed then would
    # end its stream at once and never show the resume.
    store = SlowClaims()
    with _resuming(store) as (client, filled):
        before = client.portal.call(store.get_run, filled.bad)  # type: ignore[union-attr]
        headers = {"X-Nestegg-Token": TOKEN}
        started = client.post(f"/api/runs/{filled.bad}/resume", headers=headers)
        assert started.status_code == 202
        after = client.portal.call(store.get_run, filled.bad)  # type: ignore[union-attr]
        assert before is not None and after is not None
        assert after.fence > before.fence
        assert after.status in ("running", "completed")


def _resumes_at_once(client: TestClient, run_id: str, count: int) -> list[httpx.Response]:
    """``count`` resumes of ``run_id`` sent at the same moment to the started application."""

    async def send() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as sender:
            headers = {"X-Nestegg-Token": TOKEN}
            url = f"/api/runs/{run_id}/resume"
            return list(await asyncio.gather(*(sender.post(url, headers=headers)
                                               for _ in range(count))))  # fmt: skip

    return client.portal.call(send)  # type: ignore[union-attr]


def test_resumes_of_one_run_at_the_same_moment_start_it_once_the_others_are_409() -> None:
    # All three were answered 202; two failed afterwards, seen only on the server's stderr.
    store = SlowClaims()
    with _resuming(store) as (client, filled):
        before = client.portal.call(store.get_run, filled.bad)  # type: ignore[union-attr]
        answers = _resumes_at_once(client, filled.bad, 3)
        assert sorted(a.status_code for a in answers) == [202, 409, 409]
        locked = (
            f"run {filled.bad!r} is being executed by a live process (pid {os.getpid()}); "
            "it cannot be resumed now"
        )  # what nestegg resume says
        assert [a.json() for a in answers if a.status_code == 409] == [{"error": locked}] * 2
        deadline = time.monotonic() + WAIT_SECONDS
        while (run := client.portal.call(store.get_run, filled.bad)).status != "completed":  # type: ignore[union-attr]
            assert time.monotonic() < deadline, run.status
            time.sleep(0.05)
        assert before is not None and run.fence == before.fence + 1  # claimed once


class ClaimedElsewhere(MemoryCheckpointStorage):
    """A memory store where, once ``taken`` is set, another process on another host
    claims a run just before this one does."""

    taken = False

    async def claim_run(self, run_id: str, expected_fence: int, *args: Any, **kwargs: Any) -> Any:
        if self.taken:
            now = time.time()
            other = Owner(host="elsewhere", pid=4242, started="1")
            await super().claim_run(run_id, expected_fence, other, now + 60, now, **kwargs)
        return await super().claim_run(run_id, expected_fence, *args, **kwargs)


def test_a_resume_another_process_claims_first_is_409() -> None:
    # It was answered 202 (the fence had moved on) and failed afterwards, on stderr alone.
    store = ClaimedElsewhere()
    with _resuming(store) as (client, filled):
        store.taken = True
        headers = {"X-Nestegg-Token": TOKEN}
        refused = client.post(f"/api/runs/{filled.bad}/resume", headers=headers)
        assert refused.status_code == 409
        assert refused.json() == {
            "error": f"run {filled.bad!r} is being executed by a live process (pid 4242); "
            "it cannot be resumed now"
        }


def test_a_clutch_without_allow_writes_is_refused() -> None:
    # It opened the store it names for writing, and served nothing else.
    store = MemoryCheckpointStorage()
    clutch = build("cli-test", CheckpointConfig(storage=store, policy=POLICY))
    with pytest.raises(ConfigurationError, match="need allow_writes=True"):
        create_app(UISettings(clutch=clutch))


def test_resume_of_a_run_whose_event_log_is_torn_is_refused_and_not_offered(
    tmp_path: Path,
) -> None:
    # A torn log was 500 (and the page offered the cancelled run's resume)
    with _waiting_ui(tmp_path, waits=False, stopped=False) as (ui, _, clutch):
        assert ui.client.portal.call(clutch.cancel, "stopped")  # type: ignore[union-attr]
        for run_id, unknown in (
            ("waits", "what it waits for"),  # asked of its run_waiting event
            ("stopped", "whether its on_request hook passed"),  # cancelled before a step
        ):
            damage_newest_event_batch(f"sqlite:///{tmp_path / 'runs.db'}", run_id, tear)
            why = (
                f"run {run_id!r} is refused: the event log of run {run_id!r} is damaged (a "
                f"torn batch), so {unknown} is unknown; it was not resumed and nothing of it "
                "was changed (fork it from a checkpoint to go on in a new run, or delete it)"
            )
            _refused_and_untouched(ui, run_id, 409, why)


def test_a_prune_with_a_field_twice_is_refused_and_deletes_nothing(ui: Ui) -> None:
    # orjson keeps the last of a field given twice: {"keep": 5, "keep": 1} would keep one
    for body in ('{"keep": 5, "keep": 1}', '{"keep": 5, "dry_run": true, "dry_run": false}'):
        refused: Any = ui.write("POST", "/api/prune", content=body)
        field = body.split(", ")[-1].split(":")[0]
        assert (refused.status_code, refused.json()["error"]) == (
            400,
            f"the request body has the field {field} twice: give it once",
        )
    assert len(_checkpoints(ui, ui.filled.ok)) == 3
