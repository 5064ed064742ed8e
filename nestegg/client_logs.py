"""The log records of the broker and store clients nestegg drives (aio-pika, aiormq,
psycopg_pool): every failure of theirs reaches nestegg as an exception, which names it,
so in a program that configured no logging their own lines of it (``error when creating
transport``, ``error connecting in 'nestegg-...'``) are not printed by logging's last
resort. A program that configured logging gets them as before."""

from __future__ import annotations

import logging


def quiet_unless_configured(*loggers: str) -> None:
    """Give each of ``loggers`` a NullHandler, once."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(handler, logging.NullHandler) for handler in logger.handlers):
            logger.addHandler(logging.NullHandler())


__all__ = ["quiet_unless_configured"]
