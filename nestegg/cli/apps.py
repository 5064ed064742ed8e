"""Loading the user's Clutch (``--app module:attr``) and pointing it at the chosen store."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from nestegg.cli.app import CommandError, error_line, open_selected
from nestegg.constants import EXIT_USAGE

if TYPE_CHECKING:
    from nestegg.checkpoint.stores.base import CheckpointStorage
    from nestegg.clutch import Clutch

APP_HELP = (
    "The Clutch that resumes or forks the runs, as module:attribute (e.g. "
    "myproject.pipelines:enrichment); the current directory is importable. If that "
    "Clutch's CheckpointConfig names a store, that store is used and --store is ignored; "
    "otherwise the Clutch uses the store --store (or $NESTEGG_STORE, or the embedded "
    "default) selects."
)


def import_app(spec: str, named: str = "--app") -> Clutch:
    """The Clutch at ``module:attr`` (``attr`` may be dotted), given as ``named``.

    Raises:
        CommandError: (bad usage) the spec is malformed, the module cannot be imported,
            the attribute is missing or is not a checkpointed Clutch.
    """
    from nestegg.clutch import Clutch

    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise CommandError(f"{named} must look like module:attribute, got {spec!r}", EXIT_USAGE)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as error:
        raise CommandError(
            f"cannot import {module_name!r}: {error}{_raised_at(error)}", EXIT_USAGE
        ) from error
    except Exception as error:  # the module's own code failed while it was imported
        raise CommandError(
            f"cannot import {module_name!r}: {error_line(error)}{_raised_at(error)} "
            "(nestegg --debug shows the traceback)",
            EXIT_USAGE,
        ) from error
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise CommandError(f"{module_name!r} has no attribute {attribute!r}", EXIT_USAGE)
        target = getattr(target, part)
    if not isinstance(target, Clutch):
        raise CommandError(f"{spec} is {_kind(target)}, not a nestegg Clutch", EXIT_USAGE)
    if target.checkpoint_config is None:
        raise CommandError(
            f"the Clutch at {spec} has no checkpointing (checkpoint=CheckpointConfig(...))",
            EXIT_USAGE,
        )
    return target


def _kind(target: Any) -> str:
    """What ``target`` is, for a message: ``of type int``, ``of type mylib.Pipeline`` (a
    type outside the builtins with its module), ``the class nestegg.clutch.Clutch``."""
    if isinstance(target, type):
        return f"the class {_type_name(target)} (not an instance of it)"
    return f"of type {_type_name(type(target))}"


def _type_name(cls: type) -> str:
    if cls.__module__ == "builtins":
        return cls.__qualname__
    return f"{cls.__module__}.{cls.__qualname__}"


def _raised_at(error: Exception) -> str:
    """`` (at FILE, line N)``: where the import of a module failed, in the code imported:
    the innermost frame outside importlib and the nestegg package, before the first frame
    in nestegg (a Clutch built with a bad argument: the user's line that built it, not
    nestegg's that refused it); empty when there is none (no module of that name; a
    SyntaxError, which names its place itself)."""
    importing = os.path.dirname(importlib.__file__) + os.sep
    nestegg = os.path.dirname(os.path.dirname(__file__)) + os.sep
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)[1:]  # this module's call
        if not frame.filename.startswith(("<frozen ", importing))
    ]
    inside = [frame.filename.startswith(nestegg) for frame in frames]
    frames = frames[: inside.index(True)] if True in inside else frames
    if not frames:
        return ""
    return f" (at {_shown(frames[-1].filename)}, line {frames[-1].lineno})"


def _shown(path: str) -> str:
    """``path`` relative to the current directory when under it."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def own_store(clutch: Clutch) -> CheckpointStorage | None:
    """The store the Clutch's CheckpointConfig names, None for the embedded default."""
    config = clutch.checkpoint_config
    return config.storage if config is not None else None


@contextlib.asynccontextmanager
async def bound(clutch: Clutch, url: str | None) -> AsyncIterator[CheckpointStorage]:
    """The Clutch using the right store for the duration: its own store if its config names
    one, else the store ``url`` selects (None: the embedded default). Restores the Clutch
    and closes what it opened afterwards."""
    config = clutch.checkpoint_config
    assert config is not None
    if config.storage is not None:
        try:
            with clutch.using_store(config.storage):
                yield config.storage
        finally:
            await config.storage.close()
        return
    store = open_selected(url)
    try:
        with clutch.using_store(store):
            await store.setup()
            yield store
    finally:
        await store.close()
