package image

import (
	"bytes"
	"path/filepath"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// TestPlanRead: a plan's backing reads, issued by hand through the backend (IOPlan.Do),
// give what ReadAt gives (data, holes, punched blocks); the plan holds its
// range shared until Finish or Abort, so a write or punch of it cannot
// start meanwhile, and PlanRead declines instead of waiting when one holds
// the range; reads it cannot plan are declined with nothing held.
func TestPlanRead(t *testing.T) {
	_, s := newFileStore(t, 256<<20, FormatOptions{})
	defer s.Close()
	h := mustCreate(t, s, "a", 8<<20)
	defer h.Close()
	bs := int64(s.BlockSize())

	data := directio.AlignedBlock(4 << 20)
	for i := range data {
		data[i] = byte(i/int(bs)*7 + 1)
	}
	if _, err := h.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := h.Punch(5*bs, 3*bs); err != nil {
		t.Fatal(err)
	}

	var rp IOPlan
	for _, c := range []struct{ off, n int64 }{
		{0, bs}, {2 * bs, 1 << 20}, {4*bs + 0, 6 * bs}, {(4 << 20) - 2*bs, 4 * bs}, {6 << 20, 1 << 20},
	} {
		got := directio.AlignedBlock(int(c.n))
		for i := range got {
			got[i] = 0xAA // holes must be zeroed by PlanRead
		}
		if !h.PlanRead(&rp, got, c.off, 8) {
			t.Fatalf("read %d at %d: not planned", c.n, c.off)
		}
		for i, io := range rp.IOs {
			if err := rp.Do(i); err != nil {
				t.Fatalf("backing read %d at %d: %v", len(io.Buf), io.Off, err)
			}
		}
		first, count := uint64(c.off/bs), uint64(c.n/bs)
		if _, ok := h.d.ranges.tryLock(first, count, true); ok {
			t.Fatalf("read %d at %d: a write could lock the range of an open plan", c.n, c.off)
		}
		rp.Finish()
		lr, ok := h.d.ranges.tryLock(first, count, true)
		if !ok {
			t.Fatalf("read %d at %d: range still held after Finish", c.n, c.off)
		}
		lr.unlock()

		want := make([]byte, c.n)
		if _, err := h.ReadAt(want, c.off); err != nil {
			t.Fatal(err)
		}
		if rp.N != int(c.n) || !bytes.Equal(got, want) {
			t.Fatalf("read %d at %d: plan gave %d bytes that differ from ReadAt's", c.n, c.off, rp.N)
		}
	}

	// Declined, with nothing held.
	buf := directio.AlignedBlock(int(2 * bs))
	lr := h.d.ranges.lock(10, 1, true) // a write in progress
	if h.PlanRead(&rp, buf, 9*bs, 8) {
		t.Fatal("planned a read of a range a write holds")
	}
	lr.unlock()
	for _, c := range []struct {
		what string
		p    []byte
		off  int64
		max  int
	}{
		{"unaligned offset", buf, 100, 8},
		{"unaligned buffer", directio.AlignedBlock(int(3 * bs))[1 : 2*bs+1], 0, 8},
		{"at the end", buf, 8 << 20, 8},
		{"too many backing reads", directio.AlignedBlock(int(6 * bs)), 3 * bs, 1}, // data, hole, data
	} {
		if h.PlanRead(&rp, c.p, c.off, c.max) {
			t.Fatalf("%s: planned", c.what)
		}
	}
	if lr, ok := h.d.ranges.tryLock(0, ^uint64(0), true); !ok {
		t.Fatal("a declined plan left a range held")
	} else {
		lr.unlock()
	}
	// Abort releases too.
	if !h.PlanRead(&rp, buf, 0, 8) {
		t.Fatal("not planned")
	}
	rp.Abort()
	if lr, ok := h.d.ranges.tryLock(0, ^uint64(0), true); !ok {
		t.Fatal("Abort left the range held")
	} else {
		lr.unlock()
	}
	// A closed handle plans nothing.
	h2, err := s.OpenDisk("a")
	if err != nil {
		t.Fatal(err)
	}
	h2.Close()
	if h2.PlanRead(&rp, buf, 0, 8) {
		t.Fatal("planned a read on a closed handle")
	}
}

// TestPlanWrite: a planned write into holes gets blocks that are in flight
// (not free, not mapped) until Finish maps and journals them, so they read
// back after a reopen; Abort returns them. On a full store whose free
// blocks wait in quarantine, PlanWrite declines instead of committing,
// and WriteAt (which commits) serves the write.
func TestPlanWrite(t *testing.T) {
	path, s := newFileStore(t, 32<<20, FormatOptions{JournalSize: 1 << 20})
	defer func() { s.Close() }()
	var err error
	h := mustCreate(t, s, "a", 64<<20)
	bs := int64(s.BlockSize())
	data := directio.AlignedBlock(1 << 20)
	for i := range data {
		data[i] = byte(i/int(bs)*5 + 3)
	}
	if _, err := h.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, h, data[:bs], 16<<20) // a small first write prepares the backing (TestPlanWritePreparesBacking)

	var pl IOPlan
	issue := func(pl *IOPlan) {
		t.Helper()
		for i, io := range pl.IOs {
			if err := pl.Do(i); err != nil {
				t.Fatalf("backing write %d at %d: %v", len(io.Buf), io.Off, err)
			}
		}
	}
	// Half over data, half into the hole after it.
	p := directio.AlignedBlock(int(8 * bs))
	for i := range p {
		p[i] = 0xC5
	}
	off := int64(1<<20) - 4*bs
	free := s.Info().FreeBlocks
	if !h.PlanWrite(&pl, p, off, 8) {
		t.Fatal("write over data and a hole: not planned")
	}
	if got := s.Info().FreeBlocks; got != free-4 {
		t.Fatalf("a planned write into 4 hole blocks: %d free blocks, want %d", got, free-4)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check with a planned write in flight: %v", rep.Findings)
	}
	issue(&pl)
	pl.Finish()
	want := append(append([]byte(nil), data[:off]...), bytes.Repeat([]byte{0xC5}, len(p))...)
	got := make([]byte, len(want))
	if _, err := h.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after Finish: %v, or the disk differs", err)
	}

	// Abort returns the blocks; the range still reads zeros.
	free = s.Info().FreeBlocks
	if !h.PlanWrite(&pl, p, 8<<20, 8) {
		t.Fatal("write into holes: not planned")
	}
	issue(&pl)
	pl.Abort()
	if got := s.Info().FreeBlocks; got != free {
		t.Fatalf("after Abort: %d free blocks, want %d", got, free)
	}
	zero := make([]byte, len(p))
	if _, err := h.ReadAt(zero, 8<<20); err != nil || !bytes.Equal(zero, make([]byte, len(p))) {
		t.Fatalf("an aborted write into holes shows: %v", err)
	}

	// Commit, reopen: the planned write's blocks are mapped.
	h.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = OpenPath(path, testOptions()); err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, s, "a"); !bytes.Equal(got[:len(want)], want) {
		t.Fatal("after a reopen the planned write is gone")
	}

	// Full, with the only free blocks in quarantine.
	if h, err = s.OpenDisk("a"); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	chunk := directio.AlignedBlock(1 << 20)
	var end int64
	for end = 2 << 20; ; end += 1 << 20 {
		if _, err := h.WriteAt(chunk, end); err != nil {
			break
		}
	}
	for ; ; end += bs {
		if _, err := h.WriteAt(chunk[:bs], end); err != nil {
			break
		}
	}
	if err := h.Punch(2<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if h.PlanWrite(&pl, p, end, 8) {
		t.Fatal("planned a write into holes on a full store (its freed blocks wait for a commit)")
	}
	if _, err := h.WriteAt(p, end); err != nil {
		t.Fatalf("WriteAt on a full store with blocks in quarantine: %v", err)
	}
}

// newFileStore formats a store file of size bytes in a temporary directory
// and opens it, so that plans go through the File backend's seam.
func newFileStore(t *testing.T, size int64, fo FormatOptions) (string, *Store) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.img")
	if err := FormatPath(path, size, fo); err != nil {
		t.Fatal(err)
	}
	s, err := OpenPath(path, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	return path, s
}

// TestPlanOnMemory: plans go through the backend's submission seam, so
// they are made on the memory backends too (no descriptor needed): there
// PrepareSQE says false and Do performs the I/O, which reads back through
// ReadAt; the File backend prepares an io_uring entry instead. A wrapper
// that is not a backend.Submitter (its I/O may block) gets no plan.
func TestPlanOnMemory(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	h := mustCreate(t, ms.s, "a", 1<<20)
	defer h.Close()
	bs := int64(ms.s.BlockSize())
	p := directio.AlignedBlock(int(4 * bs))
	for i := range p {
		p[i] = byte(i/int(bs) + 1)
	}
	var pl IOPlan
	if !h.PlanWrite(&pl, p, 2*bs, 8) {
		t.Fatal("write on a Mem backend not planned")
	}
	var sqe iouring.SQE
	if prepareSQE(&pl, &sqe, 0) || sqe != (iouring.SQE{}) {
		t.Fatal("Mem prepared an io_uring entry")
	}
	for i := range pl.IOs {
		if err := pl.Do(i); err != nil {
			t.Fatal(err)
		}
	}
	pl.Finish()
	got := make([]byte, len(p))
	if _, err := h.ReadAt(got, 2*bs); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("planned write on Mem reads back wrong (%v)", err)
	}
	q := directio.AlignedBlock(int(4 * bs))
	if !h.PlanRead(&pl, q, 2*bs, 8) {
		t.Fatal("read on a Mem backend not planned")
	}
	for i := range pl.IOs {
		if err := pl.Do(i); err != nil {
			t.Fatal(err)
		}
	}
	pl.Finish()
	if !bytes.Equal(q, p) {
		t.Fatal("planned read on Mem differs from the planned write")
	}

	// A wrapper embedding a Backend is not a Submitter: declined.
	mem := backend.NewMem(64 << 20)
	if err := Format(mem, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(struct{ backend.Backend }{mem}, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	hw := mustCreate(t, s, "w", 1<<20)
	defer hw.Close()
	if hw.PlanWrite(&pl, p, 0, 8) || hw.PlanRead(&pl, q, 0, 8) {
		t.Fatal("planned on a backend that is not a Submitter")
	}

	// The File backend prepares an entry with its descriptor and the I/O.
	_, fs := newFileStore(t, 64<<20, FormatOptions{})
	defer fs.Close()
	hf := mustCreate(t, fs, "f", 1<<20)
	defer hf.Close()
	mustWrite(t, hf, p, 4096) // prepares the store file's chunk (TestPlanWritePreparesBacking)
	if !hf.PlanWriteSync(&pl, p, 0, 8) && !hf.PlanWrite(&pl, p, 0, 8) {
		t.Fatal("write on a File backend not planned")
	}
	if !prepareSQE(&pl, &sqe, 0) || sqe.Opcode != iouring.OpWrite || sqe.Fd < 0 ||
		sqe.Off != uint64(pl.IOs[0].Off) || sqe.Len != uint32(len(pl.IOs[0].Buf)) ||
		sqe.Addr != uint64(uintptr(unsafe.Pointer(&pl.IOs[0].Buf[0]))) {
		t.Fatalf("File's entry for %d bytes at %d: %+v", len(pl.IOs[0].Buf), pl.IOs[0].Off, sqe)
	}
	pl.Abort()
}

// TestPlanWritePreparesBacking: the first write into a chunk of a store
// file that no write has used since the store was opened prepares it
// (backend.Preparer): zeros over every free block of the chunk, so later
// first writes there are overwrites for the host file system. PlanWrite,
// which must not block, declines that first write; WriteAt prepares and
// writes; then PlanWrite plans the next hole in the chunk. Blocks in use
// when a chunk is prepared keep their bytes: after a reopen (every chunk
// unprepared again) a new disk's first write prepares the chunk holding
// the first disk's data, which must read back the same.
func TestPlanWritePreparesBacking(t *testing.T) {
	path, s := newFileStore(t, 4*backend.PrepareChunk, FormatOptions{JournalSize: 1 << 20})
	defer func() { s.Close() }()
	h := mustCreate(t, s, "a", 64<<20)
	var st unix.Stat_t
	used := func() int64 {
		t.Helper()
		if err := unix.Stat(path, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	before, freeBefore := used(), s.Info().FreeBlocks
	p := directio.AlignedBlock(4096)
	var pl IOPlan
	if h.PlanWrite(&pl, p, 0, 8) {
		pl.Abort()
		t.Fatal("PlanWrite planned a first write into an unprepared chunk of the store file")
	}
	if free := s.Info().FreeBlocks; free != freeBefore {
		t.Fatalf("the declined plan kept blocks: %d free, want %d", free, freeBefore)
	}
	if _, err := h.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if grew := used() - before; grew < backend.PrepareChunk/2 {
		t.Errorf("the store file grew by %d bytes on the first write, want a prepared chunk (%d)", grew, backend.PrepareChunk)
	}
	if got := s.Counters().PreparedBytes; got < backend.PrepareChunk/2 {
		t.Errorf("PreparedBytes %d after preparing a chunk", got)
	}
	if free := s.Info().FreeBlocks; free != freeBefore-1 {
		t.Errorf("after the preparation %d blocks free, want %d", free, freeBefore-1)
	}
	// A large first write does not prepare (it would write its blocks
	// twice); it needs no more than it allocates.
	data := randomBytes(9, 8<<20)
	if _, err := h.WriteAt(data, 8<<20); err != nil {
		t.Fatal(err)
	}
	if !h.PlanWrite(&pl, p, 16<<20, 8) {
		t.Fatal("PlanWrite declined a hole in a prepared chunk")
	}
	for i := range pl.IOs {
		if err := pl.Do(i); err != nil {
			t.Fatal(err)
		}
	}
	pl.Finish()
	h.Close()

	// Reopen: a's chunk is unprepared again and holds a's data.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var err error
	if s, err = OpenPath(path, testOptions()); err != nil {
		t.Fatal(err)
	}
	b := mustCreate(t, s, "b", 64<<20)
	if _, err := b.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if got := readAll(t, s, "a"); !bytes.Equal(got[8<<20:16<<20], data) {
		t.Fatal("a's data changed when a write of b's prepared the chunk")
	}
	if got := s.Counters().PreparedBytes; got < backend.PrepareChunk/2 {
		t.Errorf("PreparedBytes %d: b's first write did not prepare the chunk after the reopen", got)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings)
	}
}

// TestPlanAsync: on a backend whose I/O a submission loop starts and reaps
// itself (backend.AsyncSubmitter: RBD; here backend.Async over memory),
// plans are made only for a caller with a completion queue of the store
// (IOPlan.Completions) and are Async: their I/O starts with Start and
// completes through the queue's eventfd and Reap, reads back through
// ReadAt, and a failed I/O aborts the plan, giving back the blocks of a
// write into holes, counted as a backend error. A queue of another store
// gets no plan, and neither does a synchronous write.
func TestPlanAsync(t *testing.T) {
	mem := backend.NewMem(64 << 20)
	mem.CheckAlignment(512)
	if err := Format(mem, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	ab := backend.NewAsync(mem)
	s, err := Open(ab, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("check: %v", rep.Findings)
		}
		s.Close()
	}()
	cq, err := s.NewCompletions()
	if err != nil || cq == nil {
		t.Fatalf("completion queue of a store on an AsyncSubmitter: %v, %v", cq, err)
	}
	if ms := newMemStore(t, 16<<20, FormatOptions{}); true {
		if c, err := ms.s.NewCompletions(); c != nil || err != nil {
			t.Fatalf("a store on Mem (a Submitter) made a completion queue: %v, %v", c, err)
		}
	}
	h := mustCreate(t, s, "a", 1<<20)
	defer h.Close()
	bs := int64(s.BlockSize())
	p := directio.AlignedBlock(int(4 * bs))
	for i := range p {
		p[i] = byte(i/int(bs) + 1)
	}

	var pl IOPlan
	if h.PlanWrite(&pl, p, 0, 8) || h.PlanRead(&pl, p, 0, 8) {
		t.Fatal("planned on an AsyncSubmitter without a completion queue")
	}
	pl.Completions = cq
	if h.PlanWriteSync(&pl, p, 0, 8) {
		t.Fatal("planned a synchronous write on an AsyncSubmitter")
	}
	run := func(what string) map[uint64]int64 {
		t.Helper()
		if !pl.Async() {
			t.Fatalf("%s: the plan is not Async", what)
		}
		var sqe iouring.SQE
		if prepareSQE(&pl, &sqe, 0) {
			t.Fatalf("%s: an Async plan prepared an io_uring entry", what)
		}
		for i := range pl.IOs {
			if err := pl.Start(i, uint64(100+i)); err != nil {
				t.Fatalf("%s: start: %v", what, err)
			}
		}
		return reapAll(t, cq, len(pl.IOs))
	}
	if !h.PlanWrite(&pl, p, 2*bs, 8) {
		t.Fatal("write not planned with a completion queue")
	}
	res := run("write")
	for i := range pl.IOs {
		if r := res[uint64(100+i)]; r != int64(len(pl.IOs[i].Buf)) {
			t.Fatalf("write I/O %d: %d of %d bytes", i, r, len(pl.IOs[i].Buf))
		}
	}
	pl.Finish()
	got := directio.AlignedBlock(len(p))
	if _, err := h.ReadAt(got, 2*bs); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("async planned write reads back wrong (%v)", err)
	}
	q := directio.AlignedBlock(len(p))
	if !h.PlanRead(&pl, q, 2*bs, 8) {
		t.Fatal("read not planned with a completion queue")
	}
	run("read")
	pl.Finish()
	if !bytes.Equal(q, p) {
		t.Fatal("async planned read differs from the write")
	}

	// A failed I/O: the plan is aborted, the blocks given to the holes go
	// back, and the error is counted; the retry (WriteAt) then succeeds.
	errs := s.Counters().Errors
	ab.SetFault(func(backend.IO) error { return syscall.EIO })
	if !h.PlanWrite(&pl, p, 8*bs, 8) {
		t.Fatal("write into holes not planned")
	}
	if res := run("failing write"); res[100] != -int64(syscall.EIO) {
		t.Fatalf("failing write: result %d, want -EIO", res[100])
	}
	pl.Abort()
	if e := s.Counters().Errors; e != errs+1 {
		t.Errorf("backend errors %d after an aborted plan, want %d", e, errs+1)
	}
	ab.SetFault(nil)
	if _, err := h.WriteAt(p, 8*bs); err != nil {
		t.Fatal(err)
	}

	// Another store's completion queue gets no plan.
	mem2 := backend.NewMem(16 << 20)
	if err := Format(mem2, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(backend.NewAsync(mem2), testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	cq2, err := s2.NewCompletions()
	if err != nil {
		t.Fatal(err)
	}
	defer cq2.Close()
	pl.Completions = cq2
	if h.PlanRead(&pl, q, 2*bs, 8) {
		t.Fatal("planned with another store's completion queue")
	}

	// The queue closes once all its I/O is reaped, not before.
	pl.Completions = cq
	if !h.PlanRead(&pl, q, 2*bs, 8) {
		t.Fatal("read not planned")
	}
	for i := range pl.IOs {
		if err := pl.Start(i, uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := cq.Close(); err == nil {
		t.Fatal("closed a completion queue with I/O not reaped")
	}
	reapAll(t, cq, len(pl.IOs))
	pl.Finish()
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
}

// reapAll waits (at most 10 s at a time) on cq's eventfd until n
// completions have been reaped, and returns their results by tag.
func reapAll(t *testing.T, cq *Completions, n int) map[uint64]int64 {
	t.Helper()
	res := map[uint64]int64{}
	var b [8]byte
	for len(res) < n {
		fds := []unix.PollFd{{Fd: int32(cq.Fd()), Events: unix.POLLIN}}
		k, err := unix.Poll(fds, 10_000)
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			t.Fatalf("waiting for %d completions, %d came (%v)", n, len(res), err)
		}
		if _, err := unix.Read(cq.Fd(), b[:]); err != nil {
			t.Fatal(err)
		}
		cq.Reap(func(tag uint64, r int64) { res[tag] = r })
	}
	return res
}

// prepareSQE puts the plan's i-th I/O on an io_uring entry as the doors do
// (package door/storeplan).
func prepareSQE(pl *IOPlan, sqe *iouring.SQE, i int) bool {
	sub := pl.Submitter()
	return sub != nil && sub.PrepareSQE(sqe, pl.BackendIO(i))
}

// A plan that is declined is counted by its reason, and the counts show in
// the store's metrics (vdisk stats, vdiskfs_plan_declines_total).
func TestPlanDeclinesCounted(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	h := mustCreate(t, ms.s, "a", 1<<20)
	defer h.Close()
	bs := int64(ms.s.BlockSize())
	p := directio.AlignedBlock(int(2 * bs))
	var pl IOPlan
	if h.PlanRead(&pl, p[:bs/2], 0, 8) {
		t.Fatal("planned an unaligned read")
	}
	if h.PlanWrite(&pl, p, 1<<20, 8) {
		t.Fatal("planned a growing write")
	}
	if !h.PlanWrite(&pl, p, 0, 8) {
		t.Fatal("write not planned")
	}
	var other IOPlan
	if h.PlanRead(&other, p, 0, 8) {
		t.Fatal("planned a read of a range a write holds")
	}
	pl.Abort()
	got := ms.s.Metrics().Counters.PlanDeclines
	want := map[string]uint64{"unaligned": 1, "end": 1, "busy": 1}
	if len(got) != len(want) {
		t.Fatalf("declines %v, want %v", got, want)
	}
	for r, n := range want {
		if got[r] != n {
			t.Errorf("declines %v, want %v", got, want)
		}
	}
	if s := Decline(200).String(); s != "unknown" {
		t.Errorf("an unknown reason reads %q", s)
	}
	if len(DeclineReasons()) != int(numDeclines) {
		t.Errorf("DeclineReasons lists %d of %d", len(DeclineReasons()), numDeclines)
	}
}

// slowReads is a backend (not a Submitter, so plans run each I/O through
// ReadAt) whose data reads take a while.
type slowReads struct{ backend.Backend }

func (b slowReads) ReadAt(p []byte, off int64) (int, error) {
	time.Sleep(time.Millisecond)
	return b.Backend.ReadAt(p, off)
}

// A read that runs its I/Os one after another counts each I/O's own
// latency, not the time since the plan started (which would add up): the
// latencies of its I/Os sum to no more than the read took.
func TestSerialLatencyPerIO(t *testing.T) {
	mem := backend.NewMem(64 << 20)
	if err := Format(mem, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(slowReads{mem}, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := mustCreate(t, s, "a", 4*maxRunBytes)
	defer h.Close()
	p := directio.AlignedBlock(4 * maxRunBytes)
	mustWrite(t, h, p, 0)
	before := s.Metrics().Histograms["data_read_latency_seconds"]
	start := time.Now()
	if _, err := h.ReadAt(p, 0); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start).Seconds()
	after := s.Metrics().Histograms["data_read_latency_seconds"]
	n, sum := after.Count-before.Count, after.Sum-before.Sum
	if n < 4 {
		t.Fatalf("the read took %d backend reads, want at least 4 (one per %d bytes)", n, maxRunBytes)
	}
	if sum > took {
		t.Errorf("%d reads counted %.4f s of latency in a read of %.4f s: each I/O's latency is not its own", n, sum, took)
	}
}
