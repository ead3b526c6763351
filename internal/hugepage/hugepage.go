// Package hugepage maps anonymous memory for I/O buffers on transparent
// huge pages, for the buffers that large O_DIRECT I/O goes from and into.
//
// # Why
//
// The block layer takes one segment per physically contiguous piece of a
// buffer. Go heap memory and plain anonymous mappings come in 4 KiB pages,
// so a 1 MiB buffer is up to 256 segments: more than a virtio-blk queue's
// max_segments (254), and the device gets the I/O as two requests or more.
// A 2 MiB huge page is one segment, and pinning it for the I/O is one page
// instead of 512.
//
// # What Map gives
//
// Map returns private anonymous memory, zeroed, whose address and length
// are multiples of Size, advised MADV_HUGEPAGE: with transparent huge pages
// in "madvise" or "always" mode the kernel backs each Size piece with one
// huge page when it is first touched (or later, through khugepaged). The
// advice is a hint: without THP, or when the kernel finds no free huge
// page, the memory works the same on 4 KiB pages.
//
// The memory is outside the Go heap: the garbage collector neither scans
// nor frees it, and it must not hold Go pointers. Its owner gives it back
// with Unmap once nothing uses it any more; using it after that faults.
//
// # Concurrency
//
// Map, Unmap and HugeBytes keep no state and are safe to call from any
// goroutine.
package hugepage

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Size is the size and alignment of a transparent huge page on amd64 and
// arm64 (with 4 KiB base pages), and the granularity of Map.
const Size = 2 << 20

// Map maps n bytes rounded up to a multiple of Size, aligned to Size and
// advised for huge pages. n must be positive.
func Map(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("hugepage: map %d bytes", n)
	}
	size := uintptr(roundUp(n))
	// Map one Size more than asked, then unmap the unaligned head and the
	// tail beyond the aligned piece: mmap itself only aligns to 4 KiB.
	raw, err := unix.MmapPtr(-1, 0, nil, size+Size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("hugepage: map %d bytes: %w", size+Size, err)
	}
	head := (Size - uintptr(raw)%Size) % Size
	if head > 0 {
		if err := unix.MunmapPtr(raw, head); err != nil {
			return nil, fmt.Errorf("hugepage: trim the head of a mapping: %w", err)
		}
	}
	p := unsafe.Add(raw, head)
	if tail := Size - head; tail > 0 {
		if err := unix.MunmapPtr(unsafe.Add(p, size), tail); err != nil {
			return nil, fmt.Errorf("hugepage: trim the tail of a mapping: %w", err)
		}
	}
	b := unsafe.Slice((*byte)(p), size)
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE) // EINVAL without THP: a hint only
	return b, nil
}

// Unmap gives back memory from Map. b must be a whole mapping as Map
// returned it (its first byte and its capacity), and nothing may use it
// afterwards.
func Unmap(b []byte) error {
	if cap(b) == 0 {
		return nil
	}
	if err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(b)), uintptr(cap(b))); err != nil {
		return fmt.Errorf("hugepage: unmap %d bytes: %w", cap(b), err)
	}
	return nil
}

// Mapping is what /proc/self/smaps says of the mapping holding an address.
type Mapping struct {
	Size          int64 // bytes of the whole mapping (the kernel may have merged neighbours into it)
	AnonHugePages int64 // bytes of it backed by transparent huge pages
	THPEligible   bool  // the kernel may back it with huge pages
}

// Lookup reads /proc/self/smaps for the mapping that holds b's first byte:
// how much of it huge pages back. It serves tests and diagnostics; it
// reads a file the size of the process's memory map.
func Lookup(b []byte) (Mapping, error) {
	if cap(b) == 0 {
		return Mapping{}, fmt.Errorf("hugepage: lookup of an empty slice")
	}
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return Mapping{}, fmt.Errorf("hugepage: %w", err)
	}
	defer f.Close()
	var m Mapping
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 && strings.Contains(line, " ") {
			if found {
				break // past the mapping
			}
			if found = lo <= addr && addr < hi; found {
				m.Size = int64(hi - lo)
			}
			continue
		}
		if !found {
			continue
		}
		var kb int64
		switch {
		case strings.HasPrefix(line, "AnonHugePages:"):
			if _, err := fmt.Sscanf(line, "AnonHugePages: %d kB", &kb); err != nil {
				return Mapping{}, fmt.Errorf("hugepage: smaps line %q: %w", line, err)
			}
			m.AnonHugePages = kb << 10
		case strings.HasPrefix(line, "THPeligible:"):
			m.THPEligible = strings.TrimSpace(strings.TrimPrefix(line, "THPeligible:")) == "1"
		}
	}
	if err := sc.Err(); err != nil {
		return Mapping{}, fmt.Errorf("hugepage: read smaps: %w", err)
	}
	if !found {
		return Mapping{}, fmt.Errorf("hugepage: no mapping holds %#x", addr)
	}
	return m, nil
}

// Available reports whether the kernel offers transparent huge pages to
// memory advised MADV_HUGEPAGE ("always" or "madvise" mode).
func Available() bool {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	return err == nil && !strings.Contains(string(mode), "[never]")
}

func roundUp(n int) int { return (n + Size - 1) / Size * Size }
