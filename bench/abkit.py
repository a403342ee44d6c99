"""Helpers the A/B scripts in bench/ share (imported from the script's own
directory: `python3 bench/cold-ab.py ...` puts bench/ on sys.path)."""
import os
import socket
import subprocess


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
