"""Whether the call a re-executed step makes is the one its journal recorded.

A journal entry is replayed only for the same function called with the same arguments.
When the arguments are the same and the names differ only by leading module names, the
module now named being loaded under that name (``scratch.pipe.llm`` recorded,
``pipe.llm`` called, ``pipe`` imported), it is the same function: the pipeline's module
is imported by another name than when the run journaled it, and the error says how to
import it as the journal names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nestegg.errors import ModuleNameMismatchError, NonDeterminismError
from nestegg.journal_failures import replayed_failure
from nestegg.module_names import loaded_module_of


def replay_entry(
    recorded: Mapping[str, Any], function: str, digest: str, step: int, position: int
) -> Any:
    """The outcome a journal entry recorded, after checking it is the same call.

    Raises:
        ModuleNameMismatchError: the same function, its module named otherwise.
        NonDeterminismError: another call, or other arguments.
        JournaledCallError: the recorded call failed for good (an instance of its
            exception class too, when it can be: see :mod:`nestegg.journal_failures`).
    """
    journaled = str(recorded.get("function"))
    if journaled != function or recorded.get("args") != digest:
        said = (
            f"step {step}, call {position}: the journal recorded "
            f"{journaled}(args {recorded.get('args')}) but the step now calls "
            f"{function}(args {digest}); "
        )
        modules = _module_names(journaled, function) if recorded.get("args") == digest else None
        if modules is not None:
            raise ModuleNameMismatchError(said + _import_advice(*modules), *modules)
        raise NonDeterminismError(said + _likely_cause(journaled != function))
    error = recorded.get("error")
    if error is not None:
        raise replayed_failure(function, error)
    return recorded.get("result")


def _module_names(journaled: str, function: str) -> tuple[str, str] | None:
    """The module names (journaled, imported now) of one function named ``journaled`` in
    the journal and ``function`` now, when the two differ only by whole leading module
    names: ``function`` starts with a module loaded under that name, and both names keep
    a module of their own once the prefix is added or removed. None otherwise (a name
    given with ``durable(name=...)`` and changed, say)."""
    module = loaded_module_of(function)
    if module is None:
        return None
    if journaled.endswith("." + function):
        return journaled[: -len(function)] + module, module
    if function.endswith("." + journaled):
        prefix = function[: -len(journaled)]
        if module.startswith(prefix) and len(module) > len(prefix):
            return module[len(prefix) :], module
    return None


def _import_advice(journaled_module: str, imported_module: str) -> str:
    """What to do when the pipeline's module is imported by another name than journaled."""
    return (
        f"the same function, its module imported as {imported_module!r} but journaled as "
        f"{journaled_module!r} (the run was started from another directory or with another "
        f"PYTHONPATH): resume the run with its module imported as the journal names it "
        f"(--app {journaled_module}:ATTR), or from the directory and PYTHONPATH it was "
        f"started with; its journaled calls are then replayed"
    )


def _likely_cause(other_function: bool) -> str:
    """What usually makes a re-executed step call something else, and what to do."""
    if other_function:
        cause = (
            "was the function renamed or moved, or the agent changed to call another one? "
            "Give a function a fixed name with durable(name=...); "
        )
    else:
        cause = (
            "an argument differs from the recorded call's: does it change between runs "
            "(a timestamp, a random id, data read anew)? Pass such values in the run's "
            "input or compute them inside the journaled call; "
        )
    return cause + "replay='rerun' calls again, paying for the call again"
