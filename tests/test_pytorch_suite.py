"""The runner of PyTorch's device-generic tests (torch_tpu.testing.pytorch_suite), on a small
device-generic test file written here: outcomes, the CPU recheck, timeouts and crashes that end
only their worker, and the expected-failures comparison. No PyTorch test file is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from torch_tpu.testing import pytorch_suite

SYNTHETIC = """
import os
import signal
import time
import unittest

import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests
from torch.testing._internal.common_utils import TestCase


class TestSynthetic(TestCase):
    def test_pass(self, device):
        x = torch.arange(4, device=device)
        self.assertEqual((x + 1).cpu(), torch.arange(1, 5))

    @dtypes(torch.float32, torch.int64)
    def test_dtyped(self, device, dtype):
        self.assertEqual(torch.ones(3, dtype=dtype, device=device).sum().item(), 3)

    def test_fails_everywhere(self, device):
        self.assertEqual(1, 2)

    def test_fails_off_cpu(self, device):
        self.assertEqual(torch.device(device).type, "cpu")

    def test_errors_off_cpu(self, device):
        if torch.device(device).type != "cpu":
            raise RuntimeError("boom off cpu")

    def test_skipped(self, device):
        raise unittest.SkipTest("not here")

    def test_hangs_off_cpu(self, device):
        if torch.device(device).type != "cpu":
            time.sleep(600)

    def test_hangs_hard_off_cpu(self, device):
        if torch.device(device).type != "cpu":
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGALRM])
            time.sleep(600)

    def test_crashes_off_cpu(self, device):
        if torch.device(device).type != "cpu":
            os._exit(7)


class TestNotDeviceGeneric(TestCase):
    def test_not_collected(self):
        pass


instantiate_device_type_tests(TestSynthetic, globals())
"""

EXPECTED = """\
# a comment, then entries
test_synthetic.*.test_fails_off_cpu_tpu | silent-wrong-result | the synthetic wrong value
test_synthetic.*.test_pass_* | unsupported | stale: this test passes
test_synthetic.*.test_nothing_matches_* | crash | no test has this name
"""


def _name(test_id: str) -> str:
    """test_synthetic.TestSyntheticPRIVATEUSE1.test_pass_tpu -> test_pass_tpu"""
    return test_id.split(".", 2)[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("suite")
    (tmp / "tests").mkdir()
    (tmp / "tests" / "test_synthetic.py").write_text(SYNTHETIC)
    (tmp / "expected.txt").write_text(EXPECTED)
    out = tmp / "report.json"
    cmd = [sys.executable, "-m", "torch_tpu.testing.pytorch_suite", "--tests", str(tmp / "tests")]
    cmd += ["--timeout", "30", "--kill-grace", "5", "--check"]
    cmd += ["--expected", str(tmp / "expected.txt"), "--report", str(out)]
    done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=1500, env=dict(os.environ))
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(out.read_text())


def _outcomes(report):
    return {_name(t["id"]): t for t in report["tests"]}


def test_collects_only_the_tpu_instantiations(report):
    _, rep = report
    ids = set(_outcomes(rep))
    assert ids == {
        "test_crashes_off_cpu_tpu",
        "test_dtyped_tpu_float32",
        "test_dtyped_tpu_int64",
        "test_errors_off_cpu_tpu",
        "test_fails_everywhere_tpu",
        "test_fails_off_cpu_tpu",
        "test_hangs_hard_off_cpu_tpu",
        "test_hangs_off_cpu_tpu",
        "test_pass_tpu",
        "test_skipped_tpu",
    }


def test_each_outcome_and_the_cpu_recheck(report):
    _, rep = report
    got = {k: (v["outcome"], v["cpu_outcome"]) for k, v in _outcomes(rep).items()}
    assert got == {
        "test_crashes_off_cpu_tpu": ("crash", "pass"),
        "test_dtyped_tpu_float32": ("pass", None),
        "test_dtyped_tpu_int64": ("pass", None),
        "test_errors_off_cpu_tpu": ("error", "pass"),
        "test_fails_everywhere_tpu": ("fail", "fail"),
        "test_fails_off_cpu_tpu": ("fail", "pass"),
        "test_hangs_hard_off_cpu_tpu": ("timeout", "pass"),
        "test_hangs_off_cpu_tpu": ("timeout", "pass"),
        "test_pass_tpu": ("pass", None),
        "test_skipped_tpu": ("skip", None),
    }
    got = _outcomes(rep)
    assert "boom off cpu" in got["test_errors_off_cpu_tpu"]["message"]
    # The alarm stops a sleeping test in its worker; a test that blocks the alarm is killed.
    assert got["test_hangs_off_cpu_tpu"]["message"] == "ran past the 30 s timeout"
    assert got["test_hangs_hard_off_cpu_tpu"]["message"].endswith("and was killed")
    assert "exit status 7" in got["test_crashes_off_cpu_tpu"]["message"]


def test_pass_rate_leaves_out_skips_and_cpu_failures(report):
    _, rep = report
    total = rep["summary"]["total"]
    assert total["collected"] == 10
    assert total["skip"] == 1 and total["cpu_also_fails"] == 1
    assert total["counted"] == 8 and total["pass"] == 3
    assert total["pass_rate"] == pytest.approx(100 * 3 / 8, abs=0.01)


def test_expected_failures_comparison(report):
    done, rep = report
    new = {_name(i) for i in rep["new_failures"]}
    # Covered by an entry: fails_off_cpu. On CPU too: fails_everywhere. The rest are new.
    assert new == {
        "test_crashes_off_cpu_tpu",
        "test_errors_off_cpu_tpu",
        "test_hangs_hard_off_cpu_tpu",
        "test_hangs_off_cpu_tpu",
    }
    assert rep["fixed_entries"] == ["test_synthetic.*.test_pass_*"]
    assert _outcomes(rep)["test_fails_off_cpu_tpu"]["expected"].startswith("silent-wrong-result")
    assert done.returncode == 1, "--check exits 1 on a failure no entry covers"
    assert "pass%" in done.stdout


def test_cpu_id_mapping():
    to_cpu = pytorch_suite.to_cpu_id
    assert to_cpu("m.TestFooPRIVATEUSE1.test_bar_tpu_float32") == "m.TestFooCPU.test_bar_cpu_float32"
    assert to_cpu("m.TestFooTPU.test_bar_tpu") == "m.TestFooCPU.test_bar_cpu"
    assert to_cpu("m.TestFooTPU.test_tpu_x_tpu_int64") == "m.TestFooCPU.test_tpu_x_cpu_int64"


def test_expected_file_validation(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("a.b.c | not-a-kind | why\n")
    with pytest.raises(ValueError, match="not-a-kind"):
        pytorch_suite.load_expected(bad)
    bad.write_text("a.b.c | crash\n")
    with pytest.raises(ValueError, match="test id glob"):
        pytorch_suite.load_expected(bad)


def test_repo_expected_failures_file_parses():
    if not pytorch_suite.DEFAULT_EXPECTED.exists():
        pytest.skip("the expected-failures file lives in the source tree, not the wheel")
    entries = pytorch_suite.load_expected(pytorch_suite.DEFAULT_EXPECTED)
    assert entries, "the expected-failures file has entries"
    assert all(e.kind in pytorch_suite.KINDS for e in entries)


def test_sample_is_deterministic_and_keeps_order():
    ids = [f"m.C.test_{i}" for i in range(50)]
    a = pytorch_suite.sample_ids(ids, 10)
    assert a == pytorch_suite.sample_ids(list(ids), 10)
    assert len(a) == 10 and a == sorted(a, key=ids.index)
    assert pytorch_suite.sample_ids(ids, None) == ids


def test_summary_counts():
    T = pytorch_suite.TestOutcome
    s = pytorch_suite.summarize(
        [T("a", "pass"), T("b", "fail", cpu_outcome="pass"), T("c", "timeout", cpu_outcome="error"), T("d", "skip")]
    )
    assert (s["pass"], s["fail"], s["cpu_also_fails"], s["skip"], s["counted"]) == (1, 1, 1, 1, 2)
    assert s["pass_rate"] == 50.0


def test_matches_for_k_and_exclude():
    test_id = "test_x.TestFooTPU.test_batch_vs_slicing_log_tpu_float32"
    assert pytorch_suite._matches(test_id, ["test_batch_vs_slicing"])
    assert pytorch_suite._matches(test_id, ["*Foo*float32"])
    assert not pytorch_suite._matches(test_id, ["float64", "*Bar*"])
