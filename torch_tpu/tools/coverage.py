"""`python -m torch_tpu.tools.coverage`: PyTorch's OpInfo suite (op_db) on tpu, as a table.

One row per op_db entry: forward (values match CPU), grad (gradients match CPU autograd, no
fallback in backward), errors (error_inputs raise CPU's exception class) and native (no CPU
fallback in the forward samples), then the totals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

_MARK = {"pass": "ok", "fail": "FAIL", None: "-"}


def _row(r) -> str:
    native = {"pass": "native", "fail": "fallback", None: "-"}[r.results.get("native")]
    cells = [_MARK[r.results.get(a)] for a in ("forward", "grad", "errors")]
    reason = "; ".join(f"{a}: {r.reasons[a]}" for a in ("forward", "native", "grad", "errors") if a in r.reasons)
    return f"{r.name:48s} {cells[0]:>7} {cells[1]:>5} {cells[2]:>6}  {native:8s}  {reason[:140]}"


def _percent(passed: int, total: int) -> str:
    return f"{passed}/{total} ({100.0 * passed / total:.1f}%)" if total else "0/0"


def format_totals(totals: dict) -> str:
    return "\n".join(
        [
            f"native forward: {_percent(*totals['native_forward'])}",
            f"grad:           {_percent(*totals['grad'])}",
            f"error parity:   {_percent(*totals['errors'])}",
            f"forward (any):  {_percent(*totals['forward'])}",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_tpu.tools.coverage", description=__doc__)
    parser.add_argument("--ops", nargs="*", help="regexes of op_db entry names to run (default: all)")
    parser.add_argument("--shard", default=None, help="I/N: run every N-th entry starting at I")
    parser.add_argument("--range", default=None, help="A:B: run entries A to B (after --ops and --shard)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--expected", action="store_true", help="print the failures as an expected-failures list")
    parser.add_argument("--failures-only", action="store_true", help="list only rows with a failure")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per op (default 300)")
    args = parser.parse_args(argv)

    import torch_tpu  # noqa: F401
    from torch_tpu.testing import opinfo

    ops = opinfo.select(opinfo.op_db(), args.ops)
    if args.shard:
        index, count = (int(x) for x in args.shard.split("/"))
        ops = ops[index::count]
    if args.range:
        first, last = (int(x) if x else None for x in args.range.split(":"))
        ops = ops[first:last]
    start = time.perf_counter()
    cpu_start = time.process_time()
    results = []
    kwargs = {} if args.timeout is None else {"timeout_s": args.timeout}
    if not args.expected:
        print(f"{'op':48s} {'forward':>7} {'grad':>5} {'errors':>6}  native")
    for op in ops:
        r = opinfo.check_op(op, **kwargs)
        results.append(r)
        if not args.expected and (not args.failures_only or r.failures()):
            print(_row(r), flush=True)
    if args.expected:
        sys.stdout.write(opinfo.format_expected(results))
        return 0
    totals = opinfo.totals(results)
    print()
    print(format_totals(totals))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    print(f"{len(results)} entries in {wall:.0f} s ({cpu:.0f} s CPU)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                [
                    {
                        "name": r.name,
                        "results": r.results,
                        "reasons": r.reasons,
                        "fallback_ops": sorted(r.fallback_ops),
                        "seconds": r.seconds,
                    }
                    for r in results
                ],
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
