"""Request bodies the inspector's writes refuse (400) before anything changes: a cancel's
or a delete's body, as a resume's is read."""

from __future__ import annotations

import uuid
from typing import Any

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
