"""What a user meets first: a tiny Hugging Face Llama's greedy generate() on tpu, cold and warm,
against the same call on CPU measured in the same run.

python benchmarks/cold_start.py [--new-tokens 32] [--json OUT]

Each row runs in a fresh process (so "cold" really is a new process) with its own cache dir:
- CPU: generate() in a new process (first call, then a second call).
- tpu, cold cache: a new process and an empty TORCH_TPU_CACHE_DIR (first call, second call), as
  a user meets it: first-seen ops run on the host tier while they compile in the background.
- tpu, cold, compile first: the same with TORCH_TPU_ASYNC_COMPILE=0 (each first call compiles
  before it runs), in its own empty cache dir.
- tpu, warm cache: a new process reusing the cache dir the compile-first row filled.
Each process reports the first and second generate() times, the import-to-model time, and the
torch_tpu counters (op/graph compiles, persistent-cache hits, traces and XLA compiles where the
build counts them). Prints the times and their ratios to CPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _child(device: str, new_tokens: int, config: dict) -> dict:
    start = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    if device == "tpu":
        import torch_tpu
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval().to(device)
    prompt = torch.randint(0, config["vocab_size"], (1, 8)).to(device)
    ready = time.perf_counter()
    times = []
    tokens = None
    for _ in range(2):
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        tokens = out.cpu().tolist()
        times.append(time.perf_counter() - t0)
    result = {"setup_s": ready - start, "first_s": times[0], "second_s": times[1], "tokens": tokens}
    if device == "tpu":
        counters = torch_tpu.metrics.counters()
        result["counters"] = {k: v for k, v in counters.items() if isinstance(v, int)}
    return result


def _run(device: str, new_tokens: int, cache_dir: str | None, timeout: int, **extra_env: str) -> dict:
    from torch_tpu.testing.models import TINY_LLAMA

    env = dict(os.environ, **extra_env)
    if cache_dir is not None:
        env["TORCH_TPU_CACHE_DIR"] = cache_dir
    child = ["--child", device, "--new-tokens", str(new_tokens), "--config", json.dumps(TINY_LLAMA)]
    proc = subprocess.run(
        [sys.executable, os.path.abspath(__file__), *child],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd="/",  # never the repo root: the source tree would shadow the installed wheel
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # the child's model config, as JSON
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.new_tokens, json.loads(args.config))))
        return 0
    with tempfile.TemporaryDirectory(prefix="torch_tpu_cold_") as cache, tempfile.TemporaryDirectory() as first:
        rows = {
            "CPU": _run("cpu", args.new_tokens, None, args.timeout),
            "tpu, cold cache": _run("tpu", args.new_tokens, cache, args.timeout),
            "tpu, cold, compile first": _run("tpu", args.new_tokens, first, args.timeout, TORCH_TPU_ASYNC_COMPILE="0"),
            "tpu, warm cache": _run("tpu", args.new_tokens, first, args.timeout),
        }
    cpu = rows["CPU"]
    print(f"tiny HF Llama generate(max_new_tokens={args.new_tokens}), each row a new process")
    print("| run | setup s | 1st generate s | 2nd generate s | 1st / CPU 1st | 2nd / CPU 2nd | compiles |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | {r['error']} | | | | | |")
            continue
        c = r.get("counters", {})
        compiles = (
            f"op {c.get('op_compiles', 0)}, graph {c.get('graph_compiles', 0)}, "
            f"persistent hits {c.get('persistent_cache_hits', 0)}, host-tier runs {c.get('host_tier_runs', 0)}"
            if c
            else "-"
        )
        same = "" if "error" in cpu or r["tokens"] == cpu["tokens"] else " (tokens differ from CPU!)"
        first = f"{r['first_s'] / cpu['first_s']:.1f}x" if "error" not in cpu else "-"
        second = f"{r['second_s'] / cpu['second_s']:.1f}x" if "error" not in cpu else "-"
        print(
            f"| {name} | {r['setup_s']:.2f} | {r['first_s']:.2f} | {r['second_s']:.2f} | {first} | {second} | "
            f"{compiles}{same} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
