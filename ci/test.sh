#!/usr/bin/env bash
# Runs the torch_tpu tests: builds the wheel and runs //tests/... (pytest against the installed
# wheel) and //ci/... (wheel checks), printing every test log so pytest's summary lines reach the
# output. Exits non-zero when a test fails. Extra arguments go to `bazel test`, e.g.
#   bash ci/test.sh --test_filter=...   or   bash ci/test.sh --test_arg=-k --test_arg=add
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
ci_setup

flags=(--config=wheel_common --config=no_rbe)
if [ "${CI:-}" = true ]; then
  flags+=(--config=ci)
fi
bazel test "${flags[@]}" --test_output=all "$@" -- //ci/... //tests/...
