"""`nestegg threads`, `nestegg thread` and `nestegg threads prune` as real processes, on the
LangGraph threads a graph left in a SQLite store."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from nestegg.constants import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_USAGE
from tests.cli.test_subprocess import nestegg

pytest.importorskip("langgraph.graph")

from nestegg.langgraph import NestEggSaver
from tests.langgraph.graphs import build_loop, loop_config


@pytest.fixture
def store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'graph.db'}"
    with NestEggSaver.from_url(url) as saver:
        build_loop(saver, 5).invoke({"items": [], "turn": 0}, loop_config("chat-1", 5))
        build_loop(saver, 2).invoke({"items": [], "turn": 0}, loop_config("chat-2", 2))
    return url


def _json(tmp_path: Path, *args: str) -> object:
    done = nestegg(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def test_threads_lists_every_thread_with_its_checkpoints(tmp_path: Path, store: str) -> None:
    rows = _json(tmp_path, "--store", store, "threads", "--json")
    assert isinstance(rows, list)
    assert {r["thread_id"]: r["checkpoints"] for r in rows} == {"chat-1": 7, "chat-2": 4}
    plain = nestegg(tmp_path, "--store", store, "threads")
    assert plain.returncode == 0 and "chat-1" in plain.stdout and "CHECKPOINTS" in plain.stdout


def test_thread_shows_checkpoints_newest_first_with_metadata(tmp_path: Path, store: str) -> None:
    rows = _json(tmp_path, "--store", store, "thread", "chat-2", "--json")
    assert isinstance(rows, list)
    assert [r["step"] for r in rows] == [2, 1, 0, -1]
    assert rows[-1]["metadata"]["source"] == "input" and rows[-1]["parent_id"] is None
    assert rows[0]["parent_id"] == rows[1]["checkpoint_id"]
    missing = nestegg(tmp_path, "--store", store, "thread", "nope")
    assert missing.returncode == EXIT_NOT_FOUND
    assert missing.stderr.strip() == "error: no LangGraph thread 'nope'"
    empty = nestegg(tmp_path, "--store", store, "thread", "")
    assert empty.returncode == EXIT_USAGE
    assert empty.stderr.strip() == (
        "error: the THREAD argument is empty: a LangGraph thread needs a non-empty thread id"
    )
    prune = nestegg(tmp_path, "--store", store, "threads", "prune", "chat-1", "", "--yes")
    assert prune.returncode == EXIT_USAGE
    assert prune.stderr.strip() == (
        "error: a THREAD argument is empty: a LangGraph thread needs a non-empty thread id"
    )
    assert len(_json(tmp_path, "--store", store, "thread", "chat-1", "--json")) == 7  # type: ignore[arg-type]


def test_prune_keeps_the_latest_checkpoint_and_the_values_it_needs(
    tmp_path: Path, store: str
) -> None:
    dry = nestegg(tmp_path, "--store", store, "threads", "prune", "chat-1", "--dry-run")
    assert dry.returncode == 0 and dry.stdout.split() == ["chat-1"]
    assert dry.stderr == (  # counts agree with their nouns, not "1 thread(s)"
        "would prune to their latest checkpoints: 1 thread (dry run, nothing changed)\n"
    )
    # asked as prune asks, the verb first (it was "prune to their latest checkpoints 1 ...?")
    asked = nestegg(tmp_path, "--store", store, "threads", "prune", "chat-1", stdin="n\n")
    assert asked.returncode == EXIT_FAILED
    assert asked.stderr.startswith(
        "Prune 1 LangGraph thread to the latest checkpoint of each namespace? [y/N]:"
    )
    assert _json(tmp_path, "--store", store, "thread", "chat-1", "--json").__len__() == 7

    done = nestegg(tmp_path, "--store", store, "threads", "prune", "chat-1", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stderr == "pruned 1 LangGraph thread\n"
    assert len(_json(tmp_path, "--store", store, "thread", "chat-1", "--json")) == 1  # type: ignore[arg-type]
    assert len(_json(tmp_path, "--store", store, "thread", "chat-2", "--json")) == 4  # type: ignore[arg-type]
    with NestEggSaver.from_url(store) as saver:
        latest = saver.get_tuple({"configurable": {"thread_id": "chat-1"}})
        assert latest is not None and len(latest.checkpoint["channel_values"]["items"]) == 5


def test_prune_counts_only_threads_with_something_to_prune(tmp_path: Path, store: str) -> None:
    # it counted every thread it took, one already at one checkpoint per namespace too
    # ("pruned 1 LangGraph thread" where nothing was removed)
    first = nestegg(tmp_path, "--store", store, "threads", "prune", "chat-1", "--yes")
    assert (first.stdout, first.stderr) == ("chat-1\n", "pruned 1 LangGraph thread\n")
    again = nestegg(tmp_path, "--store", store, "threads", "prune", "chat-1", "--yes")
    assert again.returncode == 0 and again.stdout == ""
    assert again.stderr == (
        "nothing to prune: no checkpoint of the thread is superseded by a newer one of its "
        "namespace\n"
    )
    dry = nestegg(tmp_path, "--store", store, "threads", "prune", "--dry-run")
    assert dry.returncode == 0 and dry.stdout == "chat-2\n"
    assert dry.stderr == (
        "would prune to their latest checkpoints: 1 thread (dry run, nothing changed)\n"
    )
    every = nestegg(tmp_path, "--store", store, "threads", "prune", "--yes")
    assert (every.stdout, every.stderr) == ("chat-2\n", "pruned 1 LangGraph thread\n")
    for args in (["--dry-run"], ["--yes"]):
        none = nestegg(tmp_path, "--store", store, "threads", "prune", *args)
        assert none.returncode == 0 and none.stdout == ""
        assert none.stderr == (
            "nothing to prune: no checkpoint of the 2 threads is superseded by a newer one of its "
            "namespace\n"
        )
    deleted = nestegg(tmp_path, "--store", store, "threads", "prune", "--delete", "--dry-run")
    assert sorted(deleted.stdout.split()) == ["chat-1", "chat-2"]  # --delete takes them all


def test_a_pruned_thread_stays_as_old_as_its_last_write(tmp_path: Path) -> None:
    # a prune set the thread's time to its own: --older-than never reached it again
    url = f"sqlite:///{tmp_path / 'old.db'}"
    with NestEggSaver.from_url(url, clock=lambda: time.time() - 3600) as saver:
        build_loop(saver, 3).invoke({"items": [], "turn": 0}, loop_config("k1", 3))
    before = _json(tmp_path, "--store", url, "threads", "--json")
    pruned = nestegg(
        tmp_path, "--store", url, "threads", "prune", "k1", "--older-than", "30m", "--yes"
    )
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stderr.endswith("pruned 1 LangGraph thread\n")
    after = _json(tmp_path, "--store", url, "threads", "--json")
    assert after[0]["updated_at"] == before[0]["updated_at"]  # type: ignore[index]
    options = ("--older-than", "30m", "--delete", "--dry-run")
    old = nestegg(tmp_path, "--store", url, "threads", "prune", *options)
    assert old.returncode == 0 and old.stdout == "k1\n"


def test_prune_of_named_threads_that_are_not_there_exits_3_naming_them(
    tmp_path: Path, store: str
) -> None:
    # it printed "no LangGraph threads to prune" and exited 0, where `thread nope` exits 3
    for args in (["nope"], ["nope", "--dry-run"], ["nope", "--delete"]):
        none = nestegg(tmp_path, "--store", store, "threads", "prune", *args, "--yes")
        assert none.returncode == EXIT_NOT_FOUND
        assert (none.stdout, none.stderr) == ("", "error: no LangGraph thread 'nope'\n")
    two = nestegg(tmp_path, "--store", store, "threads", "prune", "a", "b", "a", "--yes")
    assert two.returncode == EXIT_NOT_FOUND
    assert two.stderr == "error: no LangGraph threads 'a', 'b'\n"
    assert len(_json(tmp_path, "--store", store, "thread", "chat-1", "--json")) == 7  # type: ignore[arg-type]
    # the named threads that are there are pruned, then the others are named
    some = nestegg(tmp_path, "--store", store, "threads", "prune", "nope", "chat-1", "--yes")
    assert some.returncode == EXIT_NOT_FOUND and some.stdout == "chat-1\n"
    assert some.stderr.splitlines()[-1] == "error: no LangGraph thread 'nope'"
    assert len(_json(tmp_path, "--store", store, "thread", "chat-1", "--json")) == 1  # type: ignore[arg-type]
    assert len(_json(tmp_path, "--store", store, "thread", "chat-2", "--json")) == 4  # type: ignore[arg-type]


def test_prune_delete_removes_threads_and_unconfirmed_changes_nothing(
    tmp_path: Path, store: str
) -> None:
    for answer in ("n\n", ""):  # a no, and stdin's end (no answer), said alike
        refused = nestegg(tmp_path, "--store", store, "threads", "prune", "--delete", stdin=answer)
        assert refused.returncode == EXIT_FAILED, answer
        assert "Delete 2 LangGraph threads? [y/N]:" in refused.stdout + refused.stderr
        assert refused.stderr.endswith("error: nothing was changed (not confirmed)\n")
        assert len(_json(tmp_path, "--store", store, "threads", "--json")) == 2  # type: ignore[arg-type]
    done = nestegg(tmp_path, "--store", store, "threads", "prune", "--delete", "--yes")
    assert done.returncode == 0 and sorted(done.stdout.split()) == ["chat-1", "chat-2"]
    assert done.stderr == "deleted 2 LangGraph threads\n"
    assert _json(tmp_path, "--store", store, "threads", "--json") == []
    recent = nestegg(tmp_path, "--store", store, "threads", "prune", "--older-than", "1d", "--yes")
    assert recent.returncode == 0 and recent.stdout == ""


def test_thread_json_names_nan_and_infinities_in_metadata(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    odd = {"score": float("nan"), "high": float("inf"), "low": float("-inf")}
    config = {**loop_config("odd", 1), "metadata": odd}
    with NestEggSaver.from_url(url) as saver:
        build_loop(saver, 1).invoke({"items": [], "turn": 0}, config)
    rows = _json(tmp_path, "--store", url, "thread", "odd", "--json")
    assert isinstance(rows, list)
    shown = {key: rows[0]["metadata"][key] for key in odd}  # strict JSON, never null
    assert shown == {"score": "NaN", "high": "Infinity", "low": "-Infinity"}


ODD_ID = "chat\x1b[31m\nred\x7f"
ODD_NS = "sub\x07ns"


def _raw_controls(text: str) -> set[str]:
    """The control characters in command output, but for the line ends."""
    return {c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F)}


def test_control_characters_of_stored_ids_are_printed_escaped(tmp_path: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    url = f"sqlite:///{tmp_path / 'odd.db'}"
    with NestEggSaver.from_url(url) as saver:
        config = {"configurable": {"thread_id": ODD_ID, "checkpoint_ns": ODD_NS}}
        for checkpoint_id in ("1", "2"):  # two: prune has one to take
            checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
            saver.put(config, checkpoint, {}, {})  # type: ignore[arg-type]
    listed = nestegg(tmp_path, "--store", url, "threads")
    assert listed.returncode == 0, listed.stderr
    assert "chat\\x1b[31m\\nred\\x7f" in listed.stdout and "sub\\x07ns" in listed.stdout
    shown = nestegg(tmp_path, "--store", url, "thread", ODD_ID)
    assert shown.returncode == 0 and "sub\\x07ns" in shown.stdout
    pruned = nestegg(tmp_path, "--store", url, "threads", "prune", "--dry-run")
    assert pruned.returncode == 0 and pruned.stdout == "chat\\x1b[31m\\nred\\x7f\n"
    for done in (listed, shown, pruned):
        assert _raw_controls(done.stdout + done.stderr) == set()
    exact = _json(tmp_path, "--store", url, "threads", "--json")  # --json has the ids whole
    assert exact[0]["thread_id"] == ODD_ID and exact[0]["namespaces"] == [ODD_NS]  # type: ignore[index]


class _Shift:
    """A toy cipher for LangGraph's EncryptedSerializer: a graph's own serde."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "shift", bytes((b + 1) % 256 for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        return bytes((b - 1) % 256 for b in ciphertext)


def test_thread_written_with_a_serde_of_its_own_is_listed_without_its_metadata(
    tmp_path: Path,
) -> None:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    url = f"sqlite:///{tmp_path / 'sealed.db'}"
    with NestEggSaver.from_url(url, serde=EncryptedSerializer(_Shift())) as saver:
        build_loop(saver, 2).invoke({"items": [], "turn": 0}, loop_config("sealed", 2))
    rows = _json(tmp_path, "--store", url, "thread", "sealed", "--json")
    assert isinstance(rows, list) and len(rows) == 4
    assert all(r["metadata"] is None and r["step"] is None for r in rows)
    assert {r["metadata_type"] for r in rows} == {"msgpack+shift"}
    assert rows[0]["parent_id"] == rows[1]["checkpoint_id"]
    plain = nestegg(tmp_path, "--store", url, "thread", "sealed")
    assert plain.returncode == 0, plain.stderr
    assert rows[0]["checkpoint_id"] in plain.stdout
    assert "serialized as 'msgpack+shift'" in plain.stderr


def _move_to_the_empty_id(store: str, thread_id: str) -> None:
    """Store the thread ``thread_id`` under the id ``""``, as an older version could."""
    from nestegg.checkpoint.stores.threads import ROW_KINDS, ThreadChange
    from nestegg.langgraph.rows import prefix_range

    async def move(saver: NestEggSaver) -> None:
        rows = [
            row
            for kind in ROW_KINDS
            for row in await saver.storage.scan_thread_rows(thread_id, kind, *prefix_range(""))
        ]
        await saver.storage.apply_thread_change("", ThreadChange(put=rows), 1.0)
        await saver.storage.delete_threads([thread_id])

    with NestEggSaver.from_url(store) as saver:
        saver._run(move(saver))


def test_prune_of_every_thread_takes_one_an_older_version_stored_under_an_empty_id(
    tmp_path: Path, store: str
) -> None:
    _move_to_the_empty_id(store, "chat-2")
    done = nestegg(tmp_path, "--store", store, "threads", "prune", "--yes")
    assert done.returncode == 0, done.stderr
    rows = _json(tmp_path, "--store", store, "threads", "--json")
    assert {r["thread_id"]: r["checkpoints"] for r in rows} == {"chat-1": 1, "": 1}  # type: ignore[union-attr, index]
    deleted = nestegg(tmp_path, "--store", store, "threads", "prune", "--delete", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert _json(tmp_path, "--store", store, "threads", "--json") == []


def test_a_thread_with_writes_but_no_checkpoint_is_shown_as_listed(
    tmp_path: Path, store: str
) -> None:
    """As a run that failed before its first checkpoint leaves it: listed by threads, so
    thread shows it too (no checkpoint) instead of saying there is no such thread."""
    with NestEggSaver.from_url(store, defer_writes=False) as saver:
        config = {"configurable": {"thread_id": "w", "checkpoint_ns": "", "checkpoint_id": "c1"}}
        saver.put_writes(config, [("items", 1)], "task-1")  # type: ignore[arg-type]
    listed = _json(tmp_path, "--store", store, "threads", "--json")
    assert {r["thread_id"]: r["checkpoints"] for r in listed}["w"] == 0  # type: ignore[union-attr]
    assert _json(tmp_path, "--store", store, "thread", "w", "--json") == []
    shown = nestegg(tmp_path, "--store", store, "thread", "w")
    assert shown.returncode == 0, shown.stderr
    assert (
        "thread 'w' has no checkpoint, only writes waiting for one" in shown.stderr + shown.stdout
    )
    pruned = nestegg(tmp_path, "--store", store, "threads", "prune", "w", "--yes")
    assert (pruned.returncode, pruned.stdout) == (0, "")  # it said the thread held the latest
    assert pruned.stderr == (
        "nothing to prune: no checkpoint of the thread is superseded by a newer one of its "
        "namespace\n"
    )


def test_thread_shows_one_an_older_version_stored_under_an_empty_id(
    tmp_path: Path, store: str
) -> None:
    refusal = (
        "error: the THREAD argument is empty: a LangGraph thread needs a non-empty thread id\n"
    )
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    for url in (store, missing):  # no such thread stored: refused as before
        empty = nestegg(tmp_path, "--store", url, "thread", "")
        assert (empty.returncode, empty.stderr) == (EXIT_USAGE, refusal)
    shown = _json(tmp_path, "--store", store, "thread", "chat-2", "--json")
    _move_to_the_empty_id(store, "chat-2")
    assert _json(tmp_path, "--store", store, "thread", "", "--json") == shown
    plain = nestegg(tmp_path, "--store", store, "thread", "")
    assert plain.returncode == 0, plain.stderr
    assert all(row["checkpoint_id"] in plain.stdout for row in shown)  # type: ignore[union-attr, index]


def test_threads_prune_takes_one_an_older_version_stored_under_an_empty_id(
    tmp_path: Path, store: str
) -> None:
    refusal = "error: a THREAD argument is empty: a LangGraph thread needs a non-empty thread id\n"
    missing = f"sqlite:///{tmp_path / 'none.db'}"
    for url in (store, missing):  # no such thread stored: refused as before, nothing pruned
        empty = nestegg(tmp_path, "--store", url, "threads", "prune", "chat-1", "", "--yes")
        assert (empty.returncode, empty.stderr) == (EXIT_USAGE, refusal)
    _move_to_the_empty_id(store, "chat-2")
    counts = {"chat-1": 7, "": 4}
    rows = _json(tmp_path, "--store", store, "threads", "--json")
    assert {r["thread_id"]: r["checkpoints"] for r in rows} == counts  # type: ignore[union-attr, index]
    pruned = nestegg(tmp_path, "--store", store, "threads", "prune", "", "--yes")
    assert pruned.returncode == 0, pruned.stderr
    assert "pruned 1 LangGraph thread" in pruned.stderr + pruned.stdout
    rows = _json(tmp_path, "--store", store, "threads", "--json")
    assert {r["thread_id"]: r["checkpoints"] for r in rows} == {**counts, "": 1}  # type: ignore[union-attr, index]
    deleted = nestegg(tmp_path, "--store", store, "threads", "prune", "", "--delete", "--yes")
    assert deleted.returncode == 0, deleted.stderr
    rows = _json(tmp_path, "--store", store, "threads", "--json")
    assert {r["thread_id"]: r["checkpoints"] for r in rows} == {"chat-1": 7}  # type: ignore[union-attr, index]


def _tear_items(store: str, thread_id: str) -> int:
    """Cut 3 bytes off each row of channel ``items`` of the thread; how many rows."""
    import sqlite3

    with sqlite3.connect(store.removeprefix("sqlite:///")) as db:
        torn = db.execute(
            "update lg_rows set body = substr(body, 1, length(body) - 3) "
            "where thread_id = ? and kind = 'blob' and instr(key, 'items') > 0",
            (thread_id,),
        )
        return torn.rowcount


def test_thread_marks_checkpoints_whose_rows_are_damaged(tmp_path: Path, store: str) -> None:
    _tear_items(store, "chat-2")
    rows = _json(tmp_path, "--store", store, "thread", "chat-2", "--json")
    assert isinstance(rows, list)
    assert [r["valid"] for r in rows] == [False, False, False, True]
    newest = rows[0]["checkpoint_id"]
    assert rows[0]["damage"].startswith(
        f"LangGraph thread 'chat-2', checkpoint '{newest}', channel 'items': "
        "the LangGraph channel value row fails its checksum (stored "
    )
    plain = nestegg(tmp_path, "--store", store, "thread", "chat-2")
    assert plain.returncode == 0, plain.stderr
    assert [line.split()[-1] for line in plain.stdout.splitlines()[1:]] == [
        "DAMAGED",
        "DAMAGED",
        "DAMAGED",
        "ok",
    ]
    assert plain.stderr.startswith(
        f"warning: 3 of 4 checkpoints cannot be read (CHECK DAMAGED): {rows[0]['damage']}"
    )
    ok = _json(tmp_path, "--store", store, "thread", "chat-1", "--json")
    assert isinstance(ok, list) and all(r["valid"] and r["damage"] is None for r in ok)


def test_prune_goes_on_past_damaged_rows_keeping_them_and_says_so(
    tmp_path: Path, store: str
) -> None:
    # a damaged row made the prune of its thread fail
    torn = _tear_items(store, "chat-2")
    done = nestegg(tmp_path, "--store", store, "threads", "prune", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["chat-2", "chat-1"]  # most recently written first
    assert done.stderr == (
        "pruned 2 LangGraph threads\n"
        f"note: kept {torn} rows of thread 'chat-2' that cannot be read (altered or torn) and "
        "what they may need; nestegg thread marks DAMAGED the checkpoints that need them\n"
    )
    rows = _json(tmp_path, "--store", store, "thread", "chat-2", "--json")
    assert [r["valid"] for r in rows] == [False]  # type: ignore[union-attr, index]
    assert len(_json(tmp_path, "--store", store, "thread", "chat-1", "--json")) == 1  # type: ignore[arg-type]
