#!/usr/bin/env bash
echo "bazel coverage is unavailable offline: @remote_coverage_tools is a local stub" >&2
exit 1
