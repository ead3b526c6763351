package backend

import (
	"fmt"
	"sync"
)

// Stats counts the calls a test backend (Mem, Crash) received. Only calls
// that succeeded are counted, and bytes are those transferred.
type Stats struct {
	Reads, Writes, Flushes, Discards, WriteZeroes int64
	BytesRead, BytesWritten                       int64
}

// Mem is an in-memory Backend for tests. It is safe for concurrent use (it
// serialises operations). It refuses I/O outside [0, Size()), and, after
// CheckAlignment, unaligned I/O, so tests catch what O_DIRECT would refuse.
// Discard and WriteZeroes zero the range.
//
// Close marks it closed (operations then fail with ErrClosed) but keeps the
// contents: Reopen makes it usable again, as reopening a device would.
type Mem struct {
	size int64

	// mu protects everything below it.
	mu struct {
		sync.Mutex
		image          *pageImage
		sectorSize     int  // reported by SectorSize; the unit of alignment checks
		checkAlignment bool // refuse I/O not aligned to sectorSize
		closed         bool
		stats          Stats
	}
}

// NewMem returns a Mem of size zero bytes with 512-byte sectors, not checking
// alignment. Memory is allocated as pages are written.
func NewMem(size int64) *Mem {
	return newMem(newPageImage(size), 512, false)
}

// NewMemFrom returns a Mem holding a copy of data.
func NewMemFrom(data []byte) *Mem {
	return newMem(newPageImageFrom(data), 512, false)
}

func newMem(image *pageImage, sectorSize int, checkAlignment bool) *Mem {
	m := &Mem{size: image.size}
	m.mu.image = image
	m.mu.sectorSize = sectorSize
	m.mu.checkAlignment = checkAlignment
	return m
}

// CheckAlignment makes m refuse, with an error wrapping ErrUnaligned, any I/O
// whose offset, length or buffer address is not a multiple of sectorSize (512
// or 4096), as O_DIRECT would; SectorSize then reports sectorSize. It panics
// if sectorSize is not a power of two of at least 512.
func (m *Mem) CheckAlignment(sectorSize int) {
	if !validSectorSize(sectorSize) {
		panic(fmt.Sprintf("backend: Mem.CheckAlignment(%d): not a power of two of at least 512", sectorSize))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.sectorSize = sectorSize
	m.mu.checkAlignment = true
}

func (m *Mem) Size() int64 { return m.size }

func (m *Mem) SectorSize() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.sectorSize
}

func (m *Mem) Describe() string { return fmt.Sprintf("memory (%d bytes)", m.size) }

// ReadAt copies len(p) bytes at off into p.
func (m *Mem) ReadAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLockedMu(off, int64(len(p)), p); err != nil {
		return 0, m.opError("read", off, int64(len(p)), err)
	}
	m.mu.image.readAt(p, off)
	m.mu.stats.Reads++
	m.mu.stats.BytesRead += int64(len(p))
	return len(p), nil
}

// WriteAt copies p to off.
func (m *Mem) WriteAt(p []byte, off int64) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLockedMu(off, int64(len(p)), p); err != nil {
		return 0, m.opError("write", off, int64(len(p)), err)
	}
	m.mu.image.writeAt(p, off)
	m.mu.stats.Writes++
	m.mu.stats.BytesWritten += int64(len(p))
	return len(p), nil
}

// WriteAtDurable is WriteAt: everything written to a Mem is durable.
func (m *Mem) WriteAtDurable(p []byte, off int64) (int, error) { return m.WriteAt(p, off) }

// Flush only counts: everything written to a Mem is durable.
func (m *Mem) Flush() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.mu.closed {
		return fmt.Errorf("backend %s: flush: %w", m.Describe(), ErrClosed)
	}
	m.mu.stats.Flushes++
	return nil
}

// Discard zeros [off, off+n).
func (m *Mem) Discard(off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLockedMu(off, n, nil); err != nil {
		return m.opError("discard", off, n, err)
	}
	m.mu.image.zero(off, n)
	m.mu.stats.Discards++
	return nil
}

// WriteZeroes zeros [off, off+n).
func (m *Mem) WriteZeroes(off, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.checkLockedMu(off, n, nil); err != nil {
		return m.opError("write zeroes", off, n, err)
	}
	m.mu.image.zero(off, n)
	m.mu.stats.WriteZeroes++
	return nil
}

// Close marks m closed; the contents stay. Calling it again returns nil.
func (m *Mem) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.closed = true
	return nil
}

// Reopen makes a closed m usable again, with its contents, as reopening the
// same device would.
func (m *Mem) Reopen() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.closed = false
}

// Bytes returns a copy of the contents.
func (m *Mem) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.image.bytes()
}

// Stats returns the counts of calls so far.
func (m *Mem) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.stats
}

// checkLockedMu checks that m is open and the I/O in range and, if asked,
// aligned. Caller holds m.mu.
func (m *Mem) checkLockedMu(off, n int64, p []byte) error {
	if m.mu.closed {
		return ErrClosed
	}
	if err := checkRange(off, n, m.size); err != nil {
		return err
	}
	if m.mu.checkAlignment {
		return checkAligned(off, n, p, m.mu.sectorSize)
	}
	return nil
}

func (m *Mem) opError(op string, off, n int64, err error) error {
	return fmt.Errorf("backend %s: %s %d bytes at %d: %w", m.Describe(), op, n, off, err)
}
