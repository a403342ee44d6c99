#!/usr/bin/env python3
"""Alternating A/B of first pushes of a never-indexed tree, with rsync and a
cold push in the same rounds.

usage: first-ab.py WSD_A WSD_B ROUNDS [PROFILE]

Creates one make-tree.py profile (default mixed, seed 1), then each round
runs, in an order reversed every other round, into an empty destination:

  A-first   WSD_A push with a new (empty) client state: index + push
  B-first   WSD_B the same
  B-cold    WSD_B push of the source it indexed once before the rounds
  rsync     rsync -a

Each wsd push goes to a fresh `wsd serve` of the same binary on loopback.
Before each step, as root, the page cache is dropped and the source read
back (warm source). Prints per-round wall times, then per step the median
wall time, the median CPU time (the client or rsync, plus the daemon) and
the median and range of the per-round ratio to rsync and to A-first, and
the load average. WSD_AB_NICE=N (root) runs every step at that niceness
(e.g. -10, as `bench/compare --priority` raises its priority on a shared
machine).

Works in $WSD_AB_DIR (default /tmp), in a directory removed at the end.
"""
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from abkit import index_source, serve, warm
# Pushes walk, as when these figures were first taken: no on-demand agent
# (issue 32) watching the tree between steps; bench/noop-ab.py measures it.
os.environ.setdefault("WSD_AGENT", "off")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAKE_TREE = os.environ.get("WSD_MAKE_TREE") or os.path.join(ROOT, "..", "shared", "bench", "make-tree.py")


def daemon_cpu_s(proc):
    if proc is None:
        return 0.0
    fields = open(f"/proc/{proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    a, b, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    profile = sys.argv[4] if len(sys.argv) > 4 else "mixed"
    work = os.path.join(os.environ.get("WSD_AB_DIR", "/tmp"), f"first-ab-{os.getpid()}")
    os.makedirs(work)
    try:
        run(a, b, rounds, profile, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(a, b, rounds, profile, work):
    src = os.path.join(work, "src")
    subprocess.run([sys.executable, MAKE_TREE, "create", profile, src, "--seed", "1"],
                   check=True, capture_output=True)
    indexed = os.path.join(work, "indexed-state")
    # Nothing listens on port 1: this only builds B's index of the source,
    # twice, so that no file is still racily clean for the cold pushes.
    # Each of them goes to a new address, so it sends the whole tree.
    for _ in range(2):
        index_source(b, src, indexed)
        time.sleep(3)
    steps = ["A-first", "B-first", "B-cold", "rsync"]
    wall = {s: [] for s in steps}
    cpu = {s: [] for s in steps}
    nice = os.environ.get("WSD_AB_NICE")
    if nice:
        os.nice(int(nice) - os.nice(0))
    k = 0
    for r in range(rounds):
        for step in (steps if r % 2 == 0 else steps[::-1]):
            k += 1
            dst, dstate = os.path.join(work, f"dst{k}"), os.path.join(work, f"dstate{k}")
            os.makedirs(dst)
            warm(src)
            proc = None
            if step == "rsync":
                argv = ["rsync", "-a", src + "/", dst + "/"]
            else:
                wsd = a if step == "A-first" else b
                state = indexed if step == "B-cold" else os.path.join(work, f"cstate{k}")
                proc, addr = serve([wsd], dst, dstate)
                time.sleep(0.3)
                argv = [wsd, "push", src, "--remote", addr, "--state", state, "-q"]
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            d0 = daemon_cpu_s(proc)
            t0 = time.perf_counter()
            subprocess.run(argv, check=True)
            wall[step].append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[step].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
                             + daemon_cpu_s(proc) - d0)
            if proc:
                proc.terminate()
                proc.wait()
            for d in (dst, dstate, os.path.join(work, f"cstate{k}")):
                shutil.rmtree(d, ignore_errors=True)
        print(f"round {r + 1}: " + "  ".join(f"{s} {wall[s][-1] * 1000:.0f} ms" for s in steps)
              + f"  load {open('/proc/loadavg').read().split()[0]}", flush=True)
    for s in steps:
        to_rsync = [x / y for x, y in zip(wall[s], wall["rsync"])]
        to_a = [x / y for x, y in zip(wall[s], wall["A-first"])]
        print(f"{s}: median {statistics.median(wall[s]) * 1000:.0f} ms, cpu "
              f"{statistics.median(cpu[s]) * 1000:.0f} ms; / rsync {statistics.median(to_rsync):.2f} "
              f"({min(to_rsync):.2f}-{max(to_rsync):.2f}); / A-first {statistics.median(to_a):.2f} "
              f"({min(to_a):.2f}-{max(to_a):.2f})")
    print("load", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
