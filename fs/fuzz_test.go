package fs

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/fs/fuseuring"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// FuzzMountOps runs programs of file operations, decoded from the input,
// through real mounts, against a byte model of each disk: direct and
// buffered reads and writes (aligned and not, within, across and past the
// size), synchronous writes (O_DSYNC handles, RWF_DSYNC), bursts of
// parallel direct writes and reads that contend for ranges, punch, zero
// range, allocate, truncate, fsync, fdatasync and reopens. Every operation
// must succeed and every read must return what the model holds.
//
// The mounts run with Strict on (the store checks itself after every
// commit) on each transport this kernel offers, and on the io_uring
// transport both over a store file (the backend puts the I/O on the
// queue's ring) and over memory (the queue thread has the backend do it),
// so the programs run the planner and the submission path a root mount
// uses, the queue-thread path and its fallbacks to a worker included.
func FuzzMountOps(f *testing.F) {
	mounts := newFuzzMounts(f)
	for _, seed := range mountOpsSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, prog []byte) {
		mounts.run(t, prog)
	})
}

// TestMountOpsRandom runs random programs through the same harness on
// every mount, and asserts that the io_uring mounts served requests on
// their queue threads.
func TestMountOpsRandom(t *testing.T) {
	n := 60
	if testing.Short() {
		n = 12
	}
	seed := testutil.Seed(t)
	mounts := newFuzzMounts(t)
	r := rand.New(rand.NewPCG(seed, 11))
	for i := range n * len(mounts.tcs) {
		prog := make([]byte, 1+4*(8+r.IntN(60)))
		for j := range prog {
			prog[j] = byte(r.Uint32())
		}
		prog[0] = byte(i % len(mounts.tcs))
		if !t.Run(fmt.Sprint(i), func(t *testing.T) { mounts.run(t, prog) }) {
			t.Fatalf("program %x", prog)
		}
	}
	for i, tc := range mounts.tcs {
		if tc.mountOpts.Transport == TransportIOURing {
			tc.ownerIO(mounts.names[i])
		}
	}
}

// fuzzMounts are the mounts programs run on: prog[0] picks one.
type fuzzMounts struct {
	tcs   []*testCase
	names []string
	next  int // numbers the disks of each program
}

func newFuzzMounts(t testing.TB) *fuzzMounts {
	requireFUSE(t)
	strict := withStoreOptions(image.Options{Strict: true, CommitInterval: 50 * time.Millisecond})
	m := &fuzzMounts{}
	add := func(name string, opts ...tcOption) {
		m.tcs = append(m.tcs, newTestCase(t, append(opts, strict)...))
		m.names = append(m.names, name)
	}
	add("dev, file", withStoreSize(1<<30), withMountOptions(Options{Transport: TransportDev}))
	if _, err := os.Stat(fuseuring.EnableParam); err != nil {
		t.Logf("no FUSE-over-io_uring on this kernel (%v): the programs run on /dev/fuse only", err)
		return m
	}
	if err := fuseuring.Enable(); err != nil {
		t.Fatal(err)
	}
	add("io_uring, file", withStoreSize(1<<30), withMountOptions(Options{Transport: TransportIOURing}))
	add("io_uring, memory", withMemBackend(backend.NewMem(256<<20)), withMountOptions(Options{Transport: TransportIOURing}))
	return m
}

// mountOpsSeeds are small programs: each op once over aligned, unaligned
// and growing ranges, and a burst against a punch.
func mountOpsSeeds() [][]byte {
	var seeds [][]byte
	for mnt := byte(0); mnt < 3; mnt++ {
		for op := byte(0); op < numMountOps; op++ {
			seeds = append(seeds, []byte{mnt, mopWrite, 0, 3, 4, op, 0, 1, 2, op, 1, 5, 6, mopRead, 0, 0, 7})
		}
		seeds = append(seeds, []byte{mnt, mopBurst, 0, 0, 0, mopPunch, 0, 2, 3, mopBurst, 0, 1, 1, mopReopen, 0, 0, 0, mopRead, 0, 0, 9})
	}
	return seeds
}

// The operations of a program: 4 bytes each, op, disk, a, b (offset and
// length selectors, or a mode).
const (
	mopWrite byte = iota
	mopRead
	mopDsyncWrite
	mopBurst
	mopPunch
	mopZeroRange
	mopAllocate
	mopTruncate
	mopFsync
	mopReopen
	mopCopy // copy_file_range from the other disk: shared blocks, written around later
	numMountOps
)

// fuzzDiskMax bounds a program's disks, so that a program stays fast.
const fuzzDiskMax = 6 << 20

// fuzzDisk is one disk of a program: its open handles and its model.
type fuzzDisk struct {
	path        string
	plain, sync *os.File // O_RDWR|O_DIRECT, and O_RDWR|O_DSYNC
	model       []byte   // the disk's bytes; len is its size
}

// run runs prog on the mount prog[0] picks, on two new disks that it
// removes at the end.
func (m *fuzzMounts) run(t *testing.T, prog []byte) {
	if len(prog) == 0 {
		return
	}
	tc := m.tcs[int(prog[0])%len(m.tcs)]
	prog = prog[1:]
	m.next++
	disks := make([]*fuzzDisk, 2)
	for i := range disks {
		d := &fuzzDisk{path: tc.path(fmt.Sprintf("fz%d-%d.raw", m.next, i))}
		d.open(t, os.O_CREATE|os.O_EXCL)
		disks[i] = d
	}
	defer func() {
		for _, d := range disks {
			d.close()
			if err := os.Remove(d.path); err != nil {
				t.Errorf("remove %s: %v", d.path, err)
			}
		}
	}()
	for i := 0; i+4 <= len(prog); i += 4 {
		op, d := prog[i]%numMountOps, disks[int(prog[i+1])%len(disks)]
		a, b := prog[i+2], prog[i+3]
		what := fmt.Sprintf("op %d (%d %d %d) on %s", i/4, op, a, b, d.path)
		if op == mopCopy {
			if err := d.copyFrom(disks[1-int(prog[i+1])%len(disks)], a, b); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			continue
		}
		if err := d.do(t, op, a, b, uint64(i)); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	for _, d := range disks {
		d.verify(t, "at the end")
	}
}

func (d *fuzzDisk) open(t *testing.T, flags int) {
	t.Helper()
	var err error
	if d.plain, err = os.OpenFile(d.path, os.O_RDWR|unix.O_DIRECT|flags, 0o600); err != nil {
		t.Fatal(err)
	}
	if d.sync, err = os.OpenFile(d.path, os.O_RDWR|unix.O_DSYNC, 0o600); err != nil {
		t.Fatal(err)
	}
}

func (d *fuzzDisk) close() {
	d.plain.Close()
	d.sync.Close()
}

// offLen decodes an offset and a length selector into a range: aligned to
// 4 KiB or not, inside the disk, across its end or past it.
func (d *fuzzDisk) offLen(a, b byte) (off, n int64) {
	size := int64(len(d.model))
	switch a % 4 {
	case 0: // a 4 KiB block inside the first MiBs
		off = int64(a/4) * 4096 * 3
	case 1: // anywhere, unaligned
		off = int64(a) * 12347
	case 2: // at the size, aligned down
		off = size &^ 4095
	default: // just before the size
		off = max(0, size-int64(a))
	}
	switch b % 4 {
	case 0:
		n = 4096 * int64(1+b/4%16)
	case 1:
		n = int64(b) * 311
	case 2:
		n = 1 << 20
	default:
		n = 4096 * int64(1+b/4)
	}
	off = min(off, fuzzDiskMax-4096)
	return off, max(1, min(n, fuzzDiskMax-off))
}

// aligned is whether a range can go to O_DIRECT as it is.
func aligned(off, n int64) bool { return off%4096 == 0 && n%4096 == 0 }

func (d *fuzzDisk) do(t *testing.T, op, a, b byte, seq uint64) error {
	off, n := d.offLen(a, b)
	switch op {
	case mopWrite, mopDsyncWrite:
		p := directio.AlignedBlock(int(n + 4096))[:n]
		fillSeq(p, seq)
		var err error
		switch {
		case op == mopDsyncWrite && b%2 == 0:
			_, err = unix.Pwritev2(int(d.plain.Fd()), [][]byte{p}, off, unix.RWF_DSYNC)
		case op == mopDsyncWrite || !aligned(off, n):
			_, err = d.sync.WriteAt(p, off) // O_DSYNC, and not O_DIRECT
		default:
			_, err = d.plain.WriteAt(p, off)
		}
		if err != nil {
			return fmt.Errorf("write %d at %d: %w", n, off, err)
		}
		d.write(p, off)
	case mopRead:
		return d.readCompare(off, n)
	case mopBurst:
		return d.burst(seq, a)
	case mopPunch:
		if err := unix.Fallocate(int(d.plain.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
			return fmt.Errorf("punch %d at %d: %w", n, off, err)
		}
		d.zero(off, n, true)
	case mopZeroRange:
		mode, keep := uint32(unix.FALLOC_FL_ZERO_RANGE), b%2 == 0
		if keep {
			mode |= unix.FALLOC_FL_KEEP_SIZE
		}
		if err := unix.Fallocate(int(d.plain.Fd()), mode, off, n); err != nil {
			return fmt.Errorf("zero range %d at %d: %w", n, off, err)
		}
		d.zero(off, n, keep)
	case mopAllocate:
		mode, keep := uint32(0), b%2 == 0
		if keep {
			mode = unix.FALLOC_FL_KEEP_SIZE
		}
		if err := unix.Fallocate(int(d.plain.Fd()), mode, off, n); err != nil {
			return fmt.Errorf("allocate %d at %d: %w", n, off, err)
		}
		if !keep && off+n > int64(len(d.model)) {
			d.resize(off + n)
		}
	case mopTruncate:
		size := off + n
		if a%2 == 0 {
			size = off
		}
		if err := d.plain.Truncate(size); err != nil {
			return fmt.Errorf("truncate to %d: %w", size, err)
		}
		d.resize(size)
	case mopFsync:
		sync := d.plain.Sync
		if a%2 == 0 {
			sync = func() error { return unix.Fdatasync(int(d.plain.Fd())) }
		}
		if err := sync(); err != nil {
			return fmt.Errorf("fsync: %w", err)
		}
	case mopReopen:
		d.close()
		d.open(t, 0)
		d.verify(t, "after a reopen")
	}
	return nil
}

// copyFrom copies a range of src into d with copy_file_range: whole
// blocks become shared, edges are copied.
func (d *fuzzDisk) copyFrom(src *fuzzDisk, a, b byte) error {
	srcOff, n := src.offLen(a, b)
	off, _ := d.offLen(b, a)
	if a%2 == 0 {
		off = off&^4095 | srcOff&4095 // placed alike in their blocks: shared
	}
	off = min(off, fuzzDiskMax-n)
	roff, woff := srcOff, off
	k, err := unix.CopyFileRange(int(src.plain.Fd()), &roff, int(d.plain.Fd()), &woff, int(n), 0)
	if err != nil {
		return fmt.Errorf("copy %d bytes at %d to %d: %w", n, srcOff, off, err)
	}
	want := max(0, min(n, int64(len(src.model))-srcOff))
	if int64(k) != want {
		return fmt.Errorf("copy %d bytes at %d to %d: copied %d, want %d", n, srcOff, off, k, want)
	}
	if k > 0 {
		d.write(bytes.Clone(src.model[srcOff:srcOff+int64(k)]), off)
	}
	return nil
}

// burst runs parallel direct I/O on the disk: writers on disjoint 4 KiB
// blocks (holes and mapped ones) and readers of blocks nobody writes, so
// the queue threads' plans meet ranges held by each other and by workers.
func (d *fuzzDisk) burst(seq uint64, a byte) error {
	const blocks = 16
	base := int64(a%8) * 64 << 10
	if base+2*blocks*4096 > int64(len(d.model)) {
		d.resize(base + 2*blocks*4096) // readers stay within the size
		if err := d.plain.Truncate(int64(len(d.model))); err != nil {
			return fmt.Errorf("burst: truncate: %w", err)
		}
	}
	errs := make(chan error, 2*blocks)
	var wg sync.WaitGroup
	bufs := make([][]byte, blocks)
	for i := range blocks {
		bufs[i] = directio.AlignedBlock(4096)
		fillSeq(bufs[i], seq<<8|uint64(i))
		off := base + int64(2*i)*4096 // writers take even blocks
		wg.Go(func() {
			if _, err := d.plain.WriteAt(bufs[i], off); err != nil {
				errs <- fmt.Errorf("burst write at %d: %w", off, err)
			}
		})
		roff := off + 4096 // readers odd ones
		want := bytes.Clone(d.model[roff : roff+4096])
		wg.Go(func() {
			got := directio.AlignedBlock(4096)
			if _, err := d.plain.ReadAt(got, roff); err != nil {
				errs <- fmt.Errorf("burst read at %d: %w", roff, err)
			} else if !bytes.Equal(got, want) {
				errs <- fmt.Errorf("burst read at %d: bytes differ from the model", roff)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err // the first; nil once errs is empty
	}
	for i := range blocks {
		d.write(bufs[i], base+int64(2*i)*4096)
	}
	return nil
}

// readCompare reads [off, off+n) the way a client would (direct when
// aligned, else through the O_DSYNC handle, which is buffered) and
// compares it with the model.
func (d *fuzzDisk) readCompare(off, n int64) error {
	got := directio.AlignedBlock(int(n + 4096))[:n]
	f := d.plain
	if !aligned(off, n) {
		f = d.sync
	}
	k, err := f.ReadAt(got, off)
	size := int64(len(d.model))
	want := []byte{}
	if off < size {
		want = d.model[off:min(off+n, size)]
	}
	if k != len(want) || err != nil && k == int(n) {
		return fmt.Errorf("read %d at %d of a %d-byte disk: got %d bytes, %v", n, off, size, k, err)
	}
	if !bytes.Equal(got[:k], want) {
		i := 0
		for i < k && got[i] == want[i] {
			i++
		}
		return fmt.Errorf("read %d at %d: byte %d is %#x, the model has %#x", n, off, off+int64(i), got[i], want[i])
	}
	return nil
}

// verify reads the whole disk and compares it with the model.
func (d *fuzzDisk) verify(t *testing.T, when string) {
	t.Helper()
	fi, err := d.plain.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != int64(len(d.model)) {
		t.Fatalf("%s %s: size %d, the model's %d", d.path, when, fi.Size(), len(d.model))
	}
	for off := int64(0); off < int64(len(d.model)); off += 1 << 20 {
		if err := d.readCompare(off, min(1<<20, int64(len(d.model))-off+4095)&^4095); err != nil {
			t.Fatalf("%s %s: %v", d.path, when, err)
		}
	}
}

func (d *fuzzDisk) write(p []byte, off int64) {
	if end := off + int64(len(p)); end > int64(len(d.model)) {
		d.resize(end)
	}
	copy(d.model[off:], p)
}

// zero zeroes [off, off+n) of the model, clipped to the size when keep,
// else growing it.
func (d *fuzzDisk) zero(off, n int64, keep bool) {
	if !keep && off+n > int64(len(d.model)) {
		d.resize(off + n)
	}
	if off < int64(len(d.model)) {
		clear(d.model[off:min(off+n, int64(len(d.model)))])
	}
}

func (d *fuzzDisk) resize(size int64) {
	if size <= int64(len(d.model)) {
		d.model = d.model[:size]
		return
	}
	d.model = append(d.model, make([]byte, size-int64(len(d.model)))...)
}

// fillSeq fills p with bytes that depend on seq, never all zero.
func fillSeq(p []byte, seq uint64) {
	r := rand.New(rand.NewPCG(seq, 3))
	for i := range p {
		p[i] = byte(r.Uint32()) | 1
	}
}
