"""A checkpointed SELECTOR pipeline the command line tests recover (``--app``).

Its selector picks ``count`` (which adds 1 to ``n``) until ``n`` is 2; while ``failing()``
(by default: while the environment variable CLI_SELECTOR_FAIL is ``1``) it raises
LookupError once ``n`` is 1, failing step 2. With CLI_SELECTOR_KILL=1, ``count`` kills its
own process (SIGKILL) at ``n`` = 1, leaving the run interrupted.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores.base import CheckpointStorage

FAIL_ENV = "CLI_SELECTOR_FAIL"
KILL_ENV = "CLI_SELECTOR_KILL"


def failing_by_env() -> bool:
    return os.environ.get(FAIL_ENV) == "1"


def build(config: CheckpointConfig, failing: Callable[[], bool] = failing_by_env) -> Clutch:
    """The pipeline ``cli-selector`` on ``config``'s store."""
    clutch = Clutch("cli-selector", strategy=Strategy.SELECTOR, checkpoint=config)

    @clutch.selector
    async def pick(data: dict[str, int]) -> str | None:
        if failing() and data["n"] >= 1:
            raise LookupError(f"no route at n={data['n']}")
        return "count" if data["n"] < 2 else None

    @clutch.agent()
    async def count(data: dict[str, int]) -> dict[str, int]:
        if os.environ.get(KILL_ENV) == "1" and data["n"] == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"n": data["n"] + 1}

    return clutch


pipeline = build(CheckpointConfig())


async def fail_in_the_selector(store: CheckpointStorage, run_id: str) -> None:
    """Run ``run_id`` in ``store`` to its failure in the selector at step 2, then close
    ``store``."""
    clutch = build(CheckpointConfig(storage=store), failing=lambda: True)
    try:
        await clutch.run({"n": 0}, run_id=run_id)
    except LookupError:
        pass
    else:
        raise AssertionError("the selector did not fail the run")
    finally:
        await store.close()
