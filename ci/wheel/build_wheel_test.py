"""Checks the built torch_tpu wheel: name and tags, RECORD, METADATA pins, entry points, _C.so.

Run by `bazel test //ci/wheel:build_wheel_test`; argv: WHEEL LOCK.
"""

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
import zipfile

import build_wheel

WHEEL, LOCK = sys.argv[1], sys.argv[2]


class WheelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.zf = zipfile.ZipFile(WHEEL)
        cls.names = cls.zf.namelist()
        cls.dist_info = next(n.split("/")[0] for n in cls.names if n.endswith(".dist-info/WHEEL"))

    def read(self, name):
        return self.zf.read(self.dist_info + "/" + name).decode()

    def test_file_name_matches_this_interpreter(self):
        py = "cp%d%d" % sys.version_info[:2]
        platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        self.assertTrue(
            os.path.basename(WHEEL).endswith("-%s-%s-%s.whl" % (py, py + sys.abiflags, platform)), WHEEL
        )
        self.assertIn("Tag: %s-%s-%s" % (py, py + sys.abiflags, platform), self.read("WHEEL"))
        self.assertIn("Root-Is-Purelib: false", self.read("WHEEL"))

    def test_record_lists_every_file_with_its_sha256(self):
        rows = [r.split(",") for r in self.read("RECORD").splitlines()]
        self.assertEqual(sorted(r[0] for r in rows), sorted(self.names))
        for path, digest, size in rows:
            if path.endswith("/RECORD"):
                self.assertEqual((digest, size), ("", ""))
                continue
            data = self.zf.read(path)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            self.assertEqual(digest, "sha256=" + expected, path)
            self.assertEqual(int(size), len(data), path)

    def test_requires_dist_pins_come_from_the_lock(self):
        pins = build_wheel.read_lock(LOCK)
        requires = [l.split(": ", 1)[1] for l in self.read("METADATA").splitlines() if l.startswith("Requires-Dist:")]
        self.assertEqual(
            requires, ["%s==%s" % (n, pins[n]) for n in ("torch", "jax", "jaxlib", "numpy")]
        )
        self.assertEqual(pins["torch"], "2.13.0")

    def test_entry_points(self):
        text = self.read("entry_points.txt")
        self.assertIn("[torch.backends]\ntorch_tpu = torch_tpu:_autoload\n", text)
        self.assertIn("[console_scripts]\ntpu-info = torch_tpu.tools.tpu_info:main\n", text)

    def test_package_and_extension(self):
        self.assertIn("torch_tpu/__init__.py", self.names)
        self.assertIn("torch_tpu/_C.so", self.names)
        self.assertFalse([n for n in self.names if "__pycache__" in n or n.endswith(".pyc")])

    def test_extension_finds_torch_through_its_rpath(self):
        readelf = shutil.which("readelf", path=os.environ.get("PATH", "") + ":/usr/bin:/bin")
        if not readelf:
            self.skipTest("readelf not found")
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            so = self.zf.extract("torch_tpu/_C.so", tmp)
            dynamic = subprocess.run([readelf, "-d", so], check=True, capture_output=True, text=True).stdout
        self.assertIn("$ORIGIN/../torch/lib", dynamic)
        self.assertNotIn("_solib", dynamic)
        for lib in ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so"):
            self.assertIn("[%s]" % lib, dynamic)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
