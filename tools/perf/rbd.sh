#!/bin/bash
# rbd.sh [ROUNDS] [SECONDS]: vdiskfs on an RBD store against librbd itself,
# side by side on one cluster. The raw side is fio's rbd engine (librbd's
# asynchronous API, no FUSE, no map) on an image; each vdiskfs side is fio
# (libaio, O_DIRECT) on a disk file of a mounted store on another image of
# the same size (SIZE, default 4G). All use the same 2 GiB, laid out once
# with 1 MiB writes, and librbd's cache is off for all (vdiskfs turns it
# off; fio gets a configuration copy that says so). Workloads: 1 MiB
# sequential write and read at iodepth 16, 4 KiB random read and write at
# iodepth 32, each SECONDS (default 10) after 2 s of ramp, the sides
# taking turns (the order rotating from round to round). It prints each
# side's MB/s and IOPS per round, the median and range of the ratios
# vdiskfs/raw (each against the raw run of its own round), and each
# daemon's CPU per I/O (from /proc/PID/stat, ramp included).
#
# Needs root, /dev/fuse, fio (Debian's has the rbd engine), python3, and a
# vdisk built with the RBD backend (VDISK, default bin/vdisk: make build
# TAGS=rbd). VDISK may name several binaries, as NAME=PATH words
# (VDISK="old=/tmp/vdisk-old new=bin/vdisk"): each gets its own store and
# mount and takes its turn in every round, so old and new are measured side
# by side under the same load. With CEPH_CONF set it uses that cluster's
# pool POOL (default rbd; it needs about 2 GiB per side plus the raw
# image's); without, it starts a one-node cluster (tools/ceph/cluster.sh, a
# memstore OSD of 16 GiB) in DIR/ceph and stops it at the end.
# WORKLOADS="rand-read-4k-qd32 ..." runs only those; MOUNT_ARGS are added to
# vdisk mount (e.g. "--fuse-transport dev").
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3} secs=${2:-10}
pool=${POOL:-rbd} size=${SIZE:-4G}
dir=${DIR:-/var/tmp/vdisk-rbd-bench}
raw=bench-raw-$$
names=() bins=()
for v in ${VDISK:-bin/vdisk}; do
	if [[ $v == *=* ]]; then names+=("${v%%=*}") bins+=("${v#*=}"); else names+=(vdisk) bins+=("$v"); fi
done
mkdir -p "$dir"
started=
cleanup() {
	local i
	for i in "${!names[@]}"; do
		"${bins[$i]}" umount "$dir/mnt-${names[$i]}" >/dev/null 2>&1 || umount "$dir/mnt-${names[$i]}" 2>/dev/null || true
	done
	if [ -n "${CEPH_CONF:-}" ]; then
		rbd rm --no-progress "$pool/$raw" >/dev/null 2>&1 || true
		for i in "${!names[@]}"; do rbd rm --no-progress "$pool/bench-store-${names[$i]}-$$" >/dev/null 2>&1 || true; done
	fi
	[ -n "$started" ] && tools/ceph/cluster.sh stop "$dir/ceph"
	rm -f "$dir"/*.json "$dir"/*.cpu "$dir/fio.conf"
}
trap cleanup EXIT
if [ -z "${CEPH_CONF:-}" ]; then
	started=1
	eval "$(VDISK_CEPH_OSD_BYTES=16G tools/ceph/cluster.sh start "$dir/ceph")"
fi
for i in "${!names[@]}"; do
	printf '%s: %s\n' "${names[$i]}" "$("${bins[$i]}" version | head -1)" >&2
	"${bins[$i]}" ls rbd:x/y 2>&1 | grep -q "without Ceph RBD support" && { echo "${bins[$i]} has no RBD backend: make build TAGS=rbd" >&2; exit 1; }
done

# fio's rbd engine reads CEPH_CONF: a copy with librbd's cache off.
awk '{print} /^\[client\]/ {print "rbd cache = false"; done=1} END {if (!done) print "[client]\nrbd cache = false"}' \
	"$CEPH_CONF" >"$dir/fio.conf"

rbd create --size "$size" "$pool/$raw"
raw_args=(--ioengine=rbd --clientname=admin --pool="$pool" --rbdname="$raw")
CEPH_CONF=$dir/fio.conf fio --name=layout "${raw_args[@]}" --size=2G --rw=write --bs=1M --iodepth=16 >/dev/null
declare -A pids
for i in "${!names[@]}"; do
	n=${names[$i]} mnt=$dir/mnt-${names[$i]}
	"${bins[$i]}" format "rbd:$pool/bench-store-$n-$$" --size "$size" >/dev/null
	# shellcheck disable=SC2086 # MOUNT_ARGS is several options
	out=$("${bins[$i]}" mount "rbd:$pool/bench-store-$n-$$" "$mnt" ${MOUNT_ARGS:-})
	pids[$n]=$(sed -n 's/.*(pid \([0-9]*\).*/\1/p' <<<"$out")
	truncate -s 2G "$mnt/bench.raw"
	fio --name=layout --filename="$mnt/bench.raw" --ioengine=libaio --direct=1 --size=2G --rw=write --bs=1M --iodepth=16 --end_fsync=1 >/dev/null
done

# cpu PID: the process's user+system CPU in clock ticks.
cpu() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# The workloads, named as the compare tool's built-in job file names them.
default_workloads="seq-write-1m-qd16 seq-read-1m-qd16 rand-read-4k-qd32 rand-write-4k-qd32"
workload_args() {
	case $1 in
	seq-write-1m-qd1) echo --rw=write --bs=1M --iodepth=1 ;;
	seq-write-1m-qd16) echo --rw=write --bs=1M --iodepth=16 ;;
	ch-write-256k-qd64) echo --rw=write --bs=256k --iodepth=64 ;;
	seq-read-1m-qd16) echo --rw=read --bs=1M --iodepth=16 ;;
	rand-read-4k-qd32) echo --rw=randread --bs=4k --iodepth=32 ;;
	rand-write-4k-qd32) echo --rw=randwrite --bs=4k --iodepth=32 ;;
	*) echo "unknown workload $1 (want one of $default_workloads seq-write-1m-qd1 ch-write-256k-qd64)" >&2; return 1 ;;
	esac
}
read -r -a workloads <<<"${WORKLOADS:-$default_workloads}"
run() { # run SIDE WORKLOAD OUT
	local args before
	args=$(workload_args "$2")
	# shellcheck disable=SC2086 # args is several options
	local common=(--name=w --size=2G $args --time_based --runtime="$secs" --ramp_time=2 --output-format=json)
	if [ "$1" = raw ]; then
		CEPH_CONF=$dir/fio.conf fio "${raw_args[@]}" "${common[@]}" >"$3"
	else
		before=$(cpu "${pids[$1]}")
		fio --filename="$dir/mnt-$1/bench.raw" --ioengine=libaio --direct=1 "${common[@]}" >"$3"
		echo $(($(cpu "${pids[$1]}") - before)) >"${3%.json}.cpu"
	fi
}
sides=(raw "${names[@]}")
for r in $(seq 1 "$rounds"); do
	for w in "${workloads[@]}"; do
		k=$(((r - 1) % ${#sides[@]}))
		for side in "${sides[@]:k}" "${sides[@]:0:k}"; do run "$side" "$w" "$dir/$w-$side-$r.json"; done
	done
done
python3 - "$dir" "$rounds" "$secs" "$(getconf CLK_TCK)" "${names[*]}" "${workloads[@]}" <<'PY'
import json, statistics as st, sys
d, rounds, secs, tck, names, workloads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5].split(), sys.argv[6:]
R = range(1, rounds + 1)
def fig(p):
    j = json.load(open(p))["jobs"][0]
    return (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20, j["read"]["iops"] + j["write"]["iops"]
def cpu_us(w, n, r, iops):  # daemon CPU per I/O, ramp included
    t = int(open(f"{d}/{w}-{n}-{r}.cpu").read()) / tck
    return 1e6 * t / (iops * (secs + 2)) if iops else 0
mm = lambda xs: f"{st.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"
for w in workloads:
    raw = [fig(f"{d}/{w}-raw-{r}.json") for r in R]
    print(f"{w}: raw librbd {' '.join(f'{m:.0f}' for m, _ in raw)} MiB/s, median {st.median(m for m, _ in raw):.0f} MiB/s "
          f"{st.median(i for _, i in raw):.0f} IOPS")
    for n in names:
        vd = [fig(f"{d}/{w}-{n}-{r}.json") for r in R]
        ratios = [b[0] / a[0] for a, b in zip(raw, vd)]
        cpus = [cpu_us(w, n, r, i) for r, (_, i) in zip(R, vd)]
        print(f"{w}: {n} {' '.join(f'{m:.0f}' for m, _ in vd)} MiB/s, median {st.median(m for m, _ in vd):.0f} MiB/s "
              f"{st.median(i for _, i in vd):.0f} IOPS, ratio to raw median {mm(ratios)}, "
              f"daemon CPU {st.median(cpus):.0f} us/IO")
        if n != names[0]:  # against the first binary, round by round
            first = [fig(f"{d}/{w}-{names[0]}-{r}.json") for r in R]
            print(f"{w}: {n}/{names[0]} median {mm([b[0] / a[0] for a, b in zip(first, vd)])}")
PY
