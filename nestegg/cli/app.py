"""The typer application: global options, store selection, and errors as exit codes.

Every error ends the command with one line on stderr (``error: ...``) and an exit code:
0 ok, 1 failed operation, 2 bad usage, 3 not found, 4 store unreachable, 5 the run waits
(``nestegg resume`` of a run whose wait is not over), 130 Ctrl-C.
``--debug`` adds the traceback.

This module, as every module that declares commands, imports only what reading the
command line needs (typer, the exit codes, the errors): a store, asyncio, the output and
the Clutch are imported by the functions that use them, so that ``nestegg --help``
imports none of them and ``nestegg runs`` only the store it reads.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperGroup

from nestegg.cli import json_output
from nestegg.cli.escapes import escaped, escaped_lines
from nestegg.constants import (
    DEFAULT_DB_NAME,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    FILE_RUNS_DIR,
    STORE_ENV,
)
from nestegg.errors import (
    BrokerRefusedError,
    CheckpointNotFoundError,
    ConfigurationError,
    InvalidIdentifierError,
    MissingDependencyError,
    NestEggError,
    RunNotFoundError,
    SignalError,
    SignalValueError,
    StorageUnavailableError,
)
from nestegg.identifiers import check_name
from nestegg.urls import without_password

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.checkpoint.stores.file import FileCheckpointStorage
    from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

T = TypeVar("T")

STORE_HELP = (
    "Store URL: sqlite:///file.db, file:///dir, postgresql://..., redis://... (not one in "
    "memory: memory://, sqlite://). "
    f"Default: ${STORE_ENV}, else the embedded default (SQLite at "
    f"$NESTEGG_HOME/{DEFAULT_DB_NAME}, NESTEGG_HOME defaulting to ~/.nestegg)."
)

StoreOption = Annotated[
    str | None, typer.Option("--store", "-s", help=STORE_HELP, show_default=False)
]


def _note_json(value: bool) -> bool:
    json_output.state.requested = value
    return value


JsonOption = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Machine-readable JSON on stdout (ISO 8601 times; NaN and infinities as the "
        'strings "NaN", "Infinity", "-Infinity").',
        callback=_note_json,
    ),
]


def id_argument(help_text: str, what: str = "run id") -> Any:
    """An id argument (``what``: ``"run id"``...) whose value no run can have is refused as
    the command line is read (exit 2), before a store is opened or an app imported."""

    def check(value: str) -> str:
        return check_name(value, what)

    return typer.Argument(help=help_text, show_default=False, callback=check)


REPLACE_FLAG = "--replace"
"""The option of ``nestegg signal`` that sends another value (``replace=True`` in Python)."""


class CommandError(Exception):
    """A command failed: ``message`` goes to stderr as one line, ``exit_code`` to the shell;
    ``details``: what ``--json`` adds beside the message on stdout."""

    def __init__(
        self, message: str, exit_code: int = EXIT_FAILED, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.details = details or {}


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
    if isinstance(error, ConfigurationError | InvalidIdentifierError | BrokerRefusedError):
        return EXIT_USAGE
    return EXIT_FAILED


def error_line(error: BaseException) -> str:
    """One line saying what went wrong."""
    if isinstance(error, SignalError | SignalValueError):
        text = error.advice(REPLACE_FLAG)  # the command's option, not the library's
    elif isinstance(error, CommandError | NestEggError):
        text = str(error)
    else:
        text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return " ".join(text.split()) or type(error).__name__


def _report(error: BaseException, debug: bool) -> int:
    """Write the ``error:`` line (escaped, as the traceback and the ``warning:`` lines: an
    agent's error may quote a model's reply holding terminal commands), and for a command
    given ``--json`` the error as a JSON object on stdout if it wrote none there; the
    exit code."""
    if debug:
        sys.stderr.write(escaped_lines("".join(traceback.format_exception(error))))
    if isinstance(error, _CLICK_EXCEPTION):
        message: str = error.format_message()  # type: ignore[attr-defined]
        context = getattr(error, "ctx", None)
        hint = f" (see '{context.command_path} --help')" if context is not None else ""
        line, code = " ".join(message.split()) + hint, int(getattr(error, "exit_code", EXIT_USAGE))
    else:
        line, code = error_line(error), exit_code_for(error)
    sys.stderr.write(f"error: {escaped(line)}\n")
    if json_output.state.requested and not json_output.state.written:
        from nestegg.cli.render import Output

        Output(as_json=True).json(_error_object(error, line, code))
    return code


def _error_object(error: BaseException, line: str, code: int) -> dict[str, Any]:
    """What ``--json`` writes of a command that failed: the ``error`` line, the
    ``exit_code``, the library error's ``type`` (the one the command's error was raised
    from: ``RunWaiting`` for a run that waits) and the command's ``details``."""
    found: dict[str, Any] = {"error": line, "exit_code": code}
    raised = error if isinstance(error, NestEggError) else error.__cause__
    if isinstance(raised, NestEggError):
        found["type"] = type(raised).__name__
    if isinstance(error, CommandError):
        found.update(error.details)
    return found


METAVARS = {
    "store": "URL",
    "older_than": "DURATION",
    "output": "FILE",
    "source": "FILE",
    "app": "MODULE:ATTR",
    "poll_interval": "SECONDS",
    "grace": "SECONDS",
    "since": "SEQ",
    "limit": "N",
    "keep": "N",
    "concurrency": "N",
    "from_checkpoint": "CHECKPOINT_ID",
    "data": "JSON",
    "data_file": "PATH",
}
"""Names shown in help for values (the others: the parameter's name in capitals)."""


class _NamedArgument(TyperArgument):
    """An argument shown by its name alone: ``RUN_ID``, not ``{run_id}`` or ``<str>``."""

    def _usage_display_name(self) -> str:
        return self.display_name_raw if self.required else f"[{self.display_name_raw}]"

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _name_values(params: Sequence[Any]) -> None:
    """Give each value a name in help (``RUN_ID``, ``--store URL``), not its type."""
    for param in params:
        if param.metavar is None and not getattr(param, "is_flag", False) and param.name:
            param.metavar = METAVARS.get(param.name, param.name.upper())
        if type(param) is TyperArgument:
            param.__class__ = _NamedArgument


class NestEggGroup(TyperGroup):
    """The command group; turns every exception into one line on stderr and an exit code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _name_values(self.params)
        for command in self.commands.values():
            _name_values(command.params)

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
        json_output.state = json_output.JsonOutput()
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
            if type(error).__name__ == "NoArgsIsHelpError":  # `nestegg`, nothing after it
                sys.stderr.write(error.ctx.get_help() + "\n")  # type: ignore[attr-defined]
                code = EXIT_USAGE
            else:
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


def _print_version(value: bool) -> None:
    if value:
        from nestegg import __version__

        sys.stdout.write(f"nestegg {__version__}\n")
        raise typer.Exit(EXIT_OK)


@app.callback()
def main_options(
    ctx: typer.Context,
    store: StoreOption = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks with errors.")] = False,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Inspect, resume, recover and clean up checkpointed nestegg runs.

    Exit codes: 0 ok, 1 failed operation, 2 bad usage, 3 not found, 4 store unreachable.
    """
    ctx.obj = Settings(store=store, debug=debug)


def store_url(ctx: typer.Context, store: str | None) -> str | None:
    """The store URL chosen: the command's --store, the global one, $NESTEGG_STORE, else None
    (the embedded default).

    Raises:
        CommandError: an empty --store, or a store in memory (bad usage; leave it out for
            the default).
    """
    settings = ctx.find_object(Settings) or Settings()
    for given in (store, settings.store):
        if given is not None and not given.strip():
            raise CommandError(
                "--store is empty: give a store URL, or leave --store out for "
                f"${STORE_ENV} or the default store",
                EXIT_USAGE,
            )
    from nestegg.checkpoint.stores import in_memory

    chosen = store or settings.store or os.environ.get(STORE_ENV) or None
    if chosen is not None and in_memory(chosen):
        raise CommandError(
            f"store URL {without_password(chosen)!r} from {_origin(chosen)} names a store in "
            "memory, which lives only inside the process that made it: a command's would be "
            "new and empty, and gone when it ends; give a store in a file instead, such as "
            "sqlite:///runs.db",
            EXIT_USAGE,
        )
    return chosen


def explicit_store(ctx: typer.Context, store: str | None) -> bool:
    """Whether --store was given on the command line (not from the environment)."""
    settings = ctx.find_object(Settings) or Settings()
    return bool(store or settings.store)


def describe_store(url: str | None) -> str:
    """The store as users know it: its URL (without its password), or the embedded
    default's path."""
    if url:
        return without_password(url)
    return f"the default store ({_default_path()})"


def _default_path() -> Path:
    """Where the embedded default store is (or would be)."""
    from nestegg.checkpoint.stores import home_path

    return home_path() / DEFAULT_DB_NAME


def _origin(url: str) -> str:
    return f"${STORE_ENV}" if os.environ.get(STORE_ENV) == url else "--store"


def open_selected(url: str | None, *, read_only: bool = False) -> CheckpointStorage:
    """The store for ``url`` (for a reader if ``read_only``: see :func:`open_store`), or
    the embedded default when None.

    Raises:
        CommandError: an unknown scheme or a malformed URL (naming where it came from).
    """
    from nestegg.checkpoint.stores import default_store, open_store

    try:
        return open_store(url, read_only=read_only) if url else default_store()
    except (ValueError, TypeError) as error:
        if isinstance(error, MissingDependencyError) or not url:
            raise
        raise CommandError(_bad_url(url, error), EXIT_USAGE) from error


def _bad_url(url: str, error: Exception) -> str:
    from nestegg.checkpoint.stores import NO_SCHEME
    from nestegg.checkpoint.stores.registry import BY_SCHEME

    if "://" not in url and url.partition(":")[0] not in BY_SCHEME:  # sqlite:x.db has one
        reason = NO_SCHEME
    else:  # the URL is named once, with where it came from (a store's own words name it too)
        named = re.escape(f"store URL {without_password(url)!r}: ")
        reason = re.sub(rf"^(?:Redis |PostgreSQL |SQLite |file |memory )?{named}", "", str(error))
    return f"bad store URL {without_password(url)!r} from {_origin(url)}: {reason}"


def _embedded_for_reading(url: str | None) -> Any:
    """The SQLite (read-only) or file store ``url`` names, else None; not opened yet."""
    if not url:
        from nestegg.checkpoint.stores.sqlite import SQLiteCheckpointStorage

        return SQLiteCheckpointStorage(_default_path(), read_only=True)
    if url.startswith("sqlite:"):  # open_store takes its ?max_pending_commits= out
        from nestegg.checkpoint.stores import open_store

        return open_store(url, read_only=True)
    if url.startswith("file:"):
        from nestegg.checkpoint.stores.file import FileCheckpointStorage

        return FileCheckpointStorage.from_url(url)
    return None


def _open_existing(url: str | None, read_only: bool) -> CheckpointStorage:
    """The store for a command that needs one to exist: an embedded store (SQLite, file)
    is never created, and SQLite is opened read-only if ``read_only``.

    Raises:
        CommandError: no store there (exit 3), or a bad URL (exit 2).
    """
    try:
        store = _embedded_for_reading(url)
    except (ValueError, TypeError) as error:
        if not url:  # the default store's home is a file: no URL to name
            raise
        raise CommandError(_bad_url(url, error), EXIT_USAGE) from error
    if store is None:  # a server store: its setup() then creates, migrates and marks nothing
        return open_selected(url, read_only=read_only)
    where = url or f"{_default_path()} (the default store; a run creates it)"
    if (absent := embedded_absent(store, where)) is not None:
        raise absent
    sqlite = sqlite_store(store)
    if not read_only and sqlite is not None and isinstance(sqlite.path, Path):
        from nestegg.checkpoint.stores.sqlite.read_only import check_existing_store

        check_existing_store(sqlite.path)  # setup() would give a foreign file our schema
    opened: CheckpointStorage = store if read_only else open_selected(url)
    return opened


def embedded_absent(
    store: CheckpointStorage, where: str, *, from_url: bool = True
) -> CommandError | None:
    """The refusal (exit 3) of a command that needs the embedded ``store`` (SQLite, file;
    shown as ``where``) to exist, when it does not; None when it does or is not embedded.
    ``from_url``: a relative SQLite path came from a URL (say how to name an absolute
    one)."""
    if (sqlite := sqlite_store(store)) is not None:
        if isinstance(sqlite.path, Path) and not sqlite.path.is_file():
            hint = _relative(sqlite.path) if from_url else ""
            return CommandError(f"no store at {where}: no such file{hint}", EXIT_NOT_FOUND)
    elif (files := file_store(store)) is not None and not (files.root / FILE_RUNS_DIR).is_dir():
        return CommandError(f"no store at {where}: no nestegg file store there", EXIT_NOT_FOUND)
    return None


def sqlite_store(store: object) -> SQLiteCheckpointStorage | None:
    """``store`` if it is a SQLite store, else None; the SQLite store is not imported to
    tell (a store whose module was never imported has no instances)."""
    from nestegg.checkpoint.stores.registry import loaded_class

    cls: type[SQLiteCheckpointStorage] | None = loaded_class("SQLiteCheckpointStorage")
    return store if cls is not None and isinstance(store, cls) else None


def file_store(store: object) -> FileCheckpointStorage | None:
    """``store`` if it is a file store, else None; as :func:`sqlite_store` tells."""
    from nestegg.checkpoint.stores.registry import loaded_class

    cls: type[FileCheckpointStorage] | None = loaded_class("FileCheckpointStorage")
    return store if cls is not None and isinstance(store, cls) else None


def _relative(path: Path) -> str:
    """For a SQLite URL naming a relative path (``sqlite:///tmp/runs.db`` is ``tmp/runs.db``
    here, as in SQLAlchemy), where it was looked for, and, for one in a directory (which
    may have been meant from the root), how to name an absolute path."""
    if path.is_absolute():
        return ""
    where = f" {str(path)!r} in the current directory"
    if len(path.parts) < 2:
        return where
    return (
        f"{where} (sqlite:/// names a relative path; an absolute one takes four slashes: "
        f"sqlite:////{path.as_posix()})"
    )


async def server_absent(store: CheckpointStorage, where: str) -> CommandError | None:
    """The refusal (exit 3) of a command that needs ``store`` (shown as ``where``) to
    exist, when it is one its setup would create (PostgreSQL's tables, Redis's mark) and
    that was never set up; None when it is there or is not such a store. Creates nothing.

    Raises:
        StorageUnavailableError: its server cannot be reached.
    """
    exists = getattr(store, "exists", None)
    if exists is None or await exists():
        return None
    return CommandError(f"no store at {where}: {getattr(store, 'ABSENT', '')}", EXIT_NOT_FOUND)


@contextlib.asynccontextmanager
async def opened_store(
    url: str | None, *, read_only: bool = False, existing: bool = False
) -> AsyncIterator[CheckpointStorage]:
    """The store ``url`` selects, set up, closed afterwards: as :func:`run_with_store`
    opens it for ``read_only`` and ``existing``.

    Raises:
        CommandError: no store there (exit 3), or a bad URL (exit 2).
    """
    store = _open_existing(url, read_only) if read_only or existing else open_selected(url)
    try:
        where = without_password(str(url))
        if (read_only or existing) and (absent := await server_absent(store, where)) is not None:
            raise absent
        if not (read_only and file_store(store) is not None):  # it would create
            await store.setup()
        yield store
    finally:
        await store.close()


async def _with_store(
    url: str | None,
    work: Callable[[CheckpointStorage], Awaitable[T]],
    read_only: bool,
    existing: bool,
) -> T:
    async with opened_store(url, read_only=read_only, existing=existing) as store:
        return await work(store)


def run_with_store(
    ctx: typer.Context,
    store: str | None,
    work: Callable[[CheckpointStorage], Awaitable[T]],
    *,
    read_only: bool = False,
    existing: bool = False,
) -> T:
    """Open the selected store, run ``work`` on it in an event loop, close the store.

    ``existing``: an embedded store must exist (nothing is created: CommandError with
    exit 3 otherwise); ``read_only`` too, and SQLite is opened read-only.
    """
    import asyncio

    url = store_url(ctx, store)
    return asyncio.run(_with_store(url, work, read_only, existing))


def run_async(work: Callable[[], Awaitable[T]]) -> T:
    """Run ``work`` in a fresh event loop."""
    import asyncio

    async def call() -> T:
        return await work()

    return asyncio.run(call())
