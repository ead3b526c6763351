package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// A 1 MiB write into fresh space on a fresh store is exactly one backend
// data write: the seed's lesson (256 × 4 KiB instead of 1 × 1 MiB) counted.
func TestOneMiBWriteIsOneBackendWrite(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "d.raw", 0)
	defer d.Close()
	before := ms.s.Counters()
	buf := directio.AlignedBlock(1 << 20)
	for i := range buf {
		buf[i] = byte(i)
	}
	if _, err := d.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	after := ms.s.Counters()
	if n := after.DataWrites - before.DataWrites; n != 1 {
		t.Fatalf("1 MiB write issued %d backend data writes, want 1", n)
	}
	if n := after.DataReads - before.DataReads; n != 0 {
		t.Fatalf("1 MiB aligned write into fresh space read %d times", n)
	}
	// Reading it back is one backend read too.
	before = ms.s.Counters()
	if _, err := d.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if n := ms.s.Counters().DataReads - before.DataReads; n != 1 {
		t.Fatalf("1 MiB read issued %d backend reads, want 1", n)
	}
}

// A 1 GiB sequential write in 1 MiB pieces leaves a handful of extents, and
// one backend write per piece.
func TestSequentialWriteStaysContiguous(t *testing.T) {
	ms := newMemStore(t, 1200<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "seq.raw", 0)
	defer d.Close()
	buf := directio.AlignedBlock(1 << 20)
	before := ms.s.Counters()
	for i := int64(0); i < 1024; i++ {
		buf[0] = byte(i)
		if _, err := d.WriteAt(buf, i<<20); err != nil {
			t.Fatal(err)
		}
		if i%256 == 255 {
			if err := d.Sync(); err != nil { // commits in between must not break locality
				t.Fatal(err)
			}
		}
	}
	writes := ms.s.Counters().DataWrites - before.DataWrites
	info := d.Stat()
	t.Logf("1 GiB in 1 MiB writes: %d extents, %d backend data writes", info.Extents, writes)
	if info.Extents > 4 {
		t.Fatalf("%d extents after a sequential 1 GiB write, want a handful", info.Extents)
	}
	if writes != 1024 {
		t.Fatalf("%d backend writes for 1024 MiB pieces, want 1024", writes)
	}
	// Two disks written in alternation both stay contiguous.
	a := mustCreate(t, ms.s, "a.raw", 0)
	b := mustCreate(t, ms.s, "b.raw", 0)
	defer a.Close()
	defer b.Close()
	d.Close()
	if err := ms.s.Remove("seq.raw"); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	for i := int64(0); i < 64; i++ {
		for _, h := range []*Disk{a, b} {
			if _, err := h.WriteAt(buf, i<<20); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ea, eb := a.Stat().Extents, b.Stat().Extents; ea > 2 || eb > 2 {
		t.Fatalf("interleaved sequential writers: %d and %d extents, want at most 2 each", ea, eb)
	}
}

// Concurrent writers and readers on overlapping and disjoint ranges of
// several disks, under the race detector in CI. Each goroutine owns a
// stripe, so the final content is known; overlapping readers only check
// that what they see is one of the values ever written there.
func TestConcurrentIO(t *testing.T) {
	ms := newMemStore(t, 256<<20, FormatOptions{})
	const stripes, stripe = 8, 256 << 10
	disks := []*Disk{mustCreate(t, ms.s, "x.raw", 0), mustCreate(t, ms.s, "y.raw", 0)}
	defer func() {
		for _, d := range disks {
			d.Close()
		}
	}()
	iters := 300
	if testing.Short() {
		iters = 60
	}
	var wg sync.WaitGroup
	final := make([][]byte, len(disks))
	for i := range final {
		final[i] = make([]byte, stripes*stripe)
	}
	var mu sync.Mutex
	for di, d := range disks {
		for g := 0; g < stripes; g++ {
			wg.Add(1)
			go func(d *Disk, di, g int) {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(di), uint64(g)))
				base := int64(g * stripe)
				local := make([]byte, stripe)
				for i := 0; i < iters; i++ {
					off := rng.Int64N(stripe - 1)
					n := 1 + rng.Int64N(min(stripe-off, 20000))
					switch rng.IntN(6) {
					case 0:
						if err := d.Punch(base+off, n); err != nil {
							t.Error(err)
							return
						}
						// Punch clips to the size; the stripe may lie past it.
						size := d.Size() - base
						if size > off {
							clear(local[off:min(off+n, size)])
						}
					case 1:
						if err := d.Sync(); err != nil {
							t.Error(err)
							return
						}
					default:
						p := make([]byte, n)
						for j := range p {
							p[j] = byte(g + 1)
						}
						if _, err := d.WriteAt(p, base+off); err != nil {
							t.Error(err)
							return
						}
						copy(local[off:], p)
					}
					got := make([]byte, n)
					if _, err := d.ReadAt(got, base+off); err != nil && !errors.Is(err, io.EOF) {
						t.Error(err)
						return
					}
					size := max(0, d.Size()-(base+off))
					if want := local[off : off+min(n, size)]; !bytes.Equal(got[:len(want)], want) {
						t.Errorf("disk %d stripe %d: read back differs at %d", di, g, base+off+int64(firstDiff(got, want)))
						return
					}
				}
				mu.Lock()
				copy(final[di][base:], local)
				mu.Unlock()
			}(d, di, g)
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	ms.reopen()
	for di, name := range []string{"x.raw", "y.raw"} {
		got := readAll(t, ms.s, name)
		want := final[di][:len(got)]
		if !bytes.Equal(got, want) {
			t.Fatalf("%s after reopen differs at %d", name, firstDiff(got, want))
		}
	}
}

// Writes to a full store fail with ErrNoSpace, leave other disks and
// acknowledged data alone, and succeed again once space is freed.
func TestFullStore(t *testing.T) {
	ms := newMemStore(t, 24<<20, FormatOptions{JournalSize: 1 << 20})
	a := mustCreate(t, ms.s, "a.raw", 0)
	b := mustCreate(t, ms.s, "b.raw", 0)
	defer a.Close()
	defer b.Close()
	chunk := bytes.Repeat([]byte{0xab}, 1<<20)
	if _, err := b.WriteAt(chunk, 0); err != nil {
		t.Fatal(err)
	}
	var off int64
	var err error
	for off = 0; off < 64<<20; off += 1 << 20 {
		if _, err = a.WriteAt(chunk, off); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("filling the store: got %v at %d, want ErrNoSpace", err, off)
	}
	if err := a.Sync(); err != nil {
		t.Fatalf("sync of a full store: %v", err)
	}
	if got := readAll(t, ms.s, "b.raw"); !bytes.Equal(got, chunk) {
		t.Fatal("other disk changed when the store filled")
	}
	if got := readAll(t, ms.s, "a.raw"); int64(len(got)) != off || !bytes.Equal(got[:1<<20], chunk) {
		t.Fatalf("full disk: %d bytes readable, want %d", len(got), off)
	}
	// Overwrites of mapped blocks need no space.
	if _, err := a.WriteAt(chunk[:4096], 0); err != nil {
		t.Fatalf("overwrite in a full store: %v", err)
	}
	// Punching frees space (after the commit the allocator does itself).
	if err := a.Punch(0, 4<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := b.WriteAt(chunk, 1<<20); err != nil {
		t.Fatalf("write after freeing space: %v", err)
	}
	ms.reopen()
}

// A failed backend write is reported, and leaves the map as it was: the
// range reads what it read before.
func TestWriteErrorLeavesMapUnchanged(t *testing.T) {
	c := backend.NewCrash(32 << 20)
	c.CheckAlignment(512)
	if err := Format(c, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(c, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := mustCreate(t, s, "d.raw", 1<<20)
	defer d.Close()
	old := bytes.Repeat([]byte{1}, 8192)
	if _, err := d.WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	allocBefore := d.Stat().Allocated
	c.SetFault(func(op backend.Op) error {
		if op.Kind == backend.OpWrite {
			return syscall.EIO
		}
		return nil
	})
	if _, err := d.WriteAt(bytes.Repeat([]byte{2}, 8192), 65536); !errors.Is(err, syscall.EIO) {
		t.Fatalf("write into a hole with EIO: %v", err)
	}
	if _, err := d.WriteAt([]byte{3}, 100); !errors.Is(err, syscall.EIO) {
		t.Fatalf("overwrite with EIO: %v", err)
	}
	c.SetFault(nil)
	if got := d.Stat().Allocated; got != allocBefore {
		t.Fatalf("failed write changed allocation: %d -> %d", allocBefore, got)
	}
	got := make([]byte, 8192)
	if _, err := d.ReadAt(got, 65536); err != nil || !bytes.Equal(got, make([]byte, 8192)) {
		t.Fatalf("failed write into a hole left data behind (%v)", err)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatal(rep.Findings)
	}
}

// After a failed flush, every later sync fails too: the store never pretends
// that a later flush covered data that may have been lost (fsyncgate).
func TestFailedFlushPoisons(t *testing.T) {
	c := backend.NewCrash(32 << 20)
	if err := Format(c, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(c, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	d := mustCreate(t, s, "d.raw", 0)
	if _, err := d.WriteAt(make([]byte, 4096), 0); err != nil {
		t.Fatal(err)
	}
	c.SetFault(func(op backend.Op) error {
		if op.Kind == backend.OpFlush {
			return syscall.EIO
		}
		return nil
	})
	if err := d.Sync(); !errors.Is(err, syscall.EIO) || !errors.Is(err, ErrFailed) {
		t.Fatalf("sync with a failing flush: %v", err)
	}
	c.SetFault(nil)
	for i := 0; i < 3; i++ {
		if err := d.Sync(); !errors.Is(err, ErrFailed) {
			t.Fatalf("sync %d after a failed flush: %v, want ErrFailed", i, err)
		}
	}
	if _, err := d.WriteAt(make([]byte, 4096), 4096); !errors.Is(err, ErrFailed) {
		t.Fatalf("write after a failed flush: %v, want ErrFailed", err)
	}
	d.Close()
	if err := s.Close(); !errors.Is(err, ErrFailed) {
		t.Fatalf("close after a failed flush: %v, want ErrFailed", err)
	}
}

// Removing a disk and creating another over the same physical space never
// shows the old disk's bytes, even for partly written blocks.
func TestDeletedDiskIsolation(t *testing.T) {
	ms := newMemStore(t, 32<<20, FormatOptions{})
	a := mustCreate(t, ms.s, "a.raw", 0)
	pattern := bytes.Repeat([]byte("SECRET!!"), (8<<20)/8)
	if _, err := a.WriteAt(pattern, 0); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := ms.s.Remove("a.raw"); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	b := mustCreate(t, ms.s, "b.raw", 8<<20)
	defer b.Close()
	// Sparse, partial-block writes all over.
	for off := int64(100); off < 8<<20; off += 64<<10 + 777 {
		if _, err := b.WriteAt([]byte{'x'}, off); err != nil {
			t.Fatal(err)
		}
	}
	got := readAll(t, ms.s, "b.raw")
	if i := bytes.Index(got, []byte("SECRET")); i >= 0 {
		t.Fatalf("new disk shows the deleted disk's bytes at %d", i)
	}
	for i, c := range got {
		if c != 0 && c != 'x' {
			t.Fatalf("byte %d is %q", i, c)
		}
	}
}

// Unlinking an open disk keeps it usable through its handle; its blocks are
// freed at the last Close; a crash before that frees them at the next Open.
func TestRemoveWhileOpen(t *testing.T) {
	ms := newMemStore(t, 32<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "d.raw", 0)
	data := bytes.Repeat([]byte{7}, 1<<20)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	freeBefore := ms.s.Info().FreeBytes
	if err := ms.s.Remove("d.raw"); err != nil {
		t.Fatal(err)
	}
	if _, err := ms.s.Stat("d.raw"); !errors.Is(err, ErrNotExist) {
		t.Fatalf("removed disk still listed: %v", err)
	}
	if _, err := d.WriteAt(data[:4096], 1<<20); err != nil {
		t.Fatalf("write to an unlinked open disk: %v", err)
	}
	got := make([]byte, 1<<20)
	if _, err := d.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read of an unlinked open disk: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	if free := ms.s.Info().FreeBytes; free < freeBefore+1<<20 {
		t.Fatalf("free bytes %d after the last close, want at least %d", free, freeBefore+1<<20)
	}
	// Orphan left by a crash: unlink while open, commit, then "crash" by
	// reopening from the bytes without closing.
	e := mustCreate(t, ms.s, "e.raw", 0)
	if _, err := e.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Remove("e.raw"); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(backend.NewMemFrom(ms.mem.Bytes()), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s2.List()); n != 0 {
		t.Fatalf("%d disks after reopening with an orphan, want 0", n)
	}
	if rep := s2.Check(); !rep.Clean() {
		t.Fatal(rep.Findings)
	}
	s2.Close()
	e.Close()
}

// Names are validated everywhere.
func TestNames(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	long := string(bytes.Repeat([]byte{'n'}, MaxNameLen+1))
	for _, name := range []string{"", ".", "..", "a/b", "nul\x00", "\xff\xfe", long} {
		if _, err := ms.s.Create(name, 0, Attr{}); !errors.Is(err, ErrInvalidName) {
			t.Errorf("create %q: %v, want ErrInvalidName", name, err)
		}
	}
	if _, err := ms.s.Create("ok.raw", 0, Attr{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ms.s.Create("ok.raw", 0, Attr{}); !errors.Is(err, ErrExist) {
		t.Fatalf("duplicate create: %v", err)
	}
	if err := ms.s.Rename("ok.raw", "a/b"); !errors.Is(err, ErrInvalidName) {
		t.Fatalf("rename to a/b: %v", err)
	}
	if err := ms.s.Rename("missing", "x"); !errors.Is(err, ErrNotExist) {
		t.Fatalf("rename missing: %v", err)
	}
}

// Rename keeps content, replaces an existing target and survives reopen.
func TestRename(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	a := mustCreate(t, ms.s, "a.raw", 0)
	a.WriteAt([]byte("aaaa"), 0)
	a.Close()
	b := mustCreate(t, ms.s, "b.raw", 0)
	b.WriteAt([]byte("bbbb"), 0)
	b.Close()
	if err := ms.s.Rename("a.raw", "b.raw"); err != nil {
		t.Fatal(err)
	}
	ms.reopen()
	if got := readAll(t, ms.s, "b.raw"); string(got) != "aaaa" {
		t.Fatalf("after rename over: %q", got)
	}
	if names := ms.s.List(); len(names) != 1 {
		t.Fatalf("%d disks, want 1", len(names))
	}
}

// Extreme offsets and sizes give errors, never panics.
func TestExtremeArguments(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "d.raw", 0)
	defer d.Close()
	p := make([]byte, 10)
	cases := []struct {
		name string
		err  error
	}{
		{"write negative", func() error { _, err := d.WriteAt(p, -1); return err }()},
		{"write near 2^63", func() error { _, err := d.WriteAt(p, 1<<63-5); return err }()},
		{"write past max size", func() error { _, err := d.WriteAt(p, MaxDiskSize-5); return err }()},
		{"read negative", func() error { _, err := d.ReadAt(p, -1); return err }()},
		{"truncate negative", d.Truncate(-1)},
		{"truncate huge", d.Truncate(1<<63 - 1)},
		{"punch negative", d.Punch(-5, 10)},
		{"punch huge", d.Punch(1<<62, 1<<62)},
		{"zero range negative length", d.ZeroRange(0, -1, false)},
		{"allocate huge", d.Allocate(0, 1<<62, false)},
	}
	for _, c := range cases {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		} else if !errors.Is(c.err, ErrInvalid) && !errors.Is(c.err, ErrTooLarge) && !errors.Is(c.err, ErrNoSpace) {
			t.Errorf("%s: %v, want ErrInvalid, ErrTooLarge or ErrNoSpace", c.name, c.err)
		}
	}
	// A huge sparse disk is fine: only written blocks cost space.
	if err := d.Truncate(MaxDiskSize); err != nil {
		t.Fatalf("truncate to MaxDiskSize: %v", err)
	}
	if _, err := d.WriteAt([]byte("end"), MaxDiskSize-3); err != nil {
		t.Fatalf("write at the end of a MaxDiskSize disk: %v", err)
	}
	if off, err := d.SeekData(0); err != nil || off != (MaxDiskSize-3)/4096*4096 {
		t.Fatalf("seek data: %d, %v", off, err)
	}
	if err := d.Truncate(0); err != nil {
		t.Fatal(err)
	}
}

// Attributes persist.
func TestAttributes(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "d.raw", 12345)
	mode, uid := uint32(0o600), uint32(1000)
	if err := d.SetAttr(AttrChange{Mode: &mode, UID: &uid}); err != nil {
		t.Fatal(err)
	}
	d.Close()
	ms.reopen()
	info, err := ms.s.Stat("d.raw")
	if err != nil {
		t.Fatal(err)
	}
	if info.Mode != 0o600 || info.UID != 1000 || info.Size != 12345 {
		t.Fatalf("after reopen: %+v", info)
	}
}

func ExampleStore() {
	mem := backend.NewMem(64 << 20)
	if err := Format(mem, FormatOptions{}); err != nil {
		panic(err)
	}
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	if _, err := s.Create("vm.raw", 1<<30, Attr{Mode: 0o644}); err != nil {
		panic(err)
	}
	d, _ := s.OpenDisk("vm.raw")
	defer d.Close()
	d.WriteAt([]byte("hello"), 4096)
	d.Sync()
	fmt.Println(d.Stat().Size, d.Stat().Allocated)
	// Output: 1073741824 4096
}

// CheckProgress reports extents checked, ending at the total.
func TestCheckProgress(t *testing.T) {
	ms := newMemStore(t, 32<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "d.raw", 0)
	defer d.Close()
	for i := int64(0); i < 100; i++ {
		if _, err := d.WriteAt([]byte{1}, i*3*4096); err != nil {
			t.Fatal(err)
		}
	}
	var last, total int
	rep := ms.s.CheckProgress(func(done, tot int) { last, total = done, tot })
	if !rep.Clean() || rep.Extents != 100 || last != 100 || total != 100 {
		t.Fatalf("progress %d/%d, report %+v", last, total, rep)
	}
}

// Rewriting a disk again and again (truncate to 0, then parallel writers, as
// qemu-img convert -W does) never fails for space the truncate freed: a
// writer that finds the store full waits for the commit that releases the
// quarantine, even when another writer's commit has already taken it.
func TestRewriteReusesFreedSpace(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{JournalSize: 1 << 20})
	d := mustCreate(t, ms.s, "d.raw", 0)
	defer d.Close()
	const size, writers = 24 << 20, 8
	rounds := 10
	if testing.Short() {
		rounds = 4
	}
	for round := 0; round < rounds; round++ {
		if err := d.Truncate(0); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				buf := directio.AlignedBlock(1 << 20)
				for off := int64(w) << 20; off < size; off += writers << 20 {
					if _, err := d.WriteAt(buf, off); err != nil {
						errs <- fmt.Errorf("round %d writer %d at %d MiB: %w", round, w, off>>20, err)
						return
					}
				}
			}(w)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
