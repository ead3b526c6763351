package backend

import (
	"errors"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A Preparer is a backend on which the first write into a range costs far
// more than a later one, and which can take that cost ahead of time, for
// a whole chunk at once: a regular file on a host file system. A direct
// write into a hole of a file makes ext4 or XFS allocate blocks under the
// file's lock held exclusively (every other write to the file waits), and
// on an io_uring it cannot be issued without blocking, so the kernel hands
// it to a worker thread. Allocated ahead (fallocate: unwritten extents,
// which read as zeros), the same write is an overwrite: issued at once,
// under the shared lock, with only the conversion of the extent to written
// left at its completion.
//
// The store prepares the chunks that hold the blocks it hands out before
// their first write (image: allocHoles). Preparation never changes what
// any byte reads; it is only about speed, so an error or a stale answer
// never affects correctness: at worst a write pays the allocation itself.
type Preparer interface {
	// Prepared reports whether every chunk holding [off, off+n) has been
	// prepared since the backend was opened (and not discarded since).
	// It never blocks, so a thread that must not block may ask.
	Prepared(off, n int64) bool
	// Prepare allocates the chunks holding [off, off+n) in the host file
	// system, waiting for it. An error (the host file system is full, or
	// cannot allocate ahead) leaves the range as it was.
	Prepare(off, n int64) error
}

var _ Preparer = (*File)(nil)

// PrepareChunk is the unit in which a File allocates its host file ahead
// of writes, aligned to offsets in the file: a store file grows on its
// host file system 64 MiB at a time as its blocks are first used (so its
// host extents are large too), instead of one block per first write.
const PrepareChunk = 64 << 20

// chunkSet is a set of chunk numbers, safe for concurrent use: one bit per
// chunk, set and cleared with atomic operations.
type chunkSet struct {
	words []atomic.Uint64
}

func newChunkSet(size int64) chunkSet {
	chunks := (size + PrepareChunk - 1) / PrepareChunk
	return chunkSet{words: make([]atomic.Uint64, (chunks+63)/64)}
}

// chunks returns the chunk numbers [lo, hi) covering [off, off+n).
func chunks(off, n int64) (lo, hi int64) {
	return off / PrepareChunk, (off + n + PrepareChunk - 1) / PrepareChunk
}

// all reports whether every chunk in [lo, hi) is in the set.
func (c *chunkSet) all(lo, hi int64) bool {
	for i := lo; i < hi; i++ {
		if int(i/64) >= len(c.words) || c.words[i/64].Load()&(1<<(i%64)) == 0 {
			return false
		}
	}
	return true
}

func (c *chunkSet) add(lo, hi int64) {
	for i := lo; i < hi && int(i/64) < len(c.words); i++ {
		c.words[i/64].Or(1 << (i % 64))
	}
}

func (c *chunkSet) remove(lo, hi int64) {
	for i := lo; i < hi && int(i/64) < len(c.words); i++ {
		c.words[i/64].And(^uint64(1 << (i % 64)))
	}
}

// Prepared reports whether the chunks holding [off, off+n) were allocated
// ahead since open. Always true when the host file system cannot allocate
// ahead (the store then writes without preparing).
func (f *File) Prepared(off, n int64) bool {
	if f.noPrepare.Load() || n <= 0 {
		return true
	}
	return f.prepared.all(chunks(off, n))
}

// Prepare allocates the chunks holding [off, off+n) with fallocate (mode
// 0: holes become unwritten extents, data stays as it is; the file keeps
// its size). A file system without fallocate turns preparation off.
func (f *File) Prepare(off, n int64) error {
	if f.Prepared(off, n) {
		return nil
	}
	lo, hi := chunks(off, n)
	start, end := lo*PrepareChunk, min(hi*PrepareChunk, f.size)
	err := f.withFD(func(fd int) error { return fallocate(fd, 0, start, end-start) })
	if errors.Is(err, unix.EOPNOTSUPP) {
		f.noPrepare.Store(true)
		return nil
	}
	if err != nil {
		return f.opError("prepare", start, end-start, err)
	}
	f.prepared.add(lo, hi)
	return nil
}

// unprepare forgets the chunks holding [off, off+n): a hole was punched
// there, after which a write into it would allocate again. A Prepare
// racing with the punch can leave a chunk marked prepared with the hole
// in it: a write there then pays the allocation itself, slow but correct.
func (f *File) unprepare(off, n int64) {
	f.prepared.remove(chunks(off, n))
}
