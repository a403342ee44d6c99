#!/usr/bin/env python3
"""One-shot no-op `wsd push` with and without the on-demand agent (issue 32).

usage: noop-ab.py WSD ROUNDS [PROFILE]

Creates a make-tree.py profile (default mixed, seed 1) in $WSD_AB_DIR
(default /tmp/noop-ab; removed and re-created), pushes it once to a fresh
`wsd serve` (index beside the tree, as bench/compare keeps it), then per
round, alternating which goes first:

  A  `wsd push --no-agent`: the walk (stats every file), as before agents
  B  `wsd push`: made by the local agent the earlier pushes started

and, every round, the first-push cost: the agent stopped (`wsd agent
stop`), then `wsd push` (walks, then starts an agent) against `wsd push
--no-agent`, and how long the new agent takes until it answers. After the
rounds, the agent's CPU (utime+stime) and RSS over IDLE_SECS (default 60)
without requests. Prints per-round figures, medians of the per-pair ratios
B/A, and the load average before and after.
"""
import json, os, shutil, socket, statistics, subprocess, sys, time
from abkit import free_port

MT = os.environ.get("WSD_MAKE_TREE", "/work/shared/bench/make-tree.py")
WSD, N = sys.argv[1], int(sys.argv[2])
PROFILE = sys.argv[3] if len(sys.argv) > 3 else "mixed"
IDLE = float(os.environ.get("IDLE_SECS", "60"))
W = os.environ.get("WSD_AB_DIR", "/tmp/noop-ab")
shutil.rmtree(W, ignore_errors=True)
os.makedirs(W)
env = dict(os.environ)
env.pop("WSD_AGENT", None)
load0 = open("/proc/loadavg").read().split()[:3]


def sh(a):
    return subprocess.run(a, check=True, capture_output=True, text=True, env=env)


def timed(a):
    t0 = time.perf_counter()
    out = sh(a).stdout
    return time.perf_counter() - t0, json.loads(out.strip().splitlines()[-1])


src, root, state = f"{W}/src", f"{W}/root", f"{W}/src.wsd-state"
sh([sys.executable, MT, "create", PROFILE, src, "--seed", "1"])
os.makedirs(root)
p = free_port()
serve = subprocess.Popen([WSD, "serve", "--root", root, "--state", f"{W}/served-state",
                          "--listen", f"127.0.0.1:{p}"],
                         stdout=subprocess.DEVNULL, stderr=open(f"{W}/serve.log", "w"))
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", p), 0.2).close()
        break
    except OSError:
        time.sleep(0.05)
push = [WSD, "push", src, "--remote", f"127.0.0.1:{p}", "--json", "--state", state]
status = [WSD, "agent", "status", src, "--state", state, "--json"]
stop = [WSD, "agent", "stop", src, "--state", state]
sh(push + ["--no-agent"])  # the cold push


def agent_ready():
    """Seconds from now until an agent answers; its pid."""
    t0 = time.perf_counter()
    while True:
        st = json.loads(sh(status).stdout)
        if st["running"]:
            return time.perf_counter() - t0, st["pid"]
        time.sleep(0.002)


res = {"A": [], "B": [], "first": [], "first_noagent": [], "ready": []}
ratios, first_ratios = [], []
for r in range(1, N + 1):
    # First push: no agent, the push walks and starts one.
    sh(stop)
    order = ["first", "first_noagent"] if r % 2 else ["first_noagent", "first"]
    got = {}
    for k in order:
        if k == "first":
            sh(stop)
            got[k], s = timed(push)
            assert "agent" not in s, s
            ready, pid = agent_ready()
            res["ready"].append(ready)
        else:
            got[k], _ = timed(push + ["--no-agent"])
    # The agent of this round is up (started by "first"); warm it once.
    timed(push)
    order = "AB" if r % 2 else "BA"
    for name in order:
        if name == "A":
            got[name], s = timed(push + ["--no-agent"])
            assert "agent" not in s, s
        else:
            got[name], s = timed(push)
            assert s.get("agent") is True, s
        assert s["entries"] == 0, s
    for k, v in got.items():
        res[k].append(v)
    ratios.append(got["B"] / got["A"])
    first_ratios.append(got["first"] / got["first_noagent"])
    print(f"round {r}: no-op A (walk) {got['A']*1e3:.1f} ms, B (agent) {got['B']*1e3:.1f} ms, "
          f"B/A {ratios[-1]:.2f}; first push with agent start {got['first']*1e3:.1f} ms vs "
          f"{got['first_noagent']*1e3:.1f} ms without ({first_ratios[-1]:.2f}); "
          f"agent ready {res['ready'][-1]*1e3:.0f} ms after", flush=True)

# Idle cost of the agent left running.
st = json.loads(sh(status).stdout)
pid = st["pid"]
hz = os.sysconf("SC_CLK_TCK")


def ticks(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def rss(pid):
    kv = dict(l.split(":", 1) for l in open(f"/proc/{pid}/status"))
    return kv["VmRSS"].strip(), kv["VmHWM"].strip()


c0, t0 = ticks(pid), time.monotonic()
time.sleep(IDLE)
c1, el = ticks(pid), time.monotonic() - t0
rss_now, hwm = rss(pid)
sh(stop)
serve.terminate()
serve.wait()
med = statistics.median
print(f"profile {PROFILE}, {N} rounds")
for k, what in (("A", "no-op, walk (--no-agent)"), ("B", "no-op, by the agent"),
                ("first_noagent", "first push, no agent started"),
                ("first", "first push, walk + agent start"), ("ready", "agent answering after")):
    v = res[k]
    print(f"  {what}: median {med(v)*1e3:.1f} ms (range {min(v)*1e3:.1f}-{max(v)*1e3:.1f})")
print(f"  no-op B/A median {med(ratios):.3f} (range {min(ratios):.2f}-{max(ratios):.2f})")
print(f"  first push with/without agent start median {med(first_ratios):.3f} "
      f"(range {min(first_ratios):.2f}-{max(first_ratios):.2f})")
print(f"  agent idle {el:.0f} s: {c1 - c0} ticks = {100 * (c1 - c0) / hz / el:.3f}% of one core; "
      f"RSS {rss_now} (peak {hwm})")
print("  load before", load0, "after", open("/proc/loadavg").read().split()[:3])
shutil.rmtree(W, ignore_errors=True)
