#!/bin/bash
# fill.sh [ROUNDS]: the random 4 KiB fill of a new 1 GiB disk (issue 17),
# on default vdiskfs mounts and on a raw sparse file of the same ext4, side
# by side: fio --rw=randwrite --bs=4k --iodepth=32 over GIB (1) GiB, every
# block exactly once (fio's random map; no time limit, no ramp; libaio,
# O_DIRECT, --fallocate=none so that nothing is mapped first).
# Every round and target gets a fresh store (or raw file), and the order of
# the targets rotates from round to round; before each fill: sync and
# SETTLE (5) seconds, so that the writes before it have drained on the host.
# Targets: raw, and each NAME=BINARY of VDISK (default: vdiskfs=a binary
# built from this tree), so that VDISK="old=/tmp/vdisk-old new=bin/vdisk"
# compares two builds against the same raw file.
# It prints every fill's IOPS and the daemon's CPU time per write, then per
# target the median and range of IOPS and of the per-round ratio to raw.
# Needs root, /dev/fuse, fio and python3; DIR (default /var/tmp/vdisk-fill)
# must take O_DIRECT (not tmpfs). See docs/BENCHMARKS.md, "Paired runs".
set -euo pipefail
rounds=${1:-3}
gib=${GIB:-1} settle=${SETTLE:-5}
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=${DIR:-/var/tmp/vdisk-fill}
mkdir -p "$dir/mnt"
mnt=$dir/mnt
declare -A bins
if [[ -n ${VDISK:-} ]]; then
	for nb in $VDISK; do bins[${nb%%=*}]=${nb#*=}; done
else
	(cd "$top" && go build -o "$dir/vdisk" ./cmd/vdisk)
	bins[vdiskfs]=$dir/vdisk
fi
names=(raw "${!bins[@]}")
cleanup() {
	for b in "${bins[@]}"; do "$b" umount "$mnt" 2>/dev/null && break; done
	umount "$mnt" 2>/dev/null || true
	rm -f "$dir/store.img" "$dir/raw.img"
}
trap cleanup EXIT
cleanup

fill() { # fill FILE OUT
	fio --name=fill --filename="$1" --size="${gib}G" --rw=randwrite --bs=4k --iodepth=32 \
		--direct=1 --ioengine=libaio --fallocate=none --output-format=json >"$2"
}
for r in $(seq 1 "$rounds"); do
	n=${#names[@]}
	for i in $(seq 0 $((n - 1))); do
		t=${names[$(((i + r) % n))]}
		out=$dir/$t-$r.json
		sync
		sleep "$settle"
		if [[ $t == raw ]]; then
			truncate -s "${gib}G" "$dir/raw.img"
			fill "$dir/raw.img" "$out"
			echo 0 >"$dir/$t-$r.cpu"
			rm -f "$dir/raw.img"
			continue
		fi
		b=${bins[$t]}
		rm -f "$dir/store.img"
		"$b" format "$dir/store.img" --size "$((gib * 4))G" >/dev/null
		m=$("$b" mount "$dir/store.img" "$mnt") # the defaults, as a user runs it
		pid=$(sed -n 's/.*(pid \([0-9]*\).*/\1/p' <<<"$m")
		truncate -s "${gib}G" "$mnt/fill.raw"
		before=$(awk '{print $14 + $15}' "/proc/$pid/stat")
		fill "$mnt/fill.raw" "$out"
		after=$(awk '{print $14 + $15}' "/proc/$pid/stat")
		echo $((after - before)) >"$dir/$t-$r.cpu"
		"$b" umount "$mnt" >/dev/null
		rm -f "$dir/store.img"
	done
done
python3 - "$dir" "$rounds" "$gib" "${names[@]}" <<'PY'
import json, os, statistics as st, sys
d, rounds, gib, names = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
writes = gib << 18
hz = os.sysconf("SC_CLK_TCK")
iops = {t: [json.load(open(f"{d}/{t}-{r}.json"))["jobs"][0]["write"]["iops"] for r in range(1, rounds + 1)] for t in names}
for t in names:
    cpu = [int(open(f"{d}/{t}-{r}.cpu").read()) / hz / writes * 1e6 for r in range(1, rounds + 1)]
    line = f"{t:10} IOPS {' '.join(f'{x:.0f}' for x in iops[t])}: median {st.median(iops[t]):.0f}"
    if t != "raw":
        ratios = [a / b for a, b in zip(iops[t], iops["raw"])]
        line += f", vs raw {st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}), daemon CPU {st.median(cpu):.1f} us/write"
    print(line)
PY
