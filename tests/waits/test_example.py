"""examples/refund_approval.py runs its stages in separate processes and pays once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_refund_example_waits_in_one_process_and_resumes_in_another_run_after_run(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "REFUND_PAID_LOG": str(tmp_path / "paid.log")}
    url = f"sqlite:///{tmp_path / 'refunds.db'}"  # one store: the second play is a new run
    runs = []
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, "examples/refund_approval.py", url],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        run_id = done.stdout.split()[2]
        assert re.fullmatch(r"refund-1042-[0-9a-f]{8}", run_id), done.stdout
        assert done.stdout.splitlines() == [
            f"start: run {run_id} waits for 'approval'; process exits",
            f"approve: run {run_id} resumed: approved by ann",
            "approve: refund of 129.00 for A-1042 sent",
            "assessments paid for: 1",
        ]
        runs.append(run_id)
    assert runs[0] != runs[1]
