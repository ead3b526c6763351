// Package crashloop kills the vdisk mount daemon at random moments under a
// concurrent workload and checks, after each remount, the crash contract
// end to end: everything acknowledged before the last completed fsync, or
// synchronous write (O_DSYNC, O_SYNC, RWF_DSYNC), reads back exactly, no disk shows a byte of another disk, and vdisk fsck is
// clean. The workload shares blocks too: copy_file_range within a disk,
// and snapshots (vdisk snapshot through the mount's socket), each of which
// must read, after every kill, exactly what its disk held when it was
// taken.
//
// CI runs VDISK_CRASH_CYCLES (default 50) cycles; tools/crashloop.sh runs
// any number.
package crashloop

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

const (
	disks    = 4
	diskSpan = 8 << 20 // offsets stay below this
)

// daemon is one running `vdisk mount --foreground`.
type daemon struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

// mount starts the daemon with a 200 ms commit timer; extra flags come
// after the defaults and override them.
func mount(t *testing.T, bin, store, mnt string, extra ...string) *daemon {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	d := &daemon{stderr: &bytes.Buffer{}}
	args := append([]string{"mount", store, mnt, "--foreground", "--ready-fd", "3", "--commit-interval", "200ms"}, extra...)
	d.cmd = exec.Command(bin, args...)
	d.cmd.Stderr = d.stderr
	d.cmd.ExtraFiles = []*os.File{w}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	line, _ := bufio.NewReader(r).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		d.cmd.Wait()
		t.Fatalf("mount did not become ready: %s", d.stderr)
	}
	return d
}

// diskModel tracks one disk: its content as the workload wrote it, and the
// content as of the last fsync that returned success, with the byte ranges
// touched since (which may hold old or new bytes after a crash).
type diskModel struct {
	snaps    []*snapModel // snapshots of the disk, oldest first
	nextSnap int
	checked  int  // snapshot reads verify checked
	tag      byte // high 3 bits of every byte this disk writes
	cur      []byte
	synced   []byte
	touched  []bool // since the last completed fsync
	size     int64  // current size
	sSize    int64  // size at the last completed fsync
	resized  bool   // size changed since the last completed fsync
}

// snapModel is a snapshot of a disk: its content when it was taken, and
// whether the snapshot call returned (then it must exist), or is being
// removed (then it may still exist).
type snapModel struct {
	name           string
	data           []byte
	done, removing bool
}

// snapshot takes a snapshot of disk i through the mount's socket and
// records it, keeping at most two per disk (the oldest removed first). An
// error means the daemon is gone; the snapshot may exist or not.
func (m *diskModel) snapshot(mnt string, i int) error {
	for len(m.snaps) > 0 && (len(m.snaps) >= 2 || m.snaps[0].removing) {
		old := m.snaps[0]
		old.removing = true
		if err := os.Remove(filepath.Join(mnt, old.name)); err != nil && !os.IsNotExist(err) {
			return err
		}
		m.snaps = m.snaps[1:]
	}
	sm := &snapModel{name: fmt.Sprintf("d%d-s%d.raw", i, m.nextSnap), data: bytes.Clone(m.cur[:m.size])}
	m.nextSnap++
	m.snaps = append(m.snaps, sm)
	if _, err := telemetry.Snapshot(mnt, fmt.Sprintf("d%d.raw", i), sm.name); err != nil {
		return err
	}
	sm.done = true
	return nil
}

func newDiskModel(i int) *diskModel {
	return &diskModel{tag: byte(i + 1), cur: make([]byte, diskSpan), synced: make([]byte, diskSpan), touched: make([]bool, diskSpan)}
}

func (m *diskModel) touch(off, n int64) {
	for i := off; i < min(off+n, diskSpan); i++ {
		m.touched[i] = true
	}
}

// workload runs on disk i until an operation fails (the daemon is gone)
// or stop is closed.
func workload(mnt string, i int, m *diskModel, seed uint64, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(seed, uint64(i)))
	name := filepath.Join(mnt, fmt.Sprintf("d%d.raw", i))
	direct := i%2 == 0 // half the disks O_DIRECT, half buffered
	flags := os.O_RDWR | os.O_CREATE
	if direct {
		flags |= syscall.O_DIRECT
	}
	// Disks 2 and 3 open O_DSYNC and O_SYNC: every write and punch on them
	// is promised when it returns. The others use RWF_DSYNC now and then.
	switch i % 4 {
	case 2:
		flags |= unix.O_DSYNC
	case 3:
		flags |= unix.O_SYNC
	}
	syncOpen := flags&unix.O_DSYNC != 0
	f, err := os.OpenFile(name, flags, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	buf := directio.AlignedBlock(256 << 10)
	for {
		select {
		case <-stop:
			return
		default:
		}
		switch op := rng.IntN(20); {
		case op == 19:
			if m.snapshot(mnt, i) != nil {
				return
			}
		case op == 18: // copy_file_range within the disk: whole blocks shared
			n := (1 + rng.Int64N(64)) * 4096
			src := rng.Int64N((diskSpan-n)/4096) * 4096
			dst := rng.Int64N((diskSpan-n)/4096) * 4096
			if src < dst+n && dst < src+n {
				continue
			}
			m.touch(dst, n)
			if dst+n > m.size {
				m.resized = true
			}
			roff, woff := src, dst
			k, err := unix.CopyFileRange(int(f.Fd()), &roff, int(f.Fd()), &woff, int(n), 0)
			if err != nil {
				return
			}
			if k > 0 {
				copy(m.cur[dst:dst+int64(k)], m.cur[src:src+int64(k)])
				m.size = max(m.size, dst+int64(k))
				if syncOpen {
					m.promiseRange(dst, int64(k))
				}
			}
		case op < 12: // write
			var off, n int64
			if direct {
				off, n = rng.Int64N(diskSpan/512-512)*512, (1+rng.Int64N(256))*512
			} else {
				off = rng.Int64N(diskSpan - 4096)
				n = min(1+rng.Int64N(64<<10), diskSpan-off)
			}
			p := buf[:n]
			for j := range p {
				p[j] = m.tag<<5 | byte(1+rng.IntN(31))
			}
			m.touch(off, n) // before: it may land even if we never hear back
			if off+n > m.size {
				m.resized = true
			}
			rwf := 0
			if rng.IntN(4) == 0 {
				rwf = unix.RWF_DSYNC
			}
			if _, err := unix.Pwritev2(int(f.Fd()), [][]byte{p}, off, rwf); err != nil {
				return
			}
			copy(m.cur[off:], p)
			m.size = max(m.size, off+n)
			if syncOpen || rwf != 0 {
				m.promiseRange(off, n)
			}
		case op < 14: // punch a hole
			off, n := rng.Int64N(diskSpan), rng.Int64N(512<<10)
			m.touch(off, n)
			if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
				return
			}
			if off < m.size {
				clear(m.cur[off:min(off+n, m.size)])
			}
			if syncOpen {
				m.promiseRange(off, n)
			}
		case op < 16: // truncate
			size := rng.Int64N(diskSpan)
			m.touch(min(size, m.size), diskSpan)
			m.resized = true
			if err := f.Truncate(size); err != nil {
				return
			}
			if size < m.size {
				clear(m.cur[size:])
			}
			m.size = size
		default: // fsync: everything so far is now promised
			if err := f.Sync(); err != nil {
				return
			}
			m.promise()
		}
	}
}

// promiseRange records that a synchronous write or punch of [off, off+n)
// returned: like a FUA write, it promises those bytes as they are now, and
// nothing else.
func (m *diskModel) promiseRange(off, n int64) {
	end := min(off+n, diskSpan)
	if off >= end {
		return
	}
	copy(m.synced[off:end], m.cur[off:end])
	clear(m.touched[off:end])
}

// promise records that everything the disk acknowledged so far is durable:
// an fsync returned.
func (m *diskModel) promise() {
	copy(m.synced, m.cur)
	clear(m.touched)
	m.sSize, m.resized = m.size, false
}

// verify reads every disk through the mount and checks the contract.
func verify(t *testing.T, cycle int, mnt string, models []*diskModel) {
	t.Helper()
	for i, m := range models {
		name := filepath.Join(mnt, fmt.Sprintf("d%d.raw", i))
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("cycle %d: read d%d: %v", cycle, i, err)
		}
		if !m.resized && int64(len(got)) != m.sSize {
			t.Fatalf("cycle %d: d%d is %d bytes, %d at the last fsync and not resized since", cycle, i, len(got), m.sSize)
		}
		for j, b := range got {
			if b != 0 && b>>5 != m.tag {
				t.Fatalf("cycle %d: d%d byte %d is %#x: another disk's byte (tag %d)", cycle, i, j, b, b>>5)
			}
			if j < diskSpan && !m.touched[j] && int64(j) < m.sSize && b != m.synced[j] {
				t.Fatalf("cycle %d: d%d byte %d is %#x, %#x was fsynced and nothing touched it since", cycle, i, j, b, m.synced[j])
			}
		}
		for _, sm := range m.snaps {
			got, err := os.ReadFile(filepath.Join(mnt, sm.name))
			switch {
			case err != nil && os.IsNotExist(err) && (!sm.done || sm.removing):
				sm.removing = false // gone, as it may be
				continue
			case err != nil:
				t.Fatalf("cycle %d: snapshot %s of d%d (done %v): %v", cycle, sm.name, i, sm.done, err)
			case !bytes.Equal(got, sm.data):
				t.Fatalf("cycle %d: snapshot %s of d%d reads %d bytes that differ from the %d its disk held when it was taken", cycle, sm.name, i, len(got), len(sm.data))
			}
			sm.done = true
			m.checked++
		}
		live := m.snaps[:0]
		for _, sm := range m.snaps {
			if sm.done {
				live = append(live, sm)
			}
		}
		m.snaps = live
		// Adopt what survived as the new baseline: it is all durable now
		// (the remount replayed it and the test will fsync before going on).
		n := min(int64(len(got)), diskSpan)
		clear(m.cur)
		copy(m.cur, got[:n])
		m.size = int64(len(got))
	}
}

func TestCrashLoop(t *testing.T) {
	testutil.RequireFUSE(t)
	cycles := 50
	if v := os.Getenv("VDISK_CRASH_CYCLES"); v != "" {
		cycles, _ = strconv.Atoi(v)
	}
	if testing.Short() {
		cycles = min(cycles, 10)
	}
	seed := rand.Uint64()
	if v := os.Getenv("VDISK_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d, %d cycles", seed, cycles)
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	bin := testutil.VdiskBinary(t, false)
	store := filepath.Join(dir, "store.img")
	mnt := filepath.Join(dir, "mnt")
	if out, err := exec.Command(bin, "format", store, "--size", "1G").CombinedOutput(); err != nil {
		t.Fatalf("format: %v: %s", err, out)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	models := make([]*diskModel, disks)
	for i := range models {
		models[i] = newDiskModel(i)
	}
	// The disks exist (durably) before the first kill.
	d := mount(t, bin, store, mnt)
	for i := range models {
		f, err := os.Create(filepath.Join(mnt, fmt.Sprintf("d%d.raw", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	d.cmd.Wait()
	kills := 0
	for cycle := 1; cycle <= cycles; cycle++ {
		d := mount(t, bin, store, mnt)
		verify(t, cycle, mnt, models)
		// Make the survivors the promised baseline before the next round.
		for i, m := range models {
			f, err := os.OpenFile(filepath.Join(mnt, fmt.Sprintf("d%d.raw", i)), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			m.promise()
		}
		// One snapshot per cycle before the workloads start (done before
		// the kill, so the next verify must find it), so that every run
		// checks snapshots across kills whatever the seed; the workloads
		// take more at random, some in flight at the kill.
		if err := models[cycle%disks].snapshot(mnt, cycle%disks); err != nil {
			t.Fatalf("cycle %d: snapshot of d%d: %v", cycle, cycle%disks, err)
		}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range models {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				workload(mnt, i, models[i], seed+uint64(cycle), stop)
			}(i)
		}
		time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
		if err := d.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		d.cmd.Wait()
		kills++
		close(stop)
		wg.Wait()
		// A clean unmount and fsck every tenth cycle (fsck needs the store
		// closed); the other cycles remount straight over the dead mount.
		if cycle%10 == 0 || cycle == cycles {
			d := mount(t, bin, store, mnt)
			verify(t, cycle, mnt, models)
			if err := unix.Unmount(mnt, 0); err != nil {
				t.Fatal(err)
			}
			if err := d.cmd.Wait(); err != nil {
				t.Fatalf("cycle %d: daemon exit after unmount: %v: %s", cycle, err, d.stderr)
			}
			if out, err := exec.Command(bin, "fsck", store).CombinedOutput(); err != nil {
				t.Fatalf("cycle %d: fsck: %v\n%s", cycle, err, out)
			}
		}
	}
	checked := 0
	for _, m := range models {
		checked += m.checked
	}
	t.Logf("%d kill -9 cycles survived; %d reads of snapshots matched their disks when taken", kills, checked)
	if checked == 0 {
		t.Error("no snapshot was checked")
	}
}
