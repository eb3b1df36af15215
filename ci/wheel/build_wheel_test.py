"""Checks the built torch_tpu wheel: name and tags, RECORD, METADATA pins, entry points, _C.so.

Run by `bazel test //ci/wheel:build_wheel_test`; argv: WHEEL LOCK... (one lock per torch version).
"""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import unittest
import zipfile

import build_wheel

WHEEL, LOCKS = sys.argv[1], sys.argv[2:]
GLUES = ("torch_tpu/_C/torch_2_13.so", "torch_tpu/_C/torch_2_14.so")


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

    def test_requires_dist_ranges_cover_every_lock(self):
        lines = [l.split(": ", 1)[1] for l in self.read("METADATA").splitlines() if l.startswith("Requires-Dist:")]
        requires = [l for l in lines if "; extra ==" not in l]
        self.assertEqual(requires, ["torch>=2.13,<2.15", "jax>=0.10.2,<0.11", "jaxlib>=0.10.2,<0.11", "numpy>=2.0,<3"])
        torches = sorted(build_wheel.read_lock(lock)["torch"] for lock in LOCKS)
        self.assertEqual(torches, ["2.13.0", "2.14.1"])
        build_wheel.check_requires(requires, LOCKS)  # raises SystemExit if not

    def test_extras_state_the_integrations_floors(self):
        metadata = self.read("METADATA").splitlines()
        provided = [l for l in metadata if l.startswith("Provides-Extra:")]
        self.assertEqual(provided, ["Provides-Extra: hf", "Provides-Extra: lightning"])
        extras = [l.split(": ", 1)[1] for l in metadata if "; extra ==" in l]
        self.assertEqual(
            extras,
            [
                'accelerate>=1.16; extra == "hf"',
                'transformers>=5.0; extra == "hf"',
                'pytorch-lightning>=2.6; extra == "lightning"',
            ],
        )
        build_wheel.check_requires([e.split(";")[0] for e in extras], LOCKS)

    def test_ranges_are_checked(self):
        self.assertTrue(build_wheel.satisfies("2.14.1", ">=2.13,<2.15"))
        self.assertTrue(build_wheel.satisfies("2.13.0+cpu", ">=2.13,<2.15"))
        self.assertFalse(build_wheel.satisfies("2.15.0", ">=2.13,<2.15"))
        self.assertFalse(build_wheel.satisfies("2.12.1", ">=2.13,<2.15"))
        with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
            lock = os.path.join(tmp, "lock.txt")
            with open(lock, "w") as f:
                f.write("torch==2.15.0\n")
            with self.assertRaises(SystemExit):
                build_wheel.check_requires(["torch>=2.13,<2.15"], [lock])

    def test_entry_points(self):
        text = self.read("entry_points.txt")
        self.assertIn("[torch.backends]\ntorch_tpu = torch_tpu:_autoload\n", text)
        self.assertIn("[console_scripts]\ntpu-info = torch_tpu.tools.tpu_info:main\n", text)

    def test_package_and_extension(self):
        self.assertIn("torch_tpu/__init__.py", self.names)
        for glue in GLUES:
            self.assertIn(glue, self.names)
        self.assertNotIn("torch_tpu/_C.so", self.names)
        self.assertFalse([n for n in self.names if "__pycache__" in n or n.endswith(".pyc")])

    def test_extension_finds_torch_through_its_rpath(self):
        readelf = shutil.which("readelf", path=os.environ.get("PATH", "") + ":/usr/bin:/bin")
        if not readelf:
            self.skipTest("readelf not found")
        for glue in GLUES:
            with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmp:
                so = self.zf.extract(glue, tmp)
                dynamic = subprocess.run([readelf, "-d", so], check=True, capture_output=True, text=True).stdout
            self.assertIn("$ORIGIN/../../torch/lib", dynamic, glue)
            self.assertNotIn("_solib", dynamic, glue)
            for lib in ("libc10.so", "libtorch.so", "libtorch_cpu.so", "libtorch_python.so"):
                self.assertIn("[%s]" % lib, dynamic, glue)

    def test_each_glue_is_built_against_its_own_torch(self):
        # Each glue embeds its pybind11 internals id; torch 2.13 bundles pybind11 3.0 (internals
        # v11), torch 2.14 pybind11 3.1 (v12).
        ids = {}
        for glue in GLUES:
            data = self.zf.read(glue)
            ids[glue] = sorted(set(re.findall(rb"__pybind11_internals_v(\d+)", data)))
        self.assertEqual(ids[GLUES[0]], [b"11"], ids)
        self.assertEqual(ids[GLUES[1]], [b"12"], ids)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
