"""The TPU lane's test part (ci/tpu/lane.py) outlives a test that kills its process, as XLA:TPU
aborts on what it cannot compile: that test fails with the fatal line, the tests before it keep
their outcomes, pytest starts again after it, and a resumed run retries it."""

from __future__ import annotations

import json
import os
import pathlib

from tests.helpers import run_python

LANE = pathlib.Path(__file__).resolve().parents[1] / "ci" / "tpu"

CRASHING_TESTS = """
import os
import pytest


def test_before():
    pass


def test_fails():
    assert 1 == 2, "one is not two"


def test_aborts():
    if os.environ.get("LANE_TEST_ABORTS") == "1":
        # as XLA's glog does: to file descriptor 2, past Python's sys.stderr
        os.write(2, b"F1207 15:42:23.401856    5938 xprecision_rewriter.cc:2101] Unsupported CVT\\n")
        os.abort()


@pytest.mark.skip(reason="not here")
def test_skipped():
    pass


def test_after():
    pass
"""


def _lane(repo: pathlib.Path, out: pathlib.Path, aborts: bool, *more: str) -> dict:
    env = {**os.environ, "LANE_TEST_ABORTS": "1" if aborts else "0"}  # PYTHONPATH: where pytest is
    args = [str(LANE / "lane.py"), "--repo", str(repo), "--platform", "cpu", "--parts", "tests"]
    args += ["--tests", "tests/test_crashing.py", "--test-seconds", "120", "--out", str(out), *more]
    proc = run_python(args, env, cwd=repo, timeout=300)
    assert (out / "lane.json").exists(), proc.stdout + proc.stderr
    return json.loads((out / "lane.json").read_text())["parts"]["tests"]


def test_a_test_that_aborts_fails_alone_and_the_rest_run(tmp_path):
    repo = tmp_path / "repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_crashing.py").write_text(CRASHING_TESTS)
    (repo / "ci").mkdir()
    (repo / "ci" / "tpu").symlink_to(LANE)
    part = _lane(repo, tmp_path / "first", aborts=True)
    ids = {name: f"tests.test_crashing::test_{name}" for name in ("before", "fails", "aborts", "skipped", "after")}
    assert part["outcomes"] == {
        ids["before"]: "passed",
        ids["fails"]: "failed",
        ids["aborts"]: "failed",
        ids["skipped"]: "skipped",
        ids["after"]: "passed",
    }
    assert part["crashed"] == [ids["aborts"]]
    assert part["reasons"][ids["aborts"]] == (
        "the test process killed by signal 6 (abort): xprecision_rewriter.cc:2101] Unsupported CVT"
    )
    assert part["reasons"][ids["fails"]] == "AssertionError: one is not two"
    assert part["exit_ok"] and not part["ok"]  # ok only once every failure is expected

    first = str(tmp_path / "first" / "lane.json")
    resumed = _lane(repo, tmp_path / "second", False, "--resume", first, "--retry-failed")
    assert resumed["outcomes"][ids["aborts"]] == "passed"
    assert resumed["outcomes"][ids["fails"]] == "failed"
    assert resumed["crashed"] == []
    assert resumed["passed"] == 3 and resumed["failed"] == 1 and resumed["skipped"] == 1


# An example as the cold_start part sees one: compiles 7 executables into an empty cache, none from a filled one.
FAKE_EXAMPLE = r"""
import os, pathlib
cache = pathlib.Path(os.environ["TORCH_TPU_CACHE_DIR"])
warm = (cache / "compiled").exists()
cache.mkdir(parents=True, exist_ok=True)
(cache / "compiled").write_text("x")
print("torch_tpu metrics")
print("  counters:")
print(f"    xla_compiles             {0 if warm else 7}")
print("check passed: losses and inference match CPU")
"""


def test_cold_start_runs_each_example_cold_then_warm_with_its_cache(tmp_path):
    repo = tmp_path / "repo"
    for name in ("quick", "slow"):
        (repo / "examples" / name).mkdir(parents=True)
        (repo / "examples" / name / "train.py").write_text(FAKE_EXAMPLE)
    (repo / "ci").mkdir()
    (repo / "ci" / "tpu").symlink_to(LANE)
    out = tmp_path / "out"
    args = [str(LANE / "lane.py"), "--repo", str(repo), "--platform", "cpu", "--parts", "cold_start"]
    args += ["--cold-start", "quick=120,slow=0.001", "--out", str(out)]
    proc = run_python(args, dict(os.environ), cwd=repo, timeout=300)
    assert (out / "lane.json").exists(), proc.stdout + proc.stderr
    part = json.loads((out / "lane.json").read_text())["parts"]["cold_start"]
    quick, slow = part["cold_start"]["quick"], part["cold_start"]["slow"]
    assert part["ok"]  # both ran and checked; the targets are reported, not part of "ok"
    for row in (quick, slow):
        assert (row["cold"]["xla_compiles"], row["warm"]["xla_compiles"]) == (7, 0)  # one cache per example
        assert row["warm_compiles_nothing"]
    assert quick["cold_met"] and not slow["cold_met"]
    report = (out / "lane.md").read_text()
    assert "| slow |" in report and "(NOT met)" in report
