"""A checkpointed pipeline whose journaled call fails for good while the environment
variable CLI_TEST_CALL_FAILS is ``1`` (its two attempts spent); ``CALLS`` logs the calls
really made. ``pipeline`` uses whatever store the command selects; :func:`build` takes one.
"""

from __future__ import annotations

import os

import nestegg
from nestegg import Clutch, RetryPolicy
from nestegg.checkpoint import CheckpointConfig

CALL_FAILS_ENV = "CLI_TEST_CALL_FAILS"
CALLS: list[str] = []


@nestegg.durable(retry=RetryPolicy(attempts=2, backoff=0))
async def price(item: str) -> int:
    """Stands in for a paid API call that fails while CLI_TEST_CALL_FAILS is ``1``."""
    CALLS.append(item)
    if os.environ.get(CALL_FAILS_ENV) == "1":
        raise ConnectionError(f"no price for {item} (attempt {len(CALLS)})")
    return 3


def build(config: CheckpointConfig) -> Clutch:
    """The pipeline ``priced``: ``quote`` prices the item (journaled), ``report`` says it."""
    clutch = Clutch("priced", checkpoint=config)

    @clutch.agent()
    async def quote(data: dict) -> dict:
        return {**data, "price": await price(data["item"])}

    @clutch.agent()
    async def report(data: dict) -> dict:
        return {**data, "report": f"{data['item']} costs {data['price']}"}

    return clutch


pipeline = build(CheckpointConfig())
