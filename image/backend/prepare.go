package backend

import "sync/atomic"

// A Preparer is a backend on which the first write into a range costs far
// more than a later one: a regular file on a host file system. A direct
// write into a hole of a file makes ext4 or XFS allocate a block, or, in a
// range allocated ahead with fallocate, convert an unwritten extent, under
// a journal transaction of its own (several times the kernel time of an
// overwrite, per 4 KiB write; on an io_uring an allocating write cannot be
// issued without blocking, so the kernel hands it to an io-wq worker
// thread).
// An overwrite of written blocks needs none of that.
//
// The backing is divided into chunks of PrepareChunk bytes (aligned to
// offsets of the backing). The store prepares a chunk before it first
// writes into it: it writes zeros, in large writes, over every block of
// the chunk that no one uses (image: Store.prepareChunk), and then marks
// the chunk prepared. Preparation never changes what a used block holds,
// and whether a chunk is marked only decides speed, never correctness.
type Preparer interface {
	// PrepareChunk is the chunk size in bytes: a multiple of SectorSize.
	PrepareChunk() int64
	// Prepared reports whether chunk c (bytes [c*PrepareChunk, +PrepareChunk))
	// has been marked since open and not discarded since. It never
	// blocks, so a thread that must not block may ask.
	Prepared(c int64) bool
	// MarkPrepared records that every block of chunk c has been written.
	MarkPrepared(c int64)
}

var _ Preparer = (*File)(nil)

// PrepareChunk is the chunk size of a File: a store file is written ahead
// on its host file system 64 MiB at a time as its blocks are first used (so
// its host extents are large too), instead of one block per first write.
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

// PrepareChunk is 64 MiB (the constant PrepareChunk).
func (f *File) PrepareChunk() int64 { return PrepareChunk }

// Prepared reports whether chunk c was marked since open and not punched
// since.
func (f *File) Prepared(c int64) bool { return f.prepared.all(c, c+1) }

// MarkPrepared marks chunk c.
func (f *File) MarkPrepared(c int64) { f.prepared.add(c, c+1) }

// unprepare forgets the chunks holding [off, off+n): a hole was punched
// there, so a write into it would allocate again. It runs after the
// punch; a chunk the store marks at the same time as a punch in it can
// stay marked with the hole, which costs that write its speed only.
func (f *File) unprepare(off, n int64) {
	f.prepared.remove(chunks(off, n))
}
