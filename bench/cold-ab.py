#!/usr/bin/env python3
"""Alternating A/B of cold pushes: one client binary, daemon A vs B (vs C…).

usage: cold-ab.py CLIENT_WSD "DAEMON_A[ ARGS],DAEMON_B[ ARGS],..." ROUNDS [PROFILE]
       cold-ab.py "CLIENT_A,CLIENT_B,..." "DAEMON_A,DAEMON_B,..." ROUNDS [PROFILE]

Creates one make-tree.py profile (default mixed, seed 1) and indexes it
with the (first) client, then for each round pushes it to a fresh
`wsd serve` of each daemon in turn (the order reversed every other round),
into an empty root on loopback. A daemon may carry extra `serve` arguments
after a space ("/path/wsd --no-watch"). With a comma-separated list of
clients, contender i pushes with client i (so client changes alternate
too; the clients share one index, so they must read the same schema;
give any name, e.g. "-", for an `rsync` or `cp` contender's client). The name
`rsync` instead of a daemon copies the
source with `rsync -a` into the empty root (the peer, in the same rounds;
its "daemon CPU" is rsync's children's), and `cp` copies it with `cp -a` (the
floor: no daemon, no protocol). Before each push, as root, the page cache is
dropped and the source read back (warm source, nothing else cached). Prints
per-round wall time, daemon CPU and client CPU (user + system, from
`wait4`), then per contender the median wall, the median daemon and
client CPU and the median and range of the per-round ratio to the first.
Each root is removed after its push.

Works in $WSD_AB_DIR (default /tmp), in a directory removed at the end.
On a filesystem that has seen many deletions, run it on a fresh one (see
bench/compare --fresh-fs).
"""
import os
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


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    clients, daemons, rounds = sys.argv[1].split(","), sys.argv[2].split(","), int(sys.argv[3])
    if len(clients) == 1:
        clients = clients * len(daemons)
    if len(clients) != len(daemons):
        sys.exit(f"{len(clients)} clients for {len(daemons)} daemons")
    profile = sys.argv[4] if len(sys.argv) > 4 else "mixed"
    work = os.path.join(os.environ.get("WSD_AB_DIR", "/tmp"), f"cold-ab-{os.getpid()}")
    os.makedirs(work)
    try:
        run(clients, daemons, rounds, profile, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cpu_s(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Contenders that copy the tree themselves instead of a daemon: argv for
# (source, empty destination).
PEERS = {
    "rsync": lambda src, root: ["rsync", "-a", src + "/", root + "/"],
    "cp": lambda src, root: ["cp", "-a", src + "/.", root + "/"],
}


def timed_client(argv):
    """Runs a client push; returns (wall s, user + system CPU s, peak RSS MiB)."""
    t0 = time.perf_counter()
    p = subprocess.Popen(argv)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        sys.exit(f"{argv[0]} push failed ({status})")
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def run(clients, daemons, rounds, profile, work):
    # Contenders by index: the same daemon may appear twice with two clients.
    names = [d if c == clients[0] or d in PEERS else f"{d} (client {c})"
             for c, d in zip(clients, daemons)]
    if len(set(names)) != len(names):
        sys.exit("each contender must differ in its client or its daemon")
    src, state = os.path.join(work, "src"), os.path.join(work, "client-state")
    subprocess.run([sys.executable, MAKE_TREE, "create", profile, src, "--seed", "1"],
                   check=True, capture_output=True)
    # Index the source first (nothing listens on port 1): every timed push is
    # a cold push of an indexed source, the first one included.
    index_source(clients[0], src, state)
    print("load before", open("/proc/loadavg").read().split()[:3], flush=True)
    wall = {n: [] for n in names}
    cpu = {n: [] for n in names}
    client_cpu = {n: [] for n in names}
    client_rss = {n: [] for n in names}
    k = 0
    order = list(range(len(names)))
    for r in range(rounds):
        for i in (order if r % 2 == 0 else order[::-1]):
            d, client, name = daemons[i], clients[i], names[i]
            k += 1
            root, dstate = os.path.join(work, f"root{k}"), os.path.join(work, f"state{k}")
            os.makedirs(root)
            warm(src)
            if d in PEERS:
                t0, c0 = time.perf_counter(), os.times()
                subprocess.run(PEERS[d](src, root), check=True)
                c1 = os.times()
                wall[name].append(time.perf_counter() - t0)
                cpu[name].append(c1.children_user + c1.children_system - c0.children_user - c0.children_system)
                client_cpu[name].append(0.0)
                client_rss[name].append(0.0)
                shutil.rmtree(root, ignore_errors=True)
                continue
            proc, addr = serve(d.split(), root, dstate)
            time.sleep(0.3)
            c0 = cpu_s(proc.pid)
            took, used, rss = timed_client([client, "push", src, "--remote", addr,
                                            "--state", state, "-q"])
            wall[name].append(took)
            cpu[name].append(cpu_s(proc.pid) - c0)
            client_cpu[name].append(used)
            client_rss[name].append(rss)
            proc.terminate()
            proc.wait()
            shutil.rmtree(root, ignore_errors=True)
            shutil.rmtree(dstate, ignore_errors=True)
        print(f"round {r + 1}: " + "  ".join(
            f"{n} {wall[n][-1] * 1000:.0f} ms (daemon cpu {cpu[n][-1] * 1000:.0f}, "
            f"client cpu {client_cpu[n][-1] * 1000:.0f})" for n in names), flush=True)
    base = names[0]
    for n in names:
        ratios = [x / y for x, y in zip(wall[n], wall[base])]
        print(f"{n}: median {statistics.median(wall[n]) * 1000:.0f} ms, daemon cpu "
              f"{statistics.median(cpu[n]) * 1000:.0f} ms, client cpu "
              f"{statistics.median(client_cpu[n]) * 1000:.0f} ms (peak RSS "
              f"{max(client_rss[n]):.1f} MiB), ratio to {base} "
              f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")
    # The targets are ratios to the peers measured in the same rounds.
    for peer in (p for p in PEERS if p in names):
        for n in names:
            if n in PEERS:
                continue
            ratios = [x / y for x, y in zip(wall[n], wall[peer])]
            print(f"{n} / {peer}, per round: median {statistics.median(ratios):.3f} "
                  f"({min(ratios):.2f}-{max(ratios):.2f})")
    print("load after", open("/proc/loadavg").read().split()[:3])


if __name__ == "__main__":
    main()
