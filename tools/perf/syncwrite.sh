#!/bin/bash
# syncwrite.sh [ROUNDS] [SECONDS]: synchronous 4 KiB random writes on a
# default vdiskfs mount against the raw file on the same file system, in
# alternating rounds (raw, vdiskfs, raw, ...), each a fresh fio run of
# SECONDS (default 10) over a 1 GiB file that fio laid out first:
#   dsync-qd32     O_DIRECT|O_DSYNC, libaio, iodepth 32 (a write-through
#                  hypervisor disk, fio --sync=dsync)
#   fdatasync-qd1  buffered writes, fdatasync after each (fio --fdatasync=1)
#   fdatasync-8jobs  the same from 8 threads at once: their fdatasyncs
#                  share commits and flushes (group commit)
# It prints each round's IOPS, then per workload the median and range of
# both targets and the median of the per-round ratios vdiskfs/raw.
# Needs root, /dev/fuse, fio and python3; DIR (default /var/tmp/vdisk-sync)
# must be on a file system that takes O_DIRECT (not tmpfs). See
# docs/BENCHMARKS.md, "Synchronous writes".
set -euo pipefail
rounds=${1:-5} secs=${2:-10}
top=$(cd "$(dirname "$0")/../.." && pwd)
dir=${DIR:-/var/tmp/vdisk-sync}
mkdir -p "$dir"
bin=$dir/vdisk
(cd "$top" && go build -o "$bin" ./cmd/vdisk)
store=$dir/store.img mnt=$dir/mnt raw=$dir/raw.img
cleanup() {
	"$bin" umount "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true
	rm -f "$store" "$raw" "$dir"/*.json
}
trap cleanup EXIT
rm -f "$store" "$raw"
"$bin" format "$store" --size 8G >/dev/null
"$bin" mount "$store" "$mnt" # the defaults, as a user runs it
disk=$mnt/bench.raw

run() { # run WORKLOAD FILE OUT
	local common=(--name=w --filename="$2" --size=1G --rw=randwrite --bs=4k
		--time_based --runtime="$secs" --ramp_time=1 --output-format=json)
	case $1 in
	dsync-qd32) fio "${common[@]}" --direct=1 --sync=dsync --ioengine=libaio --iodepth=32 >"$3" ;;
	fdatasync-qd1) fio "${common[@]}" --direct=0 --fdatasync=1 --ioengine=psync >"$3" ;;
	fdatasync-8jobs) fio "${common[@]}" --direct=0 --fdatasync=1 --ioengine=psync --numjobs=8 --thread --group_reporting >"$3" ;;
	esac
}
workloads=(dsync-qd32 fdatasync-qd1 fdatasync-8jobs)
for w in "${workloads[@]}"; do
	for r in $(seq 1 "$rounds"); do
		run "$w" "$raw" "$dir/$w-raw-$r.json"
		run "$w" "$disk" "$dir/$w-vdisk-$r.json"
	done
done
python3 - "$dir" "$rounds" "${workloads[@]}" <<'PY'
import json, statistics as st, sys
d, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
iops = lambda p: json.load(open(p))["jobs"][0]["write"]["iops"]
for w in workloads:
    raw = [iops(f"{d}/{w}-raw-{r}.json") for r in range(1, rounds + 1)]
    vd = [iops(f"{d}/{w}-vdisk-{r}.json") for r in range(1, rounds + 1)]
    print(f"{w}: rounds raw {' '.join(f'{x:.0f}' for x in raw)} | vdiskfs {' '.join(f'{x:.0f}' for x in vd)}")
    ratios = [v / r for v, r in zip(vd, raw)]
    print(f"{w}: raw median {st.median(raw):.0f} IOPS ({min(raw):.0f}-{max(raw):.0f}), "
          f"vdiskfs median {st.median(vd):.0f} ({min(vd):.0f}-{max(vd):.0f}), "
          f"ratio median {st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
PY
