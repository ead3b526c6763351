package coalesce

import (
	"fmt"
	"math/bits"
)

// Span is a piece of a byte range [off, off+n) of a virtual disk, in blocks of size bs.
type Span struct {
	Block   uint64 // first block index
	Blocks  uint64 // number of blocks covered (1 for a partial span)
	Off     uint64 // offset of the first data byte within Block (non-zero only for a partial head)
	Len     uint64 // number of data bytes in this span
	BufOff  uint64 // offset of this span's first data byte in the caller's buffer
	Partial bool   // the span covers part of a single block (needs read-modify-write)
}

// Spans is the result of Split: at most 3 spans (partial head, whole middle,
// partial tail). It is a fixed array so that Split does not allocate.
type Spans struct {
	S [3]Span
	N int
}

// All returns the spans in order: s.S[:s.N].
func (s *Spans) All() []Span { return s.S[:s.N] }

func (s *Spans) add(sp Span) {
	s.S[s.N] = sp
	s.N++
}

// Split splits [off, off+n) into a partial head (if off is not block-aligned,
// or the whole range lies within one block and is not a whole block), a run of
// whole blocks (if any), and a partial tail (if the end is not block-aligned).
// n == 0 gives no spans. A range inside a single block gives exactly one
// partial span.
//
// bs must be a power of two and off+n must not exceed 2^64-1; Split panics
// otherwise. It never computes a value beyond off+n, so ranges ending near
// 2^63 (the largest callers accept) or even near 2^64 are fine.
func Split(off, n, bs uint64) Spans {
	checkRange(off, n, bs)
	var s Spans
	if n == 0 {
		return s
	}

	// bs is a power of two: shift and mask instead of dividing, which is
	// several times slower on the hot path.
	shift := bits.TrailingZeros64(bs)
	pos := off // next byte of the range to place in a span
	rem := n   // bytes of the range not yet placed

	// Partial head: the range starts inside a block. It runs to the end of
	// that block or of the range, whichever comes first.
	if in := off & (bs - 1); in != 0 {
		l := min(rem, bs-in)
		s.add(Span{Block: pos >> shift, Blocks: 1, Off: in, Len: l, BufOff: 0, Partial: true})
		pos += l
		rem -= l
	}

	// pos is now block-aligned (or the range is used up): whole blocks next.
	if whole := rem >> shift; whole > 0 {
		s.add(Span{Block: pos >> shift, Blocks: whole, Len: whole * bs, BufOff: pos - off})
		pos += whole * bs
		rem -= whole * bs
	}

	// Partial tail: what is left is shorter than a block and starts on a
	// boundary. This is also the single span of a short range that starts
	// on a boundary.
	if rem > 0 {
		s.add(Span{Block: pos >> shift, Blocks: 1, Len: rem, BufOff: pos - off, Partial: true})
	}
	return s
}

// BlockRange returns the first block and the number of blocks touched by
// [off, off+n); (0, 0) when n == 0. Same preconditions as Split.
func BlockRange(off, n, bs uint64) (first, count uint64) {
	checkRange(off, n, bs)
	if n == 0 {
		return 0, 0
	}
	shift := bits.TrailingZeros64(bs)
	first = off >> shift
	last := (off + n - 1) >> shift // the last byte's block; off+n-1 cannot overflow
	return first, last - first + 1
}

// checkRange panics when bs is not a power of two or [off, off+n) wraps
// (off+n < off). The panic is built in a separate function, and the test is
// written out rather than calling isPow2, so that checkRange stays within the
// compiler's inlining budget: Split is on every request's path.
func checkRange(off, n, bs uint64) {
	if bs&(bs-1) != 0 || bs == 0 || off+n < off {
		badRange(off, n, bs)
	}
}

func badRange(off, n, bs uint64) {
	if !isPow2(bs) {
		panic(fmt.Sprintf("coalesce: block size %d is not a power of two", bs))
	}
	panic(fmt.Sprintf("coalesce: range off=%d n=%d wraps past 2^64", off, n))
}

func isPow2(x uint64) bool { return x != 0 && x&(x-1) == 0 }

// BlockOf returns the block holding byte off: off / bs.
func BlockOf(off, bs uint64) uint64 { return off / bs }

// BlockStart returns the byte offset of block: block * bs.
func BlockStart(block, bs uint64) uint64 { return block * bs }

// RoundUp rounds x up to a multiple of a (a > 0; x+a-1 must not overflow).
func RoundUp(x, a uint64) uint64 { return RoundDown(x+a-1, a) }

// RoundDown rounds x down to a multiple of a (a > 0).
func RoundDown(x, a uint64) uint64 { return x - x%a }
