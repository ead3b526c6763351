package fs

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ncw/directio"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// Simulated power loss under a mount: the store lives on a backend.Crash,
// a concurrent workload runs through the kernel on several disks (O_DIRECT
// and buffered writes, punch and zero-range fallocates, truncates, fsync and
// fdatasync), and afterwards power is cut at every flush of the history and
// at random points (unflushed writes dropped, kept at random, or torn at
// 512-byte sectors). Each possible state must open, Check clean, hold every
// byte each disk had at its last completed fsync, or synchronous write or
// fallocate (O_DSYNC, O_SYNC, RWF_DSYNC, RWF_SYNC), unless the disk itself
// changed it since, and show in each disk only zeros or bytes carrying that
// disk's tag (its number in the high nibble, a non-zero low nibble).

// plDisk is one disk of the power-loss workload. Only its own goroutine
// touches it while the workload runs.
type plDisk struct {
	name     string
	tag      byte
	data     []byte      // the model: what the disk reads now
	steps    []plStep    // every change, in order
	syncs    []plSync    // every completed fsync
	promises []plPromise // every completed synchronous write or fallocate
}

// plStep is one change through the mount; its backend ops come after start
// (the op count before the system call), so a power cut at or before start
// cannot hold any of it.
type plStep struct {
	start  int
	lo, hi int64 // the byte range it may have changed
	resize bool  // it may have changed the size
}

// plSync is the model at a completed fsync: op is the op count read after
// fsync returned, so a cut at op or later includes the commit.
type plSync struct {
	op    int
	steps int // len(steps) at the fsync: later steps came after it
	data  []byte
}

// plPromise is a synchronous write or fallocate (O_DSYNC, O_SYNC, RWF_DSYNC,
// RWF_SYNC) that returned: like a FUA write it promises its own bytes, not
// the rest of the disk. op is the op count read after it returned; the
// steps from index steps on came after it.
type plPromise struct {
	op, steps int
	lo, hi    int64
	data      []byte // what [lo, hi) reads
}

// quietLogger keeps the expected warnings of recovery out of the output.
func quietLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// It runs on both FUSE transports: over io_uring the aligned reads and
// writes take the queue-thread (owner) path, through the Crash backend's
// submission seam (Do), as a root mount's would on a file.
func TestPowerLossUnderMount(t *testing.T) {
	runs, ops, limit := 2, 140, int64(1<<20)
	if testing.Short() {
		runs, ops, limit = 1, 80, 256<<10
	}
	forTransports(t, func(t *testing.T, tr Transport) {
		total := 0
		var owner uint64
		for r := range runs {
			t.Run(fmt.Sprintf("run%d", r), func(t *testing.T) {
				n, o := runPowerLoss(t, tr, testutil.Seed(t), ops, limit)
				total, owner = total+n, owner+o
			})
		}
		t.Logf("%d power-cut states checked; %d requests took the queue-thread path", total, owner)
		if total < 300 {
			t.Errorf("only %d power-cut states checked, want at least 300", total)
		}
	})
}

// runPowerLoss runs the workload over transport tr and checks the power
// cuts; it returns the states checked and how many requests took the
// queue-thread path.
func runPowerLoss(t *testing.T, tr Transport, seed uint64, ops int, limit int64) (int, uint64) {
	const ndisks = 4
	// A small store: data region of 6 × limit (the disks hold at most 4 ×
	// limit), so that freed blocks are soon reused by other disks.
	c := backend.NewCrash(1<<20 + 6*limit)
	c.CheckAlignment(512)
	// A small journal makes checkpoints frequent, so cuts land inside
	// them too; the commit timer adds commits nobody asked for.
	tc := newTestCase(t, withMemBackend(c), withFormatOptions(image.FormatOptions{JournalSize: 64 << 10}),
		withStoreOptions(image.Options{CommitInterval: 20 * time.Millisecond, Strict: true}),
		withMountOptions(Options{Transport: tr}))

	disks := make([]*plDisk, ndisks)
	for i := range disks {
		d := &plDisk{name: fmt.Sprintf("p%d.raw", i), tag: byte(i + 1)}
		disks[i] = d
		f := tc.openFile(d.name, os.O_RDWR|os.O_CREATE, 0o600)
		if err := f.Sync(); err != nil {
			t.Fatal(err)
		}
		d.syncs = append(d.syncs, plSync{op: c.OpCount()})
		f.Close()
	}
	var wg sync.WaitGroup
	errs := make(chan error, ndisks)
	for i, d := range disks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.run(c, tc.path(d.name), rand.New(rand.NewPCG(seed, uint64(i))), ops, limit); err != nil {
				errs <- fmt.Errorf("%s: %w", d.name, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	served, retried := tc.ownerIO("workload")
	// Unmount and close: the close commits and checkpoints, and power cuts
	// land in that too. Afterwards everything is durable.
	tc.closeStore()
	end := c.OpCount()
	for _, d := range disks {
		d.syncs = append(d.syncs, plSync{op: end, steps: len(d.steps), data: d.data})
	}

	type cut struct {
		op   int
		mode backend.CrashMode
	}
	// Cuts from the end of Format on: a store half formatted is no store.
	first := tc.formatOps
	var cuts []cut
	for _, f := range c.FlushOps() {
		if f < first {
			continue
		}
		// At the flush: exactly what it made durable. Right before it: any
		// subset of the writes it was about to make durable, whole or
		// torn (at the flush itself RandomSubset would have nothing left
		// to choose from).
		// -short takes one of the two.
		cuts = append(cuts, cut{f, backend.DropUnflushed})
		if !testing.Short() || f%2 == 0 {
			cuts = append(cuts, cut{f - 1, backend.RandomSubset})
		}
		if !testing.Short() || f%2 == 1 {
			cuts = append(cuts, cut{f - 1, backend.Torn})
		}
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	for range 60 {
		cuts = append(cuts, cut{first + rng.IntN(end-first+1), backend.Torn})
	}
	for range 20 {
		cuts = append(cuts, cut{first + rng.IntN(end-first+1), backend.RandomSubset})
	}
	// At least 320 states per run, however few fsyncs this seed drew.
	for len(cuts) < 320 {
		cuts = append(cuts, cut{first + rng.IntN(end-first+1), backend.Torn})
	}
	for _, k := range cuts {
		if err := verifyPowerCut(c, k.op, k.mode, rng, disks); err != nil {
			t.Fatalf("power cut after op %d of %d (%s): %v", k.op, end, k.mode, err)
		}
	}
	t.Logf("%d ops, %d flushes, %d states checked", end, len(c.FlushOps()), len(cuts))
	return len(cuts), served + retried
}

// run is the workload of one disk: ops random operations through the
// mount, offsets below limit, each recorded in the model.
func (d *plDisk) run(c *backend.Crash, path string, rng *rand.Rand, ops int, limit int64) error {
	bf, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer bf.Close()
	df, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer df.Close()
	// Synchronous opens: every write or fallocate on them is promised
	// when it returns.
	bsf, err := os.OpenFile(path, os.O_RDWR|unix.O_DSYNC, 0)
	if err != nil {
		return err
	}
	defer bsf.Close()
	dsf, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT|unix.O_SYNC, 0)
	if err != nil {
		return err
	}
	defer dsf.Close()
	synced := func() {
		d.syncs = append(d.syncs, plSync{op: c.OpCount(), steps: len(d.steps), data: bytes.Clone(d.data)})
	}
	// promised records a synchronous change of [lo, hi) that returned.
	promised := func(st plStep) {
		d.steps = append(d.steps, st)
		size := int64(len(d.data)) // a fallocate may lie past the end
		lo, hi := min(st.lo, size), min(st.hi, size)
		d.promises = append(d.promises, plPromise{op: c.OpCount(), steps: len(d.steps), lo: lo, hi: hi,
			data: bytes.Clone(d.data[lo:hi])})
	}
	abuf := directio.AlignedBlock(64 << 10)
	fill := func(p []byte) {
		for i := range p {
			p[i] = d.tag<<4 | byte(1+rng.IntN(15))
		}
	}
	for range ops {
		st := plStep{start: c.OpCount()}
		size := int64(len(d.data))
		switch k := rng.IntN(100); {
		case k < 26: // O_DIRECT write of whole sectors, half of them of whole blocks
			unit := int64(512)
			if rng.IntN(2) == 0 {
				unit = 4096 // the queue-thread path's: block-aligned
			}
			off := rng.Int64N(limit/unit) * unit
			n := min(int64(1+rng.IntN(int(64<<10/unit)))*unit, limit-off)
			p := abuf[:n]
			fill(p)
			if _, err := df.WriteAt(p, off); err != nil {
				return fmt.Errorf("O_DIRECT write %d at %d: %w", n, off, err)
			}
			d.write(p, off)
			st.lo, st.hi, st.resize = off, off+n, off+n > size
		case k < 48: // buffered write, any offset and length
			off := rng.Int64N(limit)
			n := min(int64(1+rng.IntN(20000)), limit-off)
			p := make([]byte, n)
			fill(p)
			if _, err := bf.WriteAt(p, off); err != nil {
				return fmt.Errorf("write %d at %d: %w", n, off, err)
			}
			d.write(p, off)
			st.lo, st.hi, st.resize = off, off+n, off+n > size
		case k < 60: // a synchronous write: promised when it returns
			direct := rng.IntN(2) == 0
			var off, n int64
			var p []byte
			if direct {
				off = rng.Int64N(limit/512) * 512
				n = min(int64(1+rng.IntN(128))*512, limit-off)
				p = abuf[:n]
			} else {
				off = rng.Int64N(limit)
				n = min(int64(1+rng.IntN(20000)), limit-off)
				p = make([]byte, n)
			}
			fill(p)
			var how string
			var err error
			f, syncf := bf, bsf // buffered: O_DSYNC open
			if direct {
				f, syncf = df, dsf // O_DIRECT: O_SYNC open
			}
			switch rng.IntN(3) {
			case 0:
				how = "O_DSYNC/O_SYNC"
				_, err = syncf.WriteAt(p, off)
			case 1:
				how = "RWF_DSYNC"
				_, err = unix.Pwritev2(int(f.Fd()), [][]byte{p}, off, unix.RWF_DSYNC)
			default:
				how = "RWF_SYNC"
				_, err = unix.Pwritev2(int(f.Fd()), [][]byte{p}, off, unix.RWF_SYNC)
			}
			if err != nil {
				return fmt.Errorf("%s write %d at %d (direct %v): %w", how, n, off, direct, err)
			}
			d.write(p, off)
			st.lo, st.hi, st.resize = off, off+n, off+n > size
			promised(st)
			continue
		case k < 72: // punch or zero a range, keeping the size
			off := rng.Int64N(limit)
			n := 1 + rng.Int64N(min(256<<10, limit-off))
			mode := uint32(unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE)
			if rng.IntN(3) == 0 {
				mode = unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE
			}
			f := bf
			if sync := rng.IntN(4) == 0; sync {
				f = bsf // on a synchronous open: promised when it returns
			}
			if err := unix.Fallocate(int(f.Fd()), mode, off, n); err != nil {
				return fmt.Errorf("fallocate %#x [%d,+%d): %w", mode, off, n, err)
			}
			if off < size {
				clear(d.data[off:min(off+n, size)])
			}
			st.lo, st.hi = off, off+n
			if f == bsf {
				promised(st)
				continue
			}
		case k < 80: // truncate, either way
			ns := rng.Int64N(limit + 1)
			if err := bf.Truncate(ns); err != nil {
				return fmt.Errorf("truncate to %d: %w", ns, err)
			}
			if ns <= size {
				d.data = d.data[:ns]
			} else {
				d.data = append(d.data, make([]byte, ns-size)...)
			}
			st.lo, st.hi, st.resize = min(size, ns), math.MaxInt64, true
		case k < 86: // O_DIRECT read of whole blocks: reads what the model holds
			if size < 4096 {
				continue
			}
			off := rng.Int64N(size/4096) * 4096
			n := min(int64(1+rng.IntN(16))*4096, (size-off)/4096*4096)
			p := abuf[:n]
			if _, err := df.ReadAt(p, off); err != nil {
				return fmt.Errorf("O_DIRECT read %d at %d: %w", n, off, err)
			}
			if !bytes.Equal(p, d.data[off:off+n]) {
				return fmt.Errorf("O_DIRECT read %d at %d: differs from what the disk was written", n, off)
			}
			continue
		default: // fsync or fdatasync, on either open file
			f := bf
			if rng.IntN(2) == 0 {
				f = df
			}
			sync := unix.Fsync
			if rng.IntN(2) == 0 {
				sync = unix.Fdatasync
			}
			if err := sync(int(f.Fd())); err != nil {
				return fmt.Errorf("fsync: %w", err)
			}
			synced()
			continue
		}
		d.steps = append(d.steps, st)
	}
	return nil
}

// write applies a write to the model, growing it if needed.
func (d *plDisk) write(p []byte, off int64) {
	if end := off + int64(len(p)); end > int64(len(d.data)) {
		d.data = append(d.data, make([]byte, end-int64(len(d.data)))...)
	}
	copy(d.data[off:], p)
}

// verifyPowerCut opens the state after a power cut right after op and
// checks it against every disk's history.
func verifyPowerCut(c *backend.Crash, op int, mode backend.CrashMode, rng *rand.Rand, disks []*plDisk) error {
	s, err := image.Open(c.MemAt(op, rng, mode), image.Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		return fmt.Errorf("check: %v", rep.Findings)
	}
	for _, d := range disks {
		k := -1
		for i, sy := range d.syncs {
			if sy.op <= op {
				k = i
			}
		}
		got, err := readDisk(s, d.name)
		if err != nil {
			if k < 0 && errors.Is(err, image.ErrNotExist) {
				continue // never synced: it may not exist yet
			}
			return fmt.Errorf("%s: %w", d.name, err)
		}
		if k < 0 {
			if err := isolated(got, 0, d.tag); err != nil {
				return fmt.Errorf("%s: %w", d.name, err)
			}
			continue
		}
		sy := d.syncs[k]
		// The disk's own changes after that fsync that may have reached
		// the backing by the cut: those started at or before it.
		var later []plStep
		resized := false
		for _, st := range d.steps[sy.steps:] {
			if st.start <= op {
				later = append(later, st)
				resized = resized || st.resize
			}
		}
		if !resized && len(got) != len(sy.data) {
			return fmt.Errorf("%s: size %d, %d at the fsync at op %d, and nothing resized it since", d.name, len(got), len(sy.data), sy.op)
		}
		// Outside the ranges those changes touched, every byte is as it
		// was at the fsync (whose bytes are all the disk's own). Inside
		// them, and past the size at the fsync, every byte that differs
		// must be zero or carry the disk's tag.
		m := int64(min(len(got), len(sy.data)))
		touched, untouched := split(m, later)
		for _, r := range untouched {
			if a, b := r[0], r[1]; !bytes.Equal(got[a:b], sy.data[a:b]) {
				i := a
				for got[i] == sy.data[i] {
					i++
				}
				return fmt.Errorf("%s: byte %d is %#x, %#x at the fsync at op %d, and nothing wrote it since", d.name, i, got[i], sy.data[i], sy.op)
			}
		}
		touched = append(touched, [2]int64{m, int64(len(got))})
		for _, r := range touched {
			a, b := r[0], r[1]
			if b <= m && bytes.Equal(got[a:b], sy.data[a:b]) {
				continue
			}
			if err := isolated(got[a:b], a, d.tag); err != nil {
				return fmt.Errorf("%s: %w", d.name, err)
			}
		}
		if err := d.checkPromises(got, op); err != nil {
			return fmt.Errorf("%s: %w", d.name, err)
		}
	}
	return nil
}

// checkPromises checks got, the disk after a power cut right after op,
// against every synchronous change that had returned by then: its bytes
// are there unless a later change of the disk, started by the cut, may
// have changed them.
func (d *plDisk) checkPromises(got []byte, op int) error {
	for _, pr := range d.promises {
		if pr.op > op {
			break
		}
		var later []plStep
		resized := false
		for _, st := range d.steps[pr.steps:] {
			if st.start <= op {
				later = append(later, st)
				resized = resized || st.resize
			}
		}
		if int64(len(got)) < pr.hi && !resized {
			return fmt.Errorf("size %d, but a synchronous change of [%d, %d) returned at op %d and nothing resized the disk since", len(got), pr.lo, pr.hi, pr.op)
		}
		_, untouched := split(min(pr.hi, int64(len(got))), later)
		for _, r := range untouched {
			a, b := max(r[0], pr.lo), r[1]
			for i := a; i < b; i++ {
				if got[i] != pr.data[i-pr.lo] {
					return fmt.Errorf("byte %d is %#x, %#x by a synchronous change that returned at op %d, and nothing wrote it since", i, got[i], pr.data[i-pr.lo], pr.op)
				}
			}
		}
	}
	return nil
}

// readDisk reads a whole disk through the image API.
func readDisk(s *image.Store, name string) ([]byte, error) {
	h, err := s.OpenDisk(name)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	p := make([]byte, h.Size())
	if _, err := h.ReadAt(p, 0); err != nil && err != io.EOF {
		return nil, err
	}
	return p, nil
}

// split divides [0, n) into the ranges some step touched and the rest,
// each in order and merged.
func split(n int64, steps []plStep) (touched, untouched [][2]int64) {
	rs := make([][2]int64, 0, len(steps))
	for _, st := range steps {
		if lo, hi := st.lo, min(st.hi, n); lo < hi {
			rs = append(rs, [2]int64{lo, hi})
		}
	}
	slices.SortFunc(rs, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	at := int64(0)
	for _, r := range rs {
		if r[0] > at {
			untouched = append(untouched, [2]int64{at, r[0]})
		}
		if r[1] > at {
			if k := len(touched) - 1; k >= 0 && touched[k][1] >= r[0] {
				touched[k][1] = r[1]
			} else {
				touched = append(touched, [2]int64{max(at, r[0]), r[1]})
			}
			at = r[1]
		}
	}
	if at < n {
		untouched = append(untouched, [2]int64{at, n})
	}
	return touched, untouched
}

// isolated checks that every byte of p, which starts at byte base of the
// disk, is zero or carries tag in its high nibble.
func isolated(p []byte, base int64, tag byte) error {
	for i, b := range p {
		if b != 0 && b>>4 != tag {
			return fmt.Errorf("byte %d is %#x: written by another disk (tag %d), not this one (tag %d)", base+int64(i), b, b>>4, tag)
		}
	}
	return nil
}
