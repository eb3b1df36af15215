"""A pytest plugin for the TPU lane's test parts.

- Stops the session cleanly (JUnit XML still written) once TORCH_TPU_LANE_TEST_SECONDS have
  passed, so a run fits the time it has.
- Leaves out the tests named in the file TORCH_TPU_LANE_DONE (one JUnit-style id per line,
  `tests.test_x::test_y[...]`): an earlier run's, so a suite longer than one call resumes.
- Writes the ids of the tests collected, before that, to TORCH_TPU_LANE_COLLECTED.
"""

from __future__ import annotations

import os
import pathlib
import time

_START = time.monotonic()


def junit_id(nodeid: str) -> str:
    """pytest's `tests/test_x.py::Class::test_y[p]` as JUnit XML names it: `tests.test_x.Class::test_y[p]`."""
    path, *middle, name = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return "".join([module, *(f".{part}" for part in middle), "::", name])


def pytest_collection_modifyitems(config, items):
    collected = os.environ.get("TORCH_TPU_LANE_COLLECTED")
    if collected:
        pathlib.Path(collected).write_text("\n".join(junit_id(item.nodeid) for item in items))
    done_file = os.environ.get("TORCH_TPU_LANE_DONE")
    if not done_file:
        return
    done = set(pathlib.Path(done_file).read_text().split("\n"))
    ran = [junit_id(item.nodeid) in done for item in items]
    config.hook.pytest_deselected(items=[item for item, was in zip(items, ran) if was])
    items[:] = [item for item, was in zip(items, ran) if not was]


def pytest_runtest_logfinish(nodeid, location):
    budget = float(os.environ.get("TORCH_TPU_LANE_TEST_SECONDS", "0") or 0)
    if budget and time.monotonic() - _START > budget:
        session = pytest_runtest_logfinish.session
        if session is not None:
            session.shouldstop = f"the lane's test time budget ({budget:.0f} s) is spent"


pytest_runtest_logfinish.session = None


def pytest_sessionstart(session):
    pytest_runtest_logfinish.session = session
