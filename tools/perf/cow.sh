#!/bin/bash
# cow.sh [ROUNDS]: first writes to shared blocks (copy-on-write) against
# first writes into holes, on a default vdiskfs mount, side by side (issue
# 18). Each round and workload gets a fresh store from tools/perf/mkshared:
# src.raw written in full and snapshotted (src-snap), so every block of it
# is shared, and hole.raw, all holes, both the same size. One mount, then
# fio writes every block of each disk exactly once (no time limit, no
# ramp; random offsets from fio's random map, the same sequence on both),
# the order of the two alternating from round to round:
#   write-1m-qd16      --rw=write --bs=1M --iodepth=16 over SEQ_GIB (4) GiB
#   randwrite-4k-qd32  --rw=randwrite --bs=4k --iodepth=32 over RAND_GIB (1) GiB
# (libaio, O_DIRECT, --fallocate=none so that fio maps nothing first).
# Before each fio run: sync and SETTLE (5) seconds, so that the writes
# before it (mkshared's, the other side's) have drained on the host.
# After each round, mkshared -check: Check clean, both disks fully written,
# nothing shared any more, src-snap still as it was; it prints the extents
# each disk ended with. It prints every
# round's MB/s and the daemon's CPU per GB written, then per workload the
# median and range of the per-round ratio COW/holes.
# WORKLOADS="randwrite-4k-qd32" runs only the named ones.
# CONTROL=1 runs the same with hole2.raw, another disk of holes, in
# src.raw's place: an A/A run whose ratios show how far the host alone
# moves them.
# Needs root, /dev/fuse, fio and python3; DIR (default /var/tmp/vdisk-cow)
# must take O_DIRECT (not tmpfs). See docs/BENCHMARKS.md, "Paired
# runs".
set -euo pipefail
rounds=${1:-3}
seq_gib=${SEQ_GIB:-4} rand_gib=${RAND_GIB:-1} settle=${SETTLE:-5} control=${CONTROL:-0}
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=${DIR:-/var/tmp/vdisk-cow}
mkdir -p "$dir"
bin=$dir/vdisk mk=$dir/mkshared
(cd "$top" && go build -o "$bin" ./cmd/vdisk && go build -o "$mk" ./tools/perf/mkshared)
store=$dir/store.img mnt=$dir/mnt
cleanup() {
	"$bin" umount "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true
	rm -f "$store" "$dir"/*.json "$dir"/*.cpu
}
trap cleanup EXIT
cleanup
mkdir -p "$mnt"

cpu() { # cpu PID: user+system clock ticks of the daemon
	awk '{print $14 + $15}' "/proc/$1/stat"
}
run() { # run WORKLOAD DISK GIB PID OUT
	local rw bs qd
	case $1 in
	write-1m-qd16) rw=write bs=1M qd=16 ;;
	randwrite-4k-qd32) rw=randwrite bs=4k qd=32 ;;
	esac
	local before after
	before=$(cpu "$4")
	fio --name=w --filename="$mnt/$2" --size="$3G" --rw=$rw --bs=$bs --iodepth=$qd --direct=1 \
		--ioengine=libaio --fallocate=none --output-format=json >"$5"
	after=$(cpu "$4")
	echo $((after - before)) >"${5%.json}.cpu"
}
read -ra workloads <<<"${WORKLOADS:-write-1m-qd16 randwrite-4k-qd32}"
for r in $(seq 1 "$rounds"); do
	for w in "${workloads[@]}"; do
		gib=$seq_gib
		[[ $w == randwrite-* ]] && gib=$rand_gib
		rm -f "$store"
		"$mk" -gib "$gib" "$store" >/dev/null
		out=$("$bin" mount "$store" "$mnt") # the defaults, as a user runs it
		pid=$(sed -n 's/.*(pid \([0-9]*\).*/\1/p' <<<"$out")
		if ((r % 2)); then order=(cow holes); else order=(holes cow); fi
		for side in "${order[@]}"; do
			disk=src.raw
			((control)) && disk=hole2.raw
			[[ $side == holes ]] && disk=hole.raw
			sync
			sleep "$settle"
			run "$w" "$disk" "$gib" "$pid" "$dir/$w-$side-$r.json"
		done
		"$bin" umount "$mnt" >/dev/null
		"$mk" -check -control="$((control))" "$store" | sed "s/^/$w round $r: /"
	done
done
python3 - "$dir" "$rounds" "$(getconf CLK_TCK)" "$control" "${workloads[@]}" <<'PY'
import json, statistics as st, sys
d, rounds, tck, control, workloads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5:]
cow = "hole2 (A/A control)" if control else "COW"
def mbs(p):
    return json.load(open(p))["jobs"][0]["write"]["bw_bytes"] / 1e6
def cpu_per_gb(p):
    j = json.load(open(p))["jobs"][0]["write"]
    return int(open(p[:-5] + ".cpu").read()) / tck / (j["io_bytes"] / 1e9)
for w in workloads:
    c = [mbs(f"{d}/{w}-cow-{r}.json") for r in range(1, rounds + 1)]
    h = [mbs(f"{d}/{w}-holes-{r}.json") for r in range(1, rounds + 1)]
    cc = [cpu_per_gb(f"{d}/{w}-cow-{r}.json") for r in range(1, rounds + 1)]
    hc = [cpu_per_gb(f"{d}/{w}-holes-{r}.json") for r in range(1, rounds + 1)]
    ratios = [a / b for a, b in zip(c, h)]
    print(f"{w}: {cow} {' '.join(f'{x:.0f}' for x in c)} MB/s | holes {' '.join(f'{x:.0f}' for x in h)} MB/s | "
          f"ratio {' '.join(f'{x:.2f}' for x in ratios)}")
    print(f"{w}: daemon CPU s/GB {cow} {' '.join(f'{x:.2f}' for x in cc)} | holes {' '.join(f'{x:.2f}' for x in hc)}")
    print(f"{w}: {cow} median {st.median(c):.0f}, holes median {st.median(h):.0f}, "
          f"per-round ratio {cow}/holes median {st.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
PY
