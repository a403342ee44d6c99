#!/bin/bash
# Idle CPU of `wsd serve` and `wsd sync --watch` over 60 s (utime+stime
# from /proc/PID/stat), on a 200-file tree. WSD_BIN picks the binary.
set -u
BIN=${WSD_BIN:-$(dirname "$0")/../target/debug/wsd}
T=$(mktemp -d)
mkdir -p $T/ws $T/local
for i in $(seq 1 200); do mkdir -p $T/local/d$((i%20)); echo $i > $T/local/d$((i%20))/f$i; done
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
$BIN serve --listen 127.0.0.1:$PORT --root $T/ws --state $T/state 2>$T/serve.log &
S=$!
sleep 1
$BIN sync --remote 127.0.0.1:$PORT --watch $T/local 2>$T/sync.log &
C=$!
sleep 5
ticks() { awk '{print $14+$15}' /proc/$1/stat; }
HZ=$(getconf CLK_TCK)
s0=$(ticks $S); c0=$(ticks $C); t0=$(date +%s.%N)
sleep 60
s1=$(ticks $S); c1=$(ticks $C); t1=$(date +%s.%N)
python3 - <<PY
hz=$HZ; el=$t1-$t0
print(f"elapsed {el:.1f} s, CLK_TCK {hz}")
print(f"daemon  (wsd serve):        {($s1-$s0)} ticks = {($s1-$s0)/hz:.3f} s CPU = {100*($s1-$s0)/hz/el:.3f}% of one core")
print(f"CLI     (wsd sync --watch): {($c1-$c0)} ticks = {($c1-$c0)/hz:.3f} s CPU = {100*($c1-$c0)/hz/el:.3f}% of one core")
PY
echo "entries synced to the daemon root: $(ls $T/ws | wc -l)"
kill $C $S; wait $C $S 2>/dev/null
rm -rf $T
