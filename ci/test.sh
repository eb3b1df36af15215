#!/usr/bin/env bash
# Runs the torch_tpu tests: builds the wheel and runs //tests/... (pytest against the installed
# wheel) and //ci/... (wheel checks), printing every test log so pytest's summary lines reach the
# output. Exits non-zero when a test fails. Extra arguments go to `bazel test`, e.g.
#   bash ci/test.sh --test_filter=...   or   bash ci/test.sh --test_arg=-k --test_arg=add
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
ci_setup

bazel test "${BAZEL_FLAGS[@]}" --test_output=all "$@" -- //ci/... //tests/...
