#!/usr/bin/env python3
"""python_bench: the Python SDK (asyncio) against the C++ SDK, in one run,
against a running dsecd.

    PYTHONPATH=build/python python3 perf/python_bench.py --data-dir /tmp/bench-data

For each round it measures, C++ first and then Python:
- fncall `/bin/true` runs/s and per-run p50/p99 at --concurrency in flight
  (C++: fncall_bench; Python: dsec.AsyncClient, one thread);
- the exec round trip of `true` in one container, --execs sequential execs
  (C++: container_bench; Python: AsyncSandbox.exec awaited one at a time);
- the client's CPU per call: the client process's user+system time (all its
  threads: the SDK's included) over the measured calls, as the C++ benches
  also print it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from typing import Dict, List

import dsec

BIN = os.environ.get("DSEC_BIN_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin")


def pct(values: List[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def run_child(args: List[str]) -> str:
    out = subprocess.run(args, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit(f"python_bench: {' '.join(args)} failed: {out.stderr}")
    return out.stdout


def cpp_fncall(a) -> Dict[str, float]:
    out = run_child([os.path.join(BIN, "fncall_bench"), "--data-dir", a.data_dir, *a.addr_args, "--runs",
                     str(a.runs), "--concurrency", str(a.concurrency), "--warmup", str(a.warmup), "--no-python"])
    m = re.search(r"^/bin/true\s+(\d+) \|\s+([\d.]+)\s+([\d.]+)\s+([\d.]+) \|.*\|\s+([\d.]+)$", out, re.M)
    if not m:
        sys.exit(f"python_bench: no /bin/true row in fncall_bench's output:\n{out}")
    return {"per_s": float(m.group(2)), "p50": float(m.group(3)), "p99": float(m.group(4)),
            "cpu_ms": float(m.group(5))}


async def py_fncall(a) -> Dict[str, float]:
    async with dsec.AsyncClient(a.addr, data_dir=a.data_dir) as c:
        await asyncio.gather(*(c.run(["/bin/true"]) for _ in range(a.warmup)))
        lat: List[float] = []
        left = a.runs

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                r = await c.run(["/bin/true"])
                lat.append((time.perf_counter() - t0) * 1000)
                if r.verdict != "ok":
                    raise RuntimeError(f"run failed: {r}")

        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(a.concurrency)))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {"per_s": a.runs / wall, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "cpu_ms": cpu * 1000 / a.runs}


def cpp_exec(a) -> Dict[str, float]:
    out = run_child([os.path.join(BIN, "container_bench"), "--data-dir", a.data_dir, *a.addr_args, "--image",
                     a.image, "--creates", "0", "--concurrency", "", "--churn", "0", "--execs", str(a.execs),
                     "--idle", "0", "--crun-runs", "0"])
    m = re.search(r"exec round trip of `true`.*p50 ([\d.]+) ms, p99 ([\d.]+) ms.*client CPU ([\d.]+) ms", out)
    if not m:
        sys.exit(f"python_bench: no exec round trip in container_bench's output:\n{out}")
    return {"p50": float(m.group(1)), "p99": float(m.group(2)), "cpu_ms": float(m.group(3))}


async def py_exec(a) -> Dict[str, float]:
    async with dsec.AsyncClient(a.addr, data_dir=a.data_dir) as c:
        async with await c.create(kind="container", image=a.image) as sb:
            for _ in range(100):
                await sb.exec(["true"])
            lat: List[float] = []
            cpu0 = time.process_time()
            for _ in range(a.execs):
                t0 = time.perf_counter()
                r = await sb.exec(["true"])
                lat.append((time.perf_counter() - t0) * 1000)
                if r.verdict != "ok":
                    raise RuntimeError(f"exec failed: {r}")
            cpu = time.process_time() - cpu0
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "cpu_ms": cpu * 1000 / a.execs}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--addr", default=None, help="dsecd's SDK address (default: <data-dir>/dsecd.json)")
    p.add_argument("--data-dir", default="./dsec-data", help="dsecd's data dir (address, token, images)")
    p.add_argument("--runs", type=int, default=4000, help="fncall runs per measurement")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--execs", type=int, default=2000, help="sequential execs for the round trip")
    p.add_argument("--image", default="bench", help="container image (container_bench builds 'bench' if missing)")
    p.add_argument("--rounds", type=int, default=2, help="C++ then Python, this many times")
    a = p.parse_args()
    a.addr_args = ["--addr", a.addr] if a.addr else []
    print(f"# python_bench: /bin/true x{a.runs} at concurrency {a.concurrency}; {a.execs} sequential container execs")
    print(f"{'round':5} {'client':7} | {'runs/s':>7} {'p50 ms':>8} {'p99 ms':>8} {'cpu ms/run':>10} | "
          f"{'exec p50':>8} {'exec p99':>8} {'cpu ms/exec':>11}")
    for rnd in range(1, a.rounds + 1):
        cf = cpp_fncall(a)
        ce = cpp_exec(a)
        print(f"{rnd:5} {'C++':7} | {cf['per_s']:7.0f} {cf['p50']:8.2f} {cf['p99']:8.2f} {cf['cpu_ms']:10.3f} | "
              f"{ce['p50']:8.2f} {ce['p99']:8.2f} {ce['cpu_ms']:11.3f}", flush=True)
        pf = asyncio.run(py_fncall(a))
        pe = asyncio.run(py_exec(a))
        print(f"{rnd:5} {'Python':7} | {pf['per_s']:7.0f} {pf['p50']:8.2f} {pf['p99']:8.2f} {pf['cpu_ms']:10.3f} | "
              f"{pe['p50']:8.2f} {pe['p99']:8.2f} {pe['cpu_ms']:11.3f}", flush=True)
        print(f"{rnd:5} {'Py/C++':7} | {pf['per_s'] / cf['per_s']:7.2f} {pf['p50'] / cf['p50']:8.2f} "
              f"{pf['p99'] / cf['p99']:8.2f} {'':10} | {pe['p50'] / ce['p50']:8.2f} {pe['p99'] / ce['p99']:8.2f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
