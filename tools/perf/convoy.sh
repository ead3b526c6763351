#!/bin/bash
# convoy.sh FILE [DEVICE]: where a 4 KiB random read's time goes. Runs fio
# (4 KiB randread, iodepth 32, libaio, O_DIRECT) on FILE for 8 s and, for
# 1 s in the middle, samples /proc/diskstats of DEVICE and records the FUSE
# tracepoints fuse:fuse_request_send and fuse:fuse_request_end with perf.
# It prints fio's IOPS and mean latency, the device's time per read and how
# many reads it held on average (weighted time in queue over wall time: of
# fio's 32, the rest are in fio or in the FUSE round trip), and, for a FUSE
# file, the median time from the kernel queueing a READ for the server to
# its reply. Needs root, fio, perf and python3. See docs/BENCHMARKS.md,
# "How to read it".
set -euo pipefail
file=$1
dev=${2:-$(lsblk -no PKNAME "$(df --output=source "$(dirname "$file")" | tail -1)" 2>/dev/null || true)}
dev=${dev:-vda}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
stat_dev() { awk -v d="$dev" '$3==d{print $4+$8, $7+$11, $14}' /proc/diskstats; }
fio --name=r --filename="$file" --rw=randread --bs=4k --iodepth=32 --direct=1 \
	--ioengine=libaio --time_based --runtime=8 --ramp_time=1 --output-format=json >"$out/fio.json" &
sleep 3
s0=$(stat_dev); t0=$(date +%s.%N)
perf record -q -o "$out/perf.data" -a -e fuse:fuse_request_send -e fuse:fuse_request_end -- sleep 1 2>/dev/null
s1=$(stat_dev); t1=$(date +%s.%N)
wait
perf script -i "$out/perf.data" -F comm,tid,cpu,time,event,trace >"$out/perf.txt" 2>/dev/null
python3 - "$out" "$s0" "$s1" "$t0" "$t1" <<'PY'
import json, re, statistics as st, sys
out, s0, s1 = sys.argv[1], [int(x) for x in sys.argv[2].split()], [int(x) for x in sys.argv[3].split()]
wall = float(sys.argv[5]) - float(sys.argv[4])
r = json.load(open(out + "/fio.json"))["jobs"][0]["read"]
ios, ms, weighted = (b - a for a, b in zip(s0, s1))
print(f"fio: {int(r['iops'])} IOPS, mean latency {r['clat_ns']['mean'] / 1e3:.0f} us")
if ios:
    print(f"device: {ms * 1000 / ios:.0f} us per I/O, {weighted / 1000 / wall:.1f} I/Os held on average")
sent, took = {}, []
for line in open(out + "/perf.txt"):
    m = re.search(r'([\d.]+):\s+fuse:fuse_request_(send|end):.* req (\d+)', line)
    if not m:
        continue
    t, what, req = float(m.group(1)) * 1e6, m.group(2), m.group(3)
    if what == "send":
        sent[req] = t
    elif req in sent:
        took.append(t - sent.pop(req))
if took:
    print(f"FUSE: {len(took)} requests, queued to replied {st.median(took):.0f} us (median)")
PY
