"""A process of the wait tests: start a refund run, signal it, or recover; prints one JSON
line saying how it ended.

    python -m tests.waits.child --store URL [--prefix P] start RUN LEDGER
    python -m tests.waits.child --store URL [--prefix P] signal RUN
    python -m tests.waits.child --store URL [--prefix P] recover

``NESTEGG_TEST_KILL_AT`` (see tests.waits.pipeline) makes it stop where a test kills it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import orjson

from nestegg import RunWaiting
from tests.crash.child import open_test_store
from tests.waits.pipeline import build

APPROVAL = {"approved": True, "by": "ann"}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    store = open_test_store(args.store, args.prefix)
    clutch = build(store)
    try:
        if args.action == "start":
            result = await clutch.run({"ledger": args.ledger, "amount": 7}, run_id=args.run_id)
        elif args.action == "signal":
            result = await clutch.signal(args.run_id, "approval", APPROVAL)
        else:
            outcomes = await clutch.recover()
            result = {run_id: repr(outcome) for run_id, outcome in outcomes.items()}
        return {"result": result}
    except RunWaiting as waiting:
        return {"waiting": waiting.signal, "run_id": waiting.run_id}
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", required=True)
    parser.add_argument("--prefix")
    parser.add_argument("action", choices=["start", "signal", "recover"])
    parser.add_argument("run_id", nargs="?")
    parser.add_argument("ledger", nargs="?")
    outcome = asyncio.run(main(parser.parse_args()))
    sys.stdout.write(orjson.dumps(outcome).decode() + "\n")
