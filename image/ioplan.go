package image

import (
	"time"

	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// An IOPlan is a disk read or write turned into I/O on the store's
// backing that the caller issues itself, through the backend's submission
// seam (backend.Submitter): the FUSE io_uring transport puts each I/O on
// its own ring where the backend prepares it one (PrepareSQE: File,
// Device), so that no thread waits in pread or pwrite, and otherwise has
// the backend perform it at once (Do: Mem, Crash, in memory).
//
// Between a successful PlanRead or PlanWrite and Finish or Abort, the plan
// holds the disk's range as ReadAt and WriteAt do across their backend I/O
// (shared for a read, exclusive for a write): no conflicting write, punch
// or truncate runs, and the blocks cannot be freed and given to another
// disk while the caller's I/O is in flight. A write into holes is given
// new blocks, held in flight as WriteAt holds them: Finish maps them (with
// their journal records), Abort returns them. The caller must call Finish or
// Abort once every I/O it issued has completed, and must keep the handle
// open until then: closing the last handle of an unlinked disk frees its
// blocks without waiting for plans.
//
// An IOPlan is reused from request to request by one goroutine; its zero
// value is ready.
type IOPlan struct {
	// IOs is the I/O to issue on the backing (PrepareSQE or Do): reads
	// into, or writes from, the buffer given to the Plan call. When every
	// one has transferred all of its Buf, the request is done: N bytes of
	// the disk (N < len(p) for a read at the disk's end).
	IOs []BackingIO
	N   int
	// Durable says the writes must be durable when they complete (RWF_DSYNC,
	// a FUA write): a plan of PlanWriteSync.
	Durable bool

	write bool
	be    backend.Submitter
	off   int64
	d     *disk
	lr    lockedRange
	held  bool // lr is held
	sc    *scratch
	start time.Time
}

// BackingIO is one I/O of an IOPlan: len(Buf) bytes at Off of the backing.
type BackingIO struct {
	Off int64
	Buf []byte
}

// PlanRead plans the read of len(p) bytes at off into p, like ReadAt. Holes
// are zeroed in p at once. It returns false, with nothing held, when the
// read does not fit a plan, and ReadAt should serve it: the range or p is
// not aligned for O_DIRECT (also where the disk ends), it would take more
// than maxIOs backing reads, the backing is not a backend.Submitter (a
// wrapper whose I/O may block), the handle is closed, or a write, punch or truncate holds part of the range (PlanRead
// never waits).
func (h *Disk) PlanRead(pl *IOPlan, p []byte, off int64, maxIOs int) bool {
	return h.plan(pl, p, off, maxIOs, false, false)
}

// PlanWrite plans the write of len(p) bytes at off from p, like WriteAt,
// allocating blocks for the holes in the range. It returns false, with
// nothing held, where WriteAt should serve the write instead: as for
// PlanRead, and also when the write ends past the disk's size, the store
// takes no writes, any request holds part of the range, or the holes
// cannot be given blocks without waiting (a full store, whose WriteAt
// commits to release freed blocks, or says ENOSPC).
func (h *Disk) PlanWrite(pl *IOPlan, p []byte, off int64, maxIOs int) bool {
	return h.plan(pl, p, off, maxIOs, true, false)
}

// PlanWriteSync plans a synchronous (O_DSYNC) write, like WriteAtSync,
// where durable writes alone make it durable: an overwrite in place of
// blocks whose mappings are durable. The plan is Durable: its writes must
// be issued as durable (FUA) writes. Anything else is declined, as by
// PlanWrite, and also a write into holes or while journal records are
// pending: WriteAtSync serves those, with a commit.
func (h *Disk) PlanWriteSync(pl *IOPlan, p []byte, off int64, maxIOs int) bool {
	return h.plan(pl, p, off, maxIOs, true, true)
}

func (h *Disk) plan(pl *IOPlan, p []byte, off int64, maxIOs int, write, durable bool) bool {
	d, s := h.d, h.d.s
	sub, ok := s.be.(backend.Submitter)
	if !ok || checkRange(off, int64(len(p))) != nil || len(p) == 0 || !coalesce.IsAligned(p) {
		return false
	}
	bs := s.bs
	d.mu.RLock()
	size := d.attr.Size
	d.mu.RUnlock()
	n := min(int64(len(p)), size-off)
	if n <= 0 || uint64(off)%bs != 0 || uint64(n)%bs != 0 || write && n != int64(len(p)) {
		return false // EOF, partial blocks and growing writes: ReadAt's and WriteAt's business
	}
	if write && s.writable() != nil {
		return false
	}
	first, count := coalesce.BlockRange(uint64(off), uint64(n), bs)
	lr, ok := d.ranges.tryLock(first, count, write)
	if !ok {
		return false
	}
	if h.live() != nil {
		lr.unlock()
		return false
	}
	sc := getScratch()
	d.mu.RLock()
	sc.segs = d.m.Lookup(sc.segs, first, count)
	var nb neighbours // only holes to fill need them: not on the read path
	if write && hasHole(sc) {
		nb = d.neighboursLockedMu(first, count)
	}
	size = d.attr.Size
	d.mu.RUnlock()
	decline := func() bool {
		s.unallocate(sc.allocs)
		putScratch(sc)
		lr.unlock()
		return false
	}
	if off+n > size {
		return decline()
	}
	segs := sc.segs // what the I/O goes to
	if durable && (hasHole(sc) || !s.recordsDurable()) {
		return decline() // needs a commit: WriteAtSync's business
	}
	if write && hasHole(sc) {
		// Blocks for the holes, without waiting for a commit to free
		// any: a full store's writes go to WriteAt.
		if s.allocHoles(sc, nb, false) != nil {
			return decline()
		}
		segs = sc.out
	}
	sc.runs = coalesce.Runs(sc.runs[:0], segs, first, bs, maxRunBytes/bs)
	if len(sc.runs) > maxIOs {
		return decline()
	}
	c := s.stats.shard(sc)
	countLookup(c, sc.segs)
	countCoalesce(c, segs, sc.runs)
	buf := p[:n]
	if !write {
		zeroHoles(buf, sc.segs, first, bs)
	}
	pl.N, pl.IOs, pl.Durable = int(n), pl.IOs[:0], durable
	for _, r := range sc.runs {
		b := buf[r.BufOff:min(r.BufOff+r.Blocks*bs, uint64(n))]
		pl.IOs = append(pl.IOs, BackingIO{Off: s.dataOff + int64(r.Phys*bs), Buf: b})
	}
	pl.write, pl.be, pl.d, pl.lr, pl.held, pl.sc, pl.off, pl.start = write, sub, d, lr, true, sc, off, time.Now()
	return true
}

// backendIO is the plan's i-th I/O as the backend takes it.
func (pl *IOPlan) backendIO(i int) backend.IO {
	io := pl.IOs[i]
	return backend.IO{Off: io.Off, Buf: io.Buf, Write: pl.write, Durable: pl.Durable}
}

// PrepareSQE fills sqe, a zeroed entry of the caller's io_uring, with the
// plan's i-th I/O when the backend can take it there (backend.Submitter:
// File and Device); the caller sets UserData and submits it. False: the
// caller issues it with Do instead. Only between a successful Plan call
// and Finish or Abort.
func (pl *IOPlan) PrepareSQE(sqe *iouring.SQE, i int) bool {
	return pl.be.PrepareSQE(sqe, pl.backendIO(i))
}

// Do performs the plan's i-th I/O synchronously through the backend. After
// PrepareSQE said false it does not wait for a device (see
// backend.Submitter), so a thread that must not block may call it. An
// error means the plan must be aborted.
func (pl *IOPlan) Do(i int) error {
	return pl.be.Do(pl.backendIO(i))
}

func hasHole(sc *scratch) bool {
	for _, sg := range sc.segs {
		if sg.Hole {
			return true
		}
	}
	return false
}

// Finish ends a plan whose I/O all completed in full: it counts the
// request as ReadAt or WriteAt would (a write also dirties the store for
// the next flush, sets the disk's mtime and maps the blocks it was given,
// journaling them) and releases the range.
func (pl *IOPlan) Finish() {
	if !pl.held {
		return
	}
	d, sc := pl.d, pl.sc
	c := d.s.stats.shard(sc)
	for _, io := range pl.IOs {
		if pl.write {
			c.DataWriteLatency.observeSince(pl.start)
			c.DataWriteSize.Observe(uint64(len(io.Buf)))
			if pl.Durable {
				c.DurableWrites.Add(1)
			}
		} else {
			c.DataReadLatency.observeSince(pl.start)
			c.DataReadSize.Observe(uint64(len(io.Buf)))
		}
	}
	if pl.write {
		d.s.writeGen.Add(1)
		d.touch()
		d.publishWriteLockedRange(sc, pl.off+int64(pl.N))
		sc.allocs = sc.allocs[:0] // mapped now: Abort must not return them
	}
	d.countRequest(sc, pl.write, uint64(pl.N))
	pl.Abort()
}

// Abort releases a plan without counting it, returning the blocks a write
// was given: an I/O failed, and the caller serves the request again with
// ReadAt or WriteAt, which count and report.
// (A failed write may have changed some of its mapped blocks, as a failed
// WriteAt may.)
func (pl *IOPlan) Abort() {
	if !pl.held {
		return
	}
	pl.held = false
	pl.d.s.unallocate(pl.sc.allocs) // blocks for holes, never mapped
	pl.lr.unlock()
	putScratch(pl.sc)
	pl.d, pl.sc, pl.lr, pl.be = nil, nil, lockedRange{}, nil
	clear(pl.IOs) // let go of the caller's buffers
	pl.IOs = pl.IOs[:0]
}
