"""The ecosystem checks of issue 31 for the TPU lane, runnable on the CPU client too.

    TORCH_TPU_PLATFORM=tpu python ci/tpu_ecosystem_lane.py [RESULTS.json]

Runs, in one process (one program holds the chip at a time), the tests that train against CPU
and time the profiler: HF Trainer bf16 and a plain accelerate bf16 loop (tests/test_hf_trainer.py),
Lightning 32-true and bf16-mixed (tests/test_lightning.py), torch.profiler device time
(tests/test_profiler_device_time.py) and torch.tpu's API count (tests/test_device_api.py). Each
compares tpu losses with CPU's within bfloat16 tolerance, or checks device time > 0. Writes each
test's outcome and duration, and the platform, to RESULTS.json (default
ecosystem_results.json), and exits with pytest's status.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
FILES = ("test_hf_trainer.py", "test_lightning.py", "test_profiler_device_time.py", "test_device_api.py")


class _Record:
    def __init__(self) -> None:
        self.tests: list[dict] = []

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":
            entry = {"test": report.nodeid, "when": report.when, "outcome": report.outcome}
            entry["seconds"] = round(report.duration, 3)
            if report.outcome == "failed":
                entry["error"] = str(report.longrepr)[-2000:]
            self.tests.append(entry)


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[0] if argv else "ecosystem_results.json")
    record = _Record()
    start = time.time()
    args = ["-q", "-p", "no:cacheprovider", "-s", *(str(ROOT / "tests" / f) for f in FILES)]
    status = pytest.main(args, plugins=[record])
    import torch_tpu  # loaded by the tests already

    summary = {
        "platform": torch_tpu.platform(),
        "seconds": round(time.time() - start, 1),
        "exit_status": int(status),
        "passed": sum(t["outcome"] == "passed" for t in record.tests),
        "failed": sum(t["outcome"] == "failed" for t in record.tests),
        "tests": record.tests,
    }
    out.write_text(json.dumps(summary, indent=2))
    print(f"{summary['platform']}: {summary['passed']} passed, {summary['failed']} failed -> {out}")
    return int(status)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # `tests.helpers` imports
    sys.exit(main(sys.argv[1:]))
