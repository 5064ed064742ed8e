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

NS = "a str (a checkpoint namespace; '' is the root)"
CID = "None or a str (a checkpoint id; None and '' name none)"
TID = "a thread id (a str; a UUID or a number is taken as str() of it)"
KEY = "config['configurable']"


def _conf(**fields: Any) -> Any:
    return {"configurable": {"thread_id": "t", "checkpoint_ns": ""} | fields}


ID_REFUSED: dict[str, tuple[Call, str]] = {
    "get_tuple ns int": (
        lambda s, c: s.get_tuple(_conf(checkpoint_ns=5)),
        f"get_tuple takes {KEY}['checkpoint_ns']= {NS}, got {KEY}['checkpoint_ns']=5",
    ),
    "get_tuple ns None": (
        lambda s, c: s.get_tuple(_conf(checkpoint_ns=None)),
        f"get_tuple takes {KEY}['checkpoint_ns']= {NS}, got {KEY}['checkpoint_ns']=None",
    ),
    "get_tuple thread None": (
        lambda s, c: s.get_tuple(_conf(thread_id=None)),
        f"get_tuple takes {KEY}['thread_id']= {TID}, got {KEY}['thread_id']=None",
    ),
    "get_tuple checkpoint_id int": (
        lambda s, c: s.get_tuple(_conf(checkpoint_id=5)),
        f"get_tuple takes {KEY}['checkpoint_id']= {CID}, got {KEY}['checkpoint_id']=5",
    ),
    "list ns int": (
        lambda s, c: list(s.list(_conf(checkpoint_ns=5))),
        f"list takes {KEY}['checkpoint_ns']= {NS} or None (every namespace), "
        f"got {KEY}['checkpoint_ns']=5",
    ),
    "list checkpoint_id int": (
        lambda s, c: list(s.list(_conf(checkpoint_id=5))),
        f"list takes {KEY}['checkpoint_id']= {CID}, got {KEY}['checkpoint_id']=5",
    ),
    "list before checkpoint_id int": (
        lambda s, c: list(s.list(CFG, before={"configurable": {"checkpoint_id": 5}})),
        f"list takes before['configurable']['checkpoint_id']= {CID}, "
        "got before['configurable']['checkpoint_id']=5",
    ),
    "list every thread before checkpoint_id int": (
        lambda s, c: list(s.list(None, before={"configurable": {"checkpoint_id": 5}})),
        f"list takes before['configurable']['checkpoint_id']= {CID}, ",
    ),
    "put thread None": (
        lambda s, c: s.put(_conf(thread_id=None), empty_checkpoint(), {}, {}),
        f"put takes {KEY}['thread_id']= {TID}, got {KEY}['thread_id']=None",
    ),
    "put ns int": (
        lambda s, c: s.put(_conf(checkpoint_ns=5), empty_checkpoint(), {}, {}),
        f"put takes {KEY}['checkpoint_ns']= {NS}, got {KEY}['checkpoint_ns']=5",
    ),
    "put parent id int": (
        lambda s, c: s.put(_conf(checkpoint_id=5), empty_checkpoint(), {}, {}),
        f"put takes {KEY}['checkpoint_id']= {CID}, got {KEY}['checkpoint_id']=5",
    ),
    "put_writes checkpoint_id int": (
        lambda s, c: s.put_writes(_conf(checkpoint_id=5), [("ch", 1)], "task"),
        f"put_writes takes {KEY}['checkpoint_id']= {CID}, got {KEY}['checkpoint_id']=5",
    ),
    "put_writes ns int": (
        lambda s, c: s.put_writes(
            c | {"configurable": c["configurable"] | {"checkpoint_ns": 5}}, [("ch", 1)], "task"
        ),
        f"put_writes takes {KEY}['checkpoint_ns']= {NS}, got {KEY}['checkpoint_ns']=5",
    ),
    "delete_for_runs None": (
        lambda s, c: s.delete_for_runs(None),  # type: ignore[arg-type]
        "delete_for_runs takes run_ids= a list of run ids, got run_ids=None",
    ),
    "delete_for_runs one id": (
        lambda s, c: s.delete_for_runs("abc"),
        "delete_for_runs takes run_ids= a list of run ids, got run_ids='abc' (one id, not a "
        "list: each of its characters would be a run id; delete_for_runs(['abc']))",
    ),
    "delete_for_runs int": (
        lambda s, c: s.delete_for_runs(5),  # type: ignore[arg-type]
        "delete_for_runs takes run_ids= a list of run ids, got run_ids=5",
    ),
    "delete_for_runs holding None": (
        lambda s, c: s.delete_for_runs(["r", None]),  # type: ignore[list-item]
        "delete_for_runs takes run_ids= a list of run ids, got run_ids=['r', None] "
        "(run_ids[1] is None)",
    ),
    "copy_thread target None": (
        lambda s, c: s.copy_thread("t", None),  # type: ignore[arg-type]
        f"copy_thread takes target_thread_id= {TID}, got target_thread_id=None",
    ),
    "copy_thread source None": (
        lambda s, c: s.copy_thread(None, "t2"),  # type: ignore[arg-type]
        f"copy_thread takes source_thread_id= {TID}, got source_thread_id=None",
    ),
    "delete_thread None": (
        lambda s, c: s.delete_thread(None),  # type: ignore[arg-type]
        f"delete_thread takes thread_id= {TID}, got thread_id=None",
    ),
    "prune None": (
        lambda s, c: s.prune(None),  # type: ignore[arg-type]
        "prune takes thread_ids= a list of thread ids, got thread_ids=None",
    ),
    "prune holding None": (
        lambda s, c: s.prune([None], strategy="delete"),  # type: ignore[list-item]
        "prune takes thread_ids= a list of thread ids, got thread_ids=[None] "
        "(thread_ids[0] is None)",
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
    _refused_and_nothing_changes(seeded_saver(saver_factory, defer_writes), REFUSED[case])


@pytest.mark.parametrize("case", list(ID_REFUSED))
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_an_id_of_the_wrong_type_is_refused_by_name_on_every_store(
    saver_factory: SaverFactory, case: str
) -> None:
    """A config's id, a list of ids or a thread id of a type the saver does not read it as
    is one ConfigurationError on every store (not a TypeError from inside one, not a
    quiet empty answer, not a thread named "None")."""
    _refused_and_nothing_changes(seeded_saver(saver_factory, True), ID_REFUSED[case])


def _refused_and_nothing_changes(saver: NestEggSaver, case: tuple[Call, str]) -> None:
    config = _newest(saver)
    before = saver._run(stored_rows(saver.storage))
    call, message = case
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


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
async def test_the_async_methods_refuse_ids_of_the_wrong_type(saver_factory: SaverFactory) -> None:
    saver = saver_factory()
    await saver.aput(CFG, empty_checkpoint(), {}, {})
    before = await saver._arun(stored_rows(saver.storage))
    for call, refused in (
        (saver.aget_tuple(_conf(checkpoint_ns=5)), "aget_tuple takes config['configurable']"),
        (_alist(saver, before={"configurable": {"checkpoint_id": 5}}), "alist takes before["),
        (saver.aput(_conf(thread_id=None), empty_checkpoint(), {}, {}), "aput takes config["),
        (saver.aput_writes(_conf(checkpoint_id=5), [], "task"), "aput_writes takes config["),
        (saver.adelete_for_runs("abc"), "adelete_for_runs takes run_ids="),  # type: ignore[arg-type]
        (saver.adelete_for_runs(None), "adelete_for_runs takes run_ids="),  # type: ignore[arg-type]
        (saver.acopy_thread("t", None), "acopy_thread takes target_thread_id="),  # type: ignore[arg-type]
        (saver.adelete_thread(None), "adelete_thread takes thread_id="),  # type: ignore[arg-type]
        (saver.aprune("t"), "aprune takes thread_ids="),
    ):
        with pytest.raises(ConfigurationError) as error:
            await call
        assert str(error.value).startswith(f"NestEggSaver.{refused}")
    assert await saver._arun(stored_rows(saver.storage)) == before


async def _alist(saver: NestEggSaver, **options: Any) -> list[Any]:
    return [item async for item in saver.alist(CFG, **options)]


@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
def test_a_limit_of_zero_lists_nothing_as_langgraphs_in_memory_saver(
    saver_factory: SaverFactory,
) -> None:
    saver = seeded_saver(saver_factory, True)
    assert list(saver.list(CFG, limit=0)) == []
    assert len(list(saver.list(CFG, limit=2))) == 2
