#!/usr/bin/env bash
# Creates .venv-bench: nestegg (editable, with its server extras) beside the anchors it is
# measured against, at pinned versions. Idempotent: a second run with nothing changed only
# checks the imports.
#
#   bash bench/setup.sh          # then: .venv-bench/bin/python bench/run_all.py
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV=.venv-bench
STAMP="$VENV/.installed"

# The anchors, pinned to the versions the published numbers were measured with.
ANCHORS=(
    "eggai-clutch==0.2.2"
    "eggai==0.8.0"
    "langgraph==1.2.22"
    "langgraph-checkpoint==4.3.2"
    "langgraph-checkpoint-sqlite==3.1.2"
    "langgraph-checkpoint-postgres==3.2.0"
    "aiosqlite==0.22.1"
)

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
    echo "bench/setup.sh: Python 3.11+ needed, $PYTHON is $("$PYTHON" --version)" >&2
    exit 1
}

wanted="$(cat bench/setup.sh pyproject.toml | "$PYTHON" -c \
    'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())')"

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$wanted" ]]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e '.[postgres,redis,rabbitmq]' "${ANCHORS[@]}"
    echo "$wanted" > "$STAMP"
fi

"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version

import eggai_clutch  # noqa: F401
import langgraph.checkpoint.postgres  # noqa: F401
import langgraph.checkpoint.sqlite  # noqa: F401

import nestegg  # noqa: F401

names = ("nestegg", "eggai-clutch", "eggai", "langgraph", "langgraph-checkpoint",
         "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres")
print("bench env ready: " + ", ".join(f"{n} {version(n)}" for n in names))
EOF
