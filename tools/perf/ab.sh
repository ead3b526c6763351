#!/bin/bash
# ab.sh OLD NEW [ROUNDS] [SECONDS]: a paired A/B of two vdisk binaries on
# the default mount, as a user runs it. One store, one 2 GiB disk laid out
# once; each round mounts OLD, runs the workloads, unmounts, then the same
# with NEW (the order alternating from round to round, so that drift of the
# machine hits both alike), each fio run SECONDS (default 8) after 1 s of
# ramp. Workloads (fio libaio, O_DIRECT): 1 MiB sequential write and read
# at iodepth 16, 4 KiB random read and write at iodepth 32. It prints each
# pair's MB/s and the median and range of the per-pair ratios NEW/OLD.
# WORKLOADS="randread-4k-qd32 ..." runs only those.
# OLD and NEW are paths of vdisk binaries (build one from an older commit
# with `git worktree add /tmp/old COMMIT && (cd /tmp/old && go build -o
# /tmp/vdisk-old ./cmd/vdisk)`). Needs root, /dev/fuse, fio and python3;
# DIR (default /var/tmp/vdisk-ab) must take O_DIRECT (not tmpfs).
set -euo pipefail
old=$1 new=$2 rounds=${3:-5} secs=${4:-8}
dir=${DIR:-/var/tmp/vdisk-ab}
mkdir -p "$dir"
store=$dir/store.img mnt=$dir/mnt
cleanup() { "$new" umount "$mnt" 2>/dev/null || umount "$mnt" 2>/dev/null || true; rm -f "$store" "$dir"/*.json; }
trap cleanup EXIT
rm -f "$store"
"$new" format "$store" --size 8G >/dev/null
"$new" mount "$store" "$mnt" >/dev/null
fio --name=layout --filename="$mnt/ab.raw" --size=2G --rw=write --bs=1M --iodepth=16 \
	--direct=1 --ioengine=libaio --end_fsync=1 >/dev/null
"$new" umount "$mnt"

. "$(dirname "$0")/workloads.sh"
read -r -a workloads <<<"${WORKLOADS:-$default_workloads}"
run() { # run WORKLOAD OUT
	local args
	args=$(workload_args "$1")
	# shellcheck disable=SC2086 # args is several options
	fio --name=w --filename="$mnt/ab.raw" --size=2G $args --direct=1 \
		--ioengine=libaio --time_based --runtime="$secs" --ramp_time=1 --output-format=json >"$2"
}
side() { # side NAME BINARY ROUND
	"$2" mount "$store" "$mnt" >/dev/null
	for w in "${workloads[@]}"; do run "$w" "$dir/$w-$1-$3.json"; done
	"$new" umount "$mnt"
}
for r in $(seq 1 "$rounds"); do
	if ((r % 2)); then side old "$old" "$r"; side new "$new" "$r"; else side new "$new" "$r"; side old "$old" "$r"; fi
done
python3 - "$dir" "$rounds" "${workloads[@]}" <<'PY'
import json, statistics as st, sys
d, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def mbs(p):
    j = json.load(open(p))["jobs"][0]
    return (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e6
for w in workloads:
    o = [mbs(f"{d}/{w}-old-{r}.json") for r in range(1, rounds + 1)]
    n = [mbs(f"{d}/{w}-new-{r}.json") for r in range(1, rounds + 1)]
    ratios = [b / a for a, b in zip(o, n)]
    print(f"{w}: old {' '.join(f'{x:.0f}' for x in o)} MB/s | new {' '.join(f'{x:.0f}' for x in n)} MB/s")
    print(f"{w}: old median {st.median(o):.0f}, new median {st.median(n):.0f}, "
          f"per-pair ratio median {st.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
PY
