package backend

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
)

// OpKind is the kind of an operation on a Crash backend.
type OpKind int

const (
	OpRead OpKind = iota
	OpWrite
	OpFlush
	OpDiscard
	OpWriteZeroes
	numOpKinds
)

func (k OpKind) String() string {
	switch k {
	case OpRead:
		return "read"
	case OpWrite:
		return "write"
	case OpFlush:
		return "flush"
	case OpDiscard:
		return "discard"
	case OpWriteZeroes:
		return "write zeroes"
	default:
		return fmt.Sprintf("OpKind(%d)", int(k))
	}
}

// Op describes an operation about to run on a Crash backend, for the fault
// function.
type Op struct {
	Kind     OpKind
	Off, Len int64 // the byte range; 0, 0 for a flush
	N        int   // 1 for the first call of this kind, 2 for the second, … (calls refused for bad arguments do not count)
}

// FailNth returns a fault function for Crash.SetFault that fails the n-th call
// of kind with err, once, and lets every other call through.
func FailNth(kind OpKind, n int, err error) func(Op) error {
	return func(op Op) error {
		if op.Kind == kind && op.N == n {
			return err
		}
		return nil
	}
}

// CrashMode says what becomes of the writes that completed after the last
// flush when power is cut.
type CrashMode int

const (
	// DropUnflushed loses every write after the last flush.
	DropUnflushed CrashMode = iota
	// RandomSubset keeps each write after the last flush or not, at random
	// (probability 1/2), applying the kept ones in order.
	RandomSubset
	// Torn is RandomSubset where each kept write is also torn: each of its
	// sectors (SectorSize() bytes, 512 unless CheckAlignment said otherwise)
	// is kept or not at random (probability 1/2).
	Torn
)

func (m CrashMode) String() string {
	switch m {
	case DropUnflushed:
		return "drop-unflushed"
	case RandomSubset:
		return "random-subset"
	case Torn:
		return "torn"
	default:
		return fmt.Sprintf("CrashMode(%d)", int(m))
	}
}

// Crash is an in-memory Backend for crash tests: it records every write and
// flush, can produce what the device could hold after a power cut at any
// point of that history (StateAt, MemAt, CrashAt), and can inject faults
// (SetFault).
//
// It models a disk with a volatile write cache. Writes are applied to the live
// image at once, so reads see them; they become durable only at the next
// successful Flush. A WriteAtDurable (a FUA write) is durable at once, whole,
// and makes nothing else durable: every power-cut state after it holds it.
// Discard and WriteZeroes are recorded as writes of zeros, under the same
// rules as WriteAt.
//
// The op log holds, in completion order, every successful WriteAt, Discard,
// WriteZeroes and Flush; reads are not in it. Op index i means "right after
// the i-th op"; 0 is before any op. OpCount is the index of the latest op.
//
// Crash is safe for concurrent use; it serialises operations, which fixes
// their completion order. Close and Reopen behave as for Mem.
type Crash struct {
	size int64

	// mu protects everything below it. The fault function is called
	// without holding it, so it may call methods of the Crash.
	mu struct {
		sync.Mutex
		live           *pageImage // what reads see
		log            []logEntry // op i is log[i-1]
		flushOps       []int      // op indexes of the flushes, increasing
		calls          [numOpKinds]int
		fault          func(Op) error
		sectorSize     int
		checkAlignment bool
		closed         bool
		stats          Stats
		history        durableHistory
	}
}

// logEntry is one op of the log: a flush, or a write of n bytes at off.
type logEntry struct {
	flush bool
	fua   bool // a WriteAtDurable: durable once completed
	off   int64
	n     int64
	data  []byte // the bytes written; nil for zeros (Discard, WriteZeroes)
}

// NewCrash returns a Crash of size zero bytes with 512-byte sectors.
func NewCrash(size int64) *Crash {
	return newCrash(newPageImage(size), 512, false)
}

// NewCrashFrom returns a Crash whose initial, durable contents are a copy of
// data.
func NewCrashFrom(data []byte) *Crash {
	return newCrash(newPageImageFrom(data), 512, false)
}

// newCrash returns a Crash whose initial, durable contents are initial, which
// it takes over.
func newCrash(initial *pageImage, sectorSize int, checkAlignment bool) *Crash {
	c := &Crash{size: initial.size}
	c.mu.history.init(initial)
	c.mu.live = initial.clone()
	c.mu.sectorSize = sectorSize
	c.mu.checkAlignment = checkAlignment
	return c
}

// CheckAlignment is as for Mem; it also sets the unit of tearing.
func (c *Crash) CheckAlignment(sectorSize int) {
	if !validSectorSize(sectorSize) {
		panic(fmt.Sprintf("backend: Crash.CheckAlignment(%d): not a power of two of at least 512", sectorSize))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.sectorSize = sectorSize
	c.mu.checkAlignment = true
}

// SetFault installs f, called before every operation (reads included) with a
// description of it. If f returns an error, the operation is not performed,
// not recorded, and returns that error (wrapped). A failed Flush makes nothing
// durable. SetFault(nil) removes the fault function.
func (c *Crash) SetFault(f func(op Op) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.fault = f
}

func (c *Crash) Size() int64 { return c.size }

func (c *Crash) SectorSize() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.sectorSize
}

func (c *Crash) Describe() string { return fmt.Sprintf("crash device (%d bytes)", c.size) }

// ReadAt copies len(p) bytes at off of the live image into p.
func (c *Crash) ReadAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := c.begin(OpRead, off, n, p); err != nil {
		return 0, c.opError(OpRead, off, n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.live.readAt(p, off)
	c.mu.stats.Reads++
	c.mu.stats.BytesRead += n
	return len(p), nil
}

// WriteAt writes p at off to the live image and records it.
func (c *Crash) WriteAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := c.begin(OpWrite, off, n, p); err != nil {
		return 0, c.opError(OpWrite, off, n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordLockedMu(logEntry{off: off, n: n, data: bytes.Clone(p)})
	c.mu.stats.Writes++
	c.mu.stats.BytesWritten += n
	return len(p), nil
}

// WriteAtDurable is WriteAt whose write is durable at once (FUA): a power cut
// at any later op keeps it, whole, in its place in the order of writes.
func (c *Crash) WriteAtDurable(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := c.begin(OpWrite, off, n, p); err != nil {
		return 0, c.opError(OpWrite, off, n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordLockedMu(logEntry{off: off, n: n, data: bytes.Clone(p), fua: true})
	c.mu.stats.Writes++
	c.mu.stats.BytesWritten += n
	return len(p), nil
}

// Flush records a flush: every write before it is durable.
func (c *Crash) Flush() error {
	if err := c.begin(OpFlush, 0, 0, nil); err != nil {
		return fmt.Errorf("backend %s: flush: %w", c.Describe(), err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordLockedMu(logEntry{flush: true})
	c.mu.stats.Flushes++
	return nil
}

// Discard zeros [off, off+n), recorded as a write of zeros.
func (c *Crash) Discard(off, n int64) error {
	if err := c.begin(OpDiscard, off, n, nil); err != nil {
		return c.opError(OpDiscard, off, n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordLockedMu(logEntry{off: off, n: n})
	c.mu.stats.Discards++
	return nil
}

// WriteZeroes zeros [off, off+n), recorded as a write of zeros.
func (c *Crash) WriteZeroes(off, n int64) error {
	if err := c.begin(OpWriteZeroes, off, n, nil); err != nil {
		return c.opError(OpWriteZeroes, off, n, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recordLockedMu(logEntry{off: off, n: n})
	c.mu.stats.WriteZeroes++
	return nil
}

// Close marks c closed; the contents and the log stay. Calling it again
// returns nil.
func (c *Crash) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.closed = true
	return nil
}

// Reopen makes a closed c usable again, with its live contents and its log,
// as reopening the device without a power cut would.
func (c *Crash) Reopen() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.closed = false
}

// Bytes returns a copy of the live image: what reads see now.
func (c *Crash) Bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.live.bytes()
}

// Stats returns the counts of successful calls so far.
func (c *Crash) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.stats
}

// OpCount returns the number of ops in the log: the index of the latest.
func (c *Crash) OpCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mu.log)
}

// FlushCount returns the number of successful flushes.
func (c *Crash) FlushCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mu.flushOps)
}

// FlushOps returns the op index of each successful flush, in order. Cutting
// power at one of them (StateAt with that index) keeps exactly the writes
// before that flush.
func (c *Crash) FlushOps() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.mu.flushOps)
}

// StateAt returns a possible content of the device after a power cut right
// after op index op (0 ≤ op ≤ OpCount()): every write before the last flush
// at or before op, applied in order, and then, according to mode, some of the
// writes between that flush and op (all of its WriteAtDurable writes, whole). rng drives the random choices (it may be
// nil for DropUnflushed); the same rng state gives the same result. It panics
// on an op index out of range.
//
// StateAt copies the whole image; MemAt and CrashAt, which share memory with
// c, are much cheaper for a large image.
func (c *Crash) StateAt(op int, rng *rand.Rand, mode CrashMode) []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stateLockedMu(op, rng, mode).bytes()
}

// StateAtInto is StateAt writing into dst, which must be Size() bytes long.
func (c *Crash) StateAtInto(dst []byte, op int, rng *rand.Rand, mode CrashMode) {
	if int64(len(dst)) != c.size {
		panic(fmt.Sprintf("backend: Crash.StateAtInto: dst has %d bytes, want %d", len(dst), c.size))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stateLockedMu(op, rng, mode).readAt(dst, 0)
}

// MemAt returns a Mem holding the state StateAt would return, to open a
// store on after the power cut. It shares unchanged pages with c (copy on
// write), so it costs about Size()/4096 pointers plus the pages the unflushed
// writes touch. The Mem has c's sector size and alignment checking.
func (c *Crash) MemAt(op int, rng *rand.Rand, mode CrashMode) *Mem {
	c.mu.Lock()
	defer c.mu.Unlock()
	return newMem(c.stateLockedMu(op, rng, mode), c.mu.sectorSize, c.mu.checkAlignment)
}

// CrashAt returns a new Crash whose initial, durable contents are the state
// StateAt would return, to cut power again during recovery. Like MemAt it
// shares pages with c.
func (c *Crash) CrashAt(op int, rng *rand.Rand, mode CrashMode) *Crash {
	c.mu.Lock()
	defer c.mu.Unlock()
	return newCrash(c.stateLockedMu(op, rng, mode), c.mu.sectorSize, c.mu.checkAlignment)
}

// stateLockedMu builds, as a new image, the state after a power cut right
// after op (see StateAt). Caller holds c.mu.
func (c *Crash) stateLockedMu(op int, rng *rand.Rand, mode CrashMode) *pageImage {
	if op < 0 || op > len(c.mu.log) {
		panic(fmt.Sprintf("backend: Crash.StateAt(%d): op index outside [0, %d]", op, len(c.mu.log)))
	}
	if mode != DropUnflushed && rng == nil {
		panic(fmt.Sprintf("backend: Crash.StateAt: mode %v needs a rand.Rand", mode))
	}

	// The last flush at or before op: everything before it is durable.
	i := sort.SearchInts(c.mu.flushOps, op+1) - 1
	flushed := 0
	if i >= 0 {
		flushed = c.mu.flushOps[i]
	}
	im := c.mu.history.imageAt(flushed, c.mu.log)
	for _, e := range c.mu.log[flushed:op] {
		if e.fua {
			e.apply(im) // durable when it completed
			continue
		}
		if mode == DropUnflushed || rng.IntN(2) == 0 {
			continue // this write never reached the media
		}
		if mode == Torn {
			e.applyTorn(im, int64(c.mu.sectorSize), rng)
		} else {
			e.apply(im)
		}
	}
	return im
}

// begin is the start of every operation: it checks that c is open and the
// arguments valid, counts the call, and asks the fault function. It returns
// the error to fail the operation with.
func (c *Crash) begin(kind OpKind, off, n int64, p []byte) error {
	c.mu.Lock()
	if err := c.checkLockedMu(kind, off, n, p); err != nil {
		c.mu.Unlock()
		return err
	}
	c.mu.calls[kind]++
	op := Op{Kind: kind, Off: off, Len: n, N: c.mu.calls[kind]}
	fault := c.mu.fault
	c.mu.Unlock()

	if fault != nil {
		return fault(op)
	}
	return nil
}

// checkLockedMu checks that c is open and the I/O in range and, if asked,
// aligned. Caller holds c.mu.
func (c *Crash) checkLockedMu(kind OpKind, off, n int64, p []byte) error {
	if c.mu.closed {
		return ErrClosed
	}
	if kind == OpFlush {
		return nil
	}
	if err := checkRange(off, n, c.size); err != nil {
		return err
	}
	if c.mu.checkAlignment {
		return checkAligned(off, n, p, c.mu.sectorSize)
	}
	return nil
}

// recordLockedMu applies e to the live image and appends it to the log; a
// flush also moves the durable history forward. Caller holds c.mu.
func (c *Crash) recordLockedMu(e logEntry) {
	e.apply(c.mu.live)
	c.mu.log = append(c.mu.log, e)
	if e.flush {
		c.mu.flushOps = append(c.mu.flushOps, len(c.mu.log))
		c.mu.history.flushed(len(c.mu.log), c.mu.log)
	}
}

func (c *Crash) opError(kind OpKind, off, n int64, err error) error {
	return fmt.Errorf("backend %s: %v %d bytes at %d: %w", c.Describe(), kind, n, off, err)
}

// apply writes e into im; a flush changes nothing.
func (e *logEntry) apply(im *pageImage) {
	switch {
	case e.flush:
	case e.data == nil:
		im.zero(e.off, e.n)
	default:
		im.writeAt(e.data, e.off)
	}
}

// applyTorn writes into im a random subset of e's sectors: the pieces of e
// cut at multiples of sector, each kept with probability 1/2.
func (e *logEntry) applyTorn(im *pageImage, sector int64, rng *rand.Rand) {
	if e.flush {
		return
	}
	for start := e.off; start < e.off+e.n; {
		end := min((start/sector+1)*sector, e.off+e.n)
		if rng.IntN(2) == 1 {
			piece := logEntry{off: start, n: end - start}
			if e.data != nil {
				piece.data = e.data[start-e.off : end-e.off]
			}
			piece.apply(im)
		}
		start = end
	}
}

// durableHistory keeps what is needed to build the durable image at any
// flush cheaply: the durable image at the latest flush, kept up to date at
// every flush, and frozen snapshots of it taken every time Size()/64 bytes
// (at least 64 KiB) of writes have been applied since the previous one.
// Building the image at an older flush clones the snapshot at or before it
// and replays less than that many bytes of the log. Snapshots share pages
// with each other (copy on write), so their memory is about that of the data
// written, plus Size()/512 pointers each.
type durableHistory struct {
	latest      *pageImage // the durable image after the first latestOps ops
	latestOps   int
	snapshots   []snapshot // increasing ops; snapshots[0] is the initial image
	since       int64      // bytes applied to latest since the last snapshot
	snapshotGap int64      // bytes between snapshots
}

type snapshot struct {
	ops   int        // the number of log entries applied
	image *pageImage // never written
}

func (h *durableHistory) init(initial *pageImage) {
	h.latest = initial
	h.snapshots = []snapshot{{ops: 0, image: initial.clone()}}
	h.snapshotGap = max(initial.size/64, 64<<10)
}

// flushed moves latest to the flush at op index ops.
func (h *durableHistory) flushed(ops int, log []logEntry) {
	for _, e := range log[h.latestOps:ops] {
		e.apply(h.latest)
		h.since += e.n
	}
	h.latestOps = ops
	if h.since >= h.snapshotGap {
		h.snapshots = append(h.snapshots, snapshot{ops: ops, image: h.latest.clone()})
		h.since = 0
	}
}

// imageAt returns a new image holding the durable contents at the flush at
// op index ops (or the initial contents for 0).
func (h *durableHistory) imageAt(ops int, log []logEntry) *pageImage {
	if ops == h.latestOps {
		return h.latest.clone()
	}
	i := sort.Search(len(h.snapshots), func(i int) bool { return h.snapshots[i].ops > ops }) - 1
	s := h.snapshots[i]
	im := s.image.clone()
	for _, e := range log[s.ops:ops] {
		e.apply(im)
	}
	return im
}
