"""Request bodies the inspector's writes refuse (400) before anything changes: a cancel's
or a delete's body, as a resume's is read, and fork data the codec cannot store."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from nestegg.checkpoint import codec
from nestegg.checkpoint.records import RunRecord
from tests.ui.conftest import Ui
from tests.ui.pipelines import start_waiting

NO_FIELD = "it takes no field (send no body, or {})"
REFUSED_BODIES = (
    (b'{"dry_run": true}', 'unknown field "dry_run" in the WHAT request: ' + NO_FIELD),
    (b'{"x": 1}', 'unknown field "x" in the WHAT request: ' + NO_FIELD),
    (b"garbage", "the request body is not JSON: "),
    (b"[]", "the request body must be a JSON object, got a JSON array: []"),
    (b"null", "the request body must be a JSON object, got null: null"),
)
"""A body a cancel and a delete refuse, and the start of their error (WHAT: which)."""


def _run(ui: Ui, run_id: str) -> RunRecord | None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    return ui.client.portal.call(store.get_run, run_id)  # type: ignore[union-attr,no-any-return]


def _run_ids(ui: Ui) -> list[str]:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    runs = ui.client.portal.call(store.list_runs)  # type: ignore[union-attr]
    return sorted(run.run_id for run in runs)


def _refuses_every_body(ui: Ui, method: str, path: str, what: str) -> None:
    for body, error in REFUSED_BODIES:
        refused: Any = ui.write(method, path, content=body)
        assert refused.status_code == 400, body
        assert refused.json()["error"].startswith(error.replace("WHAT", what)), body


def test_a_delete_with_a_body_it_does_not_take_is_refused_and_deletes_nothing(ui: Ui) -> None:
    # {"dry_run": true} deleted the run, and so did a body that is not JSON
    run_id = ui.filled.bad
    before = _run(ui, run_id)
    _refuses_every_body(ui, "DELETE", f"/api/runs/{run_id}", "delete")
    assert _run(ui, run_id) == before
    for body in (b"", b"{}"):
        done: Any = ui.write("DELETE", f"/api/runs/{run_id}", content=body)
        assert (done.status_code, done.json()) == (200, {"deleted": run_id})
        run_id = ui.filled.ok


def test_a_cancel_with_a_body_it_does_not_take_is_refused_and_cancels_nothing(ui: Ui) -> None:
    store = ui.client.app.state.store  # type: ignore[attr-defined]
    waiting = f"waiting-{uuid.uuid4().hex[:8]}"
    ui.client.portal.call(lambda: start_waiting(store, waiting, nap=False))  # type: ignore[union-attr]
    try:
        for run_id, body in ((waiting, b"{}"), (ui.filled.gone, b"")):
            before = _run(ui, run_id)
            # gone is stored running, its owner dead: interrupted
            assert before is not None and before.status in ("waiting", "running")
            _refuses_every_body(ui, "POST", f"/api/runs/{run_id}/cancel", "cancel")
            assert _run(ui, run_id) == before  # still waiting (or interrupted), not claimed
            done: Any = ui.write("POST", f"/api/runs/{run_id}/cancel", content=body)
            assert done.status_code == 200 and done.json()["cancelled"] is True
    finally:
        ui.write("DELETE", f"/api/runs/{waiting}")


def _nested(depth: int) -> str:
    """A fork's request body whose data is ``depth`` lists deep."""
    return '{"data": ' + "[" * depth + "1" + "]" * depth + "}"


def _second_checkpoint(ui: Ui) -> str:
    page = ui.client.get(f"/runs/{ui.filled.ok}").text
    return re.findall(r'class="cp" href="/checkpoints/([^"?]+)"', page)[1]


def test_fork_data_the_codec_cannot_store_is_refused_and_stores_nothing(
    ui: Ui, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 500, with a RecursionError logged at 500 deep; nothing is stored either way
    checkpoint, before = _second_checkpoint(ui), _run_ids(ui)
    unstorable = "cannot store the value at data: type list is not serializable"
    for body, error in (
        (_nested(300), f"{unstorable} (Recursion limit reached)"),  # deeper than orjson writes
        (_nested(500), f"{unstorable} (nested too deeply)"),  # than Python's stack holds
    ):
        refused: Any = ui.write("POST", f"/api/checkpoints/{checkpoint}/fork", content=body)
        assert (refused.status_code, refused.json()) == (400, {"error": error})
    monkeypatch.setattr(codec, "RECORD_MAX_BYTES", 1000)  # as 64 MiB is, with less to send
    big: Any = ui.write("POST", f"/api/checkpoints/{checkpoint}/fork", json={"data": "a" * 1000})
    assert (big.status_code, big.json()) == (
        400,
        {"error": "cannot store data: it is 1,002 bytes encoded, over the 1,000 bytes a store "
         "takes at once"},
    )  # fmt: skip
    assert _run_ids(ui) == before
    assert not ui.client.app.state.background  # type: ignore[attr-defined]
