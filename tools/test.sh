#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls this through `make test`).
# It installs what the tests need, then, over both Go modules (vdiskfs and
# tools/compare): gofmt, go vet, staticcheck, the race
# detector over every package with concurrency (-short sizes), the full suite
# without it, the build with the Ceph RBD backend (tag rbd) and its tests on
# a one-node cluster (tools/test-rbd.sh), and a last look for mounts or loop
# devices left behind.
set -euo pipefail
cd "$(dirname "$0")/.."

# Every stage has a bound (apt-get, the go test -timeout of each package,
# the RBD stage), so that a hang fails the run with a stack trace, well
# inside CI's own limit, instead of being cut off with nothing to read.
# A clean run takes 10-22 minutes on 2 CPUs, depending on what else runs.

log() { printf '\n== %s\n' "$*"; }

# Debian packages the tests use: fio, qemu-img, qemu-storage-daemon (the
# reference vhost-user-blk server of vhostuser/frontend's tests) and a QEMU guest (with a static
# busybox initramfs) drive real clients through the mount, e2fsprogs and
# util-linux (losetup, unshare) the file-system tests, fuse3 gives
# fusermount for non-root fallbacks and mount.fuse3 for mount -t fuse.vdisk,
# systemd's systemd-analyze verifies the unit, man-db renders the generated
# man pages, dpkg-deb lists the package. Some tests install what is missing
# themselves too.
need_pkgs=()
for pair in fio:fio qemu-img:qemu-utils qemu-system-x86_64:qemu-system-x86 qemu-storage-daemon:qemu-system-common /bin/busybox:busybox-static mkfs.ext4:e2fsprogs losetup:util-linux fusermount3:fuse3 systemd-analyze:systemd man:man-db dpkg-deb:dpkg; do
	cmd=${pair%%:*} pkg=${pair##*:}
	command -v "$cmd" >/dev/null 2>&1 || need_pkgs+=("$pkg")
done
if ((${#need_pkgs[@]})); then
	if [ "$(id -u)" = 0 ]; then
		log "installing ${need_pkgs[*]}"
		export DEBIAN_FRONTEND=noninteractive
		timeout 5m apt-get update -qq
		timeout 10m apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
	else
		echo "missing ${need_pkgs[*]} and not root: tests that need them will fail" >&2
	fi
fi

# Every test's temporary directory (and so every mount point, store and
# loop-device backing file) lives under one directory of this run, so what
# the tests leave behind can be told from anything else on the machine.
run_tmp=$(mktemp -d "${TMPDIR:-/tmp}/vdiskfs-test.XXXXXX")
# Others may enter it (not list or write it): tests that run a client as
# another user reach their mounts and binaries below it.
chmod 0711 "$run_tmp"
export TMPDIR=$run_tmp
list_mounts() { awk -v p="$run_tmp/" 'index($2, p) == 1 {print $2}' /proc/mounts; }
list_loops() { if command -v losetup >/dev/null; then losetup -a | grep -F "$run_tmp/" || true; fi; }

# Two Go modules: vdiskfs itself, and the compare tool (tools/compare, its
# own module so that its charting stack stays out of vdiskfs's go.mod).
modules=(. tools/compare)
in_modules() { for m in "${modules[@]}"; do (cd "$m" && "$@"); done; }

log "go mod download"
in_modules go mod download

log "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

log "go vet"
in_modules go vet ./...

log "staticcheck"
STATICCHECK_VERSION=v0.8.2
if ! command -v staticcheck >/dev/null 2>&1; then
	GOFLAGS= go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
fi
staticcheck_bin=$(command -v staticcheck || echo "$(go env GOPATH)/bin/staticcheck")
in_modules "$staticcheck_bin" ./...

log "make deb, and what the package holds (dpkg-deb -c)"
make deb BUILD="$run_tmp/build" >/dev/null
deb=$(ls "$run_tmp"/build/vdiskfs_*.deb)
dpkg-deb -I "$deb" | grep -E '^ (Package|Version|Architecture|Depends):'
contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for want in ./usr/bin/vdisk ./usr/lib/systemd/system/vdiskfs@.service \
	./usr/share/man/man1/vdisk.1.gz ./usr/share/man/man1/vdisk-mount.1.gz ./usr/share/man/man1/vdisk-umount.1.gz \
	./usr/share/bash-completion/completions/vdisk ./usr/share/zsh/vendor-completions/_vdisk \
	./usr/share/fish/vendor_completions.d/vdisk.fish \
	./usr/share/vdiskfs/grafana/vdiskfs.json ./usr/share/vdiskfs/prometheus/alerts.yml; do
	if ! grep -qxF "$want" <<<"$contents"; then
		echo "the package lacks $want; it holds:"; echo "$contents"; exit 1
	fi
done
echo "$(wc -l <<<"$contents") entries, all expected ones there"
dpkg-deb -x "$deb" "$run_tmp/deb-root"
"$run_tmp/deb-root/usr/bin/vdisk" --version
rm -rf "$run_tmp/build" "$run_tmp/deb-root"

log "go test -race -short (every package)"
in_modules go test -race -short -count=1 -timeout 20m ./...

log "go test (full sizes)"
in_modules go test -count=1 -timeout 20m ./... 2>&1 | tee "$run_tmp/full.log"

# The file-system suite once more over /dev/fuse: the runs above mount
# with the default transport, io_uring where the kernel has it (as here),
# and tests that choose none would otherwise never serve over /dev/fuse.
log "go test ./fs/ over /dev/fuse (VDISKFS_TEST_TRANSPORT=dev)"
VDISKFS_TEST_TRANSPORT=dev go test -count=1 -timeout 20m ./fs/ 2>&1 | tee -a "$run_tmp/full.log"

# Where CI's time goes: every package's time in the full-size run, slowest
# first (go test prints it on each package's ok line).
log "time per package (full sizes, slowest first)"
awk '$1 == "ok" && $3 ~ /s$/ {t = $3; sub(/s$/, "", t); printf "%8.1fs  %s\n", t, $2}' "$run_tmp/full.log" | sort -rn | head -20

# Stores on Ceph RBD (build tag rbd), against a one-node cluster that
# tools/test-rbd.sh starts and stops.
log "RBD (tools/test-rbd.sh)"
timeout 30m tools/test-rbd.sh

log "nothing left behind"
if [ -n "$(list_mounts)" ]; then
	echo "mounts left behind by the tests:"; list_mounts; exit 1
fi
if [ -n "$(list_loops)" ]; then
	echo "loop devices left behind by the tests:"; list_loops; exit 1
fi
rm -rf "$run_tmp"
echo "all tests passed"
