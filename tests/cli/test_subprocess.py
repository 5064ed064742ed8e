"""The command as a real process: a run killed with SIGKILL, found and recovered."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.codec import seal, unseal
from nestegg.checkpoint.stores import open_store
from nestegg.constants import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    HOME_ENV,
    STORE_ENV,
)
from tests.cli import escape_app, selector_app
from tests.cli.conftest import fill
from tests.cli.pipeline_app import FAIL_ENV, KILL_ENV

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60
CHILD = """
import asyncio, sys
from nestegg.checkpoint import CheckpointConfig
from nestegg.checkpoint.stores import open_store
from tests.cli.pipeline_app import POLICY, build

clutch = build("cli-test", CheckpointConfig(storage=open_store(sys.argv[1]), policy=POLICY))
asyncio.run(clutch.run({"name": "Killed"}, run_id="killed", timeout=30))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (STORE_ENV, FAIL_ENV, KILL_ENV)}
    return {**env, HOME_ENV: str(tmp_path / "home"), **extra}


def _script() -> str:
    script = shutil.which("nestegg", path=str(Path(sys.executable).parent))
    assert script is not None, "the nestegg console script is not installed"
    return script


def nestegg(
    tmp_path: Path, *args: str, script: bool = False, stdin: str | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the command (``python -m nestegg.cli`` or the installed script) in the repo,
    with ``env`` added to its environment."""
    command = [_script()] if script else [sys.executable, "-m", "nestegg.cli"]
    return subprocess.run(
        [*command, *args],
        cwd=ROOT,
        env=_env(tmp_path, **env),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


@pytest.mark.parametrize("kind", ["sqlite", "file"])
def test_a_killed_run_is_listed_and_recovered(tmp_path: Path, kind: str) -> None:
    url = f"sqlite:///{tmp_path / 'n.db'}" if kind == "sqlite" else f"file://{tmp_path / 's'}"
    child = subprocess.run(
        [sys.executable, "-c", CHILD, url],
        cwd=ROOT,
        env=_env(tmp_path, **{KILL_ENV: "1"}),
        capture_output=True,
        timeout=TIMEOUT,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    listed = nestegg(tmp_path, "runs", "--interrupted", "--json", "--store", url)
    assert listed.returncode == 0, listed.stderr
    [row] = orjson.loads(listed.stdout)
    assert (row["run_id"], row["status"], row["interrupted"], row["steps"]) == (
        "killed", "running", True, 1,
    )  # fmt: skip
    table = nestegg(tmp_path, "runs", "--store", url)
    assert "\x1b[" not in table.stdout and table.stdout.splitlines()[1].split()[2] == "interrupted"
    recovered = nestegg(
        tmp_path, "recover", "--app", "tests.cli.pipeline_app:pipeline", "--store", url,
        script=True,
    )  # fmt: skip
    assert recovered.returncode == 0, recovered.stderr
    assert recovered.stdout.splitlines()[-1] == (
        "recovered 1 of 1 run; 0 failed, 0 taken by another process"
    )
    shown = orjson.loads(nestegg(tmp_path, "show", "killed", "--json", "--store", url).stdout)
    assert shown["run"]["status"] == "completed"
    assert shown["result"]["report"] == "Killed: 3 items"
    kinds = [
        orjson.loads(line)["kind"]
        for line in nestegg(tmp_path, "events", "killed", "--json", "-s", url).stdout.splitlines()
    ]
    assert "run_resumed" in kinds and kinds[-1] == "run_completed"


SELECTOR_CHILD = """
import asyncio, sys
from tests.cli.selector_app import pipeline

asyncio.run(pipeline.run({"n": 0}, run_id=sys.argv[1], timeout=30))
"""
SELECTOR_APP = "tests.cli.selector_app:pipeline"


def test_a_run_whose_selector_raises_is_stored_failed_and_not_recovered_again(
    tmp_path: Path,
) -> None:
    failing, killing = {selector_app.FAIL_ENV: "1"}, {selector_app.KILL_ENV: "1"}
    ended = {}
    for run_id, env in (("raised", failing), ("killed", killing)):  # in the default store
        child = subprocess.run(
            [sys.executable, "-c", SELECTOR_CHILD, run_id],
            cwd=ROOT, env=_env(tmp_path, **env), capture_output=True, text=True,
            timeout=TIMEOUT,
        )  # fmt: skip
        ended[run_id] = child.returncode
    assert ended == {"raised": 1, "killed": -signal.SIGKILL}

    # "raised" failed in its process; "killed" is interrupted, and its selector raises when
    # recover resumes it: stored failed, it is not left to the next recover
    recovered = nestegg(tmp_path, "recover", "--app", SELECTOR_APP, **failing)
    assert recovered.returncode == EXIT_FAILED, recovered.stderr
    assert "killed" in recovered.stdout and "raised" not in recovered.stdout
    again = nestegg(tmp_path, "recover", "--app", SELECTOR_APP, **failing)
    assert (again.returncode, again.stdout) == (
        0, "no interrupted runs of pipeline 'cli-selector'\n"
    )  # fmt: skip
    for run_id in ("raised", "killed"):
        shown = orjson.loads(nestegg(tmp_path, "show", run_id, "--json").stdout)
        assert shown["run"]["status"] == "failed"
        error = shown["run"]["error"]
        assert (error["type"], error["message"]) == ("LookupError", "no route at n=1")
        assert (error["agent"], error["hook"], error["seq"]) == (None, "selector", 2)


def test_python_dash_m_nestegg_and_errors_from_a_process(tmp_path: Path) -> None:
    helped = subprocess.run(
        [sys.executable, "-m", "nestegg", "--help"], capture_output=True, text=True, cwd=ROOT,
        timeout=TIMEOUT,
    )  # fmt: skip
    assert helped.returncode == 0 and "recover" in helped.stdout
    missing = nestegg(tmp_path, "show", "nope", script=True)
    assert missing.returncode == EXIT_NOT_FOUND
    default = tmp_path / "home" / "nestegg.db"
    assert missing.stderr == (
        f"error: no store at {default} (the default store; a run creates it): no such file\n"
    )
    assert not (tmp_path / "home").exists()  # a command that reads creates nothing


def test_error_lines_escape_control_and_bidi_characters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'n.db'}"

    async def fail() -> None:
        store = open_store(url)
        try:
            with pytest.raises(RuntimeError):
                await escape_app.build(CheckpointConfig(storage=store)).run({}, run_id="r1")
        finally:
            await store.close()

    asyncio.run(fail())
    resume = ("resume", "r1", "--app", "tests.cli.escape_app:pipeline", "--store", url)
    failed, debug, usage = (
        subprocess.run(
            [sys.executable, "-m", "nestegg.cli", *args],
            cwd=ROOT, env=_env(tmp_path), capture_output=True, timeout=TIMEOUT,
        ).stderr  # the bytes, as a terminal gets them
        for args in (resume, ("--debug", *resume), ("runs", "--bogus\u202e\x1b[2J"))
    )  # fmt: skip
    shown = b"LLM said: \\x1b[2J\\x1b]0;owned\\x07 \\u202egnp.exe"
    error = b"error: run 'r1' failed: RuntimeError: " + shown + b"\n"
    assert failed == b"warning: " + shown + b"\n" + error
    assert usage == b"error: No such option: --bogus\\u202e\\x1b[2J (see 'nestegg runs --help')\n"
    assert b"WARNING nestegg.test: " + shown in debug and b"Traceback" in debug
    assert debug.endswith(error)
    for raw in (b"\x1b", b"\x07", "\u202e".encode()):
        assert raw not in failed + usage + debug


def test_an_unreachable_postgres_is_one_line(tmp_path: Path) -> None:
    """psycopg's pool logs each failed attempt; the command shows only its error line."""
    pytest.importorskip("psycopg_pool")
    result = nestegg(tmp_path, "runs", "--store", "postgresql://postgres@127.0.0.1:1/test")
    assert result.returncode == EXIT_UNAVAILABLE
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(
        "error: PostgreSQL at postgresql://postgres@127.0.0.1:1/test is unavailable"
    )


PASSWORD = "s3cret-pw"


def _with(url: str, user: str, path: str) -> str:
    """``url`` with ``user`` (and the password PASSWORD) and ``path`` instead of its own."""
    parts = urlsplit(url)
    netloc = f"{user}:{PASSWORD}@{parts.hostname}:{parts.port}"
    return parts._replace(netloc=netloc, path=path).geturl()


def _refused(pg_url: str, redis_url: str) -> list[tuple[str, str]]:
    """Store URLs whose settings the servers refuse, each with the error's start."""
    pg_user, pg_db = urlsplit(pg_url).username or "postgres", urlsplit(pg_url).path
    urls = [
        ("PostgreSQL", _with(pg_url, "nestegg_no_such_role", pg_db), "refused the store's"),
        ("PostgreSQL", _with(pg_url, pg_user, "/nestegg_no_such_db"), "refused the store's"),
        ("Redis", _with(redis_url, "nestegg_no_such_user", "/0"), "refused the store's"),
        ("Redis", _with(redis_url, "default", "/99"), "has no such database"),
    ]
    shown = [url.replace(f":{PASSWORD}@", "@") for _, url, _ in urls]
    return [
        (url, f"error: {server} at {seen} {what}")
        for (server, url, what), seen in zip(urls, shown, strict=True)
    ]


@pytest.mark.server
def test_a_store_refusing_its_settings_is_bad_usage_naming_the_url_without_password(
    tmp_path: Path, pg_url: str, redis_url: str
) -> None:
    pytest.importorskip("psycopg_pool")
    for url, start in _refused(pg_url, redis_url):
        result = nestegg(tmp_path, "runs", "--store", url)
        assert result.returncode == EXIT_USAGE, result.stderr
        assert result.stderr.startswith(start), result.stderr
        assert len(result.stderr.splitlines()) == 1 and PASSWORD not in result.stderr


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis://127.0.0.1:1/0?prefx=app:", "unknown query option 'prefx'"),
        ("postgresql://x@127.0.0.1:1/x?sslmod=require", 'invalid URI query parameter: "sslmod"'),
    ],
)
def test_a_store_url_option_the_driver_does_not_take_is_bad_usage_naming_it(
    tmp_path: Path, url: str, reason: str
) -> None:
    result = nestegg(tmp_path, "runs", "--store", url)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert result.stderr.startswith(f"error: bad store URL '{url}' from --store: "), result.stderr
    assert reason in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def test_runs_with_interrupted_and_another_status_is_bad_usage(tmp_path: Path) -> None:
    result = nestegg(tmp_path, "runs", "--status", "completed", "--interrupted")
    assert result.returncode == EXIT_USAGE
    assert result.stderr == (
        "error: --interrupted lists running runs whose owner is gone, none with status "
        "'completed': give one of --interrupted and --status\n"
    )


def test_an_import_refused_creates_no_store(tmp_path: Path) -> None:
    for document, code in ('{"format": "other"}', EXIT_USAGE), ("{not json", EXIT_USAGE):
        result = nestegg(tmp_path, "import", "-", stdin=document)
        assert result.returncode == code and len(result.stderr.splitlines()) == 1, result.stderr
        target = nestegg(
            tmp_path, "import", "-", "--store", f"file://{tmp_path / 'dir'}", stdin=document
        )
        assert target.returncode == code, target.stderr
    assert not (tmp_path / "home").exists() and not (tmp_path / "dir").exists()


def test_an_import_refuses_a_key_twice_and_imports_nothing(tmp_path: Path) -> None:
    # it imported the last value: a run without steps, say, for a second "steps": []
    source = asyncio.run(fill(f"sqlite:///{tmp_path / 'source.db'}")).url
    exported = nestegg(tmp_path, "export", "ok", "-s", source).stdout
    document = orjson.loads(exported)
    head = exported.rstrip().removesuffix("}")
    agent = f'"agent": "{document["steps"][0]["agent"]}"'
    target = f"file://{tmp_path / 'target'}"
    once = "a dict has each key once; give each key once"
    for text, where, key in (
        (head + ', "steps": []}', "the top level", '"steps"'),
        (exported.replace(agent, f'"agent": "gone", {agent}', 1), "steps[0]", '"agent"'),
        (exported.replace('"status": ', '"status": "failed", "status": ', 1), "run", '"status"'),
    ):
        path = tmp_path / "twice.json"
        path.write_text(text)
        refused = nestegg(tmp_path, "import", str(path), "-s", target)
        assert (refused.returncode, refused.stdout) == (EXIT_USAGE, "")
        assert refused.stderr == (
            f"error: {path} holds a dict at {where} with one key twice ({key} is there "
            f"twice): {once}\n"
        )
        piped = nestegg(tmp_path, "import", "-", "-s", target, stdin=text)
        assert piped.stderr == refused.stderr.replace(str(path), "standard input", 1)
    assert not (tmp_path / "target").exists()  # nothing imported, no store made
    # an export written otherwise (compact, not as nestegg export writes it) is read again
    compact = nestegg(tmp_path, "import", "-", "-s", target, stdin=orjson.dumps(document).decode())
    assert compact.returncode == 0, compact.stderr
    assert nestegg(tmp_path, "export", "ok", "-s", target).stdout == exported


def test_an_import_refuses_a_key_twice_in_a_record_and_changes_nothing(tmp_path: Path) -> None:
    # the record's checksum held (made again after the edit): the step was imported, and
    # read back with "page" alone, its first "name" lost
    source = asyncio.run(fill(f"sqlite:///{tmp_path / 'source.db'}")).url
    document = orjson.loads(nestegg(tmp_path, "export", "ok", "-s", source).stdout)
    body = unseal(document["steps"][0]["body"].encode(), "step 1")
    document["steps"][0]["body"] = seal(body.replace(b'{"name"', b'{"name":"x","name"', 1)).decode()
    path = tmp_path / "twice.json"
    path.write_bytes(orjson.dumps(document))
    target = asyncio.run(fill(f"sqlite:///{tmp_path / 'target.db'}", "-kept")).url
    runs = ("ok-kept", "bad-kept", "gone-kept")

    def stored() -> list[str]:
        return [nestegg(tmp_path, "export", run, "-s", target).stdout for run in runs]

    before = stored()
    refused = nestegg(tmp_path, "import", str(path), "-s", target)
    assert (refused.returncode, refused.stdout) == (EXIT_USAGE, "")
    assert refused.stderr == (
        f"error: {path}: steps[0].body holds a dict at body.data with one key twice "
        '("name" is there twice): a dict has each key once; give each key once\n'
    )
    listed = orjson.loads(nestegg(tmp_path, "runs", "--json", "-s", target).stdout)
    assert sorted(row["run_id"] for row in listed) == sorted(runs)  # no run added
    assert stored() == before


def test_an_import_refuses_a_copy_its_record_body_does_not_hold(tmp_path: Path) -> None:
    # a hand-edited steps[0].agent was imported, and nestegg show listed the step under it
    source = asyncio.run(fill(f"sqlite:///{tmp_path / 'source.db'}")).url
    exported = nestegg(tmp_path, "export", "ok", "-s", source).stdout
    target = f"sqlite:///{tmp_path / 'copy.db'}"
    for keys, value, expected in (
        (("steps", 0, "agent"), "nope-agent", "steps[0].agent 'nope-agent' is not what"),
        (("steps", 2, "agent"), "fetch", "steps[2].agent 'fetch' is not what"),
        (("checkpoints", 0, "seq"), 3, "checkpoints[0].seq 3 is not what"),
    ):
        document = orjson.loads(exported)
        record = document[keys[0]][keys[1]]
        held = record[keys[2]]
        record[keys[2]] = value
        path = tmp_path / "edited.json"
        path.write_bytes(orjson.dumps(document))
        refused = nestegg(tmp_path, "import", str(path), "-s", target)
        assert (refused.returncode, refused.stdout) == (EXIT_USAGE, "")
        assert refused.stderr == (
            f"error: {path}: {expected} the record's sealed body holds, {held!r}\n"
        )
    assert not (tmp_path / "copy.db").exists()  # nothing imported, no store made
    imported = nestegg(tmp_path, "import", "-", "-s", target, stdin=exported)
    assert imported.returncode == 0, imported.stderr


def test_an_import_of_checkpoint_ids_the_store_has_changes_nothing(tmp_path: Path) -> None:
    store = asyncio.run(fill(f"sqlite:///{tmp_path / 'copy.db'}")).url
    exported = nestegg(tmp_path, "export", "ok", "-s", store)
    document = orjson.loads(exported.stdout)
    document["run"]["run_id"] = "tampered"
    refused = nestegg(tmp_path, "import", "-", "-s", store, stdin=orjson.dumps(document).decode())
    taken = document["checkpoints"][0]["checkpoint_id"]
    assert refused.returncode == EXIT_FAILED
    assert refused.stderr == (
        f"error: checkpoint {taken!r} of run 'ok' already exists in the target store; "
        "delete run 'ok' first\n"
    )
    assert nestegg(tmp_path, "export", "ok", "-s", store).stdout == exported.stdout
    listed = orjson.loads(nestegg(tmp_path, "runs", "--json", "-s", store).stdout)
    assert sorted(row["run_id"] for row in listed) == ["bad", "gone", "ok"]


def test_export_to_dash_writes_stdout_as_import_reads_stdin(tmp_path: Path) -> None:
    # -o - wrote a file named '-' in the current directory
    source = asyncio.run(fill(f"sqlite:///{tmp_path / 'source.db'}")).url
    plain = nestegg(tmp_path, "export", "ok", "-s", source)
    dashed = nestegg(tmp_path, "export", "ok", "-o", "-", "-s", source)
    assert (dashed.returncode, dashed.stdout, dashed.stderr) == (0, plain.stdout, "")
    assert not (ROOT / "-").exists()
    target = f"file://{tmp_path / 'target'}"
    imported = nestegg(tmp_path, "import", "-", "-s", target, stdin=dashed.stdout)
    assert imported.returncode == 0, imported.stderr
    assert nestegg(tmp_path, "export", "ok", "-s", target).stdout == plain.stdout


def test_log_records_are_shown_with_their_level(tmp_path: Path) -> None:
    result = nestegg(tmp_path, "recover", "--app", "tests.cli.logging_app:none")
    assert result.stderr.splitlines() == [
        "warning: a warning of nestegg",
        "error: an error of nestegg",
        "warning: a driver's message:\\n\\tover two lines",  # one line each
        "error: a failure of nestegg: KeyError: 'lost'",  # its traceback under --debug
        "error: a critical record of another library",  # its warnings hidden
        # broker and store clients' records hidden: nestegg reports their failures
        "error: 'tests.cli.logging_app' has no attribute 'none'",
    ]


def test_a_module_whose_clutch_nestegg_refuses_is_named_at_the_users_line(
    tmp_path: Path,
) -> None:
    (tmp_path / "wpipe.py").write_text(
        "import os\n"
        "from nestegg import Clutch\n"
        "from nestegg.checkpoint import CheckpointConfig, open_store\n"
        "store = open_store('sqlite:///w.db')\n"
        "triage = Clutch('t', checkpoint=CheckpointConfig(storage=store),\n"
        "                transport=os.environ['TRANSPORT'])\n"
    )
    path = os.pathsep.join((str(tmp_path), str(ROOT)))
    result = nestegg(tmp_path, "worker", "wpipe:triage", TRANSPORT="redis://[bad", PYTHONPATH=path)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert result.stderr.startswith("error: cannot import 'wpipe': bad transport URL ")
    assert result.stderr.endswith(  # the user's line that built the Clutch, not nestegg's
        f" (at {tmp_path / 'wpipe.py'}, line 5) (nestegg --debug shows the traceback)\n"
    ), result.stderr
