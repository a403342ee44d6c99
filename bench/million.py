#!/usr/bin/env python3
"""One run of a 1,000,000-file tree (issue 32, Scale): the first push of
the never-indexed tree into an empty workspace, then a no-op push; wall
time and peak RSS of the daemon and of the client (`/usr/bin/time`).

    bench/million.py [FILES]      (default 1,000,000)

Small files only (100 B - 4 KiB each, deterministic: about 2 GiB), 25 per
directory, under $MILLION_DIR (default /mnt/m1; give it a filesystem of
its own with enough inodes, e.g. `mkfs.ext4 -i 4096` on a 24 GiB sparse
image: source and copy take about 2.1 M inodes). Uses the release `wsd`
beside this script ($WSD to override). The tree is kept (a `.done` marker)
so a second run skips making it."""
import os, random, socket, subprocess, sys, time
# Pushes walk, as when these figures were first taken: no on-demand agent
# (issue 32) watching the tree between steps; bench/noop-ab.py measures it.
os.environ.setdefault("WSD_AGENT", "off")
WSD = os.environ.get("WSD", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "wsd"))
N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
base = os.environ.get("MILLION_DIR", "/mnt/m1")
src, dst = f"{base}/src", f"{base}/dst"
t0 = time.time()
rng = random.Random(1)
total = 0
if not os.path.exists(src + ".done"):
    for i in range(N):
        d = f"{src}/d{i // 25000}/e{(i // 625) % 40}/f{(i // 25) % 25}"
        if i % 25 == 0:
            os.makedirs(d, exist_ok=True)
        size = rng.randint(100, 4096)
        with open(f"{d}/x{i % 25}.txt", "wb") as f:
            f.write(rng.randbytes(size))
        total += size
    open(src + ".done", "w").write(str(total))
print(f"tree: {N} files, {int(open(src + '.done').read())/2**20:.0f} MiB, made in {time.time()-t0:.0f} s", flush=True)
os.makedirs(dst, exist_ok=True)
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
addr = f"127.0.0.1:{port}"
log = open(f"{base}/serve.log", "w")
d = subprocess.Popen([WSD, "serve", "--root", dst, "--state", f"{base}/dst.state", "--listen", addr], stdout=subprocess.DEVNULL, stderr=log)
for _ in range(3000):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close(); break
    except OSError:
        time.sleep(0.01)
def hwm(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmHWM:"): return int(l.split()[1]) // 1024
def push(label):
    t = time.time()
    p = subprocess.Popen(["/usr/bin/time", "-f", "%M", WSD, "push", src, "--remote", addr, "--json", "--state", f"{src}.wsd-state"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate()
    dt = time.time() - t
    client = int(err.strip().splitlines()[-1]) // 1024
    summ = [l for l in out.splitlines() if l.startswith("{")]
    print(f"{label}: rc {p.returncode}, {dt:.1f} s, client peak {client} MiB, daemon peak so far {hwm(d.pid)} MiB, load {open('/proc/loadavg').read().split()[0]}", flush=True)
    if summ: print("  ", summ[-1][:400], flush=True)
    if p.returncode: print(err[-2000:])
push("first push (never indexed)")
push("no-op push")
d.terminate(); d.wait()
