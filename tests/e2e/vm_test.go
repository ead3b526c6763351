package e2e

import (
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/tcgguest"
)

// The guest's disk and the pattern its writes come from.
const (
	vmDiskSize    = 512 << 20
	vmPatternSize = 30 << 20
	vmMemory      = "256M"
)

// guestOp is one step of the guest's script: a dd from the pattern file
// (pattern bytes [pat, pat+n) to disk bytes [off, off+n), bs bytes a
// request), a blkdiscard of [off, off+n), or a write-zeroes of it.
type guestOp struct {
	what    string
	discard bool
	zero    bool // BLKZEROOUT (guestzeroout): VIRTIO_BLK_T_WRITE_ZEROES
	off, n  int64
	pat     int64
	bs      string
	direct  bool
	par     bool // run in the background with the par steps next to it
	// hostOnly: the guest does not check the step's range (the host
	// does, in a test of its own).
	hostOnly bool
}

// wipes reports whether the step leaves zeros (a discard or a zeroing).
func (op guestOp) wipes() bool { return op.discard || op.zero }

// vmOps: large and small requests, O_DIRECT and through the guest's page
// cache (flushed with fsync), 4 KiB-aligned and 512-aligned, overwrites
// inside a written region, the last MiB of the disk, discards, and a write
// into a discarded range. All discards are 1 MiB-aligned, so what they
// leave is defined: zeros.
var vmOps = []guestOp{
	{what: "16 MiB at 0, bs=1M, O_DIRECT", off: 0, n: 16 << 20, pat: 0, bs: "1M", direct: true},
	{what: "4 MiB at 100 MiB+4 KiB, bs=4k, O_DIRECT", off: 100<<20 + 4096, n: 4 << 20, pat: 16 << 20, bs: "4k", direct: true},
	{what: "1 MiB at 200 MiB+512, bs=512, O_DIRECT", off: 200<<20 + 512, n: 1 << 20, pat: 20 << 20, bs: "512", direct: true},
	{what: "3 MiB at 300 MiB, bs=64k, buffered", off: 300 << 20, n: 3 << 20, pat: 21 << 20, bs: "64k"},
	{what: "256 KiB at 2 MiB+512, bs=4k, O_DIRECT (overwrite, not 4 KiB-aligned)", off: 2<<20 + 512, n: 256 << 10, pat: 24 << 20, bs: "4k", direct: true},
	{what: "the last MiB, bs=1M, O_DIRECT", off: vmDiskSize - 1<<20, n: 1 << 20, pat: 24<<20 + 256<<10, bs: "1M", direct: true},
	{what: "discard 4 MiB at 8 MiB", discard: true, off: 8 << 20, n: 4 << 20},
	{what: "discard 1 MiB at 301 MiB", discard: true, off: 301 << 20, n: 1 << 20},
	{what: "64 KiB at 9 MiB, bs=4k, O_DIRECT (into the discarded range)", off: 9 << 20, n: 64 << 10, pat: 25<<20 + 256<<10, bs: "4k", direct: true},
	{what: "4 writers at once: 1 MiB at 400 MiB, bs=64k, O_DIRECT", off: 400 << 20, n: 1 << 20, pat: 26 << 20, bs: "64k", direct: true, par: true},
	{what: "4 writers at once: 1 MiB at 401 MiB+4 KiB, bs=16k, O_DIRECT", off: 401<<20 + 4096, n: 1 << 20, pat: 27 << 20, bs: "16k", direct: true, par: true},
	{what: "4 writers at once: 1 MiB at 402 MiB+8 KiB, bs=4k, O_DIRECT", off: 402<<20 + 8192, n: 1 << 20, pat: 28 << 20, bs: "4k", direct: true, par: true},
	{what: "4 writers at once: 1 MiB at 403 MiB+12 KiB, bs=128k, buffered", off: 403<<20 + 12288, n: 1 << 20, pat: 29 << 20, bs: "128k", par: true},
}

// vmHoles are ranges never written, checked to read as zeros.
var vmHoles = [][2]int64{{50 << 20, 1 << 20}, {vmDiskSize - 2<<20, 1 << 20}}

// vmPattern is the deterministic content the guest writes from.
func vmPattern() []byte {
	var seed [32]byte
	copy(seed[:], "vdiskfs e2e guest pattern, v1")
	p := make([]byte, vmPatternSize)
	rand.NewChaCha8(seed).Read(p)
	return p
}

// expectedRange is what disk bytes [off, off+n) hold after ops.
func expectedRange(ops []guestOp, pattern []byte, off, n int64) []byte {
	buf := make([]byte, n)
	for _, op := range ops {
		lo, hi := max(off, op.off), min(off+n, op.off+op.n)
		if lo >= hi {
			continue
		}
		if op.wipes() {
			clear(buf[lo-off : hi-off])
		} else {
			copy(buf[lo-off:hi-off], pattern[op.pat+lo-op.off:op.pat+hi-op.off])
		}
	}
	return buf
}

// expectedAllocated is the bytes of the store's blocks (bs bytes each)
// written and not since wholly discarded: what a thin disk should hold
// after ops. A zeroing may free the blocks it wholly covers or allocate
// them (both are right): zeroFrees picks which.
func expectedAllocated(ops []guestOp, size, bs int64, zeroFrees bool) int64 {
	blocks := make([]bool, (size+bs-1)/bs)
	for _, op := range ops {
		if op.discard || (op.zero && zeroFrees) {
			for b := (op.off + bs - 1) / bs; (b+1)*bs <= op.off+op.n; b++ {
				blocks[b] = false
			}
			continue
		}
		for b := op.off / bs; b*bs < op.off+op.n; b++ {
			blocks[b] = true
		}
	}
	var n int64
	for _, set := range blocks {
		if set {
			n += bs
		}
	}
	return n
}

// guestInit is the guest's /init: load the virtio modules, run ops on
// /dev/vda, drop the caches, check every range's md5 with O_DIRECT reads,
// print E2E-RESULT PASS or FAIL, and power off.
func guestInit(ops []guestOp, checks [][2]int64, pattern []byte, modules []string) string {
	var s strings.Builder
	fmt.Fprintf(&s, `#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
up() { cut -d' ' -f1 /proc/uptime; }
fail() { echo "E2E-RESULT FAIL: $*"; sync; poweroff -f; sleep 30; }
echo "E2E-INIT kernel $(uname -r), up $(up) s"
`)
	for _, m := range modules {
		fmt.Fprintf(&s, "insmod /lib/modules/%[1]s || fail 'insmod %[1]s'\n", filepath.Base(m))
	}
	fmt.Fprintf(&s, `n=0
while [ ! -b /dev/vda ]; do n=$((n+1)); [ $n -gt 300 ] && fail "no /dev/vda"; sleep 0.1; done
size=$(blockdev --getsize64 /dev/vda)
[ "$size" = %d ] || fail "/dev/vda is $size bytes"
q=/sys/block/vda/queue
echo "E2E-DISK size=$size logical_block_size=$(cat $q/logical_block_size) physical_block_size=$(cat $q/physical_block_size) discard_granularity=$(cat $q/discard_granularity) discard_max_bytes=$(cat $q/discard_max_bytes) write_zeroes_max_bytes=$(cat $q/write_zeroes_max_bytes) write_cache=$(cat $q/write_cache) queues=$(ls /sys/block/vda/mq | wc -l) up=$(up)"
`, vmDiskSize)
	for i, op := range ops {
		fmt.Fprintf(&s, "echo \"E2E-STEP %d: %s, up=$(up)\"\n", i+1, op.what)
		switch {
		case op.discard:
			fmt.Fprintf(&s, "blkdiscard -o %d -l %d /dev/vda || fail 'step %d'\n", op.off, op.n, i+1)
			fmt.Fprintf(&s, "echo \"E2E-DONE %d\"\n", i+1)
			continue
		case op.zero:
			fmt.Fprintf(&s, "/bin/guestzeroout /dev/vda %d %d || fail 'step %d'\n", op.off, op.n, i+1)
			fmt.Fprintf(&s, "echo \"E2E-DONE %d\"\n", i+1)
			continue
		}
		oflag := "seek_bytes"
		if op.direct {
			oflag += ",direct"
		}
		end := fmt.Sprintf(" || fail 'step %d'", i+1)
		if op.par {
			end = ` & pids="$pids $!"`
		}
		fmt.Fprintf(&s, "dd if=/pattern.bin of=/dev/vda bs=%s iflag=skip_bytes,count_bytes,fullblock skip=%d count=%d oflag=%s seek=%d conv=notrunc,fsync status=none%s\n",
			op.bs, op.pat, op.n, oflag, op.off, end)
		if !op.par {
			fmt.Fprintf(&s, "echo \"E2E-DONE %d\"\n", i+1)
		}
		if op.par && (i+1 == len(ops) || !ops[i+1].par) {
			fmt.Fprintf(&s, "for p in $pids; do wait $p || fail 'a parallel step before %d'; done; pids=\n", i+2)
		}
	}
	fmt.Fprintf(&s, `sync
echo 3 > /proc/sys/vm/drop_caches
echo "E2E-VERIFY up=$(up)"
check() {
	got=$(dd if=/dev/vda bs=1M iflag=direct,skip_bytes,count_bytes skip=$1 count=$2 status=none | md5sum)
	got=${got%%%% *}
	[ "$got" = "$3" ] || fail "bytes $1+$2 ($4): md5 $got, want $3"
	echo "E2E-OK bytes $1+$2 ($4) md5 $got"
}
`)
	for _, c := range checks {
		sum := md5.Sum(expectedRange(ops, pattern, c[0], c[1]))
		fmt.Fprintf(&s, "check %d %d %s '%s'\n", c[0], c[1], hex.EncodeToString(sum[:]), describeRange(ops, c))
	}
	s.WriteString(`echo "E2E-RESULT PASS up=$(up)"
poweroff -f
sleep 30
`)
	return s.String()
}

func describeRange(ops []guestOp, r [2]int64) string {
	for _, op := range ops {
		if op.off == r[0] && op.n == r[1] {
			if op.discard {
				return "discarded"
			}
			if op.zero {
				return "zeroed"
			}
			return "written"
		}
	}
	return "never written"
}

// qemuAttempt is one run of QEMU with one accelerator and one aio mode.
type qemuAttempt struct {
	*tcgguest.Attempt
	accel, aio string
}

// runQEMU boots the guest and waits: for the init marker within
// initTimeout (a stalled accelerator is given up), for the result within
// total.
func runQEMU(t *testing.T, qemu string, args []string, initTimeout, total time.Duration) *qemuAttempt {
	return runQEMUWatch(t, qemu, args, initTimeout, total, nil)
}

// runQEMUWatch is runQEMU calling onLine with every line of the guest's
// console as it comes, in order, on the test's goroutine (so onLine may
// fail the test: QEMU is then killed). The guest goes on meanwhile: lines
// are queued while onLine acts on the host.
func runQEMUWatch(t *testing.T, qemu string, args []string, initTimeout, total time.Duration, onLine func(line string)) *qemuAttempt {
	t.Helper()
	a, err := tcgguest.Run(t.Context(), qemu, args, tcgguest.RunOptions{
		InitMarker: "E2E-INIT", InitTimeout: initTimeout, Total: total,
		PassMarker: "E2E-RESULT PASS", FailMarker: "E2E-RESULT FAIL",
		OnLine: onLine, Logf: t.Logf,
	})
	if err != nil {
		t.Fatal(err)
	}
	return &qemuAttempt{Attempt: a}
}

// TestVMWritesThroughVdiskfs boots Debian's stock kernel in QEMU with a
// vdisk as its virtio disk (cache=none, io_uring if QEMU takes it) and a
// busybox initramfs whose /init writes, discards and verifies; the host
// then checks every byte through the mount, again after a kill -9 of the
// daemon and a remount, again after a clean unmount and remount, and fsck
// checks the store.
func TestVMWritesThroughVdiskfs(t *testing.T) {
	requireRoot(t)
	testStart := time.Now()
	g := newGuest(t, vmOps)

	store := newStore(t)
	blockSize := storeBlockSize(t, store)
	mnt := filepath.Join(t.TempDir(), "mnt")
	m := mountStore(t, store, mnt)
	newDisk := func(aio string) string {
		disk := filepath.Join(mnt, "vm-"+aio+".raw")
		os.Remove(disk)
		f, err := os.OpenFile(disk, os.O_CREATE|os.O_RDWR, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(vmDiskSize); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return disk
	}

	// Accelerators and aio modes in order of preference: KVM is given a
	// bounded time to reach /init (a nested KVM may be too slow), then TCG.
	type accel struct {
		name              string
		args              []string
		initTimeout, full time.Duration
	}
	accels := []accel{
		{"kvm", []string{"-enable-kvm"}, 20 * time.Second, 150 * time.Second},
		{"tcg", []string{"-accel", "tcg"}, 120 * time.Second, 240 * time.Second},
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		t.Logf("no /dev/kvm: TCG only")
		accels = accels[1:]
	}
	boot := func(ac accel, aio, disk string) *qemuAttempt {
		args := g.qemuArgs(1, "-drive", "file="+disk+",format=raw,if=virtio,cache=none,aio="+aio+",discard=unmap")
		t.Logf("booting: accel=%s aio=%s disk=%s", ac.name, aio, filepath.Base(disk))
		a := runQEMU(t, g.qemu, append(args, ac.args...), ac.initTimeout, ac.full)
		a.accel, a.aio = ac.name, aio
		t.Logf("  %s/%s: %s after %v", ac.name, aio, a.Outcome, a.Elapsed.Round(time.Millisecond))
		if a.Outcome == "guest-fail" || a.Outcome == "exited" {
			t.Fatalf("guest (accel=%s aio=%s) did not pass:\n%s\nqemu stderr:\n%s", ac.name, aio, a.Console, a.Stderr)
		}
		return a
	}
	report := func(a *qemuAttempt) {
		t.Logf("RAN: accel=%s aio=%s, guest %v (boot to poweroff)", a.accel, a.aio, a.Elapsed.Round(time.Millisecond))
		g.report(t, a)
	}

	// The first guest that passes fixes the accelerator: io_uring first,
	// native and threads only if QEMU refuses it.
	aioModes := []string{"io_uring", "native", "threads"}
	refused := map[string]bool{}
	var first *qemuAttempt
	var chosen accel
	var disks []string
attempts:
	for _, ac := range accels {
		for _, aio := range aioModes {
			if refused[aio] {
				continue
			}
			disk := newDisk(aio)
			a := boot(ac, aio, disk)
			switch a.Outcome {
			case "pass":
				first, chosen = a, ac
				disks = append(disks, disk)
				break attempts
			case "refused":
				msg := strings.TrimSpace(a.Stderr)
				if strings.Contains(strings.ToLower(msg), "kvm") {
					t.Logf("  QEMU refused KVM: %s", msg)
					continue attempts
				}
				if low := strings.ToLower(msg); !strings.Contains(low, "aio") && !strings.Contains(low, "io_uring") {
					t.Fatalf("QEMU (accel=%s aio=%s) did not start: %s", ac.name, aio, msg)
				}
				t.Logf("  QEMU refused aio=%s: %s", aio, msg)
				refused[aio] = true
			case "no-progress", "timeout":
				if ac.name == "tcg" {
					t.Fatalf("guest (accel=tcg aio=%s): %s after %v; console:\n%s\nqemu stderr:\n%s", aio, a.Outcome, a.Elapsed.Round(time.Second), a.Console, a.Stderr)
				}
				so := lastLines(a.Console, 5)
				if strings.TrimSpace(so) == "" {
					so = "(no console output)"
				}
				t.Logf("  KVM too slow (%s after %v): falling back to TCG; console so far: %s", a.Outcome, a.Elapsed.Round(time.Second), so)
				continue attempts
			}
		}
	}
	if first == nil {
		t.Fatalf("QEMU never ran the guest (refused aio modes: %v)", refused)
	}
	report(first)
	// The other aio modes QEMU accepts, each on its own disk: native
	// (Linux AIO, concurrent only with async direct I/O) and threads
	// (QEMU's default, preadv/pwritev from a pool).
	for _, aio := range aioModes {
		if aio == first.aio || refused[aio] {
			continue
		}
		if testing.Short() {
			t.Logf("-short: aio=%s not run (the full run boots a guest with each aio mode)", aio)
			continue
		}
		disk := newDisk(aio)
		a := boot(chosen, aio, disk)
		switch a.Outcome {
		case "pass":
			report(a)
			disks = append(disks, disk)
		case "refused":
			t.Logf("  QEMU refused aio=%s (not run): %s", aio, strings.TrimSpace(a.Stderr))
		default:
			t.Fatalf("guest (accel=%s aio=%s): %s after %v; console:\n%s\nqemu stderr:\n%s", chosen.name, aio, a.Outcome, a.Elapsed.Round(time.Second), a.Console, a.Stderr)
		}
	}

	// Host side discards, when the guest could not.
	for _, disk := range disks {
		if len(g.hostDiscards) == 0 {
			break
		}
		f, err := os.OpenFile(disk, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, op := range g.hostDiscards {
			if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, op.off, op.n); err != nil {
				t.Fatalf("host side %s: %v", op.what, err)
			}
		}
		f.Close()
	}

	// The host sees the same bytes, every one of them, and thin disks.
	wantAlloc := expectedAllocated(g.allOps, vmDiskSize, blockSize, true)
	verifyAll := func(when string) {
		t.Helper()
		for _, disk := range disks {
			verifyVMDisk(t, disk, g.allOps, g.pattern, wantAlloc, wantAlloc, when)
		}
	}
	verifyAll("after the guest")
	// The guests flushed every write (dd conv=fsync, sync) and QEMU
	// flushes at exit: all of it must survive a crash of the daemon.
	m.kill9(t)
	m = mountStore(t, store, mnt)
	verifyAll("after kill -9 of the daemon and a remount")
	m.unmount(t)
	m = mountStore(t, store, mnt)
	verifyAll("after unmount and remount")
	m.unmount(t)
	fsckClean(t, store)
	t.Logf("TestVMWritesThroughVdiskfs: %v in all", time.Since(testStart).Round(time.Millisecond))
}

// verifyVMDisk reads the whole disk through the mount and compares it with
// what ops leave; it also checks the disk's allocation is within
// [minAlloc, maxAlloc].
func verifyVMDisk(t *testing.T, disk string, ops []guestOp, pattern []byte, minAlloc, maxAlloc int64, when string) {
	t.Helper()
	start := time.Now()
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const chunk = 4 << 20
	buf := make([]byte, chunk)
	var off int64
	for off < vmDiskSize {
		n, err := io.ReadFull(f, buf)
		if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
			t.Fatalf("%s: read %s at %d: %v", when, disk, off, err)
		}
		if n == 0 {
			break
		}
		want := expectedRange(ops, pattern, off, int64(n))
		if i := firstDiff(buf[:n], want); i >= 0 {
			t.Fatalf("%s: %s differs at byte %d (got %#x, want %#x)", when, disk, off+int64(i), buf[i], want[i])
		}
		off += int64(n)
	}
	if off != vmDiskSize {
		t.Fatalf("%s: read %d bytes of %s, want %d", when, off, disk, vmDiskSize)
	}
	alloc, size := usage(t, disk)
	name := filepath.Base(disk)
	t.Logf("%s: all %s of %s as expected (read in %v); allocated %s (st_blocks*512) of apparent %s; written blocks not discarded: %s to %s",
		when, mib(size), name, time.Since(start).Round(time.Millisecond), mib(alloc), mib(size), mib(minAlloc), mib(maxAlloc))
	if alloc > maxAlloc {
		t.Errorf("%s: %s allocates %d bytes, more than the %d bytes of blocks written and not discarded", when, name, alloc, maxAlloc)
	}
	if alloc < minAlloc {
		t.Errorf("%s: %s allocates %d bytes, less than the %d bytes of blocks holding data", when, name, alloc, minAlloc)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
