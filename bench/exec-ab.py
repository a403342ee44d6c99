#!/usr/bin/env python3
"""`shell.exec "true"` through the kernel, A against B (issue 32).

usage: exec-ab.py ROUNDS A_BENCH A_WSD B_BENCH B_WSD

Each *_BENCH is a release build of `bench/benches/kernel.rs` (the binary
`cargo bench -p wsd-bench --bench kernel --no-run` leaves in
target/release/deps/kernel-*), each *_WSD the release `wsd` it runs its
local children with (`WSD_BIN`). Per round, alternating which goes first,
runs A and B with `KERNEL_BENCH=exec` (200 calls unsandboxed, then 200
sandboxed, each in a fresh kernel; benches that have them, 200 more of
each once the workspace holds a file) and reads their p50/p99. Prints
every run with the load average at its start, then the medians over the
rounds and the median of the per-round ratios B/A, for every figure both
sides print.
"""
import os, re, statistics, subprocess, sys

N = int(sys.argv[1])
SIDES = {"A": (sys.argv[2], sys.argv[3]), "B": (sys.argv[4], sys.argv[5])}
LINE = re.compile(
    r'shell\.exec "true"( in a workspace holding one file)?, (.+?)(?:, no pending[^:]*)?: '
    r'p50 ([\d.]+)(\S+), p99 ([\d.]+)(\S+)'
)
UNIT = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def run(side):
    bench, wsd = SIDES[side]
    load = open("/proc/loadavg").read().split()[0]
    env = dict(os.environ, KERNEL_BENCH="exec", WSD_BIN=wsd)
    out = subprocess.run(
        [bench, "--bench"], env=env, check=True, capture_output=True, text=True
    ).stdout
    got = {}
    for m in LINE.finditer(out):
        mode = "sandboxed" if m.group(2).startswith("sandboxed") else "unsandboxed"
        if m.group(1):
            mode += ", one file"
        got[mode] = (
            float(m.group(3)) * UNIT[m.group(4)],
            float(m.group(5)) * UNIT[m.group(6)],
        )
    return float(load), got


results = {"A": [], "B": []}
for r in range(N):
    order = ("A", "B") if r % 2 == 0 else ("B", "A")
    for side in order:
        load, got = run(side)
        results[side].append(got)
        figures = ", ".join(
            f"{mode} p50 {p50:.2f} ms p99 {p99:.2f} ms"
            for mode, (p50, p99) in sorted(got.items())
        )
        print(f"round {r + 1} {side} (load {load:.2f}): {figures}", flush=True)

modes = [
    m
    for m in ("unsandboxed", "sandboxed", "unsandboxed, one file", "sandboxed, one file")
    if all(m in g for side in results.values() for g in side)
]
for mode in modes:
    med = {
        s: (
            statistics.median(g[mode][0] for g in results[s]),
            statistics.median(g[mode][1] for g in results[s]),
        )
        for s in results
    }
    ratio = statistics.median(
        b[mode][0] / a[mode][0] for a, b in zip(results["A"], results["B"])
    )
    print(
        f"{mode}: A p50 {med['A'][0]:.2f} ms (p99 {med['A'][1]:.2f}), "
        f"B p50 {med['B'][0]:.2f} ms (p99 {med['B'][1]:.2f}), B/A per round median {ratio:.2f}"
    )
print("load average at the end:", open("/proc/loadavg").read().split()[:3])
