#!/usr/bin/env python3
"""Alternating A/B of incremental pushes: daemon A vs B (and client A vs B).

usage: incr-ab.py CLIENT_WSD[,CLIENT_B_WSD] DAEMON_A_WSD DAEMON_B_WSD ROUNDS [PROFILE]

With two clients (comma-separated), side B pushes with the second one: to
compare clients, give the same daemon twice.

Creates two copies of a make-tree.py profile (default mixed, seed 1), pushes
each to its own `wsd serve` (A or B), then for each round applies the same
`make-tree.py mutate` round to both and times one incremental push to each,
alternating which goes first. `sync` and 0.5 s before each push; daemon CPU
is read 1.5 s after the push returns, so it includes the daemon's idle
settle. Prints per-round figures and the medians of the per-pair ratios B/A.
STRACE=1 attaches `strace -f -T` to both daemons (syscall durations in
/tmp/dp/w/{A,B}.strace), PERF=1 `perf record -g` to daemon B after its cold
push. Works in $WSD_AB_DIR (default /tmp/dp/w; removed and re-created).
"""
import os, subprocess, sys, time, socket, shutil, statistics, json
# Pushes walk, as when these figures were first taken: no on-demand agent
# (issue 32) watching the tree between steps; bench/noop-ab.py measures it.
os.environ.setdefault("WSD_AGENT", "off")
MT = "/work/shared/bench/make-tree.py"
CLIENTS, DA, DB = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
CLIENT = {"A": CLIENTS[0], "B": CLIENTS[-1]}
N = int(sys.argv[4]); PROFILE = sys.argv[5] if len(sys.argv) > 5 else "mixed"
W = os.environ.get("WSD_AB_DIR", "/tmp/dp/w"); shutil.rmtree(W, ignore_errors=True); os.makedirs(W)
def sh(a, **k): return subprocess.run(a, check=True, capture_output=True, text=True, **k)
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
ds = {}
for name, binp in (("A", DA), ("B", DB)):
    src, root, st = f"{W}/src{name}", f"{W}/root{name}", f"{W}/state{name}"
    sh([sys.executable, MT, "create", PROFILE, src, "--seed", "1"])
    os.makedirs(root)
    p = port()
    proc = subprocess.Popen([binp, "serve", "--root", root, "--state", st, "--listen", f"127.0.0.1:{p}"],
                            stdout=subprocess.DEVNULL, stderr=open(f"{W}/{name}.log", "w"))
    for _ in range(300):
        try: socket.create_connection(("127.0.0.1", p), 0.2).close(); break
        except OSError: time.sleep(0.05)
    if os.environ.get("STRACE"):
        subprocess.Popen(["strace", "-f", "-T", "-qq", "-e", "trace=rename,renameat2,unlink,unlinkat,copy_file_range,fsync,fdatasync", "-o", f"{W}/{name}.strace", "-p", str(proc.pid)])
        time.sleep(1)
    push = [CLIENT[name], "push", src, "--remote", f"127.0.0.1:{p}", "--json", "--state", src + ".wsd-state"]
    sh(push)
    if os.environ.get("STRACE"):
        open(f"{W}/{name}.strace", "a").write("=== MARK after cold push\n")
    ds[name] = (proc, src, root, push)
    if os.environ.get("PERF") and name == "B":
        ds["perf"] = subprocess.Popen(["perf", "record", "-g", "-o", f"{W}/perf.data", "-p", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
res = {"A": [], "B": []}; ratios = []; cratios = []
for r in range(1, N + 1):
    for name in "AB":
        sh([sys.executable, MT, "mutate", PROFILE, ds[name][1], "--seed", "1", "--round", str(r)])
    order = "AB" if r % 2 else "BA"
    got = {}
    for name in order:
        proc, src, root, push = ds[name]
        subprocess.run(["sync"]); time.sleep(0.5)
        c0 = cpu(proc.pid); t0 = time.monotonic(); sh(push); t = time.monotonic() - t0; time.sleep(1.5); c = cpu(proc.pid) - c0
        got[name] = (t, c); res[name].append((t, c))
    ratios.append(got["B"][0] / got["A"][0]); cratios.append(got["B"][1] / max(got["A"][1], 1e-3))
    print(f"round {r}: A {got['A'][0]*1000:.0f} ms (daemon cpu {got['A'][1]*1000:.0f}), B {got['B'][0]*1000:.0f} ms (daemon cpu {got['B'][1]*1000:.0f}), wall B/A {ratios[-1]:.2f}", flush=True)
for name in "AB":
    sh([sys.executable, MT, "digest", ds[name][1]])
    if sh([sys.executable, MT, "digest", ds[name][1]]).stdout != sh([sys.executable, MT, "digest", ds[name][2]]).stdout:
        print(f"MISMATCH {name}")
if "perf" in ds:
    ds["perf"].send_signal(2); ds["perf"].wait()
for name in "AB":
    ds[name][0].terminate(); ds[name][0].wait()
med = statistics.median
for name in "AB":
    print(name, "median push wall ms", round(med([x[0] for x in res[name]])*1000, 1), "daemon cpu ms", round(med([x[1] for x in res[name]])*1000, 1))
print("wall B/A median", round(med(ratios), 3), "range", round(min(ratios), 2), round(max(ratios), 2))
print("daemon cpu B/A median", round(med(cratios), 3), "range", round(min(cratios), 2), round(max(cratios), 2))
print("load", open("/proc/loadavg").read().split()[:3])
