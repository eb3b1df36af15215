"""`import torch` never fails because of torch_tpu: a source checkout without a built extension
warns (naming the fix) instead of raising inside torch's backend autoload, and a bad
TORCH_TPU_PLATFORM fails at the first tpu use, not at import."""

import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest

import torch_tpu
from torch_tpu import _extension

PACKAGE = os.path.dirname(torch_tpu.__file__)


def _run(code, cwd, **env):
    full_env = dict(os.environ, **env)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def checkout(tmp_path):
    """A source checkout: the package without any built extension, as the current directory."""
    shutil.copytree(PACKAGE, tmp_path / "torch_tpu", ignore=shutil.ignore_patterns("_C", "_C*.so", "__pycache__"))
    return tmp_path


def _autoload_entry_point_installed():
    return any(ep.value == "torch_tpu:_autoload" for ep in importlib.metadata.entry_points(group="torch.backends"))


@pytest.mark.skipif(not _autoload_entry_point_installed(), reason="needs the installed wheel's entry point")
def test_import_torch_in_a_checkout_warns_once_and_works(checkout):
    done = _run("import torch; print(torch.ones(1))", checkout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tensor([1.])" in done.stdout
    assert done.stderr.count("has no built extension") == 1
    assert "ci/dev_build.sh" in done.stderr and "outside the checkout" in done.stderr


def test_explicit_import_in_a_checkout_raises_the_same_advice(checkout):
    done = _run("import torch_tpu", checkout)
    assert done.returncode != 0
    assert "ImportError" in done.stderr or "ExtensionError" in done.stderr
    assert "ci/dev_build.sh" in done.stderr


def test_bad_platform_fails_at_first_tpu_use_not_at_import(tmp_path):
    code = (
        "import torch, torch_tpu\n"
        "print('imported', torch.tpu.is_available())\n"
        "try:\n    torch.ones(1, device='tpu')\n"
        "except RuntimeError as e:\n    print('first use:', e)\n"
    )
    done = _run(code, tmp_path, TORCH_TPU_PLATFORM="nonsense")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported False" in done.stdout
    assert "first use: TORCH_TPU_PLATFORM='nonsense' is not one of tpu, cuda, cpu" in done.stdout


def test_the_glue_matching_torch_is_picked(tmp_path):
    glue = tmp_path / "_C"
    glue.mkdir()
    for name in ("torch_2_13.so", "torch_2_14.so"):
        (glue / name).write_bytes(b"")
    assert _extension.find("2.14.1+cpu", str(tmp_path)) == str(glue / "torch_2_14.so")
    assert _extension.find("2.13.0", str(tmp_path)) == str(glue / "torch_2_13.so")
    assert _extension.supported_torch_versions(str(glue)) == ["2.13", "2.14"]


def test_an_unsupported_torch_gets_a_clear_error(tmp_path):
    (tmp_path / "_C").mkdir()
    (tmp_path / "_C" / "torch_2_13.so").write_bytes(b"")
    (tmp_path / "_C" / "torch_2_14.so").write_bytes(b"")
    with pytest.raises(ImportError, match=r"no extension for torch 2\.15\.0: .* supports torch 2\.13, 2\.14"):
        _extension.find("2.15.0", str(tmp_path))


def test_a_development_build_is_found_without_the_glue_folder(tmp_path):
    (tmp_path / "_C.so").write_bytes(b"")
    assert _extension.find("2.13.0", str(tmp_path)) == str(tmp_path / "_C.so")
