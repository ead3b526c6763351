package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/internal/tcgguest"
)

// guest is one guest ready to boot: the cached kernel, an initramfs whose
// /init runs ops and checks every range they touch plus vmHoles, and what
// the host must do that the guest could not (discards, when busybox has
// no blkdiscard).
type guest struct {
	qemu         string
	kernel       *tcgguest.Kernel
	initramfs    string
	applets      map[string]bool
	pattern      []byte
	ops          []guestOp // what /init runs
	hostDiscards []guestOp // the discards of ops /init cannot run
	allOps       []guestOp // ops then hostDiscards: what the disk holds at the end
}

// newGuest prepares a guest running ops. QEMU, the kernel and busybox are
// installed or fetched (and cached) as needed.
func newGuest(t *testing.T, ops []guestOp) *guest {
	t.Helper()
	needTools(t, "qemu-system-x86_64:qemu-system-x86")
	g := &guest{pattern: vmPattern()}
	g.qemu, _ = exec.LookPath("qemu-system-x86_64")
	g.kernel = cachedKernel(t)
	busybox := staticBusybox(t)
	g.applets = busyboxApplets(t, busybox)
	for _, a := range []string{"sh", "mount", "insmod", "dd", "md5sum", "blockdev", "cut", "cat", "sleep", "sync", "poweroff", "ls", "wc"} {
		if !g.applets[a] {
			t.Fatalf("%s has no %s applet", busybox, a)
		}
	}

	// Without blkdiscard in busybox, the guest skips its discards and the
	// host punches the same ranges after the guest is done.
	g.ops = ops
	if !g.applets["blkdiscard"] {
		t.Logf("busybox has no blkdiscard: the guest skips its discards; they are done host side (fallocate punch hole) afterwards")
		g.ops = nil
		for _, op := range ops {
			if op.discard {
				g.hostDiscards = append(g.hostDiscards, op)
			} else {
				g.ops = append(g.ops, op)
			}
		}
	}
	g.allOps = append(append([]guestOp{}, g.ops...), g.hostDiscards...)
	var checks [][2]int64
	for _, op := range ops {
		if !op.hostOnly {
			checks = append(checks, [2]int64{op.off, op.n})
		}
	}
	checks = append(checks, vmHoles...)

	g.initramfs = filepath.Join(t.TempDir(), "initramfs.cpio")
	files := []tcgguest.File{
		{Name: "init", Mode: 0o755, Data: []byte(guestInit(g.ops, checks, g.pattern, g.kernel.Modules))},
		{Name: "pattern.bin", Mode: 0o644, Data: g.pattern},
	}
	for _, op := range ops {
		if op.zero {
			zb, err := os.ReadFile(guestZeroOut(t))
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, tcgguest.File{Name: "bin/guestzeroout", Mode: 0o755, Data: zb})
			break
		}
	}
	initramfs := tcgguest.Initramfs{Busybox: busybox, Modules: g.kernel.Modules, Files: files}
	if err := initramfs.Write(g.initramfs); err != nil {
		t.Fatal(err)
	}
	t.Logf("initramfs: %s, busybox %s, modules %v, %d steps, %d checks", mib(fileSize(t, g.initramfs)), busybox, g.kernel.ModuleNames(), len(g.ops), len(checks))
	return g
}

// qemuArgs is the command line of the guest with smp vCPUs and the disk
// given by disk (the accelerator is the caller's).
func (g *guest) qemuArgs(smp int, disk ...string) []string {
	m := tcgguest.Machine{Kernel: g.kernel, Initramfs: g.initramfs, Memory: vmMemory, SMP: smp}
	return m.Args(disk...)
}

// vhostUserDisk is the QEMU arguments that make the guest's disk a
// vhost-user-blk device on sock with queues queues: the guest's memory a
// shared memfd the backend maps, and a chardev that reconnects every
// second when the backend goes away.
func vhostUserDisk(sock string, queues int) []string {
	return append(tcgguest.SharedMemory(vmMemory), tcgguest.VhostUserDisk("vhost0", sock, queues)...)
}

// report logs the guest's steps and checks that its disk offered discard
// (when busybox could discard) and, if any step zeroes, write-zeroes: a
// kernel without the device's write-zeroes writes zero pages instead,
// which would test nothing.
func (g *guest) report(t *testing.T, a *qemuAttempt) {
	t.Helper()
	for _, line := range strings.Split(a.Console, "\n") {
		if strings.HasPrefix(line, "E2E-") && !strings.HasPrefix(line, "E2E-OK") && !strings.HasPrefix(line, "E2E-DONE") {
			t.Logf("  guest: %s", line)
		}
	}
	if g.applets["blkdiscard"] && !regexp.MustCompile(`discard_max_bytes=[1-9]`).MatchString(a.Console) {
		t.Errorf("the guest saw no discard support on its virtio disk")
	}
	for _, op := range g.ops {
		if op.zero && !regexp.MustCompile(`write_zeroes_max_bytes=[1-9]`).MatchString(a.Console) {
			t.Errorf("the guest saw no write-zeroes support on its virtio disk")
			break
		}
	}
}

// tcgGuest runs the guest under TCG (the vhost-user tests do not try KVM:
// on the machines they run on it never reached /init) and fails the test
// unless it passes.
func (g *guest) tcgGuest(t *testing.T, smp int, disk []string, onLine func(string)) *qemuAttempt {
	t.Helper()
	a := g.runTCG(t, smp, disk, onLine)
	if a.Outcome != "pass" {
		t.Fatalf("guest: %s after %v; console:\n%s\nqemu stderr:\n%s", a.Outcome, a.Elapsed.Round(time.Second), a.Console, a.Stderr)
	}
	g.report(t, a)
	return a
}

// runTCG runs the guest under TCG and returns how it went.
func (g *guest) runTCG(t *testing.T, smp int, disk []string, onLine func(string)) *qemuAttempt {
	t.Helper()
	args := append(g.qemuArgs(smp, disk...), "-accel", "tcg")
	a := runQEMUWatch(t, g.qemu, args, 2*time.Minute, 5*time.Minute, onLine)
	a.accel = "tcg"
	t.Logf("RAN: accel=tcg smp=%d, guest %s after %v (boot to poweroff)", smp, a.Outcome, a.Elapsed.Round(time.Millisecond))
	return a
}

var (
	zeroOutMu  sync.Mutex
	zeroOutBin string
)

// guestZeroOut builds tests/e2e/guestzeroout, static, once per test
// binary.
func guestZeroOut(t *testing.T) string {
	t.Helper()
	zeroOutMu.Lock()
	defer zeroOutMu.Unlock()
	if zeroOutBin != "" {
		return zeroOutBin
	}
	dir, err := os.MkdirTemp("", "guestzeroout")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "guestzeroout")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/vdiskfs/vdiskfs/tests/e2e/guestzeroout")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build guestzeroout: %v\n%s", err, out)
	}
	zeroOutBin = bin
	return bin
}
