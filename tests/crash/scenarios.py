"""The crash scenarios, run against every store by test_crash_embedded and test_crash_servers.

- :func:`killed_and_resumed`: one run SIGKILLed at random moments many times, restarted
  each time, finally left to finish.
- :func:`racing_resumers`: several processes released at once to resume one interrupted
  run: exactly one proceeds, the others get RunLockedError; repeated over a few rounds.
- :func:`recovered_in_fresh_process`: a process running several runs is killed; another
  process's ``recover()`` finishes all of them.
- :func:`journaled_calls_survive_kills`: agents make journaled calls to a fake LLM; a
  SIGKILLed and resumed run makes again only the calls the kills interrupted.
- :func:`failed_step_replays_its_calls`: a step that failed after three journaled calls
  is resumed in another process: every call is made exactly once.
- :func:`long_run_killed_at_block_edges`: a run of several blocks of steps is SIGKILLed
  around the steps that complete a block (where the SQLite store packs them) and resumed.
- :func:`killed_in_its_first_step`: a new run SIGKILLed as its first step starts, before
  anything of the run but its creation is written (its opening goes with its first write),
  then resumed.
- :func:`exit_durability_starts_over`: a run of durability "exit" SIGKILLed in its fourth
  step is resumed from its input and pays again for every call made before the kill.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import uuid
from collections import Counter
from pathlib import Path

from nestegg.constants import FAILED, RUN_STARTED, RUNNING, STEP_BLOCK_STEPS
from tests.crash.child import EXIT_LOCKED, EXIT_RUN_FAILED
from tests.crash.harness import (
    CrashReport,
    StoreTarget,
    calls_made,
    check_run,
    child_command,
    crash_and_resume,
    expected_calls,
    finish,
    kill,
    kill_at_random_moment,
    log_lines,
    reference_run,
    run_status,
    spawn,
    stored_event_kinds,
    wait_for,
)

STEPS = 40
"""Steps of one run: long enough that the kills land before it completes."""
RACE_STEPS = 80
"""Steps of the raced run: every round but the last kills the winner before it completes."""
MIN_KILLS, MAX_KILLS = 5, 10
RACERS = 3
RACE_ROUNDS = 3
RECOVER_RUNS = 5
RECOVER_STRATEGY = "graph"
RACE_STRATEGY = "round_robin"
CALLS = 5
"""Journaled calls each agent makes in the journal scenarios."""
JOURNAL_STEPS = 24
JOURNAL_MIN_KILLS, JOURNAL_MAX_KILLS = 3, 6
FAIL_TURN = 3
FAILING_STRATEGY = "graph"
MAX_WINNER_KILL_DELAY_S = 0.05
KILLED = -signal.SIGKILL
LONG_STEPS = 3 * STEP_BLOCK_STEPS + 40
"""Steps of the long run: its history spans several blocks of step records."""
LONG_STRATEGY = "round_robin"


async def killed_and_resumed(
    target: StoreTarget, strategy: str, tmp_path: Path, rng: random.Random, report: CrashReport
) -> None:
    """SIGKILL a run 5-10 times at random moments; it must end as if never interrupted."""
    reference = await reference_run(strategy, STEPS)
    run_id = f"crash-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "executions.log"
    command = child_command(target, strategy, run_id, STEPS, log)
    result, kills = await crash_and_resume(
        command, log, rng, rng.randint(MIN_KILLS, MAX_KILLS), report
    )
    assert result == reference.result, f"result differs from an uninterrupted run\n{report}"
    assert kills >= MIN_KILLS, f"the run completed after {kills} kills\n{report}"
    executions = len(log_lines(log, run_id))
    report.note(f"{executions} executions, {reference.steps} steps, {kills} kills")
    await check_run(target, run_id, reference, executions, kills, report)


async def _race_round(
    target: StoreTarget,
    run_id: str,
    log: Path,
    tmp_path: Path,
    last: bool,
    rng: random.Random,
    report: CrashReport,
) -> object:
    """Release RACERS resumers at once: exactly one proceeds, the others are locked out.

    Unless ``last``, the one that proceeds is killed at a random moment once the others
    exited. Returns the result printed by the one that proceeded (None when killed).
    """
    barrier = tmp_path / f"barrier-{uuid.uuid4().hex[:6]}"
    barrier.mkdir()
    resume = ("--mode", "resume", "--barrier", str(barrier))
    command = child_command(target, RACE_STRATEGY, run_id, RACE_STEPS, log, *resume)
    racers = [spawn(command) for _ in range(RACERS)]
    ready = await wait_for(lambda: len(list(barrier.glob("ready-*"))) == RACERS, *racers)
    assert ready, f"racers exited before the barrier: {[finish(r, report) for r in racers]}"
    before = len(log_lines(log))
    (barrier / "go").touch()
    if last:
        outcomes = [finish(racer, report) for racer in racers]
    else:
        winner = await _first_to_execute(racers, log, before)
        outcomes = [(KILLED, None) if r is winner else finish(r, report) for r in racers]
        await asyncio.sleep(rng.uniform(0, MAX_WINNER_KILL_DELAY_S))
        assert kill(winner), f"the winner finished before it was killed\n{report}"
        assert await run_status(target, run_id) == RUNNING, (
            f"the winner completed the run before it was killed (raise RACE_STEPS)\n{report}"
        )
    codes = sorted(code for code, _ in outcomes)
    report.note(f"race round: exit codes {codes}, {len(log_lines(log)) - before} executions")
    for code, outcome in outcomes:
        if code == EXIT_LOCKED:
            report.note(f"  locked out: {outcome['locked']}")
    proceeded = [r for r, (code, _) in zip(racers, outcomes, strict=True) if code != EXIT_LOCKED]
    assert len(proceeded) == 1, f"exit codes {codes}: exactly one may proceed\n{report}"
    pids = {line.rsplit("/", 1)[1] for line in log_lines(log)[before:]}
    assert pids == {str(proceeded[0].pid)}, f"executions by {pids}\n{report}"
    return next((result for code, result in outcomes if code == 0), None)


async def _first_to_execute(
    racers: list[subprocess.Popen[str]], log: Path, before: int
) -> subprocess.Popen[str]:
    """The racer that logged the first execution after the barrier."""
    assert await wait_for(lambda: len(log_lines(log)) > before, *racers), "no racer executed"
    pid = int(log_lines(log)[before].rsplit("/", 1)[1])
    return next(racer for racer in racers if racer.pid == pid)


async def racing_resumers(
    target: StoreTarget, tmp_path: Path, rng: random.Random, report: CrashReport
) -> None:
    """Interrupt a run, then race RACERS processes to resume it, RACE_ROUNDS times."""
    reference = await reference_run(RACE_STRATEGY, RACE_STEPS)
    run_id = f"race-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "executions.log"
    command = child_command(target, RACE_STRATEGY, run_id, RACE_STEPS, log)
    assert await kill_at_random_moment(command, log, rng, report, mid_run=True), str(report)
    kills = 1
    result: object = None
    for round_index in range(RACE_ROUNDS):
        last = round_index == RACE_ROUNDS - 1
        result = await _race_round(target, run_id, log, tmp_path, last, rng, report)
        kills += not last
    assert result == reference.result, f"result differs from an uninterrupted run\n{report}"
    executions = len(log_lines(log, run_id))
    await check_run(target, run_id, reference, executions, kills, report)


async def recovered_in_fresh_process(
    target: StoreTarget, tmp_path: Path, rng: random.Random, report: CrashReport
) -> None:
    """Kill a process running RECOVER_RUNS runs; recover() in another one finishes them."""
    prefix = f"many-{uuid.uuid4().hex[:6]}"
    run_ids = [f"{prefix}-{index}" for index in range(RECOVER_RUNS)]
    log = tmp_path / "executions.log"
    many = ("--mode", "start-many", "--runs", str(RECOVER_RUNS))
    starter = spawn(child_command(target, RECOVER_STRATEGY, prefix, STEPS, log, *many))
    lines_each = rng.randint(1, 6)

    def every_run_started() -> bool:
        lines = log_lines(log)
        return all(sum(line.startswith(f"{r}/") for line in lines) >= lines_each for r in run_ids)

    if not await wait_for(every_run_started, starter):
        raise AssertionError(f"the runs ended first: {finish(starter, report)}\n{report}")
    assert kill(starter), f"the runs finished before the kill\n{report}"
    report.note(f"killed {RECOVER_RUNS} runs after {len(log_lines(log))} executions")
    references = [await reference_run(RECOVER_STRATEGY, STEPS, seed=i) for i in range(RECOVER_RUNS)]
    store = target.open()
    try:
        pipeline = references[0].pipeline(store)
        interrupted = sorted(info.run_id for info in await pipeline.list_interrupted())
    finally:
        await store.close()
    assert interrupted == run_ids, f"interrupted: {interrupted}\n{report}"
    recover = child_command(target, RECOVER_STRATEGY, prefix, STEPS, log, "--mode", "recover")
    code, results = finish(spawn(recover), report)
    assert code == 0, f"recover() failed: {results}\n{report}"
    assert sorted(results) == run_ids, f"recovered {sorted(results)}\n{report}"
    for run_id, reference in zip(run_ids, references, strict=True):
        assert results[run_id] == reference.result, f"{run_id} differs\n{report}"
        executions = len(log_lines(log, run_id))
        await check_run(target, run_id, reference, executions, 1, report)
    code, again = finish(spawn(recover), report)
    assert (code, again) == (0, {}), f"a second recover() found {again}\n{report}"


async def journaled_calls_survive_kills(
    target: StoreTarget, strategy: str, tmp_path: Path, rng: random.Random, report: CrashReport
) -> None:
    """SIGKILL a run whose agents make CALLS journaled calls each, 3-6 times.

    A re-executed step replays its recorded calls: only a call in flight when the process
    was killed is made again, so repeated calls are at most the kills.
    """
    reference = await reference_run(strategy, JOURNAL_STEPS, calls=CALLS)
    run_id = f"journal-{uuid.uuid4().hex[:8]}"
    log, calls_log = tmp_path / "executions.log", tmp_path / "calls.log"
    journaled = ("--calls", str(CALLS), "--calls-log", str(calls_log))
    command = child_command(target, strategy, run_id, JOURNAL_STEPS, log, *journaled)
    result, kills = await crash_and_resume(
        command, log, rng, rng.randint(JOURNAL_MIN_KILLS, JOURNAL_MAX_KILLS), report
    )
    assert result == reference.result, f"result differs from an uninterrupted run\n{report}"
    made = calls_made(calls_log, run_id)
    repeated = sum(count - 1 for count in made.values())
    executions = len(log_lines(log, run_id))
    report.note(f"{kills} kills, {executions - reference.steps} steps and {repeated} calls again")
    assert set(made) == expected_calls(run_id, reference, CALLS), f"calls {made}\n{report}"
    assert repeated <= kills, f"{repeated} calls made again after {kills} kills\n{report}"
    await check_run(target, run_id, reference, executions, kills, report)


async def failed_step_replays_its_calls(
    target: StoreTarget, strategy: str, tmp_path: Path, report: CrashReport
) -> None:
    """An agent fails after its third journaled call; the process exits; another one
    resumes the failed run: the step replays those three calls and makes the other two,
    so every call is made exactly once."""
    reference = await reference_run(strategy, JOURNAL_STEPS, calls=CALLS)
    run_id = f"failing-{uuid.uuid4().hex[:8]}"
    log, calls_log, flag = tmp_path / "executions.log", tmp_path / "calls.log", tmp_path / "arm"
    flag.touch()
    journaled = ("--calls", str(CALLS), "--calls-log", str(calls_log))
    failing = ("--fail-turn", str(FAIL_TURN), "--fail-flag", str(flag))
    command = child_command(target, strategy, run_id, JOURNAL_STEPS, log, *journaled, *failing)
    code, outcome = finish(spawn(command), report)
    assert code == EXIT_RUN_FAILED, f"the step did not fail: {code} {outcome}\n{report}"
    assert await run_status(target, run_id) == FAILED
    made = calls_made(calls_log, run_id)
    assert sum(made.values()) == FAIL_TURN * CALLS + 3, f"calls before the failure {made}"
    code, result = finish(spawn(command), report)
    assert (code, result) == (0, reference.result), f"resumed: {code} {result}\n{report}"
    made = calls_made(calls_log, run_id)
    assert set(made) == expected_calls(run_id, reference, CALLS), f"calls {made}\n{report}"
    assert set(made.values()) == {1}, f"calls made twice: {made}\n{report}"
    executions = len(log_lines(log, run_id))
    assert executions == reference.steps + 1, f"{executions} executions\n{report}"
    await check_run(target, run_id, reference, executions, 1, report)


async def long_run_killed_at_block_edges(
    target: StoreTarget, tmp_path: Path, rng: random.Random, report: CrashReport
) -> None:
    """SIGKILL a long run once around each step that completes a block of steps (a few
    executions before or after it), restart it each time; it must end as if never
    interrupted, with at most one step run twice per kill."""
    reference = await reference_run(LONG_STRATEGY, LONG_STEPS)
    run_id = f"long-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "executions.log"
    command = child_command(target, LONG_STRATEGY, run_id, LONG_STEPS, log)
    kills = 0
    for edge in range(STEP_BLOCK_STEPS, LONG_STEPS, STEP_BLOCK_STEPS):
        executions = edge + rng.randint(-2, 2) + kills
        process = spawn(command)
        await wait_for(lambda: len(log_lines(log)) >= executions, process)  # noqa: B023
        killed = kill(process)
        report.note(f"kill near step {edge} after {len(log_lines(log))} executions: {killed}")
        assert killed, f"the child ended before step {edge}\n{report}"
        kills += 1
    code, result = finish(spawn(command), report)
    assert code == 0, f"the last child exited {code}: {result}\n{report}"
    assert result == reference.result, f"result differs from an uninterrupted run\n{report}"
    await check_run(target, run_id, reference, len(log_lines(log, run_id)), kills, report)


FIRST_STEP_KILLS = 3
FIRST_STEP_RUN_STEPS = 10
FIRST_STEP_SLEEP_MS = ("--min-sleep-ms", "30", "--max-sleep-ms", "40")
"""Steps shorter than the 50 ms after which a step's start is written while it runs: the
kill lands before anything of the run but its creation is written."""


async def killed_in_its_first_step(
    target: StoreTarget, tmp_path: Path, report: CrashReport
) -> None:
    """SIGKILL new runs as their first step starts (a run's opening is written with its
    first step's start, journaled call or commit, so only the run itself is stored then):
    each is resumed in a new process to the uninterrupted result, with one run_started."""
    reference = await reference_run(RECOVER_STRATEGY, FIRST_STEP_RUN_STEPS)
    log = tmp_path / "executions.log"
    for _ in range(FIRST_STEP_KILLS):
        run_id = f"first-{uuid.uuid4().hex[:8]}"
        command = child_command(
            target, RECOVER_STRATEGY, run_id, FIRST_STEP_RUN_STEPS, log, *FIRST_STEP_SLEEP_MS
        )
        process = spawn(command)
        await wait_for(lambda: bool(log_lines(log, run_id)), process)  # noqa: B023
        assert kill(process), f"the run finished before it was killed\n{report}"
        assert await run_status(target, run_id) == RUNNING, f"no run stored\n{report}"
        stored = await stored_event_kinds(target, run_id)
        code, result = finish(spawn(command), report)
        assert (code, result) == (0, reference.result), f"{code}: {result}\n{report}"
        executions = len(log_lines(log, run_id))
        report.note(f"killed in its first step, its events then {stored}; {executions} executions")
        await check_run(target, run_id, reference, executions, 1, report)


EXIT_STEPS = 6
EXIT_KILL_STEP = 4
EXIT_CALLS = 2
EXIT_SLEEP_MS = ("--min-sleep-ms", "300", "--max-sleep-ms", "300")
"""Each step sleeps after its calls: the kill lands in step EXIT_KILL_STEP, after them."""


async def exit_durability_starts_over(
    target: StoreTarget, tmp_path: Path, report: CrashReport
) -> None:
    """SIGKILL a run of durability "exit" in its fourth step, once that step's calls
    returned: only the run and its run_started event were stored (no step, no journaled
    call), so a new process starts it over from its input and makes every call made before
    the kill again, the others once."""
    reference = await reference_run("sequential", EXIT_STEPS, calls=EXIT_CALLS)
    run_id = f"exit-{uuid.uuid4().hex[:8]}"
    log, calls_log = tmp_path / "executions.log", tmp_path / "calls.log"
    journaled = ("--calls", str(EXIT_CALLS), "--calls-log", str(calls_log))
    options = (*journaled, "--durability", "exit", *EXIT_SLEEP_MS)
    command = child_command(target, "sequential", run_id, EXIT_STEPS, log, *options)
    process = spawn(command)
    paid = EXIT_KILL_STEP * EXIT_CALLS
    await wait_for(lambda: len(log_lines(calls_log, run_id)) >= paid, process)
    assert kill(process), f"the run finished before it was killed\n{report}"
    before = calls_made(calls_log, run_id)
    assert sum(before.values()) == paid, f"calls before the kill {before}\n{report}"
    assert await run_status(target, run_id) == RUNNING, f"no run stored\n{report}"
    assert await stored_event_kinds(target, run_id) == [RUN_STARTED], f"{report}"
    code, result = finish(spawn(command), report)
    assert (code, result) == (0, reference.result), f"{code}: {result}\n{report}"
    once = Counter(expected_calls(run_id, reference, EXIT_CALLS))
    assert calls_made(calls_log, run_id) == once + before, f"calls {calls_made(calls_log, run_id)}"
    executions = len(log_lines(log, run_id))
    assert executions == reference.steps + EXIT_KILL_STEP, f"{executions} executions\n{report}"
    await check_run(target, run_id, reference, executions, EXIT_KILL_STEP, report)
