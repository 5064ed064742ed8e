"""How long the ``nestegg`` command takes to start: wall time of whole commands, each in a
fresh process, and the import time of the command's module.

Commands: ``nestegg --help``, ``nestegg runs --help``, and ``nestegg runs`` and
``nestegg show RUN`` on a small SQLite store (a temp file holding ``--runs`` runs of five
checkpointed steps); beside them ``python -c pass``, what any command pays for Python
itself. Each is started as the console script starts it (``from nestegg.cli import main``).

Every process finds the bytecode of the modules it imports cached (in a temp dir, by a
first run of each command), as an installed package's is; with ``--compile`` nestegg's
modules are compiled at every start instead (PYTHONDONTWRITEBYTECODE=1).

With ``--against REV``, the package of that commit (``git archive``, in a temp dir) is
measured beside this tree's, interleaved repetition by repetition (this tree, REV, REV,
this tree, ...): only numbers measured side by side are compared. The table gives the
median wall time of ``--reps`` processes, the modules each command had imported when it
ended, and the cumulative ``python -X importtime -c "import nestegg.cli.app"`` (medians).

    .venv/bin/python bench/cli_startup.py [--against REV] [--reps 21] [--runs 20] [--compile]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from harness import Table, interleaved, machine_markdown, median, print_tables, progress

REPO = Path(__file__).resolve().parent.parent
THIS_TREE = "this tree"
LAUNCH = "import sys; from nestegg.cli import main; sys.argv[0] = 'nestegg'; main()"
"""What the ``nestegg`` console script runs (its arguments follow on the command line)."""
APP_IMPORT = "import nestegg.cli.app"
IMPORT_ROW = f"`{APP_IMPORT}` (-X importtime)"
HOME_ENV = "NESTEGG_HOME"
STORE = "{store}"
"""In a command's arguments: the URL of the store of the tree that runs it."""


def fill_store(path: Path, runs: int) -> str:
    """A SQLite store at ``path`` holding ``runs`` completed runs of five steps; the id of
    the last one."""
    from nestegg import Clutch, Strategy
    from nestegg.checkpoint import CheckpointConfig, SQLiteCheckpointStorage

    async def fill() -> str:
        store = SQLiteCheckpointStorage(path)
        clutch = Clutch(
            "startup",
            strategy=Strategy.ROUND_ROBIN,
            max_turns=5,
            checkpoint=CheckpointConfig(storage=store),
        )

        @clutch.agent()
        async def step(data: dict[str, Any]) -> dict[str, Any]:
            return {"turn": data["turn"] + 1, "content": "x" * 200}

        run_id = ""
        for number in range(runs):
            run_id = f"run-{number:03d}"
            await clutch.run({"turn": 0, "content": ""}, run_id=run_id)
        await store.close()
        return run_id

    return asyncio.run(fill())


def fill_store_of(source: Path, path: Path, runs: int) -> str:
    """:func:`fill_store` run by the ``nestegg`` package under ``source``, in a child
    process: each tree reads a store its own code wrote (an older one may not read a
    newer schema)."""
    code = (
        "import sys; from cli_startup import fill_store; "
        f"print(fill_store(__import__('pathlib').Path({str(path)!r}), {runs}))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), str(REPO / "bench")])}
    done = subprocess.run(  # run where no nestegg package is: -c puts it first on the path
        [sys.executable, "-c", code],
        env=env,
        cwd=path.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def checkout(rev: str, into: Path) -> Path:
    """The ``nestegg`` package of commit ``rev``, extracted under ``into``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "nestegg"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def environment(source: Path, home: Path, cache: Path | None) -> dict[str, str]:
    """The environment of a measured process: ``source`` (a directory holding a ``nestegg``
    package) first on its path, ``home`` its NESTEGG_HOME and working directory (``-c``
    puts the working directory first on the path: not this checkout), and the bytecode of
    ``source`` cached under ``cache``, as an installed package's is (nothing written beside
    the sources), or, for None, compiled at every start."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NESTEGG_")}
    home.mkdir(exist_ok=True)
    env |= {"PYTHONPATH": str(source), HOME_ENV: str(home)}
    if cache is None:
        return {**env, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def command_line(arguments: list[str] | None, url: str) -> list[str]:
    """The process that runs ``nestegg ARGUMENTS`` (None: ``python -c pass``), its
    :data:`STORE` the store at ``url``."""
    if arguments is None:
        return [sys.executable, "-c", "pass"]
    return [sys.executable, "-c", LAUNCH, *(url if a == STORE else a for a in arguments)]


def wall(arguments: list[str], env: dict[str, str]) -> float:
    """Seconds one process took from start to exit (exit code 0 required)."""
    start = time.perf_counter()
    subprocess.run(arguments, env=env, cwd=env[HOME_ENV], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def modules_at_exit(arguments: list[str] | None, env: dict[str, str]) -> int:
    """How many modules a command (None: ``python -c pass``) had imported when it ended."""
    read, write = os.pipe()
    code = (
        "import atexit, os, sys; "
        f"atexit.register(lambda: os.write({write}, str(len(sys.modules)).encode()))"
    )
    launched = [sys.executable, "-c", code if arguments is None else f"{code}; {LAUNCH}"]
    try:
        subprocess.run(
            [*launched, *(arguments or [])],
            env=env,
            cwd=env[HOME_ENV],
            stdout=subprocess.DEVNULL,
            pass_fds=(write,),
            check=True,
        )
    finally:
        os.close(write)
    with os.fdopen(read) as counted:
        return int(counted.read())


def import_seconds(env: dict[str, str]) -> float:
    """The cumulative ``-X importtime`` of :data:`APP_IMPORT`: its line holds every module
    the statement imported."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", APP_IMPORT],
        env=env,
        cwd=env[HOME_ENV],
        capture_output=True,
        text=True,
        check=True,
    )
    for line in done.stderr.splitlines():
        parts = line.split("|")  # import time: self | cumulative | name, indented by depth
        if len(parts) == 3 and parts[2] == " nestegg.cli.app":
            return int(parts[1]) / 1e6
    raise RuntimeError(f"no import time of nestegg.cli.app in {done.stderr[-500:]!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", metavar="REV", help="a commit to measure beside this tree")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--runs", type=int, default=20, help="runs in the SQLite store")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="compile nestegg's modules at every start (PYTHONDONTWRITEBYTECODE=1), as a "
        "checkout that keeps no bytecode does",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        trees = {THIS_TREE: REPO}
        if args.against:
            (base / "old").mkdir()
            trees = {THIS_TREE: REPO, args.against: checkout(args.against, base / "old")}
        urls, last = {}, ""
        for number, (name, source) in enumerate(trees.items()):
            store = base / f"runs-{number}.db"
            last = fill_store_of(source, store, args.runs)
            urls[name] = f"sqlite:///{store}"  # an absolute path: four slashes
        commands = {
            "`python -c pass`": None,
            "`nestegg --help`": ["--help"],
            "`nestegg runs --help`": ["runs", "--help"],
            f"`nestegg runs` ({args.runs} runs)": ["runs", "--store", STORE],
            "`nestegg show RUN`": ["show", last, "--store", STORE],
        }
        envs = {
            name: environment(
                source, base / "home", None if args.compile else base / "bytecode" / str(number)
            )
            for number, (name, source) in enumerate(trees.items())
        }
        for arguments in commands.values():  # bytecode cached, files read once
            for tree in trees:
                wall(command_line(arguments, urls[tree]), envs[tree])
        samples: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.reps):
            for shown, arguments in commands.items():
                for tree in interleaved(list(trees), rep):
                    seconds = wall(command_line(arguments, urls[tree]), envs[tree])
                    samples.setdefault((shown, tree), []).append(seconds)
            for tree in interleaved(list(trees), rep):
                samples.setdefault((IMPORT_ROW, tree), []).append(import_seconds(envs[tree]))
            progress(f"repetition {rep + 1}/{args.reps} done")
        counts = {
            (shown, tree): modules_at_exit(
                None if arguments is None else [urls[tree] if a == STORE else a for a in arguments],
                envs[tree],
            )
            for shown, arguments in commands.items()
            for tree in trees
        }
    command_packages = f"- The command's: typer {version('typer')}, rich {version('rich')}"
    print(machine_markdown() + command_packages + "\n")
    print_tables([_table(args, list(trees), list(commands), samples, counts)])


def _table(
    args: argparse.Namespace,
    trees: list[str],
    commands: list[str],
    samples: dict[tuple[str, str], list[float]],
    counts: dict[tuple[str, str], int],
) -> Table:
    headers = ["command", *(f"{tree} (ms)" for tree in trees)]
    if len(trees) == 2:
        headers.append(f"{THIS_TREE} / {trees[1]}")
    headers.extend(f"modules, {tree}" for tree in trees)
    table = Table(
        f"Start-up of the nestegg command (wall time, medians of {args.reps} processes; "
        f"{'compiled at every start' if args.compile else 'bytecode cached'})",
        headers,
        notes=[
            "modules: how many were in sys.modules when the command ended",
            f'last row: `python -X importtime -c "{APP_IMPORT}"`, the cumulative import time '
            "of the statement (a fresh process each time)",
        ],
    )
    for shown in [*commands, IMPORT_ROW]:
        times = [median(samples[(shown, tree)]) for tree in trees]
        row = [shown, *(f"{value * 1e3:,.1f}" for value in times)]
        if len(trees) == 2:
            row.append(f"{times[0] / times[1]:.2f}")
        row.extend(str(counts[(shown, tree)]) if (shown, tree) in counts else "" for tree in trees)
        table.rows.append(row)
    return table


if __name__ == "__main__":
    main()
