#!/usr/bin/env python3
"""Alternating A/B of incremental pushes: daemon A vs B (and client A vs B),
with rsync in the same rounds.

usage: incr-ab.py CLIENT_WSD[,CLIENT_B_WSD] DAEMON_A_WSD DAEMON_B_WSD ROUNDS [PROFILE]

With two clients (comma-separated), side B pushes with the second one: to
compare clients, give the same daemon twice.

Creates copies of a make-tree.py profile (default mixed, seed 1), pushes
two to their own `wsd serve` (A or B) and copies the third with `rsync -a`,
then for each round applies the same `make-tree.py mutate` round to all
three and times one incremental push to each daemon and one `rsync -a
--delete --no-whole-file` (bench/compare's incremental step), rotating
which goes first. `sync` and 0.5 s before each; daemon CPU is read 1.5 s
after the push returns, so it includes the daemon's idle settle; client CPU
is the push process's (or, with AGENT=1, the agent's). Prints per-round
figures, the medians of the per-pair ratios B/A and of each side's ratio to
rsync, and the load average before and after.

AGENT=1: the pushes go through the on-demand agent (issue 32), as a user's
do from the second push on: the cold push starts it, the rounds wait until
it answers, and each timed push must be made by it. Without it, pushes walk
(`WSD_AGENT=off`), as when these figures were first taken.
NO_RSYNC=1 leaves rsync out. STRACE=1 attaches `strace -f -T` to both
daemons (syscall durations in $WSD_AB_DIR/{A,B}.strace), PERF=1 `perf
record -g` to daemon B after its cold push. Works in $WSD_AB_DIR (default
/tmp/dp/w; removed and re-created).
"""
import json, os, resource, subprocess, sys, time, socket, shutil, statistics
from abkit import free_port

AGENT = os.environ.get("AGENT") == "1"
RSYNC = os.environ.get("NO_RSYNC") != "1"
os.environ["WSD_AGENT"] = "on" if AGENT else "off"
MT = os.environ.get("WSD_MAKE_TREE", "/work/shared/bench/make-tree.py")
CLIENTS, DA, DB = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
CLIENT = {"A": CLIENTS[0], "B": CLIENTS[-1]}
N = int(sys.argv[4]); PROFILE = sys.argv[5] if len(sys.argv) > 5 else "mixed"
W = os.environ.get("WSD_AB_DIR", "/tmp/dp/w"); shutil.rmtree(W, ignore_errors=True); os.makedirs(W)
load0 = open("/proc/loadavg").read().split()[:3]
def sh(a, **k): return subprocess.run(a, check=True, capture_output=True, text=True, **k)
def port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN); return r.ru_utime + r.ru_stime
def agent_pid(client, src):
    st = json.loads(sh([client, "agent", "status", src, "--state", src + ".wsd-state", "--json"]).stdout)
    return st["pid"] if st["running"] else None
ds = {}
for name, binp in (("A", DA), ("B", DB)):
    src, root, st = f"{W}/src{name}", f"{W}/root{name}", f"{W}/state{name}"
    sh([sys.executable, MT, "create", PROFILE, src, "--seed", "1"])
    os.makedirs(root)
    p = free_port()
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
    agent = None
    if AGENT:
        deadline = time.monotonic() + 120
        while (agent := agent_pid(CLIENT[name], src)) is None:
            if time.monotonic() > deadline: sys.exit(f"no agent answered for {src}")
            time.sleep(0.02)
    ds[name] = (proc, src, root, push, agent)
    if os.environ.get("PERF") and name == "B":
        ds["perf"] = subprocess.Popen(["perf", "record", "-g", "-o", f"{W}/perf.data", "-p", str(proc.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1)
if RSYNC:
    rsrc, rdst = f"{W}/srcR", f"{W}/dstR"
    sh([sys.executable, MT, "create", PROFILE, rsrc, "--seed", "1"])
    sh(["rsync", "-a", rsrc + "/", rdst + "/"])
sides = "ABR" if RSYNC else "AB"
res = {s: [] for s in sides}; ratios = []; cratios = []; vs_rsync = {"A": [], "B": []}
for r in range(1, N + 1):
    for name in "AB":
        sh([sys.executable, MT, "mutate", PROFILE, ds[name][1], "--seed", "1", "--round", str(r)])
    if RSYNC:
        sh([sys.executable, MT, "mutate", PROFILE, rsrc, "--seed", "1", "--round", str(r)])
    order = sides[(r - 1) % len(sides):] + sides[:(r - 1) % len(sides)]
    got = {}
    for name in order:
        subprocess.run(["sync"]); time.sleep(0.5)
        if name == "R":
            t0 = time.monotonic(); c0 = children_cpu()
            sh(["rsync", "-a", "--delete", "--no-whole-file", rsrc + "/", rdst + "/"])
            got[name] = (time.monotonic() - t0, children_cpu() - c0, 0.0)
            res[name].append(got[name]); continue
        proc, src, root, push, agent = ds[name]
        c0 = cpu(proc.pid); a0 = cpu(agent) if agent else children_cpu()
        t0 = time.monotonic(); out = sh(push).stdout; t = time.monotonic() - t0
        if AGENT and json.loads(out.strip().splitlines()[-1]).get("agent") is not True:
            sys.exit(f"round {r}: the push of {name} was not made by the agent: {out}")
        time.sleep(1.5)
        c = cpu(proc.pid) - c0; cl = (cpu(agent) if agent else children_cpu()) - a0
        got[name] = (t, c, cl); res[name].append(got[name])
    ratios.append(got["B"][0] / got["A"][0]); cratios.append(got["B"][1] / max(got["A"][1], 1e-3))
    line = (f"round {r}: A {got['A'][0]*1000:.0f} ms (daemon cpu {got['A'][1]*1000:.0f}, client {got['A'][2]*1000:.0f}), "
            f"B {got['B'][0]*1000:.0f} ms (daemon cpu {got['B'][1]*1000:.0f}, client {got['B'][2]*1000:.0f}), wall B/A {ratios[-1]:.2f}")
    if RSYNC:
        for name in "AB": vs_rsync[name].append(got[name][0] / got["R"][0])
        line += f"; rsync {got['R'][0]*1000:.0f} ms (cpu {got['R'][1]*1000:.0f}), A/rsync {vs_rsync['A'][-1]:.2f}, B/rsync {vs_rsync['B'][-1]:.2f}"
    print(line, flush=True)
for name in "AB":
    if sh([sys.executable, MT, "digest", ds[name][1]]).stdout != sh([sys.executable, MT, "digest", ds[name][2]]).stdout:
        print(f"MISMATCH {name}")
if RSYNC and sh([sys.executable, MT, "digest", rsrc]).stdout != sh([sys.executable, MT, "digest", rdst]).stdout:
    print("MISMATCH rsync")
if "perf" in ds:
    ds["perf"].send_signal(2); ds["perf"].wait()
for name in "AB":
    if AGENT:
        subprocess.run([CLIENT[name], "agent", "stop", ds[name][1], "--state", ds[name][1] + ".wsd-state"], capture_output=True)
    ds[name][0].terminate(); ds[name][0].wait()
med = statistics.median
for name in "AB":
    print(name, "median push wall ms", round(med([x[0] for x in res[name]])*1000, 1), "daemon cpu ms", round(med([x[1] for x in res[name]])*1000, 1),
          "client cpu ms", round(med([x[2] for x in res[name]])*1000, 1))
if RSYNC:
    print("rsync median wall ms", round(med([x[0] for x in res["R"]])*1000, 1), "cpu ms", round(med([x[1] for x in res["R"]])*1000, 1))
print("wall B/A median", round(med(ratios), 3), "range", round(min(ratios), 2), round(max(ratios), 2))
print("daemon cpu B/A median", round(med(cratios), 3), "range", round(min(cratios), 2), round(max(cratios), 2))
if RSYNC:
    for name in "AB":
        print(f"{name}/rsync median", round(med(vs_rsync[name]), 3), "range", round(min(vs_rsync[name]), 2), round(max(vs_rsync[name]), 2))
print("load before", load0, "after", open("/proc/loadavg").read().split()[:3], "agent" if AGENT else "walk")
