"""Writes a platform wheel (PEP 427) for build_defs/wheel.bzl's torch_tpu_wheel rule.

The zip is deterministic: entries are sorted and carry a fixed timestamp, so the same inputs
give the same bytes (and Bazel's caches hit).
"""

import argparse
import base64
import hashlib
import re
import sys
import zipfile

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)


def _normalize(name):
    """PEP 503 name normalisation (jinja2 == Jinja2, opt_einsum == opt-einsum)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path):
    """Returns {normalized name: version} for the `name==version` lines of a lock file."""
    pins = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;]+)", line)
            if not m:
                raise SystemExit("%s:%d: expected NAME==VERSION, got %r" % (path, lineno, line))
            pins[_normalize(m.group(1))] = m.group(2)
    return pins


def _record_hash(data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode("ascii")


def _escape(name):
    """Wheel file name component escaping (PEP 427)."""
    return re.sub(r"[^\w\d.]+", "_", name, flags=re.UNICODE)


_SPEC = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*([0-9][0-9.]*)\s*")


def _release(version):
    """"2.14.1+cpu" -> (2, 14, 1): the release numbers, enough for the ranges used here."""
    return tuple(int(p) for p in re.match(r"[0-9]+(\.[0-9]+)*", version).group(0).split("."))


def _pad(a, b):
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)), b + (0,) * (n - len(b))


def satisfies(version, specifiers):
    """True when `version` meets every comma-separated specifier (">=2.13,<2.15")."""
    checks = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
    }
    for spec in specifiers.split(","):
        m = _SPEC.fullmatch(spec)
        if not m:
            raise SystemExit("unsupported version specifier %r" % spec)
        if not checks[m.group(1)](*_pad(_release(version), _release(m.group(2)))):
            return False
    return True


def check_requires(requires, locks):
    """Fails unless every lock pins each required distribution inside its range."""
    for lock in locks:
        pins = read_lock(lock)
        for requirement in requires:
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", requirement)
            name, specifiers = m.group(1), m.group(2)
            version = pins.get(_normalize(name))
            if version is None:
                raise SystemExit("%s does not pin %s (Requires-Dist %s)" % (lock, name, requirement))
            if specifiers and not satisfies(version, specifiers):
                raise SystemExit(
                    "Requires-Dist %s does not cover %s==%s from %s: the wheel would allow versions "
                    "it was not built for, or refuse the one it was." % (requirement, name, version, lock)
                )


def parse_extras(specs):
    """["hf=accelerate>=1.16", ...] -> {"hf": ["accelerate>=1.16", ...]} (extras in order of name)."""
    extras = {}
    for spec in specs:
        name, sep, requirement = spec.partition("=")
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or not requirement:
            raise SystemExit("expected --extra NAME=REQUIREMENT, got %r" % spec)
        extras.setdefault(name, []).append(requirement)
    return dict(sorted(extras.items()))


def build(args):
    extras = parse_extras(args.extra)
    check_requires(args.requires + [r for reqs in extras.values() for r in reqs], args.lock)
    requires = list(args.requires)

    dist_info = "%s-%s.dist-info" % (_escape(args.name), _escape(args.version))
    metadata = ["Metadata-Version: 2.1", "Name: " + args.name, "Version: " + args.version]
    if args.summary:
        metadata.append("Summary: " + args.summary)
    if args.requires_python:
        metadata.append("Requires-Python: " + args.requires_python)
    metadata += ["Requires-Dist: " + r for r in requires]
    for extra, extra_requires in extras.items():
        metadata.append("Provides-Extra: " + extra)
        metadata += ['Requires-Dist: %s; extra == "%s"' % (r, extra) for r in extra_requires]
    wheel = [
        "Wheel-Version: 1.0",
        "Generator: torch_tpu ci/wheel/build_wheel.py",
        "Root-Is-Purelib: false",
        "Tag: " + args.tag,
    ]

    files = {}
    for spec in args.file:
        path, src = spec.split("=", 1)
        if path.startswith("/") or ".." in path.split("/") or path.startswith(dist_info + "/"):
            raise SystemExit("bad path in wheel: %r" % path)
        files[path] = src

    generated = {
        dist_info + "/METADATA": ("\n".join(metadata) + "\n").encode(),
        dist_info + "/WHEEL": ("\n".join(wheel) + "\n").encode(),
    }
    with open(args.entry_points, "rb") as f:
        entry_points = f.read()
    if entry_points.strip():
        generated[dist_info + "/entry_points.txt"] = entry_points

    record = []
    with zipfile.ZipFile(args.out, "w", compression=zipfile.ZIP_DEFLATED) as zf:

        def write(path, data, executable=False):
            info = zipfile.ZipInfo(path, date_time=_ZIP_EPOCH)
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            record.append("%s,%s,%d" % (path, _record_hash(data), len(data)))

        for path in sorted(files):
            with open(files[path], "rb") as f:
                data = f.read()
            write(path, data, executable=path.endswith(".so"))
        for path in sorted(generated):
            write(path, generated[path])
        record_path = dist_info + "/RECORD"
        record.append(record_path + ",,")
        info = zipfile.ZipInfo(record_path, date_time=_ZIP_EPOCH)
        info.external_attr = 0o644 << 16
        zf.writestr(info, "\n".join(record) + "\n", compress_type=zipfile.ZIP_DEFLATED)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, fromfile_prefix_chars="@")
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("--tag", required=True, help="python-abi-platform, e.g. cp311-cp311-linux_x86_64")
    parser.add_argument("--summary", default="")
    parser.add_argument("--requires_python", default="")
    parser.add_argument("--lock", action="append", default=[], help="a lock file the ranges must cover")
    parser.add_argument("--requires", action="append", default=[], help="Requires-Dist, e.g. torch>=2.13,<2.15")
    parser.add_argument(
        "--extra", action="append", default=[], help="an optional extra's requirement: NAME=REQUIREMENT"
    )
    parser.add_argument("--entry_points", required=True)
    parser.add_argument("--file", action="append", default=[], help="PATH_IN_WHEEL=SOURCE")
    build(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
