#!/usr/bin/env bash
# Runs the kill -9 crash loop through a real mount for as many cycles as you
# like (CI runs 50):
#
#   tools/crashloop.sh [--load N] [CYCLES] [SEED]
#
# Each cycle mounts the store, runs O_DIRECT and buffered writes,
# synchronous writes, copy_file_range, punches, truncates, fsyncs and
# snapshots on four disks, kills the daemon with SIGKILL once a number of
# operations drawn from the seed have returned, remounts and checks every
# promised byte, every snapshot and disk isolation; every tenth cycle also
# unmounts cleanly and runs vdisk fsck. The seed is logged; passing it as
# SEED (or VDISK_SEED) replays the run's choices.
#
# --load N (or VDISK_CRASH_LOAD=N) runs N CPU hogs beside the test for its
# whole duration: a loaded machine stretches the daemon's windows, which is
# where timing-dependent bugs show. The test starts and kills the hogs
# itself, and they die with it if it is killed.
set -euo pipefail
cd "$(dirname "$0")/.."
while [ $# -gt 0 ]; do
	case $1 in
	--load)
		[ $# -ge 2 ] || { echo "usage: $0 [--load N] [CYCLES] [SEED]" >&2; exit 2; }
		export VDISK_CRASH_LOAD=$2
		shift 2
		;;
	--load=*)
		export VDISK_CRASH_LOAD=${1#--load=}
		shift
		;;
	*) break ;;
	esac
done
export VDISK_CRASH_CYCLES=${1:-1000}
[ $# -ge 2 ] && export VDISK_SEED=$2
exec go test -count=1 -v -timeout 0 -run 'TestCrashLoop$' ./tests/crashloop
