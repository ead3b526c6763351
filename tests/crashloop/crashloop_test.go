// Package crashloop kills the vdisk mount daemon at random moments under a
// concurrent workload and checks, after each remount, the crash contract
// end to end: everything acknowledged before the last completed fsync, or
// synchronous write (O_DSYNC, O_SYNC, RWF_DSYNC), reads back exactly, no
// disk shows a byte of another disk, and vdisk fsck is clean. The odd
// disks are encrypted (vdisk create --encrypt), unlocked at every mount by
// --key-dir, so that power cuts land on encrypted writes too. The workload
// shares blocks too: copy_file_range within a disk, and snapshots (vdisk
// snapshot through the mount's socket), each of which must read, after
// every kill, exactly what its disk held when it was taken.
//
// A run is replayable: every random choice follows from the seed (logged;
// VDISK_SEED replays it), the kill moments included, which are counts of
// completed workload operations, not times. Only the interleaving of the
// four workers is left to the scheduler; each cycle logs how far every
// worker got, and a failure prints the operations that touched the block
// that differs.
//
// CI runs VDISK_CRASH_CYCLES (default 50) cycles; tools/crashloop.sh runs
// any number, optionally beside VDISK_CRASH_LOAD CPU hogs.
package crashloop

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	// blockSize is the store's default block size: what a failure report
	// calls a block.
	blockSize = 4096
	// maxKillOps bounds the count of completed workload operations after
	// which a cycle kills the daemon (drawn from [1, maxKillOps]); it keeps
	// a cycle about as long as the wall-clock kill it replaced.
	maxKillOps = 120
	// opLogLen bounds each disk's log of operations (diskModel.log).
	opLogLen = 4096
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

// opKind names a workload operation.
type opKind uint8

const (
	opWrite opKind = iota
	opCopy
	opPunch
	opTruncate
	opFsync
	opSnapshot
	opRemove // removing a snapshot
)

func (k opKind) String() string {
	return [...]string{"write", "copy", "punch", "truncate", "fsync", "snapshot", "remove"}[k]
}

// op is one workload operation on a disk, as its log keeps it.
type op struct {
	seq   uint64 // the run's operation number (all disks), taken when it started
	cycle int
	kind  opKind
	off   int64 // the bytes it may change: [off, off+n)
	n     int64
	src   int64  // copy: source offset; truncate: new size
	sync  bool   // promised when it returned (O_DSYNC/O_SYNC open, RWF_DSYNC)
	name  string // snapshot or remove: the snapshot's name
	ret   int64  // bytes reported: write, copy
	err   error  // set when it failed; nil while in flight and once it returned
	done  bool   // it returned (successfully or not)
	after bool   // it returned after the kill was sent
}

func (o *op) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d c%d %s", o.seq, o.cycle, o.kind)
	switch o.kind {
	case opWrite, opPunch:
		fmt.Fprintf(&b, " [%d,+%d) blocks %d-%d", o.off, o.n, o.off/blockSize, (o.off+o.n-1)/blockSize)
	case opCopy:
		fmt.Fprintf(&b, " from %d to [%d,+%d) blocks %d-%d", o.src, o.off, o.n, o.off/blockSize, (o.off+o.n-1)/blockSize)
	case opTruncate:
		fmt.Fprintf(&b, " to %d", o.src)
	case opSnapshot, opRemove:
		fmt.Fprintf(&b, " %s", o.name)
	}
	if o.sync {
		b.WriteString(" sync")
	}
	switch {
	case !o.done:
		b.WriteString(": in flight at the kill")
	case o.err != nil:
		fmt.Fprintf(&b, ": failed: %v", o.err)
	case o.kind == opWrite || o.kind == opCopy:
		fmt.Fprintf(&b, ": returned %d", o.ret)
	default:
		b.WriteString(": ok")
	}
	if o.done && o.after {
		b.WriteString(" (after the kill)")
	}
	return b.String()
}

// touches reports whether o may have changed virtual block blk of its
// disk.
func (o *op) touches(blk int64) bool {
	switch o.kind {
	case opWrite, opCopy, opPunch, opTruncate:
		return o.n > 0 && o.off/blockSize <= blk && blk <= (o.off+o.n-1)/blockSize
	}
	return false
}

// diskModel tracks one disk: its content as the workload wrote it, and the
// content as of the last fsync that returned success, with the byte ranges
// touched since (which may hold old or new bytes after a crash).
type diskModel struct {
	i        int
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
	lastSync uint64 // seq of the last completed fsync (or of the verify that adopted the disk)
	// log holds the disk's last opLogLen operations, oldest first once
	// it wrapped at logNext; cycle those of the current cycle.
	log     []*op
	logNext int
	cycle   []*op
}

// snapModel is a snapshot of a disk: its content when it was taken, and
// whether the snapshot call returned (then it exists unless removed since),
// and whether it is being removed. A removal may or may not have taken
// effect, even one that returned: one the kill interrupted may have
// happened, and one that returned is undone by a kill before the next
// commit. So a snapshot being removed stays modelled, and must still read
// what it held, until a verify finds it gone; one a verify finds still
// there (again) is removed again first by the next snapshot of its disk.
type snapModel struct {
	name                  string
	data                  []byte
	seq                   uint64 // the snapshot operation's seq
	done, removing, again bool
}

func newDiskModel(i int) *diskModel {
	return &diskModel{i: i, tag: byte(i + 1), cur: make([]byte, diskSpan), synced: make([]byte, diskSpan), touched: make([]bool, diskSpan)}
}

func (m *diskModel) touch(off, n int64) {
	for i := off; i < min(off+n, diskSpan); i++ {
		m.touched[i] = true
	}
}

// record adds o to the disk's logs.
func (m *diskModel) record(o *op) {
	m.cycle = append(m.cycle, o)
	if len(m.log) < opLogLen {
		m.log = append(m.log, o)
		return
	}
	m.log[m.logNext] = o
	m.logNext = (m.logNext + 1) % opLogLen
}

// history lists the logged operations that may have changed block blk,
// and those that took or removed the snapshot called snap, oldest first,
// at most the last max of them.
func (m *diskModel) history(blk int64, snap string, max int) []string {
	var out []string
	for k := range m.log {
		o := m.log[(m.logNext+k)%len(m.log)]
		if o.touches(blk) || snap != "" && o.name == snap {
			out = append(out, o.String())
		}
	}
	if len(out) > max {
		out = append([]string{fmt.Sprintf("(%d earlier)", len(out)-max)}, out[len(out)-max:]...)
	}
	return out
}

// run is what the workers of one cycle share: the run's operation
// counter, the kill trigger, and whether the kill was sent.
type run struct {
	seq     *atomic.Uint64 // the run's last operation number
	done    atomic.Int64   // operations of this cycle that returned
	killAt  int64          // the kill follows the killAt-th return
	trigger chan struct{}  // closed at the killAt-th return
	once    sync.Once
	killed  atomic.Bool   // the kill was sent
	elapsed time.Duration // from the workers' start to the kill
}

// start numbers a new operation of disk m and logs it.
func (r *run) start(m *diskModel, cycle int, o op) *op {
	o.seq, o.cycle = r.seq.Add(1), cycle
	p := &o
	m.record(p)
	return p
}

// end records that o returned with err, and pulls the kill trigger at the
// cycle's killAt-th return.
func (r *run) end(o *op, err error) error {
	o.done, o.err, o.after = true, err, r.killed.Load()
	if r.done.Add(1) == r.killAt {
		r.once.Do(func() { close(r.trigger) })
	}
	return err
}

// worker is the outcome of one disk's workload in a cycle.
type worker struct {
	stop *op // the operation that failed (the daemon died), or nil
}

// snapshot takes a snapshot of disk i through the mount's socket and
// records it, keeping at most two per disk (the oldest removed first);
// snapshots found still there after their removal are removed again
// first. An error means the daemon is gone: the snapshot, or a removal
// before it, may have taken effect or not, which the next verify settles.
// It returns the last operation it started.
func (m *diskModel) snapshot(r *run, cycle int, mnt string) (*op, error) {
	remove := func(sm *snapModel) (*op, error) {
		sm.removing, sm.again = true, false
		o := r.start(m, cycle, op{kind: opRemove, name: sm.name})
		if err := os.Remove(filepath.Join(mnt, sm.name)); err != nil && !os.IsNotExist(err) {
			return o, r.end(o, err)
		}
		return o, r.end(o, nil)
	}
	for _, sm := range m.snaps {
		if sm.again {
			if o, err := remove(sm); err != nil {
				return o, err
			}
		}
	}
	for {
		var kept []*snapModel
		for _, sm := range m.snaps {
			if !sm.removing {
				kept = append(kept, sm)
			}
		}
		if len(kept) < 2 {
			break
		}
		if o, err := remove(kept[0]); err != nil {
			return o, err
		}
	}
	sm := &snapModel{name: fmt.Sprintf("d%d-s%d.raw", m.i, m.nextSnap), data: bytes.Clone(m.cur[:m.size])}
	o := r.start(m, cycle, op{kind: opSnapshot, name: sm.name})
	sm.seq = o.seq
	m.nextSnap++
	m.snaps = append(m.snaps, sm)
	if _, err := telemetry.Snapshot(mnt, fmt.Sprintf("d%d.raw", m.i), sm.name); err != nil {
		return o, r.end(o, err)
	}
	sm.done = true
	return o, r.end(o, nil)
}

// workload runs on disk m until an operation fails (the daemon is gone)
// or stop is closed, with its random choices from rng, and reports how
// far it got.
func workload(r *run, cycle int, mnt string, m *diskModel, rng *rand.Rand, stop <-chan struct{}) worker {
	var w worker
	i := m.i
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
		w.stop = &op{kind: opWrite, err: fmt.Errorf("open: %w", err), done: true, after: r.killed.Load()}
		return w
	}
	defer f.Close()
	buf := directio.AlignedBlock(256 << 10)
	for {
		select {
		case <-stop:
			return w
		default:
		}
		var o *op
		var err error
		switch k := rng.IntN(20); {
		case k == 19:
			o, err = m.snapshot(r, cycle, mnt)
		case k == 18: // copy_file_range within the disk: whole blocks shared
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
			o = r.start(m, cycle, op{kind: opCopy, off: dst, n: n, src: src, sync: syncOpen})
			roff, woff := src, dst
			var k int
			k, err = unix.CopyFileRange(int(f.Fd()), &roff, int(f.Fd()), &woff, int(n), 0)
			o.ret = int64(k)
			if err == nil && k > 0 {
				copy(m.cur[dst:dst+int64(k)], m.cur[src:src+int64(k)])
				m.size = max(m.size, dst+int64(k))
				if syncOpen {
					m.promiseRange(dst, int64(k))
				}
			}
		case k < 12: // write
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
			o = r.start(m, cycle, op{kind: opWrite, off: off, n: n, sync: syncOpen || rwf != 0})
			var k int
			k, err = unix.Pwritev2(int(f.Fd()), [][]byte{p}, off, rwf)
			o.ret = int64(k)
			if err == nil && int64(k) != n {
				err = fmt.Errorf("short write: %d of %d bytes", k, n)
			}
			if err == nil {
				copy(m.cur[off:], p)
				m.size = max(m.size, off+n)
				if o.sync {
					m.promiseRange(off, n)
				}
			}
		case k < 14: // punch a hole
			off, n := rng.Int64N(diskSpan), rng.Int64N(512<<10)
			m.touch(off, n)
			o = r.start(m, cycle, op{kind: opPunch, off: off, n: n, sync: syncOpen})
			err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n)
			if err == nil {
				if off < m.size {
					clear(m.cur[off:min(off+n, m.size)])
				}
				if syncOpen {
					m.promiseRange(off, n)
				}
			}
		case k < 16: // truncate
			size := rng.Int64N(diskSpan)
			from := min(size, m.size)
			m.touch(from, diskSpan)
			m.resized = true
			o = r.start(m, cycle, op{kind: opTruncate, off: from, n: diskSpan - from, src: size})
			err = f.Truncate(size)
			if err == nil {
				if size < m.size {
					clear(m.cur[size:])
				}
				m.size = size
			}
		default: // fsync: everything so far is now promised
			o = r.start(m, cycle, op{kind: opFsync})
			err = f.Sync()
			if err == nil {
				m.promise(o.seq)
			}
		}
		if o.kind != opSnapshot && o.kind != opRemove {
			r.end(o, err)
		}
		if err != nil {
			w.stop = o
			return w
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
// an fsync returned (operation seq).
func (m *diskModel) promise(seq uint64) {
	copy(m.synced, m.cur)
	clear(m.touched)
	m.sSize, m.resized = m.size, false
	m.lastSync = seq
}

// mismatch describes where got differs from want (both a disk's bytes
// from offset 0): the first differing offset and its block, a few bytes of
// each from there, how many bytes and blocks differ, and what the bytes
// found there are (zeros, this disk's, another disk's). A byte j where
// skip[j] (if skip is not nil) may differ. It returns -1 when they match.
func mismatch(m *diskModel, got, want []byte, skip []bool) (int, string) {
	n := min(len(got), len(want))
	if skip == nil && bytes.Equal(got[:n], want[:n]) {
		return -1, ""
	}
	first, bytesOff, blocks, lastBlk := -1, 0, 0, -1
	for j := 0; j < n; j++ {
		if got[j] == want[j] || skip != nil && skip[j] {
			continue
		}
		if first < 0 {
			first = j
		}
		bytesOff++
		if j/blockSize != lastBlk {
			blocks++
			lastBlk = j / blockSize
		}
	}
	if first < 0 {
		return -1, ""
	}
	end := min(first+16, n)
	blk := first / blockSize
	blkEnd := min((blk+1)*blockSize, len(got))
	var zeros, own, other int
	for _, b := range got[blk*blockSize : blkEnd] {
		switch {
		case b == 0:
			zeros++
		case b>>5 == m.tag:
			own++
		default:
			other++
		}
	}
	return first, fmt.Sprintf("first difference at byte %d (block %d, byte %d in it): want % x, got % x; "+
		"%d bytes in %d blocks differ; block %d reads %d zero bytes, %d of this disk, %d of another disk",
		first, blk, first%blockSize, want[first:end], got[first:end], bytesOff, blocks, blk, zeros, own, other)
}

// report is a failure's description what, followed by the logged
// operations of disk m that may have changed block blk, and those that
// took or removed the snapshot snap ("" for none).
func report(m *diskModel, what string, blk int64, snap string) string {
	which := fmt.Sprintf("touched block %d (bytes %d-%d)", blk, blk*blockSize, (blk+1)*blockSize-1)
	if snap != "" {
		which += " or snapshot " + snap
	}
	return fmt.Sprintf("%s\nlogged operations on d%d that %s, oldest first:\n\t%s",
		what, m.i, which, strings.Join(m.history(blk, snap, 40), "\n\t"))
}

// verify reads every disk through the mount and checks the contract,
// calling fail with the description and the bytes involved when it does
// not hold.
func verify(t *testing.T, cycle int, mnt string, models []*diskModel, seq uint64, fail func(msg string, files map[string][]byte)) {
	t.Helper()
	// Nothing the model does not know of: every disk and snapshot there
	// was made by the workload and is still modelled.
	known := map[string]bool{}
	for i, m := range models {
		known[fmt.Sprintf("d%d.raw", i)] = true
		for _, sm := range m.snaps {
			known[sm.name] = true
		}
	}
	entries, err := os.ReadDir(mnt)
	if err != nil {
		t.Fatalf("cycle %d: list the mount: %v", cycle, err)
	}
	for _, e := range entries {
		if !known[e.Name()] {
			fail(fmt.Sprintf("cycle %d: the mount holds %s, which the model does not know of", cycle, e.Name()), nil)
		}
	}
	for i, m := range models {
		name := filepath.Join(mnt, fmt.Sprintf("d%d.raw", i))
		got, err := os.ReadFile(name)
		if err != nil {
			t.Fatalf("cycle %d: read d%d: %v", cycle, i, err)
		}
		if !m.resized && int64(len(got)) != m.sSize {
			fail(report(m, fmt.Sprintf("cycle %d: d%d is %d bytes, %d at the last fsync (#%d) and not resized since",
				cycle, i, len(got), m.sSize, m.lastSync), int64(len(got))/blockSize, ""), nil)
		}
		for j, b := range got {
			if b != 0 && b>>5 != m.tag {
				fail(report(m, fmt.Sprintf("cycle %d: d%d byte %d (block %d) is %#x: another disk's byte (tag %d)",
					cycle, i, j, j/blockSize, b, b>>5), int64(j/blockSize), ""), map[string][]byte{fmt.Sprintf("d%d.got", i): got})
			}
		}
		n := min(int64(len(got)), diskSpan, m.sSize)
		if j, what := mismatch(m, got[:n], m.synced[:n], m.touched[:n]); j >= 0 {
			fail(report(m, fmt.Sprintf("cycle %d: d%d differs from what was promised (fsync #%d, or a synchronous write since) where nothing touched it since: %s",
				cycle, i, m.lastSync, what), int64(j/blockSize), ""), map[string][]byte{fmt.Sprintf("d%d.got", i): got, fmt.Sprintf("d%d.promised", i): m.synced[:n]})
		}
		live := m.snaps[:0]
		for _, sm := range m.snaps {
			data, err := os.ReadFile(filepath.Join(mnt, sm.name))
			switch {
			case err != nil && os.IsNotExist(err) && (!sm.done || sm.removing):
				continue // not taken, or removed, as the kill allowed
			case err != nil:
				fail(report(m, fmt.Sprintf("cycle %d: snapshot %s of d%d (taken #%d, done %v, removing %v): %v",
					cycle, sm.name, i, sm.seq, sm.done, sm.removing, err), 0, sm.name), nil)
			case len(data) != len(sm.data):
				fail(report(m, fmt.Sprintf("cycle %d: snapshot %s of d%d (taken #%d) is %d bytes, its disk held %d when it was taken",
					cycle, sm.name, i, sm.seq, len(data), len(sm.data)), int64(len(data))/blockSize, sm.name),
					map[string][]byte{sm.name + ".got": data, sm.name + ".want": sm.data})
			default:
				if j, what := mismatch(m, data, sm.data, nil); j >= 0 {
					blk := j / blockSize
					now := "beyond the disk's end now"
					if (blk+1)*blockSize <= len(got) {
						now = fmt.Sprintf("the disk's block %d reads the same as the snapshot's now: %v", blk,
							bytes.Equal(got[blk*blockSize:(blk+1)*blockSize], data[blk*blockSize:(blk+1)*blockSize]))
					}
					fail(report(m, fmt.Sprintf("cycle %d: snapshot %s of d%d (taken #%d, done %v) differs from what its disk held when it was taken: %s; %s",
						cycle, sm.name, i, sm.seq, sm.done, what, now), int64(blk), sm.name),
						map[string][]byte{sm.name + ".got": data, sm.name + ".want": sm.data, fmt.Sprintf("d%d.got", i): got})
				}
			}
			// It exists, whatever the call that took it said; one being
			// removed is removed again by the next snapshot of the disk.
			sm.done = true
			sm.again = sm.removing
			m.checked++
			live = append(live, sm)
		}
		m.snaps = live
		// Adopt what survived as the new baseline: it is all durable now
		// (the remount replayed it and the test will fsync before going on).
		clear(m.cur)
		copy(m.cur, got[:min(int64(len(got)), diskSpan)])
		m.size = int64(len(got))
		m.lastSync = seq
	}
}

// keepEvidence kills the daemon d and copies the store and files into a
// new directory under dir, and says where.
func keepEvidence(dir string, seed uint64, cycle int, d *daemon, store string, files map[string][]byte) string {
	if d != nil {
		d.cmd.Process.Kill()
		d.cmd.Wait()
	}
	out := filepath.Join(dir, fmt.Sprintf("seed%d-cycle%d", seed, cycle))
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Sprintf("evidence not kept: %v", err)
	}
	if o, err := exec.Command("cp", "--sparse=always", store, out).CombinedOutput(); err != nil {
		return fmt.Sprintf("store not kept: %v: %s", err, o)
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(out, name), data, 0o644); err != nil {
			return fmt.Sprintf("evidence not kept: %v", err)
		}
	}
	if d != nil {
		os.WriteFile(filepath.Join(out, "daemon.stderr"), d.stderr.Bytes(), 0o644)
	}
	return "the store (as the daemon left it, killed) and the bytes are kept in " + out
}

// startLoad starts n CPU hogs (yes > /dev/null) that live until the test
// ends, and die with the test process if it is killed.
func startLoad(t *testing.T, n int) {
	for range n {
		cmd := exec.Command("yes")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start CPU hog: %v", err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill()
			cmd.Wait()
		})
	}
}

// envInt reads a non-negative integer from the environment, def if unset.
func envInt(t *testing.T, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return n
}

func TestCrashLoop(t *testing.T) {
	testutil.RequireFUSE(t)
	cycles := int(envInt(t, "VDISK_CRASH_CYCLES", 50))
	if testing.Short() {
		cycles = min(cycles, 10)
	}
	seed := envInt(t, "VDISK_SEED", rand.Uint64())
	load := int(envInt(t, "VDISK_CRASH_LOAD", 0))
	t.Logf("seed %d, %d cycles, %d CPU hogs (VDISK_SEED=%d replays the choices)", seed, cycles, load, seed)
	startLoad(t, load)
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
	t.Cleanup(func() { dumpCycle(t, models) })
	// fail ends the test on a broken contract; with VDISK_CRASH_KEEP set
	// it first kills the daemon (nothing more is written) and keeps the
	// store and files (the bytes involved) there, for a post-mortem.
	var live *daemon
	cycle := 0
	fail := func(msg string, files map[string][]byte) {
		t.Helper()
		if keep := os.Getenv("VDISK_CRASH_KEEP"); keep != "" {
			msg += "\n" + keepEvidence(keep, seed, cycle, live, store, files)
		}
		t.Fatal(msg)
	}
	// The disks exist (durably) before the first kill; the odd ones are
	// encrypted, their keys in keys/ (mount --key-dir).
	keys := filepath.Join(dir, "keys")
	if err := os.Mkdir(keys, 0o700); err != nil {
		t.Fatal(err)
	}
	mount := func(t *testing.T, bin, store, mnt string, extra ...string) *daemon {
		return mount(t, bin, store, mnt, append([]string{"--key-dir", keys}, extra...)...)
	}
	d := mount(t, bin, store, mnt)
	for i := range models {
		name := fmt.Sprintf("d%d.raw", i)
		if i%2 == 1 {
			key := filepath.Join(keys, name+".key")
			if err := os.WriteFile(key, bytes.Repeat([]byte{byte(i)}, 32), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(bin, "create", mnt, name, "0", "--encrypt", "--key-file", key).CombinedOutput(); err != nil {
				t.Fatalf("create %s: %v: %s", name, err, out)
			}
		}
		f, err := os.OpenFile(filepath.Join(mnt, name), os.O_RDWR|os.O_CREATE, 0o644)
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
	var seq atomic.Uint64
	kills := 0
	for cycle = 1; cycle <= cycles; cycle++ {
		d := mount(t, bin, store, mnt)
		live = d
		verify(t, cycle, mnt, models, seq.Load(), fail)
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
			m.promise(seq.Load())
		}
		killAt := 1 + rng.Int64N(maxKillOps)
		for _, m := range models {
			m.cycle = m.cycle[:0]
		}
		// One snapshot per cycle before the workloads start (done before
		// the kill, so the next verify must find it), so that every run
		// checks snapshots across kills whatever the seed; the workloads
		// take more at random, some in flight at the kill.
		r := &run{seq: &seq, killAt: -1, trigger: make(chan struct{})}
		if _, err := models[cycle%disks].snapshot(r, cycle, mnt); err != nil {
			t.Fatalf("cycle %d: snapshot of d%d: %v", cycle, cycle%disks, err)
		}
		r = &run{seq: &seq, killAt: killAt, trigger: make(chan struct{})}
		stop := make(chan struct{})
		var wg sync.WaitGroup
		workers := make([]worker, disks)
		for i := range models {
			wg.Add(1)
			wrng := rand.New(rand.NewPCG(seed, uint64(cycle)<<8|uint64(i)))
			go func() {
				defer wg.Done()
				workers[i] = workload(r, cycle, mnt, models[i], wrng, stop)
			}()
		}
		started := time.Now()
		allDone := make(chan struct{})
		go func() { wg.Wait(); close(allDone) }()
		select {
		case <-r.trigger:
		case <-allDone:
		}
		r.killed.Store(true)
		r.elapsed = time.Since(started)
		if err := d.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		d.cmd.Wait()
		kills++
		close(stop)
		<-allDone
		logCycle(t, cycle, r, models, workers)
		// A clean unmount and fsck every tenth cycle (fsck needs the store
		// closed); the other cycles remount straight over the dead mount.
		if cycle%10 == 0 || cycle == cycles {
			d := mount(t, bin, store, mnt)
			live = d
			verify(t, cycle, mnt, models, seq.Load(), fail)
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

// logCycle logs how far each worker got in the cycle, and fails the test
// if one stopped before the kill was sent: an operation failed while the
// daemon was alive. (dumpCycle lists the operations on failure.)
func logCycle(t *testing.T, cycle int, r *run, models []*diskModel, workers []worker) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "cycle %d: kill after %d operations returned (%v);", cycle, r.killAt, r.elapsed.Round(time.Millisecond))
	for i, m := range models {
		fmt.Fprintf(&b, " d%d: %d ops", i, len(m.cycle))
		if n := len(m.cycle); n > 0 {
			fmt.Fprintf(&b, " #%d-#%d", m.cycle[0].seq, m.cycle[n-1].seq)
		}
		if w := workers[i]; w.stop != nil {
			fmt.Fprintf(&b, ", stopped at %s", w.stop)
		}
		b.WriteString(";")
	}
	t.Log(b.String())
	for i, w := range workers {
		if w.stop != nil && w.stop.err != nil && !w.stop.after {
			t.Fatalf("cycle %d: d%d: %s, before the kill", cycle, i, w.stop)
		}
		if w.stop != nil && w.stop.err != nil && !expectedAfterKill(w.stop.err) {
			t.Logf("cycle %d: d%d stopped with an unusual error after the kill: %v", cycle, i, w.stop.err)
		}
	}
}

// dumpCycle logs every operation of the last cycle, disk by disk, when the
// test failed.
func dumpCycle(t *testing.T, models []*diskModel) {
	if !t.Failed() {
		return
	}
	for _, m := range models {
		var b strings.Builder
		fmt.Fprintf(&b, "d%d: the %d operations of the last cycle:", m.i, len(m.cycle))
		for _, o := range m.cycle {
			fmt.Fprintf(&b, "\n\t%s", o)
		}
		t.Log(b.String())
	}
}

// expectedAfterKill reports whether err is how an operation fails once the
// daemon is gone: the FUSE connection aborted or gone (or, over
// FUSE-over-io_uring, the request canceled or interrupted), or the
// socket closed.
func expectedAfterKill(err error) bool {
	return errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECANCELED) || errors.Is(err, syscall.EINTR) ||
		errors.Is(err, telemetry.ErrNotServing) || errors.Is(err, syscall.ECONNRESET)
}
