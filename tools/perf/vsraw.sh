#!/bin/bash
# vsraw.sh [ROUNDS] [SECONDS]: default vdiskfs mounts against the raw file
# on the same ext4, side by side, the measure of issue 17's goals. Targets:
# raw (a 2 GiB file laid out once), and each NAME=BINARY of VDISK (default:
# vdiskfs=a binary built from this tree), each with a store of its own
# holding a 2 GiB disk laid out once with 1 MiB writes; every round, the
# targets take turns in an order that rotates, a mount per target and
# round as a user runs it (`vdisk mount STORE MNT`, the defaults), and fio
# (libaio, O_DIRECT, from outside the daemon) runs each workload SECONDS
# (default 8) after 1 s of ramp. WORKLOADS (default: the default four of
# workloads.sh and its other two large writes) picks them.
# It prints every run's MB/s, then per workload and target the median and
# range of MB/s and of the per-round ratio to raw.
# Needs root, /dev/fuse, fio and python3; DIR (default /var/tmp/vdisk-vsraw)
# must take O_DIRECT (not tmpfs).
set -euo pipefail
rounds=${1:-3} secs=${2:-8}
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=${DIR:-/var/tmp/vdisk-vsraw}
mkdir -p "$dir"
. "$top/tools/perf/workloads.sh"
read -r -a workloads <<<"${WORKLOADS:-$default_workloads seqwrite-1m-qd1 write-256k-qd64}"
names=(raw) bins=(none)
if [[ -n ${VDISK:-} ]]; then
	for nb in $VDISK; do names+=("${nb%%=*}") bins+=("${nb#*=}"); done
else
	(cd "$top" && go build -o "$dir/vdisk" ./cmd/vdisk)
	names+=(vdiskfs) bins+=("$dir/vdisk")
fi
cleanup() {
	local i
	for i in "${!names[@]}"; do
		((i)) && { "${bins[$i]}" umount "$dir/mnt-${names[$i]}" >/dev/null 2>&1 || umount "$dir/mnt-${names[$i]}" 2>/dev/null || true; }
	done
	rm -f "$dir"/*.img "$dir"/*.json
}
trap cleanup EXIT
cleanup
layout() { # layout FILE
	fio --name=layout --filename="$1" --size=2G --rw=write --bs=1M --iodepth=16 \
		--direct=1 --ioengine=libaio --end_fsync=1 >/dev/null
}
layout "$dir/raw.img"
for i in "${!names[@]}"; do
	((i)) || continue
	b=${bins[$i]} s=$dir/store-${names[$i]}.img m=$dir/mnt-${names[$i]}
	mkdir -p "$m"
	"$b" format "$s" --size 8G >/dev/null
	"$b" mount "$s" "$m" >/dev/null
	layout "$m/disk.raw"
	"$b" umount "$m" >/dev/null
done
n=${#names[@]}
for r in $(seq 1 "$rounds"); do
	for k in $(seq 0 $((n - 1))); do
		i=$(((k + r) % n)) t=${names[$(((k + r) % n))]}
		f=$dir/raw.img
		if ((i)); then
			"${bins[$i]}" mount "$dir/store-$t.img" "$dir/mnt-$t" >/dev/null
			f=$dir/mnt-$t/disk.raw
		fi
		for w in "${workloads[@]}"; do
			# shellcheck disable=SC2046 # several options
			fio --name=w --filename="$f" --size=2G $(workload_args "$w") --direct=1 --ioengine=libaio \
				--time_based --runtime="$secs" --ramp_time=1 --output-format=json >"$dir/$w-$t-$r.json"
		done
		if ((i)); then "${bins[$i]}" umount "$dir/mnt-$t" >/dev/null; fi
	done
done
python3 - "$dir" "$rounds" "${names[*]}" "${workloads[@]}" <<'PY'
import json, statistics as st, sys
d, rounds, names, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
def mbs(w, t, r):
    j = json.load(open(f"{d}/{w}-{t}-{r}.json"))["jobs"][0]
    return (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6
for w in workloads:
    raw = [mbs(w, "raw", r) for r in range(1, rounds + 1)]
    for t in names:
        v = [mbs(w, t, r) for r in range(1, rounds + 1)]
        ratio = [a / b for a, b in zip(v, raw)]
        print(f"{w:18} {t:10} MB/s {' '.join(f'{x:.0f}' for x in v)}: median {st.median(v):.0f}"
              + ("" if t == "raw" else f", x raw {st.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f})"))
PY
