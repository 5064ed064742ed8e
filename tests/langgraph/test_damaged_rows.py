"""A damaged saver row (torn: bytes cut off its end; altered: bytes changed in place) is
refused by name on every store: get_tuple and list raise CheckpointCorruptedError naming
the thread, the namespace (if any), the checkpoint and the channel (or the pending write)
whose row cannot be read, never a value built from it. Rows are sealed with a CRC-32; rows
an earlier version wrote, without one, read as before (and a torn one is refused too). A
prune, and keep_latest as it writes, go on past a damaged row, keeping what it may need."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from nestegg.checkpoint.stores.threads import BLOB, CHECKPOINT, WRITE, ThreadChange, ThreadRow
from nestegg.errors import CheckpointCorruptedError
from nestegg.langgraph import NestEggSaver
from nestegg.langgraph.inspect import thread_checkpoints
from nestegg.langgraph.rows import SEAL_BYTES, SEALED, BlobBody, prefix_range
from tests.langgraph.conftest import SaverFactory, kinds, thread_config
from tests.langgraph.graphs import build_loop, loop_config

TORN = "cannot be read: unexpected end of file"
SEAL = r"fails its checksum \(stored [0-9a-f]{8}, computed [0-9a-f]{8}\): it was altered or torn"


def _stored(saver: NestEggSaver, ns: str) -> Any:
    """Thread ``t``: a checkpoint of channel ``items`` in namespace ``ns`` and a write."""
    cp = empty_checkpoint() | {"channel_values": {"items": ["a", "b"]}}
    cp["channel_versions"] = {"items": "1"}
    config = saver.put(thread_config("t", ns=ns), cp, {"step": 1}, {"items": "1"})
    saver.put_writes(config, [("items", ["c"])], "task-1")
    saver._run(saver._core.flush())
    return config


def _change(saver: NestEggSaver, kind: str, part: str, change: Callable[[bytes], bytes]) -> None:
    """Replace the body of each ``kind`` row of thread ``t`` whose key holds ``part`` by
    ``change`` of it; the saver forgets what it remembers of the thread (a new process
    reading the store)."""

    async def apply() -> None:
        store = saver.storage
        rows = await store.scan_thread_rows("t", kind, *prefix_range(""))
        changed = [ThreadRow(kind, r.key, change(r.body)) for r in rows if part in r.key]
        assert changed
        await store.apply_thread_change("t", ThreadChange(put=changed), 2.0)

    saver._run(apply())
    saver._core.forget("t")


def _tear(saver: NestEggSaver, kind: str, part: str) -> None:
    """Cut 3 bytes off each such row."""
    _change(saver, kind, part, lambda body: body[:-3])


def _unseal(saver: NestEggSaver) -> None:
    """Every row of thread ``t`` as an earlier version wrote it: the map without its seal."""
    for kind in (BLOB, CHECKPOINT, WRITE):
        _change(saver, kind, "", lambda body: body.removeprefix(SEALED)[SEAL_BYTES - 1 :])


CASES = {
    "channel value": (BLOB, "items", "channel 'items': the LangGraph channel value row"),
    "checkpoint": (CHECKPOINT, "", "the LangGraph checkpoint row"),
    "write": (WRITE, "task-1", "the write 0 of task 'task-1': the LangGraph write row"),
}


def _flip(body: bytes) -> bytes:
    """``body`` with its last byte changed (a stored value's last byte)."""
    return body[:-1] + bytes([body[-1] ^ 1])


DAMAGE = {
    "torn": (_tear, SEAL),
    "altered": (lambda s, k, p: _change(s, k, p, _flip), SEAL),
    "torn, as an earlier version wrote it": (lambda s, k, p: (_unseal(s), _tear(s, k, p)), TORN),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("ns", ["", "sub:1"])
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_damaged_row_is_refused_naming_thread_checkpoint_and_channel(
    saver_factory: SaverFactory, ns: str, damage: str, case: str
) -> None:
    saver = saver_factory()
    config = _stored(saver, ns)
    kind, part, what = CASES[case]
    damage_rows, how = DAMAGE[damage]
    damage_rows(saver, kind, part)
    checkpoint_id = config["configurable"]["checkpoint_id"]
    where = "LangGraph thread 't'" + (f", namespace {ns!r}" if ns else "")
    joint = ": " if case == "checkpoint" else ", "
    expected = re.escape(f"{where}, checkpoint {checkpoint_id!r}{joint}{what} ") + how
    for read in (
        lambda: saver.get_tuple(config),
        lambda: saver.get_tuple(thread_config("t", ns=ns)),
        lambda: list(saver.list(thread_config("t", ns=ns))),
        lambda: list(saver.list(None)),
    ):
        with pytest.raises(CheckpointCorruptedError) as refused:
            read()
        assert re.fullmatch(expected, str(refused.value)), str(refused.value)


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_rows_an_earlier_version_wrote_without_a_checksum_read_as_before(
    saver_factory: SaverFactory,
) -> None:
    saver = saver_factory()
    config = _stored(saver, "")
    whole = saver.get_tuple(config)
    _unseal(saver)
    assert saver.get_tuple(config) == whole
    assert list(saver.list(thread_config("t"))) == [whole]


@pytest.mark.parametrize("saver_factory", kinds("memory", "sqlite"), indirect=True)
async def test_the_async_reads_name_it_too(saver_factory: SaverFactory) -> None:
    saver = saver_factory()
    config = _stored(saver, "")
    _tear(saver, BLOB, "items")
    with pytest.raises(CheckpointCorruptedError, match=r"^LangGraph thread 't', checkpoint '"):
        await saver.aget_tuple(config)
    with pytest.raises(CheckpointCorruptedError, match="channel 'items': the LangGraph channel"):
        [item async for item in saver.alist(config)]


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_damaged_pack_refuses_only_the_checkpoints_that_rest_on_it(
    saver_factory: SaverFactory,
) -> None:
    """A channel's pack row is needed by the checkpoints of its branch from the version that
    wrote it on: older ones, and a fork from before it, read as before; ``list(before=)``
    the first refused one lists them; ``nestegg thread`` marks the same ones damaged."""
    saver = saver_factory(pack_every=2)  # packs at steps 0, 2 and 4
    graph = build_loop(saver, 4)
    graph.invoke({"items": [], "turn": 0}, loop_config("t", 4))
    step = {t.metadata["step"]: t for t in saver.list(thread_config("t"))}
    graph.update_state(step[1].config, {"items": ["fork"]})
    saver._run(saver._core.flush())
    whole = {t.config["configurable"]["checkpoint_id"]: t for t in saver.list(thread_config("t"))}
    needing = {
        cid
        for cid, t in whole.items()
        if t.metadata["source"] == "loop" and t.metadata["step"] >= 2
    }
    pack = "items\x1fpack" + step[2].checkpoint["channel_versions"]["items"]
    _change(saver, BLOB, pack, _flip)
    refused: dict[str, str] = {}
    for cid, before in whole.items():
        if cid not in needing:
            assert saver.get_tuple(thread_config("t", cid)) == before
            continue
        with pytest.raises(CheckpointCorruptedError) as error:
            saver.get_tuple(thread_config("t", cid))
        where = f"LangGraph thread 't', checkpoint '{cid}', channel 'items': "
        expected = re.escape(where + "the LangGraph channel value row ") + SEAL
        assert re.fullmatch(expected, str(error.value)), str(error.value)
        refused[cid] = str(error.value)
    older = [t for cid, t in whole.items() if cid < step[2].config["configurable"]["checkpoint_id"]]
    assert list(saver.list(thread_config("t"), before=step[2].config)) == older
    shown = saver._run(thread_checkpoints(saver.storage, "t"))
    assert {c["checkpoint_id"]: c["damage"] for c in shown if not c["valid"]} == refused


def _blob_keys(saver: NestEggSaver, thread_id: str) -> set[str]:
    rows = saver._run(saver.storage.scan_thread_rows(thread_id, BLOB, *prefix_range("")))
    return {row.key for row in rows}


PRUNE_CASES = ["latest value", "latest checkpoint", "superseded value", "superseded checkpoint"]


@pytest.mark.parametrize("damaged", PRUNE_CASES)
@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_a_prune_keeps_what_a_damaged_row_may_need_and_prunes_the_rest(
    saver_factory: SaverFactory, damaged: str
) -> None:
    """A damaged row fails no prune. The prune keeps what it cannot tell no kept checkpoint
    needs: the values of the namespace of a damaged checkpoint it keeps, those of the
    channel of a damaged value a kept checkpoint rests on (the pieces of its chain cannot be
    told); the rest goes as from an intact thread, rows that only superseded checkpoints
    needed too, damaged or not. Thread ``clean`` is a copy left intact."""
    saver = saver_factory(pack_every=2)
    build_loop(saver, 4).invoke({"items": [], "turn": 0}, loop_config("t", 4))
    saver.copy_thread("t", "clean")
    step = {t.metadata["step"]: t for t in saver.list(thread_config("t"))}
    stored = _blob_keys(saver, "t")
    latest, superseded = step[4], step[0]
    kind, part = {
        "latest value": (BLOB, "items\x1f" + latest.checkpoint["channel_versions"]["items"]),
        "latest checkpoint": (CHECKPOINT, latest.checkpoint["id"]),
        "superseded value": (BLOB, "turn\x1f" + superseded.checkpoint["channel_versions"]["turn"]),
        "superseded checkpoint": (CHECKPOINT, superseded.checkpoint["id"]),
    }[damaged]
    _change(saver, kind, part, _flip)

    saver.prune(["t", "clean"])
    assert len(saver._run(saver.storage.scan_thread_rows("t", CHECKPOINT, *prefix_range("")))) == 1
    clean = _blob_keys(saver, "clean")
    kept = {
        "latest value": clean | {key for key in stored if "\x1fitems\x1f" in key},
        "latest checkpoint": stored,
    }.get(damaged, clean)
    assert _blob_keys(saver, "t") == kept
    if damaged.startswith("superseded"):  # all that was damaged is gone
        whole = saver.get_tuple(thread_config("clean"))
        assert whole is not None
        assert saver.get_tuple(thread_config("t")).checkpoint == whole.checkpoint  # type: ignore[union-attr]
    else:  # refused as before
        with pytest.raises(CheckpointCorruptedError, match=r"^LangGraph thread 't', checkpoint"):
            saver.get_tuple(thread_config("t"))


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_keep_latest_goes_on_past_a_damaged_row_no_later_step_needs(
    saver_factory: SaverFactory,
) -> None:
    """The values of the checkpoints ``keep_latest`` drops are collected as new ones are
    written: a damaged one among them fails no step (it made every collection raise), and
    goes with them."""
    saver = saver_factory(keep_latest=2, pack_every=2)
    graph = build_loop(saver, 3)
    graph.invoke({"items": [], "turn": 0}, loop_config("t", 3))
    older = list(saver.list(thread_config("t")))[1]
    _change(saver, BLOB, "turn\x1f" + older.checkpoint["channel_versions"]["turn"], _flip)
    result = graph.invoke({"items": [], "turn": 0}, loop_config("t", 3))
    assert len(result["items"]) == 6
    rows = saver._run(saver.storage.scan_thread_rows("t", BLOB, *prefix_range("")))
    assert all(BlobBody.unpack(row.body) for row in rows)  # the damaged one went


@pytest.mark.parametrize("saver_factory", kinds(), indirect=True)
def test_delete_for_runs_goes_on_past_a_damaged_checkpoint_keeping_it(
    saver_factory: SaverFactory,
) -> None:
    """Whose run a damaged checkpoint is cannot be told: it stays, and fails nothing (one
    anywhere in the store made every delete_for_runs raise)."""
    saver = saver_factory()
    config = thread_config("t")
    for run_id in ("r1", "r2"):  # two checkpoints of one value
        cp = empty_checkpoint() | {"channel_values": {"items": ["a"]}}
        cp["channel_versions"] = {"items": "1"}
        config = saver.put(config, cp, {"run_id": run_id}, {"items": "1"})
    damaged = config["configurable"]["checkpoint_id"]  # r2's
    _change(saver, CHECKPOINT, damaged, _flip)
    values = _blob_keys(saver, "t")
    saver.delete_for_runs(["r1", "r2"])
    rows = saver._run(saver.storage.scan_thread_rows("t", CHECKPOINT, *prefix_range("")))
    assert [row.key.split("\x1f")[-1] for row in rows] == [damaged]
    assert _blob_keys(saver, "t") == values  # which it needs cannot be told either
