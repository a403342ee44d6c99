"""Helpers the A/B scripts in bench/ share (imported from the script's own
directory: `python3 bench/cold-ab.py ...` puts bench/ on sys.path)."""
import os
import socket
import subprocess
import sys
import time


def free_port():
    """A loopback TCP port nothing listens on right now."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def warm(src):
    """Drops the page cache (as root) and reads `src` back, so a timed step
    starts from a warm source and nothing else cached."""
    if os.geteuid() == 0:
        subprocess.run("sync; echo 1 > /proc/sys/vm/drop_caches", shell=True, check=False)
    # Through a pipe: GNU tar skips reading contents when writing to /dev/null.
    with subprocess.Popen(["tar", "-C", src, "-cf", "-", "."], stdout=subprocess.PIPE) as p:
        while p.stdout.read(1 << 20):
            pass


def index_source(client, src, state):
    """Builds `client`'s index of `src` in `state` without pushing: a dry-run
    push settles (walks and hashes the tree) before it connects, and nothing
    listens on port 1. (A plain push of a never-indexed tree indexes while it
    pushes, so one that cannot connect leaves the index empty.)"""
    subprocess.run([client, "push", src, "--remote", "127.0.0.1:1", "--state", state, "-q",
                    "--dry-run"], capture_output=True)
    if not os.path.exists(os.path.join(state, "index.sqlite3")):
        raise SystemExit(f"{client} did not index {src}")


def serve(argv, root, state, stderr=subprocess.DEVNULL):
    """Starts `ARGV[0] serve ARGV[1:]` on `root` and `state` on a free
    loopback port and waits (up to 30 s) until it listens; answers the
    process and its address. Exits naming the daemon if it never does."""
    port = free_port()
    proc = subprocess.Popen(argv[:1] + ["serve"] + argv[1:] +
                            ["--root", root, "--state", state, "--listen", f"127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, f"127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"{' '.join(argv)} serve did not start listening")
            time.sleep(0.05)
