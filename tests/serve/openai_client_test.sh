#!/usr/bin/env bash
# tests/serve/openai_client_test.sh LOOM_CLI SOURCE_DIR — run
# openai_client_test.py (the official openai client against `loom serve` on
# SmolLM2) with the python that has the packages: LOOM_TEST_PYTHON
# (scripts/python-env.sh's, set by scripts/test.sh), else python3. Skips
# (exit 77) without LOOM_TEST_MODEL or without openai / jsonschema; with the
# model present, scripts/test.sh counts the latter as a failure.
set -u
cli=$1
src=$2
if [ -z "${LOOM_TEST_MODEL:-}" ]; then
  echo "skipped: LOOM_TEST_MODEL is unset (scripts/fetch-model.sh prints the default model's path)"
  exit 77
fi
py=${LOOM_TEST_PYTHON:-python3}
if ! "$py" -c 'import openai, jsonschema' 2>/dev/null; then
  echo "skipped: $py cannot import openai and jsonschema (PY=\$(scripts/python-env.sh) makes an environment;" \
       "point LOOM_TEST_PYTHON at it)"
  exit 77
fi
exec "$py" "$src/tests/serve/openai_client_test.py" --loom "$cli" --source "$src"
