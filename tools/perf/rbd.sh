#!/bin/bash
# rbd.sh [ROUNDS] [SECONDS]: vdiskfs on an RBD store against librbd itself,
# side by side on one cluster. The raw side is fio's rbd engine (librbd's
# asynchronous API, no FUSE, no map) on an image; the vdiskfs side is fio
# (libaio, O_DIRECT) on a disk file of a mounted store on another image of
# the same size (SIZE, default 4G). Both use the same 2 GiB, laid out once
# with 1 MiB writes, and librbd's cache is off for both (vdiskfs turns it
# off; fio gets a configuration copy that says so). Workloads: 1 MiB
# sequential write and read at iodepth 16, 4 KiB random read and write at
# iodepth 32, each SECONDS (default 10) after 2 s of ramp, the two sides
# taking turns (the order alternating from round to round). It prints each
# pair's MB/s and IOPS, and the median and range of the ratios vdiskfs/raw.
#
# Needs root, /dev/fuse, fio (Debian's has the rbd engine), python3, and a
# vdisk built with the RBD backend (VDISK, default bin/vdisk: make build
# TAGS=rbd). With CEPH_CONF set it uses that cluster's pool POOL (default
# rbd); without, it starts a one-node cluster (tools/ceph/cluster.sh, a
# memstore OSD of 12 GiB) in DIR/ceph and stops it at the end.
# WORKLOADS="randread-4k-qd32 ..." runs only those; MOUNT_ARGS are added to
# vdisk mount (e.g. "--fuse-transport dev").
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3} secs=${2:-10}
vdisk=${VDISK:-bin/vdisk}
pool=${POOL:-rbd} size=${SIZE:-4G}
dir=${DIR:-/var/tmp/vdisk-rbd-bench}
raw=bench-raw-$$ store=rbd:$pool/bench-store-$$ mnt=$dir/mnt
mkdir -p "$dir"
started=
cleanup() {
	"$vdisk" umount "$mnt" >/dev/null 2>&1 || umount "$mnt" 2>/dev/null || true
	if [ -n "${CEPH_CONF:-}" ]; then
		rbd rm --no-progress "$pool/$raw" >/dev/null 2>&1 || true
		rbd rm --no-progress "${store#rbd:}" >/dev/null 2>&1 || true
	fi
	[ -n "$started" ] && tools/ceph/cluster.sh stop "$dir/ceph"
	rm -f "$dir"/*.json "$dir/fio.conf"
}
trap cleanup EXIT
if [ -z "${CEPH_CONF:-}" ]; then
	started=1
	eval "$(VDISK_CEPH_OSD_BYTES=12G tools/ceph/cluster.sh start "$dir/ceph")"
fi
"$vdisk" version | head -1 >&2
"$vdisk" ls rbd:x/y 2>&1 | grep -q "without Ceph RBD support" && { echo "$vdisk has no RBD backend: make build TAGS=rbd" >&2; exit 1; }

# fio's rbd engine reads CEPH_CONF: a copy with librbd's cache off.
awk '{print} /^\[client\]/ {print "rbd cache = false"; done=1} END {if (!done) print "[client]\nrbd cache = false"}' \
	"$CEPH_CONF" >"$dir/fio.conf"

rbd create --size "$size" "$pool/$raw"
"$vdisk" format "$store" --size "$size" >/dev/null
"$vdisk" mount "$store" "$mnt" ${MOUNT_ARGS:-} >/dev/null
truncate -s 2G "$mnt/bench.raw"
raw_args=(--ioengine=rbd --clientname=admin --pool="$pool" --rbdname="$raw")
vd_args=(--filename="$mnt/bench.raw" --ioengine=libaio --direct=1)
CEPH_CONF=$dir/fio.conf fio --name=layout "${raw_args[@]}" --size=2G --rw=write --bs=1M --iodepth=16 >/dev/null
fio --name=layout "${vd_args[@]}" --size=2G --rw=write --bs=1M --iodepth=16 --end_fsync=1 >/dev/null

. tools/perf/workloads.sh
read -r -a workloads <<<"${WORKLOADS:-$default_workloads}"
run() { # run SIDE WORKLOAD OUT
	local args
	args=$(workload_args "$2")
	# shellcheck disable=SC2086 # args is several options
	local common=(--name=w --size=2G $args --time_based --runtime="$secs" --ramp_time=2 --output-format=json)
	if [ "$1" = raw ]; then
		CEPH_CONF=$dir/fio.conf fio "${raw_args[@]}" "${common[@]}" >"$3"
	else
		fio "${vd_args[@]}" "${common[@]}" >"$3"
	fi
}
for r in $(seq 1 "$rounds"); do
	for w in "${workloads[@]}"; do
		if ((r % 2)); then order="raw vdisk"; else order="vdisk raw"; fi
		for side in $order; do run "$side" "$w" "$dir/$w-$side-$r.json"; done
	done
done
python3 - "$dir" "$rounds" "${workloads[@]}" <<'PY'
import json, statistics as st, sys
d, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def fig(p):
    j = json.load(open(p))["jobs"][0]
    return (j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 2**20, j["read"]["iops"] + j["write"]["iops"]
for w in workloads:
    raw = [fig(f"{d}/{w}-raw-{r}.json") for r in range(1, rounds + 1)]
    vd = [fig(f"{d}/{w}-vdisk-{r}.json") for r in range(1, rounds + 1)]
    ratios = [b[0] / a[0] for a, b in zip(raw, vd)]
    print(f"{w}: raw librbd {' '.join(f'{m:.0f}' for m, _ in raw)} MiB/s | vdiskfs {' '.join(f'{m:.0f}' for m, _ in vd)} MiB/s")
    print(f"{w}: raw median {st.median(m for m, _ in raw):.0f} MiB/s {st.median(i for _, i in raw):.0f} IOPS, "
          f"vdiskfs median {st.median(m for m, _ in vd):.0f} MiB/s {st.median(i for _, i in vd):.0f} IOPS, "
          f"ratio median {st.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
PY
