#!/usr/bin/env python3
"""The `large` profile of bench/compare: a deterministic tree whose size is
a parameter, so cost can be read against the number of files.

    bench/large-tree.py create DIR [--files 100000] [--seed 1]

At the default 100,000 files it is about 2 GiB: 99.9 % text-like files
(make-tree.py's size distribution, median ~2 KiB) in directories of about
25 files nested up to 6 deep, and one 16 MiB incompressible file per
1,000 files (1.6 GiB of the total). Every count scales with --files, so
the bytes grow linearly with it too. `make-tree.py mutate large DIR` and
`make-tree.py digest DIR` work on it as on the other profiles (mutate
picks its files from what it finds).
"""
import argparse
import importlib.util
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
MAKE_TREE = os.environ.get("WSD_MAKE_TREE") or os.path.join(HERE, "..", "..", "shared", "bench", "make-tree.py")

FILES_PER_DIR = 25
FILES_PER_BIG = 1000
BIG_BYTES = 16 * 1024 * 1024


def make_tree_module():
    spec = importlib.util.spec_from_file_location("make_tree", MAKE_TREE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def create(root, files, seed):
    mt = make_tree_module()
    rng = random.Random(seed)
    dirs = [""]
    for i in range(max(1, files // FILES_PER_DIR)):
        parent = rng.choice(dirs)
        if parent.count("/") >= 6:
            parent = ""
        dirs.append(f"{parent}d{i:05d}/".lstrip("/"))
    bigs = files // FILES_PER_BIG
    total = 0
    for i in range(files - bigs):
        rel = f"{rng.choice(dirs)}f{i:06d}.{rng.choice(['rs', 'ts', 'md', 'json', 'txt'])}"
        data = mt.text_bytes(rng, mt.small_size(rng))
        mt.write(os.path.join(root, rel), data, 0o755 if rng.random() < 0.02 else 0o644)
        total += len(data)
    for i in range(bigs):
        data = rng.randbytes(BIG_BYTES)
        mt.write(os.path.join(root, "blobs", f"big{i:04d}.bin"), data)
        total += len(data)
    print(f"created {files} files, {total} bytes under {root}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("verb", choices=["create"])
    ap.add_argument("dir")
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    create(a.dir, a.files, a.seed)


if __name__ == "__main__":
    main()
