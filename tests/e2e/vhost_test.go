package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// vhostOps is vmOps and write-zeroes (whole store blocks and pieces of
// them, over written data and over a hole).
var vhostOps = append(append([]guestOp{}, vmOps...),
	guestOp{what: "2 MiB at 500 MiB, bs=256k, O_DIRECT", off: 500 << 20, n: 2 << 20, pat: 0, bs: "256k", direct: true},
	guestOp{what: "write-zeroes 1 MiB at 500 MiB+512 KiB", zero: true, off: 500<<20 + 512<<10, n: 1 << 20},
	guestOp{what: "write-zeroes 8.5 KiB at 1 MiB-3.5 KiB (512-aligned, over written data)", zero: true, off: 1<<20 - 3584, n: 8704},
	guestOp{what: "write-zeroes 64 KiB at 60 MiB (a hole)", zero: true, off: 60 << 20, n: 64 << 10},
)

// vhostQueues is the number of queues every vhost-user guest is given; it
// runs with as many vCPUs so that the guest's virtio-blk uses them all.
const vhostQueues = 2

// TestVMVhostUserReference proves the vhost-user guest harness against a
// reference backend, qemu-storage-daemon's vhost-user-blk export of a raw
// file: the same guest script as the vdiskfs tests (large, small and
// 512-byte writes, discards, write-zeroes, flushes, reads) must pass, and
// the file must then hold exactly the bytes it wrote. It checks the
// harness, not vdiskfs: -short (tools/test.sh's race run) leaves it to the
// full run.
func TestVMVhostUserReference(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the reference server's guest is booted by the full run")
	}
	requireRoot(t)
	start := time.Now()
	needTools(t, "qemu-storage-daemon:qemu-system-common")
	g := newGuest(t, vhostOps)
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(raw, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, vmDiskSize); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "qsd.sock")
	startQSD(t, raw, sock)
	g.tcgGuest(t, vhostQueues, vhostUserDisk(sock, vhostQueues), nil)
	// ext4 counts its extent tree blocks in st_blocks too: a few blocks
	// more than the data are allowed.
	const ext4Meta = 64 << 10
	verifyVMDisk(t, raw, g.allOps, g.pattern,
		expectedAllocated(g.allOps, vmDiskSize, 4096, true), expectedAllocated(g.allOps, vmDiskSize, 4096, false)+ext4Meta, "after the guest on qemu-storage-daemon")
	t.Logf("TestVMVhostUserReference: %v in all", time.Since(start).Round(time.Millisecond))
}

// startQSD serves raw as a vhost-user-blk device on sock with
// qemu-storage-daemon (O_DIRECT, discards punched) and returns once the
// socket accepts; cleanup stops it.
func startQSD(t *testing.T, raw, sock string) {
	t.Helper()
	cmd := exec.Command("qemu-storage-daemon",
		"--blockdev", "driver=file,node-name=file0,filename="+raw+",cache.direct=on,aio=io_uring,discard=unmap",
		"--export", fmt.Sprintf("type=vhost-user-blk,id=exp0,node-name=file0,addr.type=unix,addr.path=%s,writable=on,num-queues=%d", sock, vhostQueues),
	)
	logf, err := os.Create(filepath.Join(t.TempDir(), "qsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("qemu-storage-daemon: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("qemu-storage-daemon log:\n%s", b)
		}
	})
	waitSocket(t, sock, exited)
}

// waitSocket waits until sock exists (a server listening on it: the
// vhost-user servers here take one frontend at a time, so it is not
// connected to) or exited says the server is gone.
func waitSocket(t *testing.T, sock string, exited <-chan error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode().Type() == os.ModeSocket {
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("the server of %s exited: %v", sock, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket %s after a minute", sock)
		}
	}
}

// seqWrites is n steps of mib MiB each (bs=64k, O_DIRECT, conv=fsync: a
// flush at the end of each) one after the other from off: distinct
// ranges, so that which of them a snapshot or a crash kept can be told
// apart.
func seqWrites(what string, off int64, n, mib int) []guestOp {
	var ops []guestOp
	for i := range n {
		at := off + int64(i*mib)<<20
		ops = append(ops, guestOp{what: fmt.Sprintf("%s %d/%d: %d MiB at %d MiB, bs=64k, O_DIRECT", what, i+1, n, mib, at>>20),
			off: at, n: int64(mib) << 20, pat: int64(i%(29-mib+1)) << 20, bs: "64k", direct: true})
	}
	return ops
}

// vhostStore is a store mounted with --vhost-user-dir and one disk of
// vmDiskSize made through the mount, served on sock.
type vhostStore struct {
	store, mnt, dir, disk, sock string
	m                           *mount
}

func newVhostStore(t *testing.T) *vhostStore {
	t.Helper()
	v := &vhostStore{store: newStore(t), mnt: filepath.Join(t.TempDir(), "mnt"), dir: t.TempDir()}
	v.m = mountStore(t, v.store, v.mnt, "--vhost-user-dir", v.dir)
	v.disk = filepath.Join(v.mnt, "vm.raw")
	f, err := os.OpenFile(v.disk, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(vmDiskSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	v.sock = filepath.Join(v.dir, "vm.raw.sock")
	waitSocket(t, v.sock, nil)
	fi, err := os.Stat(v.sock)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("%s has mode %04o, want 0600", v.sock, perm)
	}
	return v
}

// TestVMVhostUserVdiskfs: a guest on a vdiskfs disk's vhost-user socket
// (vdisk mount --vhost-user-dir, two queues and two vCPUs) writes large,
// small and 512-byte requests, discards, zeroes, flushes and reads back;
// meanwhile `vdisk snapshot` is taken while it writes, and must hold every
// write the guest had completed before the call. Then the disk's file in
// the mount reads the same bytes as the guest wrote, vdisk ls and stats
// show the door, and vdisk fsck is clean.
func TestVMVhostUserVdiskfs(t *testing.T) {
	requireRoot(t)
	start := time.Now()
	snapSteps := seqWrites("while the snapshot is taken", 420<<20, 24, 1)
	ops := append(append([]guestOp{}, vhostOps...), snapSteps...)
	g := newGuest(t, ops)
	v := newVhostStore(t)
	bin := vdiskBin(t)

	// The snapshot is taken once the guest says it completed the third of
	// snapSteps: the guest runs its steps in order, so every step up to
	// that one was acknowledged before the call.
	snapAt := len(vhostOps) + 3
	var (
		mu       sync.Mutex
		lastDone int // the last step the guest said it completed
		snapOut  string
		snapErr  error
		snapDone = make(chan struct{})
		after    int // lastDone when the call returned
	)
	onLine := func(line string) {
		var step int
		if _, err := fmt.Sscanf(line, "E2E-DONE %d", &step); err != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		lastDone = step
		if step == snapAt {
			go func() {
				out, err := runErr(2*time.Minute, bin, "snapshot", v.disk, "snap.raw")
				mu.Lock()
				snapOut, snapErr, after = out, err, lastDone
				mu.Unlock()
				close(snapDone)
			}()
		}
	}
	a := g.tcgGuest(t, vhostQueues, vhostUserDisk(v.sock, vhostQueues), onLine)
	if !strings.Contains(a.Console, "write_cache=write back") {
		t.Errorf("the guest does not see a volatile write cache (VIRTIO_BLK_F_FLUSH): %s", diskLine(a.Console))
	}
	if !strings.Contains(a.Console, fmt.Sprintf("queues=%d ", vhostQueues)) {
		t.Errorf("the guest does not use %d queues: %s", vhostQueues, diskLine(a.Console))
	}
	select {
	case <-snapDone:
	case <-time.After(2 * time.Minute):
		t.Fatal("vdisk snapshot did not return")
	}
	if snapErr != nil {
		t.Fatalf("vdisk snapshot while the guest wrote: %v\n%s", snapErr, snapOut)
	}
	t.Logf("vdisk snapshot called once step %d of %d was completed; it returned once step %d was", snapAt, len(ops), after)

	// The disk's file holds what the guest wrote.
	bs := storeBlockSize(t, v.store) // through the mount
	verifyVMDisk(t, v.disk, g.allOps, g.pattern,
		expectedAllocated(g.allOps, vmDiskSize, bs, true), expectedAllocated(g.allOps, vmDiskSize, bs, false), "after the guest on vhost-user")

	// The snapshot holds every step completed before the call.
	verifyRanges(t, filepath.Join(v.mnt, "snap.raw"), ops[:snapAt], g.pattern, "the snapshot taken while the guest wrote")

	// The door shows in ls and stats.
	ls := run(t, time.Minute, vdiskBin(t), "ls", v.mnt)
	if !strings.Contains(ls, v.sock) {
		t.Errorf("vdisk ls does not show the socket %s:\n%s", v.sock, ls)
	}
	stats := run(t, time.Minute, vdiskBin(t), "stats", v.mnt, "--json")
	var st struct {
		VhostUser []struct {
			Disk   string
			Socket string
			Stats  struct {
				Write, Flush, Discard, WriteZeroes struct{ Requests, Bytes uint64 }
				Connects                           uint64
			}
		} `json:"vhost_user"`
	}
	if err := json.Unmarshal([]byte(stats), &st); err != nil {
		t.Fatalf("vdisk stats --json: %v", err)
	}
	found := false
	for _, u := range st.VhostUser {
		if u.Disk != "vm.raw" {
			continue
		}
		found = true
		s := u.Stats
		t.Logf("vhost-user counters of vm.raw: %+v", s)
		if s.Write.Requests == 0 || s.Flush.Requests == 0 || s.Discard.Requests == 0 || s.WriteZeroes.Requests == 0 || s.Connects == 0 {
			t.Errorf("vdisk stats: vm.raw's door counted %+v; want writes, flushes, discards, write-zeroes and a connect", s)
		}
	}
	if !found {
		t.Errorf("vdisk stats shows no vhost-user counters of vm.raw:\n%s", stats)
	}
	v.m.unmount(t)
	if _, err := os.Stat(v.sock); !os.IsNotExist(err) {
		t.Errorf("the socket is still there after the unmount: %v", err)
	}
	fsckClean(t, v.store)
	t.Logf("TestVMVhostUserVdiskfs: %v in all", time.Since(start).Round(time.Millisecond))
}

// TestVMVhostUserDaemonKill: the daemon serving a guest's disk is killed
// with -9 while the guest writes and flushes, and mounted again on the same
// mount point with the same --vhost-user-dir: QEMU reconnects (reconnect=1)
// and the requests in flight are resubmitted to the new daemon, so the
// guest finishes without an I/O error; every write it flushed before the
// kill, and every write after the kill, is in the disk's file
// (flushed-before-kill).
//
// The step the kill interrupts is checked on its own
// (acknowledged-before-kill-flushed-after): its writes completed before
// the kill were acknowledged by the dead daemon and not yet flushed, and
// the flush that ends the step, answered by the new daemon, tells the
// guest they are durable, so the door must not return a write the next
// daemon would not read back.
func TestVMVhostUserDaemonKill(t *testing.T) {
	requireRoot(t)
	start := time.Now()
	// The kill comes in the middle of a step (the guest announces a
	// step, then runs it), so that the daemon dies with requests in
	// flight; the steps before it were completed, flushed included.
	const killIn = 4
	ops := seqWrites("written and flushed across the kill", 64<<20, 16, 2)
	ops[killIn-1].hostOnly = true
	g := newGuest(t, ops)
	v := newVhostStore(t)
	var (
		flushed   []int // steps completed (written and flushed) before the kill
		remounted = make(chan *mount, 1)
	)
	onLine := func(line string) {
		var step int
		if _, err := fmt.Sscanf(line, "E2E-STEP %d:", &step); err != nil || step != killIn || flushed != nil {
			return
		}
		for i := 1; i < step; i++ {
			flushed = append(flushed, i)
		}
		time.Sleep(30 * time.Millisecond) // into the step's requests
		// The guest goes on meanwhile (its console lines queue).
		v.m.kill9(t)
		remounted <- mountStore(t, v.store, v.mnt, "--vhost-user-dir", v.dir)
	}
	a := g.runTCG(t, vhostQueues, vhostUserDisk(v.sock, vhostQueues), onLine)
	var m *mount
	select {
	case m = <-remounted:
	default:
		t.Fatalf("the guest finished before the daemon was killed:\n%s", a.Console)
	}
	if a.Outcome != "pass" {
		// Say what the new daemon saw and which requests' data is not
		// where the guest wrote it, then fail.
		t.Logf("vdisk stats of the new daemon:\n%s", lastLines(run(t, time.Minute, vdiskBin(t), "stats", v.mnt), 8))
		badChunks(t, v.disk, ops, g.pattern, 64<<10)
		t.Fatalf("guest: %s after %v; console:\n%s\nqemu stderr:\n%s", a.Outcome, a.Elapsed.Round(time.Second), a.Console, a.Stderr)
	}
	g.report(t, a)
	if strings.Contains(a.Console, "I/O error") {
		t.Errorf("the guest's kernel logged an I/O error:\n%s", a.Console)
	}
	t.Logf("killed during step %d; steps flushed before the kill: %v", killIn, flushed)
	t.Run("flushed-before-kill", func(t *testing.T) {
		var before []guestOp
		for _, i := range flushed {
			before = append(before, ops[i-1])
		}
		verifyRanges(t, v.disk, before, g.pattern, "the steps flushed before the kill")
		verifyRanges(t, v.disk, ops[killIn:], g.pattern, "the steps after the kill")
	})
	t.Run("acknowledged-before-kill-flushed-after", func(t *testing.T) {
		verifyRanges(t, v.disk, ops[killIn-1:killIn], g.pattern, "the step the kill interrupted")
		if t.Failed() {
			badChunks(t, v.disk, ops[killIn-1:killIn], g.pattern, 64<<10)
		}
	})
	stats := run(t, time.Minute, vdiskBin(t), "stats", v.mnt)
	t.Logf("vdisk stats of the new daemon (door):\n%s", lastLines(stats, 8))
	m.unmount(t)
	fsckClean(t, v.store)
	t.Logf("TestVMVhostUserDaemonKill: %v in all", time.Since(start).Round(time.Millisecond))
}

// verifyRanges checks that path holds, in each of ops' ranges, what ops
// left there.
func verifyRanges(t *testing.T, path string, ops []guestOp, pattern []byte, what string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bad := 0
	for _, op := range ops {
		got := make([]byte, op.n)
		if _, err := f.ReadAt(got, op.off); err != nil {
			t.Fatalf("%s: read %s at %d: %v", what, path, op.off, err)
		}
		if i := firstDiff(got, expectedRange(ops, pattern, op.off, op.n)); i >= 0 {
			t.Errorf("%s: %s differs at byte %d, in %q", what, path, op.off+int64(i), op.what)
			bad++
		}
	}
	if bad == 0 {
		t.Logf("%s: all %d ranges as written", what, len(ops))
	}
}

// diskLine is the guest's E2E-DISK line.
func diskLine(console string) string {
	for _, l := range strings.Split(console, "\n") {
		if strings.HasPrefix(l, "E2E-DISK") {
			return l
		}
	}
	return "(no E2E-DISK line)"
}

// badChunks logs, as runs of chunk-sized pieces, where ops' ranges in
// path do not hold what ops wrote and what they hold instead (zeros or
// other data).
func badChunks(t *testing.T, path string, ops []guestOp, pattern []byte, chunk int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	type run struct {
		off, n int64
		what   string
	}
	var runs []run
	for _, op := range ops {
		for off := op.off; off < op.off+op.n; off += chunk {
			got := make([]byte, chunk)
			if _, err := f.ReadAt(got, off); err != nil {
				t.Fatalf("read %s at %d: %v", path, off, err)
			}
			what := "as written"
			switch {
			case firstDiff(got, expectedRange(ops, pattern, off, chunk)) < 0:
			case firstDiff(got, make([]byte, chunk)) < 0:
				what = "zeros"
			default:
				what = "other data"
			}
			if l := len(runs) - 1; l >= 0 && runs[l].what == what && runs[l].off+runs[l].n == off {
				runs[l].n += chunk
			} else {
				runs = append(runs, run{off, chunk, what})
			}
		}
	}
	for _, r := range runs {
		t.Logf("  %s: bytes %d+%d (%s): %s", filepath.Base(path), r.off, r.n, mib(r.n), r.what)
	}
}
