package coalesce

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/internal/hugepage"
)

// align is the address and length granularity of O_DIRECT buffers:
// directio.AlignSize on Linux, and the smallest size class.
const align = 4096

// Pool hands out buffers whose address is aligned to directio.AlignSize (4096)
// and whose length is a multiple of 4096, for O_DIRECT I/O. Size classes are
// powers of two from 4 KiB to maxSize; larger requests are allocated directly
// (and dropped on Put).
//
// Classes below slabMinClass come from sync.Pool + directio.AlignedBlock on
// the Go heap. Larger classes come from slabs: huge-page mappings
// (internal/hugepage) carved into buffers of the class size and kept on a
// free list, up to DefaultSlabLimit bytes of slabs per pool; past that,
// Get allocates on the heap and Put drops what it did not carve. See the
// package doc for why.
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

	// slabs is the memory of the slab classes. It is apart from the Pool
	// so that a cleanup can unmap it once the Pool is unreachable.
	slabs *slabs
}

type sizeClass struct {
	size int
	bufs sync.Pool // heap classes: *[]byte, each holding a free aligned buffer of len size

	// slab is true for classes of slabMinClass and up. free holds the
	// buffers of their slabs not handed out (each len == cap == size);
	// guarded by Pool.slabs.mu.
	slab bool
	free [][]byte
}

// slabs is the slab memory of a pool and its accounting.
type slabs struct {
	// limit bounds the bytes mapped, all classes together. Set at
	// NewPool (tests lower it), then read only.
	limit int

	// mu guards the fields below and the slab classes' free lists. It is
	// held for a list operation, and while a slab is mapped (rare: the
	// pool only grows to its peak use), never across I/O, and no other
	// lock is taken under it.
	mu struct {
		sync.Mutex
		all    []slab // every slab mapped
		mapped int    // bytes of all
		out    int    // slab buffers handed out and not yet put back
		closed bool   // release unmapped all; later Gets use the heap
	}
}

// slab is one mapping carved into buffers of one class.
type slab struct {
	mem   []byte
	class *sizeClass
}

// maxClassSize bounds the largest size class, so that class sizes cannot
// overflow int whatever maxSize a caller passes.
const maxClassSize = 1 << 30

// slabMinClass is the smallest class served from huge-page slabs. Below
// it a buffer spans at most 16 pages, far from a device's segment limit,
// and sync.Pool on the heap serves it as well.
const slabMinClass = 64 << 10

// DefaultSlabLimit is the most slab memory a pool maps: enough for every
// request of a deep queue of 1 MiB writes and a few 4 MiB runs at once.
// It is what the pool keeps at most after a peak.
const DefaultSlabLimit = 64 << 20

// NewPool returns a pool whose largest size class is maxSize rounded up to a
// power of two, at least 4 KiB and at most 1 GiB. A typical maxSize is the
// largest I/O, such as FUSE's MaxWrite of 1 MiB.
func NewPool(maxSize int) *Pool {
	maxSize = min(max(maxSize, align), maxClassSize)
	n := 1 // number of classes: align<<(n-1) is the largest
	for align<<(n-1) < maxSize {
		n++
	}
	p := &Pool{classes: make([]sizeClass, n), slabs: &slabs{limit: DefaultSlabLimit}}
	for i := range p.classes {
		c := &p.classes[i]
		c.size = align << i
		c.slab = c.size >= slabMinClass
	}
	// A pool dropped without Close (a store abandoned by a crash test)
	// still gives its slabs back, if every buffer was put back.
	runtime.AddCleanup(p, func(s *slabs) { _ = s.release() }, p.slabs)
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
	if c.slab {
		if b := p.slabs.get(c); b != nil {
			return b[:n]
		}
		return directio.AlignedBlock(c.size)[:n:c.size]
	}
	if box, ok := c.bufs.Get().(*[]byte); ok {
		b := *box
		*box = nil // do not keep the buffer alive from the parked box
		p.headers.Put(box)
		return b[:n]
	}
	return directio.AlignedBlock(c.size)[:n:c.size]
}

// get takes a free buffer of slab class c, mapping a slab when the class
// has none left and the limit allows; nil when it does not (or the
// mapping failed: the heap serves then).
func (s *slabs) get(c *sizeClass) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(c.free) == 0 && !s.mu.closed {
		s.growLocked(c)
	}
	k := len(c.free)
	if k == 0 {
		return nil
	}
	b := c.free[k-1]
	c.free[k-1] = nil
	c.free = c.free[:k-1]
	s.mu.out++
	return b
}

// growLocked maps one slab for class c, if the limit allows, and puts its
// buffers on c's free list. A slab is one huge page, or the class size
// when that is larger. Caller holds s.mu.
func (s *slabs) growLocked(c *sizeClass) {
	size := max(c.size, hugepage.Size)
	if s.mu.mapped+size > s.limit {
		return
	}
	mem, err := hugepage.Map(size)
	if err != nil {
		return // the heap serves instead
	}
	s.mu.mapped += size
	s.mu.all = append(s.mu.all, slab{mem: mem, class: c})
	for off := 0; off < size; off += c.size {
		c.free = append(c.free, mem[off:off+c.size:off+c.size])
	}
}

// put puts b back on slab class c's free list if one of c's slabs holds
// it at a buffer's start, and reports whether it did.
func (s *slabs) put(c *sizeClass, b []byte) bool {
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sl := range s.mu.all {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(sl.mem)))
		if addr < base || addr-base >= uintptr(len(sl.mem)) {
			continue
		}
		if sl.class != c || (addr-base)%uintptr(c.size) != 0 {
			return false // not a buffer Get handed out
		}
		c.free = append(c.free, b[:c.size:c.size])
		s.mu.out--
		return true
	}
	return false
}

// release unmaps every slab if no slab buffer is out; otherwise it unmaps
// nothing (using one would fault) and says how many are out.
func (s *slabs) release() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.out > 0 {
		return fmt.Errorf("coalesce: pool closed with %d slab buffers out: %d bytes left mapped", s.mu.out, s.mu.mapped)
	}
	s.mu.closed = true
	var err error
	for _, sl := range s.mu.all {
		if uerr := hugepage.Unmap(sl.mem); uerr != nil && err == nil {
			err = uerr
		}
		sl.class.free = nil
	}
	s.mu.all, s.mu.mapped = nil, 0
	return err
}

// Put hands b back for reuse. b must come from Get on this pool and not be
// used afterwards. Buffers that fit no size class (above the maximum, or not
// aligned, or with a capacity that is not a class size) are dropped for the
// garbage collector, as are heap buffers of slab classes. Put(nil) does
// nothing.
func (p *Pool) Put(b []byte) {
	c := p.classOfCap(cap(b))
	if c == nil || !IsAligned(b) {
		return
	}
	if c.slab {
		p.slabs.put(c, b)
		return
	}
	box, _ := p.headers.Get().(*[]byte)
	if box == nil {
		box = new([]byte)
	}
	*box = b[:c.size:c.size]
	c.bufs.Put(box)
}

// Close unmaps the pool's slabs when every buffer carved from them has
// been put back, and from then on Get serves slab classes from the heap.
// With buffers still out it unmaps nothing and returns an error saying how
// many: the slabs stay mapped, and Put still takes them back. Close is for
// the pool's owner, once its I/O is done; a pool dropped without it is
// released the same way when the garbage collector finds it unreachable.
func (p *Pool) Close() error { return p.slabs.release() }

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
