package frontend

import (
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Buffer is a piece of guest memory: its guest physical address and the
// bytes, a slice of this process's mapping of the same pages.
type Buffer struct {
	Addr  uint64
	Bytes []byte
}

// Len is the buffer's size.
func (b Buffer) Len() int { return len(b.Bytes) }

// Slice is the piece [off, off+n) of b.
func (b Buffer) Slice(off, n int) Buffer {
	return Buffer{Addr: b.Addr + uint64(off), Bytes: b.Bytes[off : off+n]}
}

// Memory is guest memory several devices share (Options.Memory): each
// backend maps the same memfd, so a buffer at a given guest address is
// the same pages whichever device it is handed to (a 1 MiB buffer on
// physically scattered pages may cost a backing device two requests
// instead of one: devices compared on shared memory compare on the same
// pages). Devices allocate from it as from their own. Close it after
// every device that uses it.
type Memory struct{ m *memory }

// Pages says what backs guest memory.
type Pages int

const (
	// SmallPages is a memfd on the kernel's base pages, as a VM without
	// huge pages has: a buffer's pages are scattered in physical memory.
	SmallPages Pages = iota
	// HugePages is a memfd on 2 MiB hugetlb pages from the kernel's pool
	// (vm.nr_hugepages), as a VM with huge-page memory has: a buffer within
	// one huge page is physically contiguous.
	HugePages
)

// HugePageSize is the size of the pages HugePages uses; memory on them is
// a multiple of it.
const HugePageSize = 2 << 20

// NewMemory returns size bytes of guest memory on the given pages (a
// multiple of the page size). Memory on HugePages fails unless the
// kernel's pool has size bytes free.
func NewMemory(size int64, pages Pages) (*Memory, error) {
	m, err := newMemory(size, pages)
	if err != nil {
		return nil, err
	}
	return &Memory{m: m}, nil
}

// Close unmaps the memory and closes its memfd.
func (m *Memory) Close() error { return m.m.close() }

// memory is the guest's RAM: one memfd mapped shared at guest physical
// address 0, handed to the backend in SET_MEM_TABLE, and a first-fit
// allocator over it.
type memory struct {
	fd   int
	mem  []byte
	base uint64 // this process's address of mem[0]: the region's userspace_addr

	mu struct {
		sync.Mutex
		free []span // sorted by off, non-overlapping, never adjacent
	}
}

type span struct{ off, n uint64 }

func newMemory(size int64, pages Pages) (*memory, error) {
	page, flags := int64(unix.Getpagesize()), unix.MFD_CLOEXEC
	if pages == HugePages {
		page, flags = HugePageSize, flags|unix.MFD_HUGETLB|unix.MFD_HUGE_2MB
	}
	if size <= 0 || size%page != 0 {
		return nil, fmt.Errorf("guest memory of %d bytes: want a positive multiple of the page size (%d)", size, page)
	}
	fd, err := unix.MemfdCreate("vhost-user-frontend", flags)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("memfd size: %w", err)
	}
	// A hugetlb mapping reserves its pages here: an empty pool fails now,
	// not at the first touch.
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		if pages == HugePages {
			return nil, fmt.Errorf("mmap guest memory on huge pages (the pool needs %d free: sysctl vm.nr_hugepages): %w", size/HugePageSize, err)
		}
		return nil, fmt.Errorf("mmap guest memory: %w", err)
	}
	m := &memory{fd: fd, mem: mem, base: uint64(uintptr(unsafe.Pointer(&mem[0])))}
	m.mu.free = []span{{0, uint64(size)}}
	return m, nil
}

func (m *memory) close() error {
	err := unix.Munmap(m.mem)
	if cerr := unix.Close(m.fd); err == nil {
		err = cerr
	}
	return err
}

// alloc returns n bytes aligned to align (a power of two), zeroed.
func (m *memory) alloc(n, align int) (Buffer, error) {
	if n <= 0 || align <= 0 || align&(align-1) != 0 {
		return Buffer{}, fmt.Errorf("guest memory: alloc of %d bytes aligned %d", n, align)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	a := uint64(align)
	for i, s := range m.mu.free {
		start := (s.off + a - 1) &^ (a - 1)
		if start+uint64(n) > s.off+s.n {
			continue
		}
		end := start + uint64(n)
		var rest []span
		if start > s.off {
			rest = append(rest, span{s.off, start - s.off})
		}
		if end < s.off+s.n {
			rest = append(rest, span{end, s.off + s.n - end})
		}
		m.mu.free = append(m.mu.free[:i], append(rest, m.mu.free[i+1:]...)...)
		b := Buffer{Addr: start, Bytes: m.mem[start:end:end]}
		clear(b.Bytes)
		return b, nil
	}
	return Buffer{}, fmt.Errorf("guest memory: no room for %d bytes aligned %d", n, align)
}

// release returns a buffer from alloc.
func (m *memory) release(b Buffer) {
	if len(b.Bytes) == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s := span{b.Addr, uint64(len(b.Bytes))}
	i := sort.Search(len(m.mu.free), func(i int) bool { return m.mu.free[i].off > s.off })
	m.mu.free = append(m.mu.free, span{})
	copy(m.mu.free[i+1:], m.mu.free[i:])
	m.mu.free[i] = s
	// Merge with the next, then the previous neighbour.
	if i+1 < len(m.mu.free) && m.mu.free[i].off+m.mu.free[i].n == m.mu.free[i+1].off {
		m.mu.free[i].n += m.mu.free[i+1].n
		m.mu.free = append(m.mu.free[:i+1], m.mu.free[i+2:]...)
	}
	if i > 0 && m.mu.free[i-1].off+m.mu.free[i-1].n == m.mu.free[i].off {
		m.mu.free[i-1].n += m.mu.free[i].n
		m.mu.free = append(m.mu.free[:i], m.mu.free[i+1:]...)
	}
}
