"""The inspector's fork checks the data it is given against the model of the agent the
fork goes to, as ``Clutch.fork`` and ``nestegg fork`` do, before anything is stored."""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from nestegg.checkpoint.stores import open_store
from nestegg.ui import UISettings
from tests.checkpoint.test_forks import typed_clutch
from tests.cli.conftest import Filled
from tests.ui.conftest import TOKEN, Ui, client_for


def test_a_fork_whose_data_does_not_fit_the_next_agents_model_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the inspector handed its check the data's wrapper, which every model let through:
    # the fork was started, and refused only by its own task, logged as a failed fork
    caplog.set_level(logging.INFO, logger="nestegg.ui")
    store = open_store(f"sqlite:///{tmp_path / 'runs.db'}")
    clutch = typed_clutch(store, [])
    asyncio.run(clutch.run({"notes": []}, run_id="orig"))
    [after_first] = [c for c in asyncio.run(clutch.list_checkpoints("orig")) if c.seq == 1]
    settings = UISettings(store=store, clutch=clutch, allow_writes=True, token=TOKEN)
    with client_for(settings) as client:
        ui = Ui(client, Filled(str(tmp_path), "", "", ""), "sqlite")
        path = f"/api/checkpoints/{after_first.checkpoint_id}/fork"
        refused: Any = ui.write("POST", path, json={"data": {"notes": "x"}})
        assert refused.status_code == 409
        assert refused.json() == {
            "error": (
                f"fork of checkpoint {after_first.checkpoint_id!r} of run 'orig': the data "
                "given does not fit the model Notes of agent 'second' (notes: Input should "
                "be a valid list); nothing was stored: give data that fits it"
            )
        }
        runs = client.portal.call(store.list_runs)  # type: ignore[union-attr]
        assert [run.run_id for run in runs] == ["orig"]
        assert [r.getMessage() for r in caplog.records if r.name == "nestegg.ui"] == []
        fitting: Any = ui.write("POST", path, json={"data": {"notes": ["mine"]}})
        assert fitting.status_code == 201
        assert re.fullmatch(r"\S+", fitting.json()["run_id"])
    asyncio.run(store.close())
