"""Retention on the write path (keep_latest, ttl with an injected clock), linear storage,
LangGraph's delta channels, and bad settings."""

from __future__ import annotations

import operator
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from nestegg.checkpoint.stores.memory import MemoryCheckpointStorage
from nestegg.checkpoint.stores.threads import BLOB, CHECKPOINT, ThreadStore
from nestegg.errors import ConfigurationError
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.rows import prefix_range
from tests.langgraph.conftest import SaverFactory, kinds, thread_config, thread_entries
from tests.langgraph.graphs import build_loop, loop_config


async def _rows(store: ThreadStore, thread_id: str, kind: str) -> list[Any]:
    return await store.scan_thread_rows(thread_id, kind, *prefix_range(""))


def _run(saver: NestEggSaver, thread_id: str, steps: int, size: int = 100) -> dict[str, Any]:
    app = build_loop(saver, steps, size)
    return app.invoke({"items": [], "turn": 0}, loop_config(thread_id, steps), durability="sync")


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_keep_latest_keeps_n_checkpoints_and_every_value_they_need(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory(keep_latest=3, pack_every=4)
    result = _run(saver, "t", 41)
    listed = list(saver.list({"configurable": {"thread_id": "t"}}))
    assert len(listed) == 3
    for tup in listed:  # each kept checkpoint rebuilds its whole list
        turn = tup.checkpoint["channel_values"]["turn"]
        assert tup.checkpoint["channel_values"]["items"] == result["items"][:turn]
    blobs = saver._run(_rows(saver.storage, "t", BLOB))
    # The values of the dropped checkpoints went; what is left is about one pack cycle.
    assert len(blobs) < 3 * 4 * 3


def test_storage_grows_linearly_with_the_steps() -> None:
    def stored(steps: int) -> int:
        saver = NestEggSaver(MemoryCheckpointStorage())
        _run(saver, "t", steps, size=1000)
        rows = saver._run(_rows(saver.storage, "t", BLOB))
        saver.close()
        return sum(len(r.body) for r in rows)

    small, large = stored(100), stored(400)
    # Four times the steps: about four times the bytes (a whole copy per step: sixteen).
    assert 3.5 < large / small < 5
    assert large < 400 * 1000 * 2.5


def test_ttl_deletes_threads_not_written_for_that_long_on_the_write_path() -> None:
    now = [1_000_000.0]
    saver = NestEggSaver(MemoryCheckpointStorage(), ttl=timedelta(hours=1), clock=lambda: now[0])
    _run(saver, "old", 3)
    now[0] += 1800
    _run(saver, "recent", 3)
    now[0] += 1900  # "old" last written 3700 s ago, "recent" 1900 s ago
    _run(saver, "new", 3)
    assert saver.get_tuple({"configurable": {"thread_id": "old"}}) is None
    assert saver.get_tuple({"configurable": {"thread_id": "recent"}}) is not None
    assert saver.get_tuple({"configurable": {"thread_id": "new"}}) is not None
    saver.close()


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_pruned_thread_keeps_the_time_of_its_last_write_and_its_ttl(
    saver_factory: SaverFactory,
) -> None:
    now = [1_000_000.0]
    saver = saver_factory(ttl=timedelta(hours=1), clock=lambda: now[0])
    _run(saver, "old", 3)
    now[0] += 1800
    saver.prune(["old"])  # deletes checkpoints and values: no write of the thread
    [info] = saver._run(saver.storage.list_threads())
    assert (info.thread_id, info.updated_at) == ("old", 1_000_000.0)
    now[0] += 1900  # "old" last written 3700 s ago, pruned 1900 s ago
    _run(saver, "new", 3)
    assert saver.get_tuple({"configurable": {"thread_id": "old"}}) is None
    assert saver.get_tuple({"configurable": {"thread_id": "new"}}) is not None


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_thread_delete_for_runs_empties_leaves_no_entry_behind(
    saver_factory: SaverFactory,
) -> None:
    """Its checkpoints, their writes and values gone, the thread's entry goes too: not
    listed, no ttl or ``threads prune`` would ever take it."""
    saver = saver_factory()
    cp = empty_checkpoint() | {"channel_values": {"items": ["a"]}}
    cp["channel_versions"] = {"items": "1"}
    for thread_id, run_id in (("t", "r1"), ("kept", "r2")):
        config = saver.put(thread_config(thread_id), cp, {"run_id": run_id}, {"items": "1"})
        saver.put_writes(config, [("items", ["b"])], "task-1")
    saver.delete_for_runs(["r1"])
    assert saver._run(thread_entries(saver.storage)) == {"kept"}


def test_prune_keep_latest_keeps_the_pieces_a_delta_is_built_from() -> None:
    saver = NestEggSaver(MemoryCheckpointStorage(), pack_every=16)
    result = _run(saver, "t", 10)
    saver.prune(["t"])
    fresh = NestEggSaver(saver.storage)  # remembers nothing: reads the chain back
    latest = fresh.get_tuple({"configurable": {"thread_id": "t"}})
    assert latest is not None and latest.checkpoint["channel_values"]["items"] == result["items"]
    assert len(saver._run(_rows(saver.storage, "t", CHECKPOINT))) == 1
    saver.close()


@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
def test_writes_committed_one_by_one_when_not_deferred(saver_factory: SaverFactory) -> None:
    saver = saver_factory(defer_writes=False)
    config = saver.put(
        {"configurable": {"thread_id": "t", "checkpoint_ns": ""}},
        {
            "v": 1,
            "id": str(uuid.uuid4()),
            "ts": "",
            "channel_values": {},
            "channel_versions": {},
            "versions_seen": {},
            "updated_channels": None,
        },  # type: ignore[typeddict-unknown-key]
        {},
        {},
    )
    saver.put_writes(config, [("a", 1), ("b", 2)], "task-1")
    other = NestEggSaver(saver.storage)
    tup = other.get_tuple(config)
    assert tup is not None and [w[1:] for w in tup.pending_writes or []] == [("a", 1), ("b", 2)]


def _reduce(state: list[str] | None, writes: list[list[str]]) -> list[str]:
    return [*(state or []), *(x for w in writes for x in w)]


try:
    from langgraph.channels.delta import DeltaChannel
except ImportError:  # pragma: no cover - a LangGraph without delta channels
    DeltaChannel = None


class DeltaState(TypedDict):
    log: Annotated[list[str], DeltaChannel(_reduce, snapshot_frequency=3) if DeltaChannel else list]
    turn: Annotated[int, operator.add]


@pytest.mark.skipif(DeltaChannel is None, reason="this LangGraph has no DeltaChannel")
def test_delta_channels_of_langgraph_work_across_savers() -> None:
    from langgraph.graph import END, START, StateGraph

    State = DeltaState

    def step(state: State) -> dict[str, Any]:
        return {"log": [f"entry-{state['turn']}"], "turn": 1}

    graph = StateGraph(State)
    graph.add_node("step", step)
    graph.add_edge(START, "step")
    graph.add_conditional_edges("step", lambda s: END if s["turn"] >= 8 else "step")
    store = MemoryCheckpointStorage()
    with NestEggSaver(store) as saver:
        result = graph.compile(checkpointer=saver).invoke(
            {"log": [], "turn": 0}, loop_config("d", 8)
        )
    assert result["log"] == [f"entry-{i}" for i in range(8)]
    with NestEggSaver(store) as fresh:
        state = graph.compile(checkpointer=fresh).get_state(loop_config("d", 8))
        assert state.values["log"] == result["log"]


def test_bad_settings_are_refused_by_name() -> None:
    store = MemoryCheckpointStorage()
    with pytest.raises(ConfigurationError, match="keep_latest"):
        NestEggSaver(store, keep_latest=0)
    with pytest.raises(ConfigurationError, match="ttl"):
        NestEggSaver(store, ttl=timedelta(0))
    with pytest.raises(ConfigurationError, match="pack_every"):
        NestEggSaver(store, pack_every=0)
    with pytest.raises(ConfigurationError, match="cannot keep LangGraph threads"):
        NestEggSaver(object())
    saver = NestEggSaver(store)
    _run(saver, "t", 3)
    before = saver._run(_rows(store, "t", CHECKPOINT))
    with pytest.raises(ConfigurationError, match="prune strategy 'all'"):
        saver.prune(["t"], strategy="all")
    assert saver._run(_rows(store, "t", CHECKPOINT)) == before  # nothing changed
    with pytest.raises(
        ConfigurationError, match=r"got thread_ids='t' \(one id, not a list.*prune\(\['t'\]\)"
    ):
        saver.prune("t", strategy="delete")  # one id, not the thread of each of its letters
    assert saver._run(_rows(store, "t", CHECKPOINT)) == before
    saver.close()


def test_a_url_string_for_the_store_points_to_from_url() -> None:
    with pytest.raises(ConfigurationError) as refused:
        NestEggSaver("sqlite:///x.db")  # type: ignore[arg-type]
    assert str(refused.value) == (
        "NestEggSaver takes a store, got the string 'sqlite:///x.db' (a URL: "
        "NestEggSaver.from_url('sqlite:///x.db') opens the store and closes it with the saver)"
    )


BAD_SETTINGS = [
    (
        "close_storage",
        "yes",
        "takes close_storage=True or close_storage=False, got close_storage='yes'",
    ),
    ("defer_writes", "no", "takes defer_writes=True or defer_writes=False, got defer_writes='no'"),
    ("defer_writes", None, "takes defer_writes=True or defer_writes=False, got defer_writes=None"),
    (
        "pack_every",
        True,
        "takes pack_every= a positive integer, got pack_every=True (a bool, not a number)",
    ),
    (
        "pack_every",
        2.0,
        "takes pack_every= a positive integer, got pack_every=2.0 (a float, not an integer)",
    ),
    (
        "keep_latest",
        True,
        "takes keep_latest= a positive integer or None, got keep_latest=True "
        "(a bool, not a number)",
    ),
    ("keep_latest", 0, "takes keep_latest= a positive integer or None, got keep_latest=0"),
    ("ttl", 60, "takes ttl= a positive timedelta, got ttl=60"),
    ("clock", 0.0, "takes clock= a function giving seconds since the epoch, got clock=0.0"),
    (
        "serde",
        "json",
        "takes serde= a LangGraph serializer (with dumps_typed and loads_typed, as "
        "JsonPlusSerializer(); or with dumps and loads), got serde='json'",
    ),
    (
        "serde",
        JsonPlusSerializer,
        "takes serde= a LangGraph serializer (with dumps_typed and loads_typed, as "
        "JsonPlusSerializer(); or with dumps and loads), got serde=<class "
        "'langgraph.checkpoint.serde.jsonplus.JsonPlusSerializer'> (a class: pass an "
        "instance, JsonPlusSerializer())",
    ),
]


@pytest.mark.parametrize(("option", "value", "message"), BAD_SETTINGS)
def test_a_setting_of_the_wrong_type_is_refused_by_name_and_value(
    option: str, value: Any, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        NestEggSaver(MemoryCheckpointStorage(), **{option: value})
    assert str(refused.value) == f"NestEggSaver {message}"
    if option == "close_storage":  # from_url sets it: a TypeError, as Python's
        return
    opened: list[str] = []
    monkeypatch.setattr("nestegg.langgraph.saver.open_store", opened.append)
    with pytest.raises(ConfigurationError) as refused:
        NestEggSaver.from_url(f"sqlite:///{tmp_path / 'g.db'}", **{option: value})
    assert str(refused.value) == f"NestEggSaver {message}"
    assert opened == [] and list(tmp_path.iterdir()) == []  # refused before opening


class _Untyped:
    """A serializer of LangGraph's older kind (dumps and loads), which it wraps."""

    def dumps(self, obj: Any) -> bytes:
        return repr(obj).encode()

    def loads(self, data: bytes) -> Any:
        return data


@pytest.mark.parametrize("serde", [None, JsonPlusSerializer(), _Untyped()])
def test_a_serializer_langgraph_calls_is_taken(serde: Any) -> None:
    with NestEggSaver(MemoryCheckpointStorage(), serde=serde) as saver:
        assert callable(saver.serde.dumps_typed) and callable(saver.serde.loads_typed)


@pytest.mark.parametrize("scheme", ["memory://", "sqlite:///{dir}/g.db", "file://{dir}/threads"])
def test_from_url_opens_the_store_and_closes_it_with_the_saver(scheme: str, tmp_path: Path) -> None:
    with NestEggSaver.from_url(scheme.format(dir=tmp_path)) as saver:
        result = _run(saver, "t", 4)
        assert saver.get_tuple({"configurable": {"thread_id": "t"}}) is not None
    assert result["turn"] == 4


@pytest.mark.parametrize("option", ["bogus", "close_storage", "storage"])
def test_from_url_refuses_an_option_the_saver_does_not_take_before_opening_the_store(
    option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the store was opened, then NestEggSaver.__init__() refused the keyword
    opened: list[str] = []
    monkeypatch.setattr("nestegg.langgraph.saver.open_store", opened.append)
    with pytest.raises(TypeError) as refused:
        NestEggSaver.from_url(f"sqlite:///{tmp_path / 'g.db'}", **{option: 1})
    assert str(refused.value) == (
        f"NestEggSaver.from_url() got an unexpected keyword argument {option!r}"
    )
    assert opened == [] and list(tmp_path.iterdir()) == []
