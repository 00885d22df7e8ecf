#!/usr/bin/env bash
# The dstack server the backend tests start runs from its own virtualenv: dstack[server] pins
# its own web stack (FastAPI, SQLAlchemy, ...) and must not share the Studio's .venv.
#   usage: bash .ci/dstack.sh [VENV_DIR]   (default var/dstack-venv; skipped when it is complete)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-var/dstack-venv}"
VERSION="0.22.5"
STAMP="$VENV/.dstack-$VERSION"
if [ -f "$STAMP" ] && [ -x "$VENV/bin/dstack" ]; then
  exit 0
fi
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "dstack[server]==$VERSION"
"$VENV/bin/dstack" --version
touch "$STAMP"
