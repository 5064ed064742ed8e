"""``events --follow`` and a resume that claims the run while it reads a step's calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from nestegg.checkpoint.formats import journal_result_body
from nestegg.checkpoint.records import JournalRecord
from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage
from nestegg.cli.events import _FollowedCalls
from nestegg.cli.render import Output
from nestegg.constants import RUN_RESUMED
from nestegg.testing.builders import OWNER, T0, create, make_commit, make_event


async def test_the_calls_of_a_step_in_flight_wait_while_a_resume_has_claimed_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = SQLiteCheckpointStorage(tmp_path / "n.db")
    run = await create(store, run_id="r")
    body = journal_result_body("ask", "0" * 16, b'"yes"', T0, 0.5)
    await store.commit(make_commit(run, journal=[JournalRecord("r", 1, 0, body)]))
    calls = _FollowedCalls(store, Output(as_json=True), run)
    claimed = await store.claim_run("r", run.fence, OWNER, T0 + 60, T0 + 1)  # a resume
    printed = run.event_seq  # the follower has printed every event

    await calls.print_new(1, attempt=(run.fence, printed))  # read at the old fence: the
    assert capsys.readouterr().out == ""  # next poll's
    # the resume's opening writes events the follower has not printed yet (its run read
    # before them: the new fence, the old step_seq): the calls wait for them
    opening = make_event("r", printed + 1, kind=RUN_RESUMED)
    await store.commit(make_commit(claimed, events=[opening], event_seq=opening.seq))
    await calls.print_new(1, attempt=(claimed.fence, printed))
    assert capsys.readouterr().out == ""
    await calls.print_new(1, attempt=(claimed.fence, opening.seq))
    assert '"kind":"call_journaled"' in capsys.readouterr().out
    await store.close()
