#!/bin/sh
# tests/constraint/run_check.sh HELPER [ARGS...] — check_schemas.py under the
# Python the client tests use (LOOM_TEST_PYTHON: scripts/test.sh points it at
# a venv with jsonschema), else python3; it skips (77) without jsonschema.
exec "${LOOM_TEST_PYTHON:-python3}" "$(dirname "$0")/check_schemas.py" "$@"
