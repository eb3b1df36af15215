"""A pytest plugin for the TPU lane: stops the session cleanly (JUnit XML still written) once
TORCH_TPU_LANE_TEST_SECONDS have passed, so a lane run fits the time it has."""

from __future__ import annotations

import os
import time

_START = time.monotonic()


def pytest_runtest_logfinish(nodeid, location):
    budget = float(os.environ.get("TORCH_TPU_LANE_TEST_SECONDS", "0") or 0)
    if budget and time.monotonic() - _START > budget:
        session = pytest_runtest_logfinish.session
        if session is not None:
            session.shouldstop = f"the lane's test time budget ({budget:.0f} s) is spent"


pytest_runtest_logfinish.session = None


def pytest_sessionstart(session):
    pytest_runtest_logfinish.session = session
