"""PyTorch's OpInfo suite (op_db) in bfloat16 and float16 on tpu, held to
tests/ops/expected_failures_{bfloat16,float16}.txt.

One test per op_db entry and dtype the entry supports on CPU: its samples in that dtype against
CPU's results in the same dtype, at bf16 tolerance (opinfo.LOW_PRECISION_TOL), with no CPU
fallback. It fails when an aspect (forward, native) fails without being listed, and when a listed
one passes. The lists stay under 5% of the entries tested, each line with its reason.
"""

from __future__ import annotations

import pathlib

import pytest
import torch

from torch_tpu.testing import opinfo

_HERE = pathlib.Path(__file__).parent
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_EXPECTED = {name: opinfo.parse_expected((_HERE / f"expected_failures_{name}.txt").read_text()) for name in _DTYPES}
_OPS = {opinfo.entry_name(op): op for op in opinfo.op_db()}
_CASES = [
    (name, dtype_name)
    for name, op in _OPS.items()
    for dtype_name, dtype in _DTYPES.items()
    if dtype in opinfo.low_precision_dtypes(op)
]


@pytest.mark.parametrize("dtype_name", list(_DTYPES))
def test_expected_failures_are_few_and_real(dtype_name):
    expected = _EXPECTED[dtype_name]
    tested = {name for name, d in _CASES if d == dtype_name}
    unknown = sorted(set(expected) - tested)
    assert not unknown, f"expected_failures_{dtype_name}.txt lists entries not tested in {dtype_name}: {unknown}"
    assert len(expected) <= 0.05 * len(tested), f"{len(expected)} of {len(tested)} entries are expected to fail"
    text = (_HERE / f"expected_failures_{dtype_name}.txt").read_text()
    entries = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
    assert all("#" in line and line.split("#", 1)[1].strip() for line in entries), "every entry needs a reason"


@pytest.mark.parametrize(("name", "dtype_name"), _CASES)
def test_op(name, dtype_name):
    result = opinfo.check_op_low_precision(_OPS[name], _DTYPES[dtype_name])
    expected = _EXPECTED[dtype_name].get(name, set())
    failed = result.failures()
    unexpected = {a: result.reasons.get(a, "") for a in sorted(failed - expected)}
    stale = sorted(a for a in expected if result.results.get(a) == "pass")
    problems = []
    if unexpected:
        problems.append(f"unexpected failures (fix, or list them in expected_failures_{dtype_name}.txt): {unexpected}")
    if stale:
        problems.append(f"listed as failing but now pass (remove from expected_failures_{dtype_name}.txt): {stale}")
    assert not problems, f"{name} in {dtype_name}: " + "; ".join(problems)
