"""PyTorch's OpInfo suite (op_db) on tpu, held to tests/ops/expected_failures.txt.

One test per op_db entry. It fails when an aspect (forward, native, grad, errors) fails without
being listed, and when a listed one passes (the list is stale). Regenerate the list with
`python -m torch_tpu.tools.coverage --expected > tests/ops/expected_failures.txt`.
"""

from __future__ import annotations

import pathlib

import pytest

from torch_tpu.testing import opinfo

_EXPECTED = opinfo.parse_expected((pathlib.Path(__file__).parent / "expected_failures.txt").read_text())
_OPS = {opinfo.entry_name(op): op for op in opinfo.op_db()}


def test_expected_failures_name_real_entries():
    unknown = sorted(set(_EXPECTED) - set(_OPS))
    assert not unknown, f"expected_failures.txt lists entries op_db does not have: {unknown}"


@pytest.mark.parametrize("name", list(_OPS))
def test_op(name):
    result = opinfo.check_op(_OPS[name])
    expected = _EXPECTED.get(name, set())
    failed = result.failures()
    unexpected = {a: result.reasons.get(a, "") for a in sorted(failed - expected)}
    stale = sorted(a for a in expected if result.results.get(a) == "pass")
    problems = []
    if unexpected:
        problems.append(f"unexpected failures (fix, or list them in expected_failures.txt): {unexpected}")
    if stale:
        problems.append(f"listed as failing but now pass (remove from expected_failures.txt): {stale}")
    assert not problems, f"{name}: " + "; ".join(problems)
