"""What a compiled ResNet-50 training step's forward keeps for its backward, against jax (issue 34).

    python benchmarks/saved_tensors.py [--batch 2] [--image-size 224] [--partitioner NAME=VALUE,...]
        [--no-jax]

Compiles tpu_training.py's compiled-step (the benchmark's ResNet-50, bfloat16 autocast, float32
parameters, AdamW, the whole step under torch.compile(backend="tpu")), runs one step and prints
the tensors the forward graph hands its backward (aot_autograd's saved tensors that are neither
inputs nor user outputs) by the op that made them: count, dtypes and MB per image; then their
logical bytes against the forward executable's output bytes (XLA's layouts, padding included)
and XLA's temporaries of each executable. Then jax's residuals for the benchmark's hand-written
step, as jax hands them to XLA and with elementwise ops recomputed (`jax.checkpoint`), which is
what XLA's fusion can leave of them inside its one-module step. Bytes are counted, not timed:
the CPU client gives the same saved tensors as a TPU (XLA's layouts and temporaries differ).
"""

from __future__ import annotations

import argparse
import collections
import copy
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
MB = 1e6

# jax primitives XLA fuses into their readers (what jax.checkpoint may recompute for free)
ELEMENTWISE = {
    "add", "sub", "mul", "div", "max", "min", "neg", "convert_element_type", "rsqrt", "sqrt", "exp", "log",
    "select_n", "gt", "ge", "lt", "le", "eq", "ne", "broadcast_in_dim", "reshape", "integer_pow", "square",
    "pow", "transpose", "squeeze", "expand_dims", "copy", "copy_p", "abs", "sign", "stop_gradient", "pjit",
    "custom_jvp_call",
}  # fmt: skip


def _table(rows: list[tuple[str, str, int]], batch: int, title: str) -> None:
    """rows: (kind, dtype, bytes); printed by kind with MB per image, then totals by dtype."""
    by_kind: dict[str, list] = collections.defaultdict(lambda: [0, set(), 0])
    by_dtype: collections.Counter = collections.Counter()
    for kind, dtype, nbytes in rows:
        entry = by_kind[kind]
        entry[0] += 1
        entry[1].add(dtype)
        entry[2] += nbytes
        by_dtype[dtype] += nbytes
    print(f"\n{title}")
    for kind, (count, dtypes, nbytes) in sorted(by_kind.items(), key=lambda kv: -kv[1][2]):
        print(f"  {kind:58s} {count:4d}  {'/'.join(sorted(dtypes)):18s} {nbytes / batch / MB:9.3f} MB/image")
    per_image = sum(nbytes for kind, _, nbytes in rows if "not per image" not in kind)
    rest = sum(nbytes for kind, _, nbytes in rows if "not per image" in kind)
    dtypes = ", ".join(f"{d} {b / MB:.1f}" for d, b in by_dtype.most_common())
    print(f"  per image: {per_image / batch / MB:.3f} MB/image; not per image: {rest / MB:.1f} MB; by dtype: {dtypes}")


def _kind(node, batch: int) -> str:
    import operator

    target = node.target
    name = f"{node.args[0].target}[{node.args[1]}]" if target is operator.getitem else str(target)
    value = node.meta["val"]
    return name if value.dim() >= 1 and value.shape[0] == batch else f"{name} (not per image)"


def torch_tpu_saved(cfg, base, batch: int, size: int, partitioner: dict | None) -> None:
    import torch
    import torch.nn.functional as F
    import tpu_models

    from torch_tpu.compile import graph

    runners: list = []
    init = graph.GraphRunner.__init__

    def capture(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.saved_positions = kwargs.get("saved_outputs", ())
        runners.append(self)

    graph.GraphRunner.__init__ = capture
    model = copy.deepcopy(base).to("tpu").train()
    opt = tpu_models.adamw(model.parameters())

    def step(x, y):
        with torch.autocast("tpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    options = {"partitioner": partitioner} if partitioner else None
    x, y = torch.randn(batch, 3, size, size), torch.randint(0, cfg.num_classes, (batch,))
    torch.compile(step, backend="tpu", options=options)(x.to("tpu"), y.to("tpu")).item()
    graph.GraphRunner.__init__ = init
    (forward,) = [r for r in runners if r.name.startswith("forward")]
    outputs = forward.output.args[0]
    saved = [outputs[i] for i in forward.saved_positions]
    rows = [(_kind(n, batch), str(n.meta["val"].dtype).removeprefix("torch."), _nbytes(n.meta["val"])) for n in saved]
    _table(rows, batch, "torch_tpu: the compiled forward's saved tensors, by the op that made them")
    logical = sum(_nbytes(n.meta["val"]) for n in outputs if getattr(n, "op", None) == "call_function")
    print(f"  the forward executable's outputs: {logical / MB:.1f} MB logical; XLA's sizes below")
    for runner in runners:
        for segment in runner.steps:
            for exe in getattr(segment, "executables", {}).values():
                sizes = exe.compiled.memory_analysis()
                arguments, out, temp = (
                    sizes.argument_size_in_bytes,
                    sizes.output_size_in_bytes,
                    sizes.temp_size_in_bytes,
                )
                print(
                    f"  {segment.name:16s} XLA: arguments {arguments / MB:9.1f} MB, outputs {out / MB:9.1f} MB, "
                    f"temporaries {temp / MB:9.1f} MB"
                )


def _nbytes(value) -> int:
    return value.numel() * value.element_size()


def jax_residuals(cfg, base, batch: int, size: int) -> None:
    import jax
    import numpy as np
    import tpu_models
    from jax._src.ad_checkpoint import saved_residuals

    params, buffers = tpu_models.jax_params(base, hwio=True)
    loss = tpu_models.jax_resnet_loss(cfg)
    images = np.random.default_rng(0).standard_normal((batch, size, size, 3), np.float32)
    labels = np.zeros((batch,), np.int32)

    def f(p):
        return loss(p, buffers, images, labels)[0]

    def rows_of(fn) -> list:
        rows = []
        for aval, source in saved_residuals(fn, params):
            match = re.search(r"output of (\w+)", source)
            kind = match.group(1) if match else source.split(" ")[0]
            if "argument" in source or "constant" in source:
                kind = "argument (parameters)" if "argument" in source else "constant (the images)"
            if not (len(aval.shape) >= 1 and aval.shape[0] == batch):
                kind += " (not per image)"
            rows.append((kind, str(aval.dtype), aval.size * aval.dtype.itemsize))
        return rows

    _table(rows_of(f), batch, "jax: residuals of jax.value_and_grad, as jax hands them to XLA")

    def policy(prim, *args, **params):
        return prim.name not in ELEMENTWISE

    recomputed = jax.checkpoint(f, policy=policy)
    _table(rows_of(recomputed), batch, "jax: residuals with elementwise ops recomputed (what XLA's fusion can leave)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--partitioner", default=None, metavar="NAME=VALUE,...", help="as tpu_training.py's")
    parser.add_argument("--no-jax", action="store_true", help="skip jax's residuals")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    import torch
    import tpu_models
    import tpu_training

    import torch_tpu  # noqa: F401

    cfg = tpu_models.ResNetConfig(image_size=args.image_size)
    torch.manual_seed(0)
    base = tpu_models.ResNet(cfg)
    partitioner = tpu_training._settings(args.partitioner) if args.partitioner else None
    print(f"ResNet-50, batch {args.batch} at {args.image_size}², bfloat16 autocast, float32 parameters")
    torch_tpu_saved(cfg, base, args.batch, args.image_size, partitioner)
    if not args.no_jax:
        jax_residuals(cfg, base, args.batch, args.image_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
