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
