"""How the ``nestegg`` command logs: one ``warning: ...`` or ``error: ...`` line per nestegg
record of that level, escaped; the broker and store clients' records under --debug only."""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from nestegg.cli.escapes import escaped, escaped_lines
from nestegg.errors import CheckpointFallbackWarning

CLIENT_LOGGERS = frozenset({"aio_pika", "aiormq", "pamqp", "psycopg", "psycopg_pool", "redis"})
"""The broker and store clients whose records the command shows under --debug only: every
failure of theirs reaches nestegg as an exception, which it reports in a line of its own
(aiormq logs each refused connection as an error, and aio-pika each reconnection)."""


class _OwnWarningsOnly(logging.Filter):
    """Lets nestegg's warnings through, other libraries' only from ERROR up, and the broker
    and store clients' (CLIENT_LOGGERS) none."""

    def filter(self, record: logging.LogRecord) -> bool:
        root = record.name.split(".")[0]
        if root == "nestegg":
            return True
        return root not in CLIENT_LOGGERS and record.levelno >= logging.ERROR


class _Escaped(logging.Formatter):
    """A record with its control and bidi characters escaped (its newlines kept)."""

    def format(self, record: logging.LogRecord) -> str:
        return escaped_lines(super().format(record))


class _LevelLine(logging.Formatter):
    """A record as one ``error: ...`` (ERROR and above) or ``warning: ...`` line, escaped
    (a newline in it as ``\\n``); a record's exception as its type and message after it
    (its traceback: under --debug)."""

    def format(self, record: logging.LogRecord) -> str:
        label = "error" if record.levelno >= logging.ERROR else record.levelname.lower()
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            text = f"{text}: {type(error).__name__}: {error}"
        return f"{label}: {escaped(text)}"


def configure_logging(argv: Sequence[str]) -> None:
    """For the command's process: one ``warning: ...`` or ``error: ...`` line per nestegg
    record of that level, drivers' chatter hidden (all of it, with details, under
    --debug)."""
    handler = logging.StreamHandler(sys.stderr)
    if "--debug" in argv:
        handler.setFormatter(_Escaped("%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.DEBUG, handlers=[handler])
        return
    handler.setFormatter(_LevelLine("%(message)s"))
    handler.addFilter(_OwnWarningsOnly())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    warnings.showwarning = _show_warning


def _show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: Any = None,
    line: str | None = None,
) -> None:
    """nestegg's warnings as one ``warning: ...`` line each; other libraries' hidden."""
    if issubclass(category, CheckpointFallbackWarning):
        sys.stderr.write(f"warning: {escaped(' '.join(str(message).split()))}\n")


__all__ = ["CLIENT_LOGGERS", "configure_logging"]
