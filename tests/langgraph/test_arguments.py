"""Arguments of the wrong shape given to NestEggSaver's reads and writes are refused with a
named error (ConfigurationError, InvalidIdentifierError for a missing id) naming the method,
the argument, what it got and what it takes, before anything is read or written: nothing
stored changes, nothing is kept for a later commit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from nestegg.errors import ConfigurationError, InvalidIdentifierError
from nestegg.langgraph import NestEggSaver
from tests.langgraph.conftest import SaverFactory, kinds, seeded_saver, stored_rows, thread_config

CONFIG = "a RunnableConfig (a dict: {'configurable': {'thread_id': ...}})"
CHECKPOINT = (
    "a LangGraph Checkpoint (a dict with 'id', 'channel_values' and 'channel_versions', "
    "as empty_checkpoint() gives)"
)
LIMIT = "None (every checkpoint) or a count of at least 0"
PAIRS = "a list of (channel, value) pairs"
CFG = thread_config("t")

Call = Callable[[NestEggSaver, Any], object]
REFUSED: dict[str, tuple[Call, str]] = {
    "get_tuple None": (
        lambda s, c: s.get_tuple(None),  # type: ignore[arg-type]
        f"get_tuple takes config= {CONFIG}, got config=None",
    ),
    "get_tuple configurable": (
        lambda s, c: s.get_tuple({"configurable": 5}),  # type: ignore[typeddict-item]
        f"get_tuple takes config= {CONFIG}, got config={{'configurable': 5}} "
        "(its 'configurable' is int)",
    ),
    "put no id": (
        lambda s, c: s.put(CFG, {"bad": 1}, {}, {}),  # type: ignore[arg-type]
        f"put takes checkpoint= {CHECKPOINT}, got checkpoint={{'bad': 1}} "
        "(no 'id', 'channel_values', 'channel_versions')",
    ),
    "put id not str": (
        lambda s, c: s.put(CFG, empty_checkpoint() | {"id": 5}, {}, {}),  # type: ignore[arg-type]
        f"put takes checkpoint= {CHECKPOINT}, got checkpoint=",
    ),
    "put metadata": (
        lambda s, c: s.put(CFG, empty_checkpoint(), None, {}),  # type: ignore[arg-type]
        "put takes metadata= a dict (CheckpointMetadata), got metadata=None",
    ),
    "put new_versions": (
        lambda s, c: s.put(CFG, empty_checkpoint(), {}, ["items"]),  # type: ignore[arg-type]
        "put takes new_versions= a dict of channel -> version, got new_versions=['items']",
    ),
    "put_writes not a list": (
        lambda s, c: s.put_writes(c, 5, "task"),  # type: ignore[arg-type]
        f"put_writes takes writes= {PAIRS}, got writes=5",
    ),
    "put_writes not pairs": (
        lambda s, c: s.put_writes(c, [("ch", 1), "ch"], "task"),  # type: ignore[list-item]
        f"put_writes takes writes= {PAIRS}, got writes=[('ch', 1), 'ch'] (writes[1] is 'ch')",
    ),
    "put_writes task_id": (
        lambda s, c: s.put_writes(c, [("ch", 1)], None),  # type: ignore[arg-type]
        "put_writes takes task_id= a str, got task_id=None",
    ),
    "list limit -1": (
        lambda s, c: list(s.list(CFG, limit=-1)),
        f"list takes limit= {LIMIT}, got limit=-1",
    ),
    "list limit a": (
        lambda s, c: list(s.list(CFG, limit="a")),  # type: ignore[arg-type]
        f"list takes limit= {LIMIT}, got limit='a'",
    ),
    "list limit True": (
        lambda s, c: list(s.list(CFG, limit=True)),
        f"list takes limit= {LIMIT}, got limit=True",
    ),
    "list filter": (
        lambda s, c: list(s.list(CFG, filter="step")),  # type: ignore[arg-type]
        "list takes filter= None or a dict of metadata key -> value, got filter='step'",
    ),
    "list before": (
        lambda s, c: list(s.list(CFG, before="c1")),  # type: ignore[arg-type]
        f"list takes before= {CONFIG} or None, got before='c1'",
    ),
}


def _newest(saver: NestEggSaver) -> Any:
    found = saver.get_tuple(CFG)
    assert found is not None
    return found.config


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
def test_an_argument_of_the_wrong_shape_is_refused_by_name_and_nothing_changes(
    saver_factory: SaverFactory, defer_writes: bool, case: str
) -> None:
    saver = seeded_saver(saver_factory, defer_writes)
    config = _newest(saver)
    before = saver._run(stored_rows(saver.storage))
    call, message = REFUSED[case]
    with pytest.raises(ConfigurationError) as refused:
        call(saver, config)
    assert str(refused.value).startswith(f"NestEggSaver.{message}")
    assert not saver._core.deferred.thread_ids()
    assert saver._run(stored_rows(saver.storage)) == before


@pytest.mark.parametrize("defer_writes", [True, False])
@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
def test_put_writes_without_a_checkpoint_id_is_refused_naming_the_key(
    saver_factory: SaverFactory, defer_writes: bool
) -> None:
    saver = seeded_saver(saver_factory, defer_writes)
    before = saver._run(stored_rows(saver.storage))
    for config in (
        CFG,
        thread_config("t") | {"configurable": {"thread_id": "t", "checkpoint_id": None}},
    ):
        with pytest.raises(InvalidIdentifierError) as refused:
            saver.put_writes(config, [("ch", 1)], "task")
        assert str(refused.value) == (
            "config['configurable']['checkpoint_id'] is missing: a task's writes are stored "
            "under the checkpoint they follow (pass the config put returned)"
        )
    assert not saver._core.deferred.thread_ids()
    assert saver._run(stored_rows(saver.storage)) == before


@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
async def test_the_async_methods_refuse_the_same_arguments(saver_factory: SaverFactory) -> None:
    saver = saver_factory()
    with pytest.raises(ConfigurationError, match=r"^NestEggSaver\.aget_tuple takes config="):
        await saver.aget_tuple(None)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"^NestEggSaver\.aput takes checkpoint="):
        await saver.aput(CFG, {"bad": 1}, {}, {})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"^NestEggSaver\.aput_writes takes writes="):
        await saver.aput_writes(thread_config("t", "c"), 5, "task")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"^NestEggSaver\.alist takes limit="):
        [item async for item in saver.alist(CFG, limit=-1)]
    assert await saver.aget_tuple(CFG) is None


@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
def test_a_limit_of_zero_lists_nothing_as_langgraphs_in_memory_saver(
    saver_factory: SaverFactory,
) -> None:
    saver = seeded_saver(saver_factory, True)
    assert list(saver.list(CFG, limit=0)) == []
    assert len(list(saver.list(CFG, limit=2))) == 2
