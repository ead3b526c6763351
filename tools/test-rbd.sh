#!/usr/bin/env bash
# The tests of stores on Ceph RBD (build tag rbd), as tools/test.sh (and so
# CI) runs them, and as anyone can on a machine like CI's (root, Debian 12,
# /dev/fuse): go vet and staticcheck of the tagged build, then a one-node
# cluster (tools/ceph/cluster.sh, which installs the Ceph packages when
# missing), the backend's RBD tests (with -race), the CLI's, the
# end-to-end ones (tests/e2e TestRBD*) and the compare tool's (its librbd
# target and stores on RBD), and the fs suite's core cases on RBD
# images (VDISKFS_TEST_RBD), with TestOwnerIO for the queue owners' own RBD
# I/O (their completion queues). The cluster is stopped however the run ends.
# With CI=true every RBD test fails, rather than skips, without a cluster.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '\n== %s\n' "$*"; }
t0=$SECONDS

log "RBD: go vet, staticcheck and build with -tags rbd (needs librbd-dev, librados-dev)"
tools/ceph/cluster.sh install
for m in . tools/compare; do
	(cd "$m" && go vet -tags rbd ./... && { "$(go env GOPATH)/bin/staticcheck" -tags rbd ./... 2>/dev/null || staticcheck -tags rbd ./...; })
done
go build -tags rbd -o /dev/null ./cmd/vdisk
echo "$((SECONDS - t0)) s"

log "RBD: a one-node Ceph cluster"
ceph_dir=$(mktemp -d "${TMPDIR:-/tmp}/vdiskfs-ceph.XXXXXX")
trap 'tools/ceph/cluster.sh stop "$ceph_dir" || true' EXIT
t1=$SECONDS
# Not eval "$(...)": that would hide a failed start from set -e.
ceph_env=$(tools/ceph/cluster.sh start "$ceph_dir")
eval "$ceph_env"
echo "up in $((SECONDS - t1)) s"

log "RBD: the backend (-race), the CLI, the end-to-end tests and the compare tool"
go test -race -tags rbd -count=1 -run 'RBD' ./image/backend
go test -tags rbd -count=1 -timeout 15m -run 'RBD|StoreName' ./cmd/vdisk ./tests/e2e
(cd tools/compare && go test -tags rbd -count=1 -timeout 10m -run 'RBD' .)

log "RBD: the fs suite's core cases on RBD images"
VDISKFS_TEST_RBD=1 go test -tags rbd -count=1 -timeout 15m \
	-run '^(TestCpSparse|TestFallocate|TestSeekDataHole|TestFsyncDurable|TestConcurrentWriters|TestNoENOSYS|TestOwnerIO)$' ./fs

tools/ceph/cluster.sh stop "$ceph_dir"
trap - EXIT
echo "RBD tests passed in $((SECONDS - t0)) s"
