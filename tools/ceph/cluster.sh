#!/usr/bin/env bash
# A one-node Ceph cluster for trying and testing vdiskfs on RBD, from Debian's
# packages, on 127.0.0.1 only, without systemd:
#
#   tools/ceph/cluster.sh start [DIR]   install what is missing (as root), start
#                                       one mon and one OSD, create the pool
#                                       "rbd", print the environment to use it
#   tools/ceph/cluster.sh stop [DIR]    stop every process it started (by PID)
#                                       and remove DIR
#   tools/ceph/cluster.sh status [DIR]  the PIDs and `ceph -s`
#   tools/ceph/cluster.sh env [DIR]     print `export CEPH_CONF=DIR/ceph.conf`
#   tools/ceph/cluster.sh install       only install what is missing: the
#                                       daemons, the CLI, librbd-dev and
#                                       librados-dev (to build with -tags rbd)
#
# DIR (default $VDISK_CEPH_DIR, else /tmp/vdiskfs-ceph) holds ceph.conf, the
# mon's store, logs, admin sockets and one PID file per daemon; nothing else
# on the machine is touched. The OSD keeps its data in RAM (memstore, with
# "memstore page set" on: without it 4 KiB writes crawl), so a stop throws the
# data away; the pool has one replica. Authentication is off (auth none):
# the cluster listens on loopback only. A dead client's watch times out in
# 5 s (osd client watch timeout), not 30, so tests of a killed lock holder
# are quick. The OSD's malloc keeps large buffers mapped (see where it
# starts), so its speed does not swing with its heap's state. Start takes
# about 10 s once the packages are there.
#
# Environment: VDISK_CEPH_PORT (mon msgr2 port, default 3300; msgr1 is
# that + 3489, so 6789 by default; unset, a busy 3300 or 6789 moves the
# mon to the first free pair of 3310, 3320 ... 3390, so a second cluster
# on the machine, such as a benchmark's, does not stop the tests),
# VDISK_CEPH_OSD_BYTES (the memstore's
# capacity, default 4G; it takes RAM only as data is written).
#
#   eval "$(tools/ceph/cluster.sh start)"
#   vdisk format rbd:rbd/store --size 8G && vdisk mount rbd:rbd/store /mnt/vdisks
#   ...
#   tools/ceph/cluster.sh stop
set -euo pipefail

cmd=${1:-}
dir=${2:-${VDISK_CEPH_DIR:-/tmp/vdiskfs-ceph}}
v2port=${VDISK_CEPH_PORT:-3300}
v1port=$((v2port + 3489))
osd_bytes=${VDISK_CEPH_OSD_BYTES:-4G}

say() { printf 'ceph: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# Debian packages: the daemons, the CLI (ceph, rbd) and the headers go-ceph
# builds against.
need_packages() {
	local pkgs=() pair
	for pair in ceph-mon:ceph-mon ceph-osd:ceph-osd rbd:ceph-common ceph:ceph-common \
		/usr/include/rbd/librbd.h:librbd-dev /usr/include/rados/librados.h:librados-dev uuidgen:uuid-runtime; do
		local what=${pair%%:*} pkg=${pair##*:}
		if [[ $what == /* ]]; then [ -e "$what" ] && continue; else command -v "$what" >/dev/null 2>&1 && continue; fi
		[[ " ${pkgs[*]} " == *" $pkg "* ]] || pkgs+=("$pkg")
	done
	((${#pkgs[@]})) || return 0
	[ "$(id -u)" = 0 ] || die "missing ${pkgs[*]}: install them (apt-get install ${pkgs[*]}) or run as root"
	say "installing ${pkgs[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
}

# pid_alive PIDFILE NAME: the PID in PIDFILE is a live process running NAME.
pid_alive() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || return 1
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
	[ "$(basename "$(readlink "/proc/$pid/exe" 2>/dev/null)")" = "$2" ]
}

port_busy() { ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }

write_conf() {
	local fsid
	fsid=$(uuidgen)
	cat >"$dir/ceph.conf" <<EOF
# Written by tools/ceph/cluster.sh: a one-node test cluster on loopback.
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$v2port,v1:127.0.0.1:$v1port]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = none
auth service required = none
auth client required = none
run dir = $dir/run
log file = $dir/log/\$name.log
admin socket = $dir/run/\$name.asok
# One OSD: one replica, and no warnings about it.
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
mon data avail crit = 1
# A killed client's watch on an image (and so its exclusive lock) expires
# after 5 s instead of 30.
osd client watch timeout = 5

[mon.a]
mon data = $dir/mon
mon cluster log file = $dir/log/mon-cluster.log

[osd.0]
osd data = $dir/osd
osd objectstore = memstore
memstore page set = true
memstore device bytes = $osd_bytes
osd class load list = *
osd class default list = *
# No disk behind it: small timeouts are fine, and nothing to scrub.
osd scrub load threshold = 0
osd max scrubs = 0

[client]
# Many clients (vdisk, rbd, ceph, fio) run at once: no admin socket for them,
# or the second fails to create the first's.
admin socket =
log file = $dir/log/client.log
EOF
}

start() {
	need_packages
	if [ -f "$dir/mon.pid" ] && pid_alive "$dir/mon.pid" ceph-mon; then
		die "a cluster is already running in $dir (stop it first: $0 stop $dir)"
	fi
	if [ -z "${VDISK_CEPH_PORT:-}" ]; then
		local p
		for p in $(seq 3300 10 3390); do
			if ! port_busy "$p" && ! port_busy $((p + 3489)); then
				v2port=$p v1port=$((p + 3489))
				break
			fi
		done
	fi
	for p in "$v2port" "$v1port"; do
		port_busy "$p" && die "port $p on this machine is in use (another cluster?): set VDISK_CEPH_PORT"
	done
	rm -rf "$dir"
	mkdir -p "$dir"/{mon,osd,run,log}
	write_conf
	export CEPH_CONF=$dir/ceph.conf

	# The mon: an initial monmap with only itself, then the daemon in the
	# foreground (-f) of a background job, so that its PID is ours to keep.
	monmaptool --create --fsid "$(awk '/^fsid/ {print $3}' "$dir/ceph.conf")" \
		--addv a "[v2:127.0.0.1:$v2port,v1:127.0.0.1:$v1port]" "$dir/monmap" >/dev/null
	ceph-mon -i a --mkfs --monmap "$dir/monmap" --keyring /dev/null >>"$dir/log/setup.log" 2>&1 \
		|| die "ceph-mon --mkfs failed: see $dir/log/setup.log"
	setsid ceph-mon -i a -f </dev/null >>"$dir/log/mon.out" 2>&1 &
	echo $! >"$dir/mon.pid"
	wait_for "the mon" 30 ceph --connect-timeout 5 mon stat

	# The OSD.
	local uuid id
	uuid=$(uuidgen)
	id=$(ceph osd new "$uuid")
	[ "$id" = 0 ] || die "ceph osd new gave id $id, want 0"
	ceph-osd -i 0 --mkfs --osd-uuid "$uuid" >>"$dir/log/setup.log" 2>&1 \
		|| die "ceph-osd --mkfs failed: see $dir/log/setup.log"
	# glibc's malloc in the OSD: messages up to 32 MiB come from its
	# heaps, and up to 1 GiB of free heap stays mapped. With the defaults
	# the OSD swung between rounds from ~1000 to ~300 MiB/s of 1 MiB
	# writes, a profile of the slow phase showing a fresh mmap, and a page
	# fault on every 4 KiB of it, for each message it read off the socket.
	MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=1073741824 setsid ceph-osd -i 0 -f </dev/null >>"$dir/log/osd.out" 2>&1 &
	echo $! >"$dir/osd.pid"
	wait_for "the OSD" 60 sh -c 'ceph osd stat -f json | grep -q "\"num_up_osds\":1"'

	# The pool vdiskfs tests and examples use.
	ceph osd pool create rbd 32 >/dev/null 2>&1
	ceph osd pool set rbd size 1 --yes-i-really-mean-it >/dev/null 2>&1
	rbd pool init rbd
	wait_for "the pool" 60 rbd create --size 4M rbd/.probe
	rbd rm --no-progress rbd/.probe >/dev/null
	say "running in $dir (mon pid $(cat "$dir/mon.pid"), osd pid $(cat "$dir/osd.pid"))"
	echo "export CEPH_CONF=$dir/ceph.conf"
}

# wait_for WHAT SECONDS COMMAND...: run COMMAND until it succeeds, at most
# SECONDS; fail naming WHAT and pointing at the logs.
wait_for() {
	local what=$1 secs=$2 t0=$SECONDS
	shift 2
	until "$@" >/dev/null 2>&1; do
		if ((SECONDS - t0 >= secs)); then
			say "$what did not come up in ${secs}s; the logs are in $dir/log:"
			tail -n 20 "$dir"/log/*.log "$dir"/log/*.out 2>/dev/null >&2 || true
			stop >/dev/null 2>&1 || true
			exit 1
		fi
		for d in mon osd; do
			if [ -f "$dir/$d.pid" ] && ! pid_alive "$dir/$d.pid" "ceph-$d"; then
				say "ceph-$d exited while waiting for $what:"
				tail -n 20 "$dir/log/$d.out" "$dir/log/$d."*.log 2>/dev/null >&2 || true
				stop >/dev/null 2>&1 || true
				exit 1
			fi
		done
		sleep 0.5
	done
}

# stop: the OSD, then the mon, each by the PID we recorded and only if it
# still runs that program: SIGTERM, then SIGKILL after 10 s.
stop() {
	[ -d "$dir" ] || return 0
	local d pid
	for d in osd mon; do
		pid_alive "$dir/$d.pid" "ceph-$d" || continue
		pid=$(cat "$dir/$d.pid")
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 100); do
			[ -d "/proc/$pid" ] || break
			sleep 0.1
		done
		if [ -d "/proc/$pid" ]; then
			say "ceph-$d (pid $pid) did not stop in 10 s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
		fi
	done
	rm -rf "$dir"
}

status() {
	local d
	for d in mon osd; do
		if pid_alive "$dir/$d.pid" "ceph-$d"; then echo "ceph-$d: pid $(cat "$dir/$d.pid")"; else echo "ceph-$d: not running"; fi
	done
	[ -f "$dir/ceph.conf" ] && CEPH_CONF=$dir/ceph.conf ceph --connect-timeout 5 -s
}

case $cmd in
start) start ;;
stop) stop ;;
status) status ;;
env) echo "export CEPH_CONF=$dir/ceph.conf" ;;
install) need_packages ;;
*) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0" >&2; exit 2 ;;
esac
