#!/usr/bin/env bash
# Runs the kill -9 crash loop through a real mount for as many cycles as you
# like (CI runs 50): tools/crashloop.sh [CYCLES] [SEED]
# Each cycle mounts the store, runs O_DIRECT and buffered writes, punches,
# truncates and fsyncs on four disks, kills the daemon with SIGKILL at a
# random moment, remounts and checks every fsynced byte and disk isolation;
# every tenth cycle also unmounts cleanly and runs vdisk fsck.
set -euo pipefail
cd "$(dirname "$0")/.."
export VDISK_CRASH_CYCLES=${1:-1000}
[ $# -ge 2 ] && export VDISK_SEED=$2
exec go test -count=1 -v -timeout 0 -run TestCrashLoop ./tests/crashloop
