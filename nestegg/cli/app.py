"""The typer application: global options, store selection, and errors as exit codes.

Every error ends the command with one line on stderr (``error: ...``) and an exit code:
0 ok, 1 failed operation, 2 bad usage, 3 not found, 4 store unreachable, 130 Ctrl-C.
``--debug`` adds the traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from nestegg.checkpoint.stores import default_home, default_store, open_store
from nestegg.checkpoint.stores.base import CheckpointStorage
from nestegg.constants import (
    DEFAULT_DB_NAME,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    STORE_ENV,
)
from nestegg.errors import (
    CheckpointNotFoundError,
    ConfigurationError,
    InvalidIdentifierError,
    NestEggError,
    RunNotFoundError,
    StorageUnavailableError,
)

T = TypeVar("T")

STORE_HELP = (
    "Store URL: sqlite:///file.db, file:///dir, postgresql://..., redis://..., memory://. "
    f"Default: ${STORE_ENV}, else the embedded default (SQLite at "
    f"$NESTEGG_HOME/{DEFAULT_DB_NAME}, NESTEGG_HOME defaulting to ~/.nestegg)."
)

StoreOption = Annotated[
    str | None, typer.Option("--store", "-s", help=STORE_HELP, show_default=False)
]
JsonOption = Annotated[
    bool, typer.Option("--json", help="Machine-readable JSON on stdout (ISO 8601 times).")
]


class CommandError(Exception):
    """A command failed: ``message`` goes to stderr as one line, ``exit_code`` to the shell."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _OwnWarningsOnly(logging.Filter):
    """Lets nestegg's warnings through and other libraries' only from ERROR up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.split(".")[0] == "nestegg" or record.levelno >= logging.ERROR


def configure_logging(argv: Sequence[str]) -> None:
    """For the command's process: one ``warning: ...`` line per nestegg warning, drivers'
    chatter hidden (all of it, with details, under --debug)."""
    handler = logging.StreamHandler(sys.stderr)
    if "--debug" in argv:
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        logging.basicConfig(level=logging.DEBUG, handlers=[handler])
        return
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    handler.addFilter(_OwnWarningsOnly())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    logging.captureWarnings(True)  # the same messages come through nestegg's logger


def _click_exception_type() -> type[Exception]:
    # typer re-exports click's BadParameter; its ancestry holds ClickException (whether
    # click is vendored by typer or installed on its own).
    for cls in typer.BadParameter.__mro__:
        if cls.__name__ == "ClickException":
            return cls
    return typer.BadParameter  # pragma: no cover


_CLICK_EXCEPTION = _click_exception_type()


def exit_code_for(error: BaseException) -> int:
    """The exit code an exception ends the command with."""
    if isinstance(error, CommandError):
        return error.exit_code
    if isinstance(error, RunNotFoundError | CheckpointNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(error, StorageUnavailableError):
        return EXIT_UNAVAILABLE
    if isinstance(error, ConfigurationError | InvalidIdentifierError):
        return EXIT_USAGE
    return EXIT_FAILED


def error_line(error: BaseException) -> str:
    """One line saying what went wrong."""
    if isinstance(error, CommandError | NestEggError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return " ".join(text.split()) or type(error).__name__


def _report(error: BaseException, debug: bool) -> int:
    if debug:
        traceback.print_exception(error, file=sys.stderr)
    if isinstance(error, _CLICK_EXCEPTION):
        message: str = error.format_message()  # type: ignore[attr-defined]
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        sys.stderr.write(f"error: {' '.join(message.split())}{hint}\n")
        return int(getattr(error, "exit_code", EXIT_USAGE))
    sys.stderr.write(f"error: {error_line(error)}\n")
    return exit_code_for(error)


class NestEggGroup(TyperGroup):
    """The command group; turns every exception into one line on stderr and an exit code."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = "--debug" in argv
        try:
            outcome = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = outcome if isinstance(outcome, int) else EXIT_OK
        except KeyboardInterrupt:
            sys.stderr.write("error: interrupted\n")
            code = EXIT_INTERRUPTED
        except typer.Abort:
            sys.stderr.write("error: aborted\n")
            code = EXIT_FAILED
        except Exception as error:
            code = _report(error, debug)
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(
    cls=NestEggGroup,
    name="nestegg",
    help="Inspect, resume, recover and clean up checkpointed nestegg runs.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@dataclass(frozen=True, slots=True)
class Settings:
    """The global options, kept on the typer context."""

    store: str | None = None
    debug: bool = False


@app.callback()
def main_options(
    ctx: typer.Context,
    store: StoreOption = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks with errors.")] = False,
) -> None:
    """Inspect, resume, recover and clean up checkpointed nestegg runs.

    Exit codes: 0 ok, 1 failed operation, 2 bad usage, 3 not found, 4 store unreachable.
    """
    ctx.obj = Settings(store=store, debug=debug)


def store_url(ctx: typer.Context, store: str | None) -> str | None:
    """The store URL chosen: the command's --store, the global one, $NESTEGG_STORE, else None
    (the embedded default)."""
    settings = ctx.find_object(Settings) or Settings()
    return store or settings.store or os.environ.get(STORE_ENV) or None


def explicit_store(ctx: typer.Context, store: str | None) -> bool:
    """Whether --store was given on the command line (not from the environment)."""
    settings = ctx.find_object(Settings) or Settings()
    return bool(store or settings.store)


def describe_store(url: str | None) -> str:
    """The store as users know it: its URL, or the embedded default's path."""
    if url:
        return url
    return f"the default store ({default_home() / DEFAULT_DB_NAME})"


def open_selected(url: str | None) -> CheckpointStorage:
    """The store for ``url``, or the embedded default when None.

    Raises:
        ConfigurationError: an unknown scheme or a malformed URL.
    """
    try:
        return open_store(url) if url else default_store()
    except (ValueError, TypeError) as error:
        if isinstance(error, NestEggError):
            raise
        raise CommandError(f"bad store URL {url!r}: {error}", EXIT_USAGE) from error


async def _with_store(url: str | None, work: Callable[[CheckpointStorage], Awaitable[T]]) -> T:
    store = open_selected(url)
    try:
        await store.setup()
        return await work(store)
    finally:
        await store.close()


def run_with_store(
    ctx: typer.Context, store: str | None, work: Callable[[CheckpointStorage], Awaitable[T]]
) -> T:
    """Open the selected store, run ``work`` on it in an event loop, close the store."""
    return asyncio.run(_with_store(store_url(ctx, store), work))


def run_async(work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` in a fresh event loop."""

    async def call() -> T:
        return await work()

    return asyncio.run(call())
