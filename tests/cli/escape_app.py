"""A pipeline whose agent fails with terminal commands and a bidi override in its error,
as an error quoting a model's reply may (``--app tests.cli.escape_app:pipeline``); the
module logs that text as a warning when it is imported."""

from __future__ import annotations

import logging

from nestegg import Clutch
from nestegg.checkpoint import CheckpointConfig

MESSAGE = "LLM said: \x1b[2J\x1b]0;owned\x07 \u202egnp.exe"


def build(config: CheckpointConfig) -> Clutch:
    """The one-agent pipeline ``escape``, its agent raising RuntimeError(MESSAGE)."""
    clutch = Clutch("escape", checkpoint=config)

    @clutch.agent()
    async def answer(data: dict) -> dict:
        raise RuntimeError(MESSAGE)

    return clutch


pipeline = build(CheckpointConfig())
logging.getLogger("nestegg.test").warning("%s", MESSAGE)
