package image

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/image/placement"
)

// An IOPlan is a disk read or write turned into I/O on the store's
// backing. It is the one data path: every read and write of a disk is
// planned (range lock, map lookup, read-modify-write of partial blocks,
// blocks for the holes, coalescing into runs), submitted through the
// backend's seam (backend.Submitter, backend.AsyncSubmitter, or backend.Do
// for a wrapper that is neither) and finished (the map published with its records, the
// counters) by the code in this file, whoever asked for it:
//
//   - Disk.ReadAt, WriteAt and WriteAtSync plan waiting as needed, perform
//     the plan's I/O on the caller's goroutine (run) and finish it;
//   - the doors' queue threads (package door: the FUSE io_uring queues),
//     which must not block, plan with PlanRead, PlanWrite or PlanWriteSync,
//     which decline what would need a wait, put each I/O on their own ring
//     where the backend prepares it an entry (Submitter: File, Device;
//     through package door/storeplan), start it on their
//     own completion queue of the backend (Start: RBD, whose I/O waits
//     for the network; the plan is Async) or have the backend perform it
//     at once (Do: Mem, Crash), and call Finish or Abort.
//
// Between a successful plan and Finish or Abort, the plan holds the disk's
// range (shared for a read, exclusive for a write): no conflicting write,
// punch or truncate runs, and the blocks cannot be freed and given to
// another disk while the I/O is in flight. A write into holes is given new
// blocks, held in flight: Finish maps them (with their journal records),
// Abort returns them. The caller must call Finish or Abort once every I/O
// it issued has completed, and must keep the handle open until then:
// closing the last handle of an unlinked disk frees its blocks without
// waiting for plans.
//
// An IOPlan is used by one goroutine at a time and may be reused from
// request to request; its zero value is ready. It allocates nothing: its
// slices belong to a pooled scratch while the plan is held.
type IOPlan struct {
	// IOs is the I/O to issue on the backing (Submitter or Do): reads
	// into, or writes from, the buffer given to the Plan call (or, for an
	// unaligned request of ReadAt or WriteAt, a bounce buffer). When
	// every one has transferred all of its Buf, the request is done: N
	// bytes of the disk (N < len(p) for a read at the disk's end).
	IOs []BackingIO
	N   int
	// Durable says the writes must be durable when they complete (RWF_DSYNC,
	// a FUA write): a synchronous overwrite in place of durable mappings.
	// N and Durable stay as they are after Finish or Abort.
	Durable bool
	// PlanOptions are the caller's: set before planning, kept by the
	// plan from request to request.
	PlanOptions

	write  bool
	be     backend.Backend
	sub    backend.Submitter // be, when it is one; else nil
	async  bool              // the I/O goes through Completions (Start)
	p      []byte            // the caller's buffer
	bounce []byte            // whole blocks from first, when p is not aligned
	off    int64
	first  uint64 // the first block of the range
	d      *disk
	lr     lockedRange
	held   bool // lr is held (by the caller, if locked)
	locked bool // planMode.locked
	sc     *scratch
	start  time.Time // the plan's submission
	timed  bool      // run timed each I/O (sc.lat); else each took from start to Finish
	// ciph decrypts a read of an encrypted disk when it finishes, in
	// data (the blocks read: p's or the bounce buffer's); nil otherwise.
	ciph *crypt.Cipher
	data []byte
	// cipherBytes is how many bytes the plan encrypts or decrypts
	// (CipherBytes).
	cipherBytes int
	raw         bool // planMode.raw: a raw write does not grow the disk
}

// PlanOptions are how a caller wants its IOPlan made. It sets them before
// planning; every reset of the plan (planning, Finish, Abort) keeps them.
type PlanOptions struct {
	// Completions is the caller's completion queue on the store's
	// backend, if the caller reaps one (Store.NewCompletions): with it,
	// PlanRead and PlanWrite take a store whose backend is a
	// backend.AsyncSubmitter, and the plan is Async.
	Completions *Completions
	// MaxCipherWrite, when not 0, declines (DeclineCipher) a plan
	// without wait that would encrypt more than this many bytes of a
	// write: a caller whose thread feeds others' I/O leaves large
	// encryptions to a thread that may block, where they run beside it.
	MaxCipherWrite int
}

// BackingIO is one I/O of an IOPlan: len(Buf) bytes at Off of the backing.
type BackingIO struct {
	Off int64
	Buf []byte
}

// A planMode says what a plan is for and how it may be made.
type planMode struct {
	write bool
	// fua: a synchronous (O_DSYNC) write, which durable (FUA) writes make
	// durable where they alone are enough (IOPlan.Durable).
	fua bool
	// wait: the caller may block (ReadAt, WriteAt). The plan then waits
	// for its range lock, reads the partial blocks it writes, grows the
	// disk, lets the allocator commit to release quarantined blocks, and
	// takes any number of I/Os. Without wait a plan that would need any
	// of these, or a fua plan that durable writes alone do not make
	// durable, is declined (a Decline), with nothing held.
	wait   bool
	maxIOs int // the most I/Os a plan without wait may have
	// locked: the caller holds an exclusive range lock over the request
	// already (a punch or truncate rewriting a partial block): the plan
	// neither takes nor releases it, and is not counted as a request.
	locked bool
	// raw: the blocks as stored, ciphertext on an encrypted disk, which
	// need no key (defrag's reads, Disk.ReadRaw). A raw write (Disk.WriteRaw)
	// puts ciphertext into new blocks, every one (what was mapped there
	// is written around, as a shared block is), the first with tweak
	// rawTweak, and never grows the disk.
	raw      bool
	rawTweak uint64
}

// errEmpty says a request of no bytes, which needs no plan.
var errEmpty = errors.New("image: empty request")

// PlanRead plans the read of len(p) bytes at off into p, like ReadAt,
// without waiting. Holes are zeroed in p at once. It returns false, with
// nothing held, when the read does not fit such a plan, and ReadAt should
// serve it: the range or p is not aligned for O_DIRECT (also where the
// disk ends), it would take more than maxIOs backing reads, the backing is
// not a backend.Submitter (a wrapper whose I/O may block) nor a
// backend.AsyncSubmitter whose completion queue the plan has (Completions),
// the handle is closed, or a write, punch or truncate holds part of the
// range.
func (h *Disk) PlanRead(pl *IOPlan, p []byte, off int64, maxIOs int) bool {
	return h.planNoWait(pl, p, off, planMode{maxIOs: maxIOs})
}

// PlanWrite plans the write of len(p) bytes at off from p, like WriteAt,
// without waiting, allocating blocks for the holes in the range. It
// returns false, with nothing held, where WriteAt should serve the write
// instead: as for PlanRead, and also when the write ends past the disk's
// size, the store takes no writes, any request holds part of the range,
// or the holes cannot be given blocks without waiting (a full store, whose
// WriteAt commits to release freed blocks, or says ENOSPC).
func (h *Disk) PlanWrite(pl *IOPlan, p []byte, off int64, maxIOs int) bool {
	return h.planNoWait(pl, p, off, planMode{write: true, maxIOs: maxIOs})
}

// PlanWriteSync plans a synchronous (O_DSYNC) write, like WriteAtSync,
// where durable writes alone make it durable: an overwrite in place of
// blocks whose mappings are durable. The plan is Durable: its writes must
// be issued as durable (FUA) writes. Anything else is declined, as by
// PlanWrite, and also a write into holes or while journal records are
// pending: WriteAtSync serves those, with a commit. It also declines on a
// backend.AsyncSubmitter (RBD, whose durable writes with librbd's cache on
// need a flush after them): WriteAtSync serves those.
func (h *Disk) PlanWriteSync(pl *IOPlan, p []byte, off int64, maxIOs int) bool {
	return h.planNoWait(pl, p, off, planMode{write: true, fua: true, maxIOs: maxIOs})
}

// planNoWait is PlanRead, PlanWrite and PlanWriteSync: prepare without
// wait, a decline counted by its reason.
func (h *Disk) planNoWait(pl *IOPlan, p []byte, off int64, m planMode) bool {
	err := h.prepare(pl, p, off, m)
	if err != nil {
		h.d.s.stats.Declines[reasonOf(err)].Add(1)
	}
	return err == nil
}

// prepare makes pl the plan of len(p) bytes at off, per m. It returns
// a decline (declined) for a plan m does not allow (only without wait), errEmpty
// for len(p) == 0 (nothing held), io.EOF for a read at or past the end,
// and the error of an invalid request or a failed read-modify-write or
// allocation; on any error nothing is held.
func (h *Disk) prepare(pl *IOPlan, p []byte, off int64, m planMode) error {
	return h.d.prepare(pl, p, off, m, &h.closed)
}

// prepare is Disk.prepare for a handle whose closed flag is closed, or,
// with closed nil, for the store's own I/O on a disk (a punch's
// read-modify-write), which holds no handle.
func (d *disk) prepare(pl *IOPlan, p []byte, off int64, m planMode, closed *atomic.Bool) error {
	// The stages, in order. The first two decide whether there is a plan
	// at all and hold nothing when they say no; from the range lock on,
	// a stage that fails releases what the plan holds.
	r, err := d.admit(pl, p, off, m, closed)
	if err != nil {
		return err
	}
	if err := d.holdRange(pl, &r, m, closed); err != nil {
		return err
	}
	err = d.lookUp(pl, &r, m)
	var buf []byte
	if err == nil {
		buf, err = d.buffer(pl, &r, m)
	}
	var segs []blockmap.Segment
	if err == nil {
		segs, err = d.placeHoles(pl, &r, m)
	}
	if err == nil {
		d.encrypt(pl, &r, m, buf, segs)
		err = d.issue(pl, &r, m, buf, segs)
	}
	if err != nil {
		pl.release()
		return err
	}
	return nil
}

// request is what prepare works out about a request before it holds
// anything, and what the map says of its range once it does.
type request struct {
	p            []byte
	off, n       int64  // n: the bytes it covers (a read stops at the size)
	first, count uint64 // its blocks
	aligned      bool   // offset, length and memory block-aligned: the I/O goes to and from p itself
	sub          backend.Submitter
	async        bool                 // its I/O starts on the caller's completion queue
	holes        bool                 // a write with blocks to fill: holes, or shared blocks written around
	nb           placement.Neighbours // where those blocks go
	c            *Shard               // the counters it counts into
	ciph         *crypt.Cipher        // an encrypted disk's (not raw): writes encrypted, reads decrypted
	tweakBase    uint64               // an encrypted disk's: the tweak of new blocks at virtual block 0
}

// admit checks the request and chooses how its I/O will be issued: the
// byte count (a read stops at the size), whether it is aligned, and,
// without wait, whether the backend takes it on a ring or on the caller's
// completion queue. It declines, holding nothing, what a plan without
// wait may not do.
func (d *disk) admit(pl *IOPlan, p []byte, off int64, m planMode, closed *atomic.Bool) (request, error) {
	s := d.s
	if closed != nil && closed.Load() {
		return request{}, m.decline(DeclineClosed, ErrClosed)
	}
	if err := checkRange(off, int64(len(p))); err != nil {
		return request{}, fmt.Errorf("disk %d %s: %w", d.id, opName(m.write), err)
	}
	r := request{p: p, off: off, n: int64(len(p))}
	if !m.raw {
		c, err := d.cipher()
		if err != nil {
			return request{}, m.decline(DeclineLocked, err)
		}
		if c != nil && m.write && !m.wait && pl.MaxCipherWrite > 0 && len(p) > pl.MaxCipherWrite {
			return request{}, declined(DeclineCipher)
		}
		r.ciph = c
	}
	if !m.write { // a read ends at the size; a write may grow the disk
		d.mu.RLock()
		size := d.attr.Size
		d.mu.RUnlock()
		if m.raw && d.enc != nil {
			// Ciphertext is read in whole blocks: the last block's bytes
			// past the size decrypt together with those before it.
			size = int64(coalesce.RoundUp(uint64(size), s.bs))
		}
		if off >= size {
			return request{}, m.decline(DeclineEnd, io.EOF)
		}
		r.n = min(r.n, size-off)
	}
	if r.n == 0 {
		return request{}, errEmpty
	}
	sub, isSub := s.be.(backend.Submitter)
	r.sub = sub
	// Async: the plan's I/O starts on the caller's completion queue,
	// which must be one of this store's backend.
	cq := pl.Completions
	r.async = !m.wait && !isSub && !m.fua && cq != nil && cq.s == s
	uoff := uint64(off)
	r.aligned = uoff%s.bs == 0 && uint64(r.n)%s.bs == 0 && coalesce.IsAligned(p)
	if !m.wait && !isSub && !r.async {
		return request{}, declined(DeclineBackend)
	}
	if !m.wait && !r.aligned {
		return request{}, declined(DeclineUnaligned) // partial blocks: ReadAt's and WriteAt's business
	}
	r.first, r.count = coalesce.BlockRange(uoff, uint64(r.n), s.bs)
	return r, nil
}

// holdRange takes the request's range lock (waiting only with wait; not
// at all when the caller holds it), makes pl the plan that holds it, and
// checks that the handle is still open and, for a write, that the store
// and the disk take writes. On an error nothing is held.
func (d *disk) holdRange(pl *IOPlan, r *request, m planMode, closed *atomic.Bool) error {
	s := d.s
	lr, held := lockedRange{}, true
	switch {
	case m.locked:
	case m.wait:
		lr = d.ranges.lock(r.first, r.count, m.write)
	default:
		lr, held = d.ranges.tryLock(r.first, r.count, m.write)
	}
	if !held {
		return declined(DeclineBusy) // PlanRead and PlanWrite never wait
	}
	sc := getScratch()
	*pl = IOPlan{IOs: sc.ios[:0], PlanOptions: pl.PlanOptions, write: m.write, be: s.be, sub: r.sub, async: r.async, p: r.p,
		off: r.off, first: r.first, d: d, lr: lr, held: true, locked: m.locked, sc: sc, raw: m.raw}
	r.c = s.stats.shard(sc)
	var err error
	switch {
	case closed != nil && closed.Load():
		err = m.decline(DeclineClosed, ErrClosed)
	case m.write:
		err = s.writable()
		if err == nil {
			err = d.readOnly()
		}
		if err != nil {
			err = m.decline(DeclineReadOnly, fmt.Errorf("disk %d write: %w", d.id, err))
		}
	}
	if err != nil {
		pl.release()
	}
	return err
}

// lookUp reads the range's map into the plan's scratch: its data and
// holes, and, for a write, the shared blocks it must write around (which
// it then fills like holes) and the neighbours that place new blocks. It
// declines, without wait, a write that grows the disk or a read of a disk
// that shrank, and a synchronous write that needs a commit.
func (d *disk) lookUp(pl *IOPlan, r *request, m planMode) error {
	s, sc := d.s, pl.sc
	d.mu.RLock()
	sc.segs = d.m.Lookup(sc.segs, r.first, r.count)
	r.holes = hasHole(sc)
	// Only holes to fill need neighbours: not the read path. Shared blocks
	// are written around, like holes.
	if m.write && d.mayShare.Load() {
		s.mu.Lock()
		sc.cowed = s.cowLockedMu(d, sc)
		r.holes = r.holes || sc.cowed
		if r.holes {
			r.nb = d.neighboursLockedMu(r.first, r.count)
			r.nb.DropShared(r.first, r.count, s.mu.shared)
		}
		s.mu.Unlock()
	} else if m.write && r.holes {
		r.nb = placement.Neighbours{Lazy: true, First: r.first, Count: r.count}
	}
	size := d.attr.Size
	if d.enc != nil {
		r.tweakBase = d.enc.tweakBase
	}
	if m.write && m.raw { // every block new, with the stream's tweaks
		sc.cow = append(sc.cow[:0], blockmap.Segment{Virt: r.first, Len: r.count, Hole: true})
		sc.cowed, r.holes = true, true
		r.nb = d.neighboursLockedMu(r.first, r.count)
		r.tweakBase = m.rawTweak - r.first
	}
	d.mu.RUnlock()
	if !m.wait && r.off+r.n > size { // a growing write, or a disk that shrank
		return declined(DeclineEnd) // WriteAt's and ReadAt's business
	}
	// A synchronous overwrite in place needs nothing journalled when the
	// mappings it writes through are durable: then the data only has to
	// be, and durable writes make it so. The range lock keeps this
	// range's mappings as they are, and every record that made them was
	// appended before the lookup.
	pl.Durable = m.fua && !r.holes && r.off+r.n <= size && s.mappingsDurable()
	if m.fua && !m.wait && !pl.Durable {
		return declined(DeclineNeedsCommit) // WriteAtSync's business
	}
	countLookup(r.c, sc.segs)
	return nil
}

// buffer returns the buffer covering whole blocks [first, first+count)
// that the I/O goes to and from: the caller's own when the request is
// aligned; else a pooled one (the plan's bounce buffer), into which a
// write first reads (or zeroes, for a hole) every block it covers only in
// part (a partial span of Split, at most two) and then copies itself. A
// write to an encrypted disk always goes from the bounce buffer, which
// its ciphertext fills (encrypt): an aligned one copies nothing there
// yet.
func (d *disk) buffer(pl *IOPlan, r *request, m planMode) ([]byte, error) {
	s, bs := d.s, d.s.bs
	if r.aligned && (!m.write || r.ciph == nil) {
		return r.p[:r.n], nil
	}
	buf := s.pool.Get(int(r.count * bs))
	pl.bounce = buf
	if !m.write || r.aligned {
		return buf, nil
	}
	uoff := uint64(r.off)
	spans := coalesce.Split(uoff, uint64(r.n), bs)
	for _, sp := range spans.All() {
		if !sp.Partial {
			continue
		}
		lo := (sp.Block - r.first) * bs
		if err := d.fillBlock(buf[lo:lo+bs], pl.sc.segs, sp.Block); err != nil {
			return nil, fmt.Errorf("disk %d write at %d: read-modify-write: %w", d.id, r.off, err)
		}
	}
	copy(buf[uoff-r.first*bs:], r.p)
	return buf, nil
}

// placeHoles gives a write's holes (and the shared blocks it writes
// around) new blocks, placed by their neighbours (fillHoles), and returns
// the segments the I/O goes to. Without wait, blocks are taken without
// waiting for a commit to free any: a full store's writes go to WriteAt.
func (d *disk) placeHoles(pl *IOPlan, r *request, m planMode) ([]blockmap.Segment, error) {
	sc := pl.sc
	if sc.cowed { // from here on the shared pieces are holes to fill
		sc.segs, sc.cow = sc.cow, sc.segs
	}
	if !m.write || !r.holes {
		return sc.segs, nil
	}
	if err := d.fillHoles(sc, r.nb, m.wait); err != nil {
		return nil, m.decline(DeclineNoBlocks, fmt.Errorf("disk %d write %d bytes at %d: %w", d.id, r.n, r.off, err))
	}
	if d.enc != nil {
		tweakNew(sc.out, sc.allocs, r.tweakBase)
	}
	return sc.out, nil
}

// encrypt turns a write's plaintext into ciphertext in the bounce buffer
// buf, each data segment under its tweak: from the caller's p when the
// request is aligned (buffer copied nothing), else in place. This is the
// only place data is encrypted, always into the store's own buffer. A
// read keeps the cipher to decrypt when it finishes.
func (d *disk) encrypt(pl *IOPlan, r *request, m planMode, buf []byte, segs []blockmap.Segment) {
	if r.ciph == nil {
		return
	}
	pl.cipherBytes = int(r.count * d.s.bs)
	if !m.write {
		pl.ciph, pl.data = r.ciph, buf
		return
	}
	src := buf
	if r.aligned {
		src = r.p
	}
	encryptSegs(r.ciph, buf, src, segs, r.first, d.s.bs)
	r.c.EncryptedBytes.Add(r.count * d.s.bs)
}

// issue coalesces the segments into runs, one backing I/O each (declining,
// without wait, more than the caller takes), zeroes a read's holes in the
// buffer, and makes the plan's I/Os.
func (d *disk) issue(pl *IOPlan, r *request, m planMode, buf []byte, segs []blockmap.Segment) error {
	s, sc, bs := d.s, pl.sc, d.s.bs
	sc.runs = coalesce.Runs(sc.runs[:0], segs, r.first, bs, maxRunBytes/bs)
	if !m.wait && len(sc.runs) > m.maxIOs {
		return declined(DeclineTooManyIOs)
	}
	countCoalesce(r.c, segs, sc.runs)
	if !m.write {
		zeroHoles(buf, sc.segs, r.first, bs)
	}
	for _, run := range sc.runs {
		b := buf[run.BufOff:min(run.BufOff+run.Blocks*bs, uint64(len(buf)))]
		pl.IOs = append(pl.IOs, BackingIO{Off: s.dataOff + int64(run.Phys*bs), Buf: b})
	}
	pl.N, pl.start = int(r.n), time.Now()
	return nil
}

// decline is err for a plan with wait, the decline for reason r for one
// without.
func (m planMode) decline(r Decline, err error) error {
	if m.wait {
		return err
	}
	return declined(r)
}

func opName(write bool) string {
	if write {
		return "write"
	}
	return "read"
}

// BackendIO is the plan's i-th I/O as the backend takes it.
func (pl *IOPlan) BackendIO(i int) backend.IO {
	io := pl.IOs[i]
	return backend.IO{Off: io.Off, Buf: io.Buf, Write: pl.write, Durable: pl.Durable}
}

// Submitter is the store's backend when it can put the plan's I/O on the
// caller's io_uring (backend.Submitter.PrepareSQE with BackendIO: File and
// Device), else nil: the caller then issues each I/O with Do (or Start,
// for an Async plan). Only between a successful Plan call and Finish or
// Abort. The doors reach it through package door/storeplan.
func (pl *IOPlan) Submitter() backend.Submitter {
	if pl.async {
		return nil
	}
	return pl.sub
}

// Async says the plan's I/O goes through Start, on the caller's
// completion queue (Completions), and not through Submitter or Do: the
// backend is a backend.AsyncSubmitter, whose I/O waits for the network.
func (pl *IOPlan) Async() bool { return pl.async }

// Start starts the plan's i-th I/O on the caller's completion queue
// without waiting; its completion comes out of Completions.Reap with tag,
// and anything but len(IOs[i].Buf) bytes there is a failure. An error is
// an I/O that did not start (nothing will be reaped for it): the plan
// must be aborted once the others it started have completed. Only for an
// Async plan, between a successful Plan call and Finish or Abort.
func (pl *IOPlan) Start(i int, tag uint64) error {
	if !pl.async {
		return fmt.Errorf("image: Start of a plan that is not Async: %w", backend.ErrUnsupported)
	}
	return pl.Completions.cq.Start(pl.BackendIO(i), tag)
}

// Do performs the plan's i-th I/O synchronously through the backend. When
// Submitter is nil or its PrepareSQE said false it does not wait for a device (see
// backend.Submitter), so a thread that must not block may call it. An
// error means the plan must be aborted.
func (pl *IOPlan) Do(i int) error {
	if pl.sub != nil {
		return pl.sub.Do(pl.BackendIO(i))
	}
	return backend.Do(pl.be, pl.BackendIO(i))
}

// run performs every I/O of the plan, in order, on the caller's goroutine
// (ReadAt, WriteAt). On error the plan must be aborted.
//
// Each I/O's latency is its own (not the time since the plan started,
// which for I/Os one after another would add up): Finish counts it.
func (pl *IOPlan) run() error {
	pl.sc.lat = pl.sc.lat[:0]
	for i := range pl.IOs {
		t := time.Now()
		if err := pl.Do(i); err != nil {
			return err
		}
		pl.sc.lat = append(pl.sc.lat, time.Since(t))
	}
	pl.timed = true
	return nil
}

// perform runs the plan's I/O (run) and finishes it, or aborts it when an
// I/O failed. N and Durable stay for the caller to read.
func (pl *IOPlan) perform() error {
	if err := pl.run(); err != nil {
		pl.Abort()
		return err
	}
	pl.Finish()
	return nil
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
// backend I/O and the request (a write also dirties the store for the
// next flush, sets the disk's mtime and maps the blocks it was given,
// journaling them; a read through a bounce buffer copies its bytes out)
// and releases the range.
func (pl *IOPlan) Finish() {
	if !pl.held {
		return
	}
	d, sc := pl.d, pl.sc
	c := d.s.stats.shard(sc)
	// I/Os issued together (a door's ring) each took from the plan's
	// submission to now, as far as the store can tell; I/Os run one after
	// another (ReadAt, WriteAt) each took its own time.
	sinceStart := time.Since(pl.start)
	for i, io := range pl.IOs {
		lat := sinceStart
		if pl.timed && i < len(sc.lat) {
			lat = sc.lat[i]
		}
		if pl.write {
			c.DataWriteLatency.ObserveDuration(lat)
			c.DataWriteSize.Observe(uint64(len(io.Buf)))
			if pl.Durable {
				c.DurableWrites.Add(1)
			}
		} else {
			c.DataReadLatency.ObserveDuration(lat)
			c.DataReadSize.Observe(uint64(len(io.Buf)))
		}
	}
	if pl.write {
		d.s.writeGen.Add(1)
		d.touch()
		end := pl.off + int64(pl.N)
		if pl.raw {
			end = 0 // its last block may reach past the size
		}
		d.publishWriteLockedRange(sc, end)
		sc.allocs = sc.allocs[:0] // mapped now: release must not return them
	} else {
		if pl.ciph != nil {
			c.DecryptedBytes.Add(decryptSegs(pl.ciph, pl.data, sc.segs, pl.first, d.s.bs))
		}
		if pl.bounce != nil {
			copy(pl.p[:pl.N], pl.bounce[uint64(pl.off)-pl.first*d.s.bs:])
		}
	}
	if !pl.locked {
		d.countRequest(sc, pl.write, uint64(pl.N))
	}
	pl.release()
}

// CipherBytes is how many bytes of the plan's blocks the store encrypts
// or decrypts: a write's, encrypted when it was planned; a read's, which
// Finish decrypts. 0 on a plain disk. Finish may run on another goroutine
// than the plan's, handed the plan whole, to spread that work
// (door.Plan.CipherBytes).
func (pl *IOPlan) CipherBytes() int { return pl.cipherBytes }

// Abort ends a plan one of whose I/O failed: it counts the backend error
// and releases the plan without counting the request, returning the
// blocks a write was given. (A failed write may have changed some of its
// mapped blocks, as a failed write to a disk may.) The queue threads then
// hand the request to ReadAt or WriteAt, which plan it again and report.
func (pl *IOPlan) Abort() {
	if !pl.held {
		return
	}
	pl.d.s.stats.Errors.Add(1)
	pl.release()
}

// release lets go of everything the plan holds: blocks given to holes and
// never mapped, the range, the scratch and the bounce buffer.
func (pl *IOPlan) release() {
	if !pl.held {
		return
	}
	s, sc := pl.d.s, pl.sc
	s.unallocate(sc.allocs)
	if !pl.locked {
		pl.lr.unlock()
	}
	if pl.bounce != nil {
		s.pool.Put(pl.bounce)
	}
	clear(pl.IOs) // let go of the caller's buffers
	sc.ios = pl.IOs[:0]
	putScratch(sc)
	*pl = IOPlan{N: pl.N, Durable: pl.Durable, PlanOptions: pl.PlanOptions}
}

// Completions is a completion queue on a store's backend for one
// submission loop (a FUSE-over-io_uring queue's owner thread) that starts
// plans' I/O itself without waiting (IOPlan.Start) and reaps their
// completions when the queue's eventfd (Fd) says so. Only a store whose
// backend is a backend.AsyncSubmitter (RBD) has them. Its loop alone uses
// it.
type Completions struct {
	s  *Store
	cq backend.CompletionQueue
}

// NewCompletions makes a completion queue for one submission loop on the
// store's backend, or returns nil (and no error) when the backend needs
// none: its I/O goes on the caller's ring, or is done at once. The caller
// closes it once every I/O it started there has been reaped.
func (s *Store) NewCompletions() (*Completions, error) {
	as, ok := s.be.(backend.AsyncSubmitter)
	if !ok {
		return nil, nil
	}
	if _, ok := s.be.(backend.Submitter); ok {
		return nil, nil // its I/O goes on the caller's ring or is done at once
	}
	cq, err := as.NewCompletionQueue()
	if err != nil {
		return nil, fmt.Errorf("store on %s: %w", s.be.Describe(), err)
	}
	return &Completions{s: s, cq: cq}, nil
}

// Fd is the queue's eventfd, readable once a completion waits: read it,
// then Reap.
func (c *Completions) Fd() int { return c.cq.Fd() }

// Reap calls fn with the tag given to IOPlan.Start and the result (bytes
// transferred or -errno) of every completion waiting, oldest first, and
// returns how many.
func (c *Completions) Reap(fn func(tag uint64, res int64)) int { return c.cq.Reap(fn) }

// Close frees the queue; every I/O started on it must have been reaped.
func (c *Completions) Close() error { return c.cq.Close() }
