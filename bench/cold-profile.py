#!/usr/bin/env python3
"""Where one cold push's time goes: per-thread CPU and waiting, per process.

usage: cold-profile.py CLIENT_WSD DAEMON_WSD [PROFILE] [--runs N] [--rsync]
                       [--perf DIR [--dwarf]] [--strace DIR]

Creates one make-tree.py profile (default mixed, seed 1), indexes it with
the client, then per run pushes it into an empty root of a fresh
`wsd serve` (as bench/cold-ab.py does: page cache dropped, source read
back). For every thread of the daemon it prints, over the push, user and
system CPU (`/proc/PID/task/TID/stat`), time spent runnable but not
running (`schedstat`: waiting for a core) and the rest of the wall time
(blocked: waiting for work, a lock or the disk); for the client, its
user and system CPU (`wait4`). With --rsync, `rsync -a` of the same tree
in the same run, its processes' CPU alike.

--perf DIR records `perf record -g` of the daemon (attached for the push)
and of the client (and rsync) into DIR (with --dwarf, call graphs from
DWARF unwinding, `--call-graph dwarf`: the release build keeps no frame
pointers, so `-g` call chains stop early); --strace DIR writes
`strace -f -c` summaries there. Either slows the push: take the CPU split
from a run without them.

Works in $WSD_AB_DIR (default /tmp), in a directory removed at the end.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import time

from abkit import index_source, serve, warm

os.environ.setdefault("WSD_AGENT", "off")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAKE_TREE = os.environ.get("WSD_MAKE_TREE") or os.path.join(ROOT, "..", "shared", "bench", "make-tree.py")
TCK = os.sysconf("SC_CLK_TCK")


def threads(pid):
    """{tid: (name, user s, sys s, run ns, wait ns)} of a live process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            base = f"/proc/{pid}/task/{tid}"
            name = open(f"{base}/comm").read().strip()
            fields = open(f"{base}/stat").read().rsplit(")", 1)[1].split()
            run, wait, _ = (int(x) for x in open(f"{base}/schedstat").read().split())
            out[tid] = (name, int(fields[11]) / TCK, int(fields[12]) / TCK, run, wait)
        except (OSError, ValueError):
            pass
    return out


def timed(argv):
    """Runs argv; returns (wall s, user s, sys s) of it and its children."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        sys.exit(f"{argv[0]} failed ({status})")
    return wall, ru.ru_utime, ru.ru_stime


# `perf record` call-graph arguments (`--dwarf` switches to DWARF unwinding).
PERF_GRAPH = ["-g"]


def attach(kind, pid, out):
    if kind == "perf":
        argv = ["perf", "record", "-q", "-F", "2000", *PERF_GRAPH, "-o", out, "-p", str(pid)]
    else:
        argv = ["strace", "-f", "-c", "-o", out, "-p", str(pid)]
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    return p


def detach(p):
    p.send_signal(signal.SIGINT)
    p.wait()


def wrap(kind, out, argv):
    if kind == "perf":
        return ["perf", "record", "-q", "-F", "2000", *PERF_GRAPH, "-o", out, "--"] + argv
    return ["strace", "-f", "-c", "-o", out, "--"] + argv


def one_push(a, src, state, work, k):
    root, dstate = os.path.join(work, f"root{k}"), os.path.join(work, f"state{k}")
    os.makedirs(root)
    warm(src)
    proc, addr = serve([a.daemon], root, dstate)
    time.sleep(0.3)
    tool = "perf" if a.perf else "strace" if a.strace else None
    outdir = a.perf or a.strace
    tracer = attach(tool, proc.pid, os.path.join(outdir, f"daemon{k}.{tool}")) if tool else None
    before = threads(proc.pid)
    argv = [a.client, "push", src, "--remote", addr, "--state", state, "-q"]
    if tool:
        argv = wrap(tool, os.path.join(outdir, f"client{k}.{tool}"), argv)
    wall, cu, cs = timed(argv)
    after = threads(proc.pid)
    if tracer:
        detach(tracer)
    proc.terminate()
    proc.wait()
    print(f"push {k}: wall {wall * 1000:.0f} ms; client user {cu * 1000:.0f} sys {cs * 1000:.0f} ms")
    rows = {}
    for tid, (name, u, s, run, wt) in after.items():
        b = before.get(tid, (name, 0, 0, 0, 0))
        key = name if not name.startswith("wsd-write") else "wsd-write-*"
        r = rows.setdefault(key, [0, 0, 0, 0])
        r[0] += u - b[1]
        r[1] += s - b[2]
        r[2] += (run - b[3]) / 1e9
        r[3] += (wt - b[4]) / 1e9
    print("  daemon thread     user ms  sys ms  on-cpu ms  runnable-waiting ms  blocked ms")
    for name, (u, s, run, wt) in sorted(rows.items(), key=lambda x: -x[1][2]):
        if run < 0.001 and wt < 0.001:
            continue
        print(f"  {name:<16} {u * 1000:8.0f} {s * 1000:7.0f} {run * 1000:10.0f} {wt * 1000:20.0f} "
              f"{max(0.0, wall - run - wt) * 1000:11.0f}")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(dstate, ignore_errors=True)


def one_rsync(a, src, work, k):
    root = os.path.join(work, f"rsync{k}")
    os.makedirs(root)
    warm(src)
    argv = ["rsync", "-a", src + "/", root + "/"]
    tool = "perf" if a.perf else "strace" if a.strace else None
    if tool:
        argv = wrap(tool, os.path.join(a.perf or a.strace, f"rsync{k}.{tool}"), argv)
    wall, u, s = timed(argv)
    print(f"rsync {k}: wall {wall * 1000:.0f} ms; user {u * 1000:.0f} sys {s * 1000:.0f} ms (all its processes)")
    shutil.rmtree(root, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("client")
    ap.add_argument("daemon")
    ap.add_argument("profile", nargs="?", default="mixed")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--rsync", action="store_true")
    ap.add_argument("--perf", metavar="DIR")
    ap.add_argument("--dwarf", action="store_true")
    ap.add_argument("--strace", metavar="DIR")
    a = ap.parse_args()
    if a.dwarf:
        PERF_GRAPH[:] = ["--call-graph", "dwarf,16384"]
    for d in (a.perf, a.strace):
        if d:
            os.makedirs(d, exist_ok=True)
    work = os.path.join(os.environ.get("WSD_AB_DIR", "/tmp"), f"cold-profile-{os.getpid()}")
    os.makedirs(work)
    try:
        src, state = os.path.join(work, "src"), os.path.join(work, "client-state")
        subprocess.run([sys.executable, MAKE_TREE, "create", a.profile, src, "--seed", "1"],
                       check=True, capture_output=True)
        index_source(a.client, src, state)
        for k in range(a.runs):
            one_push(a, src, state, work, k)
            if a.rsync:
                one_rsync(a, src, work, k)
        print("load", open("/proc/loadavg").read().split()[:3])
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
