"""N checkpointed steps of a one-agent ROUND_ROBIN pipeline, for counting instructions.

Run under valgrind with two step counts; the difference of the two totals over the
difference of the steps is a step's instructions (start-up cancels out), a count that other
work on the machine does not change:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.1500 \\
        .venv-bench/bin/python bench/step_instructions.py memory 1500
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.500 \\
        .venv-bench/bin/python bench/step_instructions.py memory 500

KIND is ``none`` (no checkpoint), ``memory`` or ``sqlite`` (a temporary file); each step
passes the ~1 KB message of harness.py, with ``CheckpointPolicy(every_n_steps=1,
keep_latest=3, durability="sync")``.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from harness import LARGE_TIMEOUT, START_INPUT, next_message

from nestegg import Clutch, Strategy
from nestegg.checkpoint import (
    CheckpointConfig,
    CheckpointPolicy,
    MemoryCheckpointStorage,
    SQLiteCheckpointStorage,
)

POLICY = CheckpointPolicy(every_n_steps=1, keep_latest=3, durability="sync")


async def main(kind: str, steps: int) -> None:
    storage: MemoryCheckpointStorage | SQLiteCheckpointStorage | None = None
    if kind == "memory":
        storage = MemoryCheckpointStorage()
    elif kind == "sqlite":
        storage = SQLiteCheckpointStorage(Path(tempfile.mkdtemp(prefix="steps-")) / "p.db")
        await storage.setup()
    elif kind != "none":
        raise SystemExit(f"KIND is none, memory or sqlite, got {kind!r}")
    config = CheckpointConfig(storage=storage, policy=POLICY, run_id="probe") if storage else None
    clutch = Clutch("bench", strategy=Strategy.ROUND_ROBIN, max_turns=steps, checkpoint=config)

    @clutch.agent()
    async def step(data: dict[str, object]) -> dict[str, object]:
        return next_message(data)

    await clutch.run(START_INPUT, timeout=LARGE_TIMEOUT)
    if storage is not None:
        await storage.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: step_instructions.py KIND STEPS (KIND: none, memory, sqlite)")
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
