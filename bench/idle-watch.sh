#!/bin/bash
# Idle CPU of `wsd serve` and `wsd sync --watch` over 60 s (utime+stime from
# /proc/PID/stat), once the initial sync of a DIRS x FILES tree is done.
# WSD_BIN picks the binary (default: this checkout's debug build).
set -u
BIN=${WSD_BIN:-$(dirname "$0")/../target/debug/wsd}
DIRS=${DIRS:-20}
FILES=${FILES:-10}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
mkdir -p "$T/ws" "$T/local"
for d in $(seq 1 "$DIRS"); do
  mkdir -p "$T/local/d$d"
  for f in $(seq 1 "$FILES"); do echo "$d.$f" > "$T/local/d$d/f$f"; done
done
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
"$BIN" serve --listen "127.0.0.1:$PORT" --root "$T/ws" --state "$T/state" 2>"$T/serve.log" &
S=$!
sleep 1
"$BIN" sync --remote "127.0.0.1:$PORT" --watch "$T/local" 2>"$T/sync.log" &
C=$!
# The first round's push summary: the initial sync is over.
for _ in $(seq 1 600); do grep -q '^push:' "$T/sync.log" && break; sleep 1; done
sleep 5
ticks() { awk '{print $14+$15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)
s0=$(ticks $S); c0=$(ticks $C); t0=$(date +%s.%N)
sleep 60
s1=$(ticks $S); c1=$(ticks $C); t1=$(date +%s.%N)
python3 - <<PY
hz=$HZ; el=$t1-$t0
print(f"{$DIRS * $FILES} files, {el:.1f} s, CLK_TCK {hz}")
print(f"daemon  (wsd serve):        {($s1-$s0)} ticks = {100*($s1-$s0)/hz/el:.3f}% of one core")
print(f"CLI     (wsd sync --watch): {($c1-$c0)} ticks = {100*($c1-$c0)/hz/el:.3f}% of one core")
PY
kill $C $S
wait $C $S 2>/dev/null
