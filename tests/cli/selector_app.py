"""A checkpointed SELECTOR pipeline the command line tests recover (``--app``).

Its selector picks ``count`` (which adds 1 to ``n``) until ``n`` is 2; while the
environment variable CLI_SELECTOR_FAIL is ``1`` it raises LookupError once ``n`` is 1.
With CLI_SELECTOR_KILL=1, ``count`` kills its own process (SIGKILL) at ``n`` = 1, leaving
the run interrupted.
"""

from __future__ import annotations

import os
import signal

from nestegg import Clutch, Strategy
from nestegg.checkpoint import CheckpointConfig

FAIL_ENV = "CLI_SELECTOR_FAIL"
KILL_ENV = "CLI_SELECTOR_KILL"

pipeline = Clutch("cli-selector", strategy=Strategy.SELECTOR, checkpoint=CheckpointConfig())


@pipeline.selector
async def pick(data: dict[str, int]) -> str | None:
    if os.environ.get(FAIL_ENV) == "1" and data["n"] >= 1:
        raise LookupError(f"no route at n={data['n']}")
    return "count" if data["n"] < 2 else None


@pipeline.agent()
async def count(data: dict[str, int]) -> dict[str, int]:
    if os.environ.get(KILL_ENV) == "1" and data["n"] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"n": data["n"] + 1}
