package fs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Backend errors through a mount: the store runs on a backend.Crash whose
// fault function fails chosen operations with EIO. What a client must see:
// the errno of its own system call is EIO; a failed read, write, fallocate
// or truncate leaves the map as it was (a failed write into a hole still
// reads zeros and allocates nothing); and a failed flush or metadata write
// is never followed by a successful fsync on any disk (image poisons the
// store: ErrFailed, EIO through the mount) until the store is reopened,
// which finds it consistent.

// faultSwitch is the fault function of a Crash: it fails the operations
// that match with EIO, all of them or only the first.
type faultSwitch struct {
	mu    sync.Mutex
	match func(backend.Op) bool // nil: nothing fails
	once  bool
	hits  int
}

func (f *faultSwitch) fault(op backend.Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.match == nil || !f.match(op) {
		return nil
	}
	f.hits++
	if f.once {
		f.match = nil
	}
	return syscall.EIO
}

// arm makes the operations that match fail from now on (once: only the
// first of them).
func (f *faultSwitch) arm(once bool, match func(backend.Op) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.match, f.once, f.hits = match, once, 0
}

// disarm stops failing and returns how many operations failed.
func (f *faultSwitch) disarm() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.match = nil
	return f.hits
}

func allOf(k backend.OpKind) func(backend.Op) bool {
	return func(op backend.Op) bool { return op.Kind == k }
}

// nthOf matches the n-th operation of kind k that also satisfies where
// (nil: any), counting from the arming.
func nthOf(k backend.OpKind, n int, where func(backend.Op) bool) func(backend.Op) bool {
	seen := 0
	return func(op backend.Op) bool {
		if op.Kind != k || where != nil && !where(op) {
			return false
		}
		seen++
		return seen == n
	}
}

// newFaultCase mounts a store on a Crash of size bytes with a 16 KiB
// journal (so that the fourth commit in a row is a checkpoint), no commit
// timer, and the fault switch installed, over transport tr.
func newFaultCase(t *testing.T, tr Transport, size int64) (*testCase, *backend.Crash, *faultSwitch) {
	t.Helper()
	c := backend.NewCrash(size)
	c.CheckAlignment(512)
	fsw := &faultSwitch{}
	c.SetFault(fsw.fault)
	// The errors are expected: keep their log lines out of the output.
	tc := newTestCase(t, withMemBackend(c), withFormatOptions(image.FormatOptions{JournalSize: 16 << 10}),
		withStoreOptions(image.Options{CommitInterval: -1, Strict: true, Logger: quietLogger()}),
		withMountOptions(Options{Logger: quietLogger(), Transport: tr}))
	return tc, c, fsw
}

// tagged returns n bytes carrying tag in the high nibble.
func tagged(tag byte, n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, uint64(tag)))
	p := directio.AlignedBlock(max(n, directio.BlockSize))[:n]
	for i := range p {
		p[i] = tag<<4 | byte(1+r.IntN(15))
	}
	return p
}

// allocated returns the store's Allocated of disk name and its free blocks.
func (tc *testCase) allocated(name string) (int64, uint64) {
	tc.t.Helper()
	info, err := tc.store.Stat(name)
	if err != nil {
		tc.t.Fatal(err)
	}
	return info.Allocated, tc.store.Info().FreeBlocks
}

// readAt reads n bytes at off of f.
func readAt(t *testing.T, f *os.File, off int64, n int) []byte {
	t.Helper()
	p := directio.AlignedBlock(max(n, directio.BlockSize))[:n]
	if _, err := f.ReadAt(p, off); err != nil {
		t.Fatalf("read %d at %d: %v", n, off, err)
	}
	return p
}

// TestBackendEIO: read, write, write-zeroes and discard errors of the
// backing reach the client as EIO (discard: not at all), leave the map and
// the free space as they were, and do not poison the store. On io_uring
// the aligned O_DIRECT reads and writes are started on the queue threads;
// their failed backing I/O must fall back to a worker, whose ReadAt or
// WriteAt fails again and reports: the test checks that this happened.
func TestBackendEIO(t *testing.T) { forTransports(t, testBackendEIO) }

func testBackendEIO(t *testing.T, tr Transport) {
	tc, _, fsw := newFaultCase(t, tr, 16<<20)
	const size = 1 << 20
	old := tagged(1, 256<<10, 1)
	f := tc.openFile("d.raw", os.O_RDWR|os.O_CREATE, 0o600)
	df := tc.openFile("d.raw", os.O_RDWR|syscall.O_DIRECT, 0)
	if _, err := f.WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	model := append(bytes.Clone(old), make([]byte, size-len(old))...)
	same := func(what string) {
		t.Helper()
		if got := readAll(t, tc.path("d.raw")); !bytes.Equal(got, model) {
			t.Fatalf("%s: the disk no longer reads what it held", what)
		}
	}
	unchanged := func(what string, alloc0 int64, free0 uint64) {
		t.Helper()
		if alloc, free := tc.allocated("d.raw"); alloc != alloc0 || free != free0 {
			t.Errorf("%s: allocated %d -> %d bytes, free %d -> %d blocks; want both unchanged", what, alloc0, alloc, free0, free)
		}
		if st := stat(t, tc.path("d.raw")); st.Size != size || st.Blocks*512 != alloc0 {
			t.Errorf("%s: st_size %d, st_blocks %d; want %d, %d", what, st.Size, st.Blocks, size, alloc0/512)
		}
	}

	// fellBack fails the subtest on io_uring unless a failed owner I/O
	// fell back to a worker since retries0 (tc.ownerRetries).
	fellBack := func(t *testing.T, what string, retries0 uint64) {
		t.Helper()
		if tr == TransportIOURing && tc.ownerRetries() == retries0 {
			t.Errorf("%s: no request fell back from the queue thread to a worker", what)
		}
	}

	t.Run("read", func(t *testing.T) {
		r0 := tc.ownerRetries()
		fsw.arm(false, allOf(backend.OpRead))
		p := directio.AlignedBlock(64 << 10)
		_, err := df.ReadAt(p, 0)
		wantErrno(t, "O_DIRECT pread of data", err, unix.EIO)
		fellBack(t, "O_DIRECT pread of data", r0)
		_, err = f.ReadAt(p[:1000], 4097)
		wantErrno(t, "pread of data", err, unix.EIO)
		// A hole reads as zeros without touching the backing.
		if _, err := df.ReadAt(p, 512<<10); err != nil || !isZero(p) {
			t.Errorf("O_DIRECT pread of a hole with reads failing: %v", err)
		}
		if fsw.disarm() == 0 {
			t.Fatal("no read failed")
		}
		same("after failed reads")
	})

	t.Run("write into a hole", func(t *testing.T) {
		alloc0, free0 := tc.allocated("d.raw")
		r0 := tc.ownerRetries()
		fsw.arm(false, allOf(backend.OpWrite))
		_, err := df.WriteAt(tagged(1, 64<<10, 2), 512<<10)
		wantErrno(t, "O_DIRECT pwrite into a hole", err, unix.EIO)
		fellBack(t, "O_DIRECT pwrite into a hole", r0)
		_, err = f.WriteAt(tagged(1, 3000, 3), 700<<10+3)
		wantErrno(t, "unaligned pwrite into a hole", err, unix.EIO)
		_, err = f.WriteAt(tagged(1, 5000, 4), size-100)
		wantErrno(t, "pwrite across the end", err, unix.EIO)
		if fsw.disarm() == 0 {
			t.Fatal("no write failed")
		}
		unchanged("after failed writes into holes", alloc0, free0)
		same("after failed writes into holes")
	})

	t.Run("write over data", func(t *testing.T) {
		alloc0, free0 := tc.allocated("d.raw")
		r0 := tc.ownerRetries()
		fsw.arm(false, allOf(backend.OpWrite))
		neu := tagged(1, 64<<10, 5)
		_, err := df.WriteAt(neu, 64<<10)
		wantErrno(t, "O_DIRECT pwrite over data", err, unix.EIO)
		fellBack(t, "O_DIRECT pwrite over data", r0)
		if fsw.disarm() == 0 {
			t.Fatal("no write failed")
		}
		unchanged("after a failed overwrite", alloc0, free0)
		// Like a disk: each byte is old or new (the Crash backend does not
		// perform a failed write, so here all are old).
		got := readAt(t, f, 64<<10, len(neu))
		for i := range got {
			if got[i] != model[64<<10+i] && got[i] != neu[i] {
				t.Fatalf("byte %d after a failed overwrite is %#x: neither old nor new", 64<<10+i, got[i])
			}
		}
		copy(model[64<<10:], got)
	})

	t.Run("read-modify-write", func(t *testing.T) {
		alloc0, free0 := tc.allocated("d.raw")
		fsw.arm(false, allOf(backend.OpRead))
		_, err := f.WriteAt([]byte("partial block"), 1000)
		wantErrno(t, "unaligned pwrite into a mapped block", err, unix.EIO)
		wantErrno(t, "truncate inside a mapped block", f.Truncate(100<<10+17), unix.EIO)
		wantErrno(t, "punch with a partial edge", unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 5000, 3000), unix.EIO)
		if fsw.disarm() == 0 {
			t.Fatal("no read failed")
		}
		unchanged("after failed read-modify-writes", alloc0, free0)
		same("after failed read-modify-writes")
	})

	t.Run("fallocate write zeroes", func(t *testing.T) {
		alloc0, free0 := tc.allocated("d.raw")
		fsw.arm(false, allOf(backend.OpWriteZeroes))
		wantErrno(t, "fallocate into a hole", unix.Fallocate(int(f.Fd()), 0, 600<<10, 128<<10), unix.EIO)
		wantErrno(t, "fallocate past the end", unix.Fallocate(int(f.Fd()), 0, size, 128<<10), unix.EIO)
		if fsw.disarm() == 0 {
			t.Fatal("no write-zeroes failed")
		}
		unchanged("after failed fallocates", alloc0, free0)
		same("after failed fallocates")
	})

	t.Run("discard", func(t *testing.T) {
		// A discard is advice: its failure is logged, the punch and the
		// commit that releases the blocks succeed.
		alloc0, free0 := tc.allocated("d.raw")
		fsw.arm(false, allOf(backend.OpDiscard))
		if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 128<<10, 64<<10); err != nil {
			t.Fatalf("punch: %v", err)
		}
		if err := f.Sync(); err != nil {
			t.Fatalf("fsync with discards failing: %v", err)
		}
		if fsw.disarm() == 0 {
			t.Fatal("no discard failed")
		}
		clear(model[128<<10 : 192<<10])
		if alloc, free := tc.allocated("d.raw"); alloc != alloc0-64<<10 || free != free0+16 {
			t.Errorf("punch of 64 KiB with discards failing: allocated %d -> %d, free blocks %d -> %d", alloc0, alloc, free0, free)
		}
		same("after a punch with a failed discard")
	})

	// Nothing above poisoned the store: writes and fsync work, and the
	// result survives a remount.
	if _, err := df.WriteAt(tagged(1, 64<<10, 6), 512<<10); err != nil {
		t.Fatal(err)
	}
	copy(model[512<<10:], tagged(1, 64<<10, 6))
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync after the faults: %v", err)
	}
	if got := readAt(t, df, 512<<10, 64<<10); !bytes.Equal(got, model[512<<10:576<<10]) {
		t.Fatal("O_DIRECT read after the faults differs from the write")
	}
	if _, retried := tc.ownerIO("faults"); tr == TransportIOURing && retried == 0 {
		t.Error("no failed owner I/O fell back to a worker")
	}
	f.Close()
	df.Close()
	tc.remount()
	same("after a remount")
}

// TestFailedFsyncPoisons fails one backend operation of one fsync's commit
// or checkpoint, at each place one can fail, and checks: that fsync gets
// EIO; every later fsync, fdatasync, write, create and truncate on any
// disk gets EIO too (no later fsync may claim to cover what was lost),
// while reads go on; the store refuses to close cleanly; and after a
// reopen it is consistent: Check clean, each disk holds what it held at
// its last successful fsync, and the writes of the failed fsync are there
// entirely, not at all, or (overwrites in place) byte by byte old or new.
func TestFailedFsyncPoisons(t *testing.T) {
	journal := func(op backend.Op) bool { return op.Off >= 8192 && op.Off < 8192+16<<10 }
	data := func(op backend.Op) bool { return op.Off >= 1<<20 }
	at := func(off int64) func(backend.Op) bool { return func(op backend.Op) bool { return op.Off == off } }
	cases := []fsyncFault{
		{"data flush before the commit", false, false, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 1, nil) }},
		{"journal write", false, false, func() func(backend.Op) bool { return nthOf(backend.OpWrite, 1, journal) }},
		{"journal flush", false, false, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 2, nil) }},
		{"data flush before a checkpoint", true, false, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 1, nil) }},
		{"checkpoint write", true, false, func() func(backend.Op) bool { return nthOf(backend.OpWrite, 1, data) }},
		{"checkpoint flush", true, false, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 2, nil) }},
		{"superblock A write", true, false, func() func(backend.Op) bool { return nthOf(backend.OpWrite, 1, at(0)) }},
		{"superblock A flush", true, false, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 3, nil) }},
		{"superblock B write", true, false, func() func(backend.Op) bool { return nthOf(backend.OpWrite, 1, at(4096)) }},
		{"superblock B flush", true, false, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 4, nil) }},
		// fsyncgate: the background commit fails and nobody is told; the
		// next fsync must not succeed.
		{"timer commit's data flush", false, true, func() func(backend.Op) bool { return nthOf(backend.OpFlush, 1, nil) }},
		{"timer commit's journal write", false, true, func() func(backend.Op) bool { return nthOf(backend.OpWrite, 1, journal) }},
		{"timer checkpoint's superblock A write", true, true, func() func(backend.Op) bool { return nthOf(backend.OpWrite, 1, at(0)) }},
	}
	forTransports(t, func(t *testing.T, tr Transport) {
		for _, k := range cases {
			t.Run(k.name, func(t *testing.T) { testFailedFsync(t, tr, k) })
		}
	})
}

// fsyncFault is a case of TestFailedFsyncPoisons.
type fsyncFault struct {
	name       string
	checkpoint bool // fill the journal first, so that the fsync checkpoints
	timer      bool // the commit that fails is the timer's (Store.Commit), not the fsync's
	match      func() func(backend.Op) bool
}

func testFailedFsync(t *testing.T, tr Transport, k fsyncFault) {
	tc, c, fsw := newFaultCase(t, tr, 8<<20)
	x := tc.openFile("x.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	y := tc.openFile("y.raw", os.O_RDWR|os.O_CREATE, 0o600)
	xs, ys := tagged(1, 256<<10, 1), tagged(2, 100000, 2)
	if _, err := x.WriteAt(xs, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := y.WriteAt(ys, 0); err != nil {
		t.Fatal(err)
	}
	if err := x.Sync(); err != nil {
		t.Fatal(err)
	}
	if k.checkpoint {
		// Commit until one more page would pass three quarters
		// of the journal: the next commit is a checkpoint.
		for i := 0; ; i++ {
			info := tc.store.Info()
			if info.JournalUsed+4096 > info.JournalBytes*3/4 {
				break
			}
			if i > 100 {
				t.Fatalf("journal does not fill: %+v", info)
			}
			if _, err := y.WriteAt([]byte{0x21}, 0); err != nil { // in place: one attr record per commit
				t.Fatal(err)
			}
			ys[0] = 0x21
			if err := y.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	ckpts := tc.store.Counters().Checkpoints

	// The writes the failing fsync is for: new blocks, and an
	// overwrite in place.
	xn, xo := tagged(1, 128<<10, 3), tagged(1, 4096, 4)
	if _, err := x.WriteAt(xn, 512<<10); err != nil {
		t.Fatal(err)
	}
	if _, err := x.WriteAt(xo, 8192); err != nil {
		t.Fatal(err)
	}
	fsw.arm(true, k.match())
	if k.timer {
		if err := tc.store.Commit(); !errors.Is(err, image.ErrFailed) {
			t.Errorf("the commit whose %s fails: %v, want ErrFailed", k.name, err)
		}
		wantErrno(t, "the fsync after the timer's failed commit", x.Sync(), unix.EIO)
	} else {
		wantErrno(t, "the fsync whose "+k.name+" fails", x.Sync(), unix.EIO)
	}
	if fsw.disarm() != 1 {
		t.Fatalf("the fault did not fire (checkpoints %d -> %d)", ckpts, tc.store.Counters().Checkpoints)
	}

	// Poisoned: nothing that commits or changes the store works
	// any more, on any disk; reads do.
	wantErrno(t, "fsync again", x.Sync(), unix.EIO)
	wantErrno(t, "fsync of another disk", y.Sync(), unix.EIO)
	wantErrno(t, "fdatasync of another disk", unix.Fdatasync(int(y.Fd())), unix.EIO)
	_, err := y.WriteAt([]byte("more"), 200000)
	wantErrno(t, "write to another disk", err, unix.EIO)
	wantErrno(t, "truncate", y.Truncate(1<<20), unix.EIO)
	_, err = os.OpenFile(tc.path("z.raw"), os.O_RDWR|os.O_CREATE, 0o600)
	wantErrno(t, "create", err, unix.EIO)
	if got := readAll(t, tc.path("y.raw")); !bytes.Equal(got, ys) {
		t.Errorf("y.raw reads differently after the failure")
	}
	if got := readAt(t, x, 512<<10, len(xn)); !bytes.Equal(got, xn) {
		t.Errorf("x.raw does not read its acknowledged write after the failure")
	}
	x.Close()
	y.Close()
	tc.ownerIO("before and after the failure") // the overwrite xo and the O_DIRECT read of xn

	// The store does not close cleanly. Power cut now: the durable
	// state is consistent and holds every disk's last fsync.
	if !tc.unmount() {
		t.FailNow()
	}
	if err := tc.store.Close(); !errors.Is(err, image.ErrFailed) {
		t.Errorf("close of the poisoned store: %v, want ErrFailed", err)
	}
	tc.store = nil
	rng := rand.New(rand.NewPCG(1, 2))
	for _, mode := range []backend.CrashMode{backend.DropUnflushed, backend.RandomSubset, backend.Torn, backend.Torn} {
		s, err := image.Open(c.MemAt(c.OpCount(), rng, mode), image.Options{CommitInterval: -1, Logger: quietLogger()})
		if err != nil {
			t.Fatalf("power cut after the failure (%s): open: %v", mode, err)
		}
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("power cut after the failure (%s): %v", mode, rep.Findings)
		}
		gy, err := readDisk(s, "y.raw")
		if err != nil || !bytes.Equal(gy, ys) {
			t.Errorf("power cut after the failure (%s): y.raw lost its last fsync (%v)", mode, err)
		}
		gx, err := readDisk(s, "x.raw")
		if err != nil || len(gx) < 256<<10 || !bytes.Equal(gx[:8192], xs[:8192]) || !bytes.Equal(gx[8192+4096:256<<10], xs[8192+4096:]) {
			t.Errorf("power cut after the failure (%s): x.raw lost its last fsync (%v)", mode, err)
		}
		s.Close()
	}
	// Reopened, it is consistent and works again.
	tc.openStore()
	tc.check("after reopening the poisoned store")
	tc.mount()
	if got := readAll(t, tc.path("y.raw")); !bytes.Equal(got, ys) {
		t.Errorf("y.raw lost what it held at its last fsync")
	}
	got := readAll(t, tc.path("x.raw"))
	if !bytes.Equal(got[:8192], xs[:8192]) || !bytes.Equal(got[8192+4096:256<<10], xs[8192+4096:]) {
		t.Errorf("x.raw lost what it held at its last fsync")
	}
	for i, b := range got[8192 : 8192+4096] {
		if b != xs[8192+i] && b != xo[i] {
			t.Fatalf("x.raw byte %d is %#x: neither before nor after the overwrite", 8192+i, b)
		}
	}
	switch {
	case len(got) == 256<<10:
	case len(got) == 640<<10 && (isZero(got[256<<10:512<<10]) && (bytes.Equal(got[512<<10:], xn) || isZero(got[512<<10:]))):
	default:
		t.Errorf("x.raw after the failed fsync: %d bytes, the write of the failed fsync partly there", len(got))
	}
	t.Logf("after reopen x.raw has %d bytes", len(got))
	// And it works again.
	if err := os.WriteFile(tc.path("z.raw"), tagged(3, 5000, 5), 0o600); err != nil {
		t.Fatalf("write after reopening: %v", err)
	}
}

// TestReadErrorOnOpen: a store whose backing fails reads while opening
// refuses to open with an error that says so (wrapping EIO), and opens
// once the reads work again.
func TestReadErrorOnOpen(t *testing.T) {
	c := backend.NewCrash(8 << 20)
	c.CheckAlignment(512)
	if err := image.Format(c, image.FormatOptions{JournalSize: 16 << 10}); err != nil {
		t.Fatal(err)
	}
	fsw := &faultSwitch{}
	c.SetFault(fsw.fault)
	for n := 1; ; n++ {
		fsw.arm(false, nthOf(backend.OpRead, n, nil))
		s, err := image.Open(c, image.Options{CommitInterval: -1, Logger: quietLogger()})
		hit := fsw.disarm()
		if hit == 0 {
			if err != nil {
				t.Fatalf("open without a fault: %v", err)
			}
			s.Close()
			t.Logf("open does %d reads; each one failing was refused with EIO", n-1)
			return
		}
		if err == nil {
			s.Close()
			t.Fatalf("open succeeded although its read #%d failed", n)
		}
		if !errors.Is(err, syscall.EIO) {
			t.Fatalf("open with read #%d failing: %v, want an error wrapping EIO", n, err)
		}
		c.Reopen()
		if n > 100 {
			t.Fatal("open keeps reading")
		}
	}
}
