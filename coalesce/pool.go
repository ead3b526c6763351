package coalesce

import (
	"fmt"
	"math/bits"
	"sync"
	"unsafe"

	"github.com/ncw/directio"
)

// align is the address and length granularity of O_DIRECT buffers:
// directio.AlignSize on Linux, and the smallest size class.
const align = 4096

// Pool hands out buffers whose address is aligned to directio.AlignSize (4096)
// and whose length is a multiple of 4096, for O_DIRECT I/O. Size classes are
// powers of two from 4 KiB to maxSize; larger requests are allocated directly
// (and dropped on Put). Built on sync.Pool + directio.AlignedBlock.
//
// A Pool is safe for concurrent use.
type Pool struct {
	// classes[i] holds free buffers of exactly align<<i bytes (len == cap).
	classes []sizeClass

	// headers holds empty *[]byte boxes. sync.Pool stores interface values,
	// and a []byte put into an interface would be copied to the heap on every
	// Put (staticcheck SA6002). So buffers travel in a *[]byte box; Get takes
	// the buffer out and parks the box here, Put reuses a parked box, and a
	// Get/Put pair allocates nothing once the pools are warm.
	headers sync.Pool
}

type sizeClass struct {
	size int
	bufs sync.Pool // of *[]byte, each holding a free aligned buffer of len size
}

// maxClassSize bounds the largest size class, so that class sizes cannot
// overflow int whatever maxSize a caller passes.
const maxClassSize = 1 << 30

// NewPool returns a pool whose largest size class is maxSize rounded up to a
// power of two, at least 4 KiB and at most 1 GiB. A typical maxSize is the
// largest I/O, such as FUSE's MaxWrite of 1 MiB.
func NewPool(maxSize int) *Pool {
	maxSize = min(max(maxSize, align), maxClassSize)
	n := 1 // number of classes: align<<(n-1) is the largest
	for align<<(n-1) < maxSize {
		n++
	}
	p := &Pool{classes: make([]sizeClass, n)}
	for i := range p.classes {
		p.classes[i].size = align << i
	}
	return p
}

// Get returns a buffer of exactly len n (n rounded up to a multiple of 4096
// is the capacity at least); the contents are NOT zeroed. Buffers from a
// size class have the class size as capacity. Get panics if n < 0.
func (p *Pool) Get(n int) []byte {
	if n < 0 {
		panic(fmt.Sprintf("coalesce: Pool.Get(%d)", n))
	}
	c := p.classFor(n)
	if c == nil {
		// Above the largest class: rare by design, not worth keeping.
		size := roundUpInt(n, align)
		return directio.AlignedBlock(size)[:n:size]
	}
	if box, ok := c.bufs.Get().(*[]byte); ok {
		b := *box
		*box = nil // do not keep the buffer alive from the parked box
		p.headers.Put(box)
		return b[:n]
	}
	return directio.AlignedBlock(c.size)[:n:c.size]
}

// Put hands b back for reuse. b must come from Get on this pool and not be
// used afterwards. Buffers that fit no size class (above the maximum, or not
// aligned, or with a capacity that is not a class size) are dropped for the
// garbage collector. Put(nil) does nothing.
func (p *Pool) Put(b []byte) {
	c := p.classOfCap(cap(b))
	if c == nil || !IsAligned(b) {
		return
	}
	box, _ := p.headers.Get().(*[]byte)
	if box == nil {
		box = new([]byte)
	}
	*box = b[:c.size:c.size]
	c.bufs.Put(box)
}

// classFor returns the smallest class that holds n bytes, or nil if n is
// larger than the largest class.
func (p *Pool) classFor(n int) *sizeClass {
	i := 0
	if n > align {
		// Index of the smallest power of two >= n, counted from align.
		i = bits.Len(uint(n-1)) - bits.Len(uint(align-1))
	}
	if i >= len(p.classes) {
		return nil
	}
	return &p.classes[i]
}

// classOfCap returns the class whose size is exactly c, or nil.
func (p *Pool) classOfCap(c int) *sizeClass {
	if c < align || c&(c-1) != 0 {
		return nil
	}
	i := bits.TrailingZeros(uint(c)) - bits.TrailingZeros(uint(align))
	if i >= len(p.classes) {
		return nil
	}
	return &p.classes[i]
}

// IsAligned reports whether b's address is aligned to 4096, as O_DIRECT
// needs (directio.AlignSize on Linux). directio v1.0.5 has no IsAligned, so
// this is the same test done here. A slice with no backing array (cap 0) has
// no address and is reported as not aligned.
func IsAligned(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))&(align-1) == 0
}

func roundUpInt(x, a int) int { return (x + a - 1) / a * a }
