#!/usr/bin/env bash
# Runs the torch_tpu tests: builds the wheel (glue for torch 2.13 and 2.14) and runs //tests/...
# (pytest against the installed wheel: the full suite under torch 2.13, the smoke subset
# //tests/torch_2_14 under torch 2.14) and //ci/... (wheel checks, core built once), then checks
# with `bazel aquery` that the core compiles once (ci/check_core_built_once.sh). Prints every
# test log so pytest's summary lines reach the output. Exits non-zero when a test fails. Extra
# arguments go to `bazel test`, e.g.
#   bash ci/test.sh --test_filter=...   or   bash ci/test.sh --test_arg=-k --test_arg=add
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
ci_setup

status=0
bazel test "${BAZEL_FLAGS[@]}" --test_output=all "$@" -- //ci/... //tests/... || status=$?
bash ci/check_core_built_once.sh "${BAZEL_FLAGS[@]}" || status=1

# One closing line over all pytest targets: "N passed, N failed" (skipped if any).
testlogs="$(bazel info "${BAZEL_FLAGS[@]}" bazel-testlogs 2>/dev/null || true)"
if [ -n "$testlogs" ] && [ -d "$testlogs" ]; then
  find "$testlogs" -name test.log -print0 2>/dev/null |
    xargs -0 -r grep -h -E '^=+ .*(passed|failed|error).* in [0-9.]+s' 2>/dev/null |
    awk '{ for (i = 1; i < NF; i++) { n = $i + 0; w = $(i + 1); sub(/,$/, "", w);
             if (w == "passed") p += n; else if (w == "failed" || w == "errors" || w == "error") f += n;
             else if (w == "skipped") s += n } }
         END { if (p + f > 0) printf "\ntests: %d passed, %d failed%s\n", p, f, (s ? sprintf(", %d skipped", s) : "") }'
fi
exit "$status"
