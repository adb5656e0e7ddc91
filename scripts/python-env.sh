#!/usr/bin/env bash
# scripts/python-env.sh — the Python environment the client tests run in: a
# virtual environment with the official `openai` client, `jsonschema` and
# `rfc3339-validator` (which jsonschema needs to check the date-time and time
# formats) pinned below, made once in ${LOOM_CACHE:-~/.cache/loom}/pyenv and
# reused while it imports all three at those versions. Debian 12's own Python
# refuses `pip install` outside a venv (PEP 668), hence the venv
# (python3-venv, which scripts/setup.sh installs).
#
# Prints ONLY the path of the environment's python on stdout (so callers can
# do PY=$(scripts/python-env.sh)); everything else goes to stderr. Needs
# PyPI the first time.
set -euo pipefail

OPENAI=3.60.0
JSONSCHEMA=4.26.0
RFC3339=0.1.4

case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  "") ;;
  *) echo "python-env: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

dir="${LOOM_CACHE:-$HOME/.cache/loom}/pyenv"
py="$dir/bin/python"
want="import openai, jsonschema, rfc3339_validator, importlib.metadata as m; \
assert m.version('openai') == '$OPENAI' and m.version('jsonschema') == '$JSONSCHEMA' \
and m.version('rfc3339-validator') == '$RFC3339'"
if [ -x "$py" ] && "$py" -c "$want" 2>/dev/null; then
  echo "python-env: cached: $dir" >&2
  echo "$py"
  exit 0
fi
echo "python-env: making $dir (openai==$OPENAI, jsonschema==$JSONSCHEMA, rfc3339-validator==$RFC3339)" >&2
python3 -m venv "$dir" >&2 || { echo "python-env: python3 -m venv failed (apt-get install python3-venv)" >&2; exit 1; }
"$py" -m pip install --quiet --disable-pip-version-check "openai==$OPENAI" "jsonschema==$JSONSCHEMA" \
  "rfc3339-validator==$RFC3339" >&2
"$py" -c "$want"
echo "$py"
