"""The child of the group-commit crash test: many runs committing at once, until killed.

Run as ``python group_child.py --store URL [--prefix P] --runs K --log FILE``. Creates
and claims K runs, then commits steps 1, 2, ... of every run at once (each run waits for
its own commit before its next), so the store writes them in group commits. After each
acknowledged commit it appends ``run_id seq`` to the log (one ``os.write`` on an
``O_APPEND`` descriptor). It runs until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nestegg.checkpoint.records import Owner, RunRecord
from nestegg.testing.builders import make_checkpoint, make_commit, make_run, make_step
from tests.crash.child import open_test_store


async def main(args: argparse.Namespace) -> None:
    store = open_test_store(args.store, args.prefix)
    await store.setup()
    log = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    owner = Owner("crash-host", os.getpid(), "group")

    async def claimed(index: int) -> RunRecord:
        run = make_run(f"group-{index:03d}")
        await store.create_run(run)
        return await store.claim_run(run.run_id, run.fence, owner, time.time() + 60, 0.0)

    async def one(run: RunRecord) -> None:
        seq = 0
        while True:
            seq += 1
            step = make_step(run.run_id, seq)
            checkpoint = make_checkpoint(run.run_id, seq)
            commit = make_commit(run, steps=[step], checkpoints=[checkpoint], step_seq=seq)
            await store.commit(commit)
            os.write(log, f"{run.run_id} {seq}\n".encode())
            # a step's work gives the other runs their turn, as a step awaiting a model
            # does: a commit the store wrote at once on this thread does not
            await asyncio.sleep(0)

    # every run claimed first, so that all of them commit from the start
    runs = await asyncio.gather(*(claimed(i) for i in range(args.runs)))
    await asyncio.gather(*(one(run) for run in runs))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix")
    parser.add_argument("--runs", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    asyncio.run(main(parser.parse_args()))
