"""A pytest plugin for the TPU lane's test parts.

- Stops the session cleanly once TORCH_TPU_LANE_TEST_SECONDS have passed, so a run fits the time
  it has.
- Leaves out the tests named in the file TORCH_TPU_LANE_DONE (one JUnit-style id per line,
  `tests.test_x::test_y[...]`): an earlier run's, so a suite longer than one call resumes.
- Writes the ids of the tests collected, before that, to TORCH_TPU_LANE_COLLECTED.
- Appends each test's start and outcome to TORCH_TPU_LANE_PROGRESS as it happens (tab-separated
  `start ID` and `done ID OUTCOME SECONDS REASON` lines), so a process that dies (XLA aborts on
  what it cannot compile) leaves the outcomes before it and names the test that killed it.
- Appends each failure's whole report (its end, up to DETAIL_CHARS) to TORCH_TPU_LANE_DETAILS:
  the results keep one line per failure, a diagnosis needs the rest.
"""

from __future__ import annotations

import os
import pathlib
import time

_START = time.monotonic()
_tests: dict[str, list] = {}  # nodeid -> [outcome, seconds, reason] of the test running


def junit_id(nodeid: str) -> str:
    """pytest's `tests/test_x.py::Class::test_y[p]` as JUnit XML names it: `tests.test_x.Class::test_y[p]`."""
    path, *middle, name = nodeid.split("::")
    module = path.removesuffix(".py").replace("/", ".")
    return "".join([module, *(f".{part}" for part in middle), "::", name])


def _progress(*fields) -> None:
    path = os.environ.get("TORCH_TPU_LANE_PROGRESS")
    if path:
        line = "\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields)
        with open(path, "a") as f:
            f.write(line + "\n")


def _reason(report) -> str:
    """The first line of why a test failed or skipped (what JUnit XML's message holds)."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, message)
        text = str(longrepr[2])
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr or "")
    return text.strip().splitlines()[0][:200] if text.strip() else ""


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


def pytest_runtest_logstart(nodeid, location):
    _tests[nodeid] = ["passed", 0.0, ""]
    _progress("start", junit_id(nodeid))


DETAIL_CHARS = 8000


def _detail(report) -> None:
    path = os.environ.get("TORCH_TPU_LANE_DETAILS")
    if path:
        with open(path, "a") as f:
            f.write(f"===== {junit_id(report.nodeid)} ({report.when})\n{str(report.longrepr)[-DETAIL_CHARS:]}\n")


def pytest_runtest_logreport(report):
    state = _tests.setdefault(report.nodeid, ["passed", 0.0, ""])
    state[1] += report.duration
    if report.failed:
        _detail(report)
    if report.failed and state[0] != "failed":
        state[0], state[2] = "failed", _reason(report)
    elif report.skipped and state[0] == "passed":
        state[0], state[2] = "skipped", _reason(report)


def pytest_runtest_logfinish(nodeid, location):
    outcome, seconds, reason = _tests.pop(nodeid, ["passed", 0.0, ""])
    _progress("done", junit_id(nodeid), outcome, f"{seconds:.1f}", reason)
    budget = float(os.environ.get("TORCH_TPU_LANE_TEST_SECONDS", "0") or 0)
    if budget and time.monotonic() - _START > budget:
        session = pytest_runtest_logfinish.session
        if session is not None:
            session.shouldstop = f"the lane's test time budget ({budget:.0f} s) is spent"


pytest_runtest_logfinish.session = None


def pytest_sessionstart(session):
    pytest_runtest_logfinish.session = session
