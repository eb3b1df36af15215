"""The OpInfo harness itself: it must see wrong values, CPU fallbacks, wrong gradients and
mismatched errors, or the op coverage numbers mean nothing."""

from __future__ import annotations

import pytest
import torch
from torch.testing._internal.opinfo.core import ErrorInput, OpInfo, SampleInput

import torch_tpu
from torch_tpu.testing import opinfo


def _samples(op, device, dtype, requires_grad, **kwargs):
    yield SampleInput(torch.randn(3, 4, device=device, dtype=dtype, requires_grad=requires_grad))


def _op(name, fn, **kwargs):
    return OpInfo(name, op=fn, dtypes=(torch.float32,), sample_inputs_func=_samples, **kwargs)


def test_a_correct_native_op_passes():
    result = opinfo.check_op(_op("harness_sin", torch.sin))
    assert result.results == {"forward": "pass", "native": "pass", "grad": "pass"}


def test_wrong_values_fail_forward():
    result = opinfo.check_op(_op("harness_off", lambda x: torch.sin(x) + (x.device.type == "tpu")))
    assert result.results["forward"] == "fail"


def test_a_cpu_fallback_is_not_native():
    def via_fallback(x):
        torch_tpu.metrics.record_fallback("aten.harness.default")  # what the boxed fallback counts
        return torch.sin(x)

    result = opinfo.check_op(_op("harness_fallback", via_fallback))
    assert result.results["forward"] == "pass"
    assert result.results["native"] == "fail"


class _WrongGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * (3 if g.device.type == "tpu" else 2)


def test_wrong_gradients_fail_grad():
    result = opinfo.check_op(_op("harness_grad", _WrongGrad.apply))
    assert result.results["forward"] == "pass"
    assert result.results["grad"] == "fail"


def _errors(op, device, **kwargs):
    yield ErrorInput(SampleInput(torch.randn(3, device=device)), error_type=ValueError, error_regex="")


def test_a_different_exception_class_fails_errors():
    def raises(x):
        raise (TypeError if x.device.type == "tpu" else ValueError)("bad")

    result = opinfo.check_op(_op("harness_errors", raises, error_inputs_func=_errors, supports_autograd=False))
    assert result.results["errors"] == "fail"
    assert "forward" in result.failures()  # every sample raises differently too


@pytest.mark.parametrize(
    "text",
    ["add forward\nadd bogus\n", "add\n"],
)
def test_expected_list_rejects_malformed_lines(text):
    with pytest.raises(ValueError):
        opinfo.parse_expected(text)


def test_expected_list_round_trips():
    result = opinfo.OpResult("x.y", {"forward": "pass", "native": "fail", "grad": "fail"}, {"native": "CPU fallback"})
    assert opinfo.parse_expected(opinfo.format_expected([result])) == {"x.y": {"native", "grad"}}
