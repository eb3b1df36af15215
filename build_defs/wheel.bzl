"""`torch_tpu_wheel`: a platform wheel from Python sources and built extensions.

rules_python's py_wheel is not available offline, so this small rule runs
//ci/wheel:build_wheel (zipfile; METADATA, WHEEL, RECORD with sha256, entry_points.txt).

- Python tag, ABI tag and platform tag come from the @python_env venv (e.g. cp311-cp311-linux_x86_64).
- `Requires-Dist` is `requires` (ranges, e.g. torch>=2.13,<2.15). The action fails unless
  every lock file of `locks` (one per torch version the wheel has glue for) pins versions
  inside those ranges, so the ranges cover what was built and tested.
"""

load("@python_env//:defs.bzl", "ABI_TAG", "PLATFORM_TAG", "PYTHON_TAG", "PYTHON_VERSION")

def _wheel_path(f, strip_prefix):
    path = f.short_path
    if strip_prefix:
        if not path.startswith(strip_prefix + "/"):
            fail("%s is not under strip_prefix %r" % (f.short_path, strip_prefix))
        path = path[len(strip_prefix) + 1:]
    return path

def _add(entries, path, f):
    if path in entries and entries[path] != f:
        fail("two files for %s in the wheel: %s and %s" % (path, entries[path].short_path, f.short_path))
    entries[path] = f

def _torch_tpu_wheel_impl(ctx):
    tag = "-".join([PYTHON_TAG, ABI_TAG, PLATFORM_TAG])
    out = ctx.actions.declare_file("%s-%s-%s.whl" % (ctx.attr.distribution, ctx.attr.version, tag))

    entries = {}  # path in the wheel -> File
    for target in ctx.attr.srcs:
        for f in target[DefaultInfo].files.to_list():
            _add(entries, _wheel_path(f, ctx.attr.strip_prefix), f)
    for target, path in ctx.attr.files.items():
        files = target[DefaultInfo].files.to_list()
        if len(files) != 1:
            fail("%s must give exactly one file for %s, got %d" % (target.label, path, len(files)))
        _add(entries, path, files[0])

    entry_points = ctx.actions.declare_file(ctx.label.name + ".entry_points.txt")
    ctx.actions.write(entry_points, "".join([
        "[%s]\n%s\n\n" % (group, "\n".join(ctx.attr.entry_points[group]))
        for group in sorted(ctx.attr.entry_points)
    ]))

    args = ctx.actions.args()
    args.use_param_file("@%s", use_always = True)
    args.set_param_file_format("multiline")
    args.add("--out", out)
    args.add("--name", ctx.attr.distribution)
    args.add("--version", ctx.attr.version)
    args.add("--tag", tag)
    args.add("--summary", ctx.attr.summary)
    args.add("--requires_python", "==%s.*" % ".".join(PYTHON_VERSION.split(".")[:2]))
    args.add_all(ctx.files.locks, before_each = "--lock")
    args.add_all(ctx.attr.requires, before_each = "--requires")
    for extra in sorted(ctx.attr.extras):
        args.add_all(["%s=%s" % (extra, r) for r in ctx.attr.extras[extra]], before_each = "--extra")
    args.add("--entry_points", entry_points)
    for path in sorted(entries):
        args.add("--file", "%s=%s" % (path, entries[path].path))

    ctx.actions.run(
        executable = ctx.executable._builder,
        arguments = [args],
        inputs = ctx.files.locks + [entry_points] + entries.values(),
        outputs = [out],
        mnemonic = "PyWheel",
        progress_message = "Building wheel %s" % out.short_path,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

torch_tpu_wheel = rule(
    implementation = _torch_tpu_wheel_impl,
    doc = "Builds <distribution>-<version>-<python>-<abi>-<platform>.whl.",
    attrs = {
        "distribution": attr.string(mandatory = True, doc = "Distribution name, e.g. torch_tpu."),
        "version": attr.string(mandatory = True),
        "summary": attr.string(default = ""),
        "srcs": attr.label_list(
            allow_files = True,
            doc = "Package files; the path in the wheel is the workspace path minus strip_prefix.",
        ),
        "strip_prefix": attr.string(default = ""),
        "files": attr.label_keyed_string_dict(
            allow_files = True,
            doc = "Single-file targets (e.g. built extensions) -> path in the wheel.",
        ),
        "entry_points": attr.string_list_dict(
            doc = 'Group -> ["name = module:attr", ...], written to entry_points.txt.',
        ),
        "locks": attr.label_list(mandatory = True, allow_files = True, doc = "Lock files whose pins must satisfy `requires`."),
        "requires": attr.string_list(doc = "Requires-Dist lines, e.g. torch>=2.13,<2.15."),
        "extras": attr.string_list_dict(
            doc = 'Optional extras: name -> Requires-Dist lines (pip install "torch_tpu[name]"); locks pin them too.',
        ),
        "_builder": attr.label(
            default = "//ci/wheel:build_wheel",
            executable = True,
            cfg = "exec",
        ),
    },
)
