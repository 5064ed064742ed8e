"""examples/refund_approval.py runs its stages in separate processes and pays once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_refund_example_waits_in_one_process_and_resumes_in_another(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "REFUND_PAID_LOG": str(tmp_path / "paid.log")}
    url = f"sqlite:///{tmp_path / 'refunds.db'}"
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
    assert done.stdout.splitlines() == [
        "start: run refund-1042 waits for 'approval'; process exits",
        "approve: run refund-1042 resumed: approved by ann",
        "approve: refund of 129.00 for A-1042 sent",
        "assessments paid for: 1",
    ]
