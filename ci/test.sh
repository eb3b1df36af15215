#!/usr/bin/env bash
# Runs the torch_tpu tests: builds the wheel and runs //tests/... (pytest against the installed
# wheel) and //ci/... (wheel checks), printing every test log so pytest's summary lines reach the
# output. Exits non-zero when a test fails. Extra arguments go to `bazel test`, e.g.
#   bash ci/test.sh --test_filter=...   or   bash ci/test.sh --test_arg=-k --test_arg=add
set -euo pipefail
cd "$(dirname "$0")/.."
source ci/setup.sh
ci_setup

status=0
bazel test "${BAZEL_FLAGS[@]}" --test_output=all "$@" -- //ci/... //tests/... || status=$?

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
