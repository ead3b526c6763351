package backend

import (
	"fmt"
	"unsafe"
)

// This file holds the argument checks every backend runs before doing I/O, so
// that the test backends (Mem, Crash) refuse exactly what File and Device
// refuse.

// checkRange returns an error wrapping ErrOutOfRange unless [off, off+n) lies
// inside a backing of size bytes.
func checkRange(off, n, size int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("range [%d, %d) is outside the %d-byte backing: %w", off, off+n, size, ErrOutOfRange)
	}
	return nil
}

// checkAligned returns an error wrapping ErrUnaligned unless off and n are
// multiples of sector and, when p is not empty, p starts at an address that is
// a multiple of sector. These are the O_DIRECT rules. Pass a nil p for
// operations without a buffer (discard, write-zeroes).
func checkAligned(off, n int64, p []byte, sector int) error {
	s := int64(sector)
	if off%s != 0 {
		return fmt.Errorf("offset is not a multiple of the %d-byte sector: %w", sector, ErrUnaligned)
	}
	if n%s != 0 {
		return fmt.Errorf("length is not a multiple of the %d-byte sector: %w", sector, ErrUnaligned)
	}
	if len(p) > 0 && uintptr(unsafe.Pointer(&p[0]))%uintptr(sector) != 0 {
		return fmt.Errorf("buffer address is not a multiple of the %d-byte sector: %w", sector, ErrUnaligned)
	}
	return nil
}

// validSectorSize reports whether s can be a sector size: a power of two of at
// least 512 bytes.
func validSectorSize(s int) bool {
	return s >= 512 && s&(s-1) == 0
}

// alignedBuffer returns a zeroed buffer of n bytes whose address is a multiple
// of align (a power of two).
func alignedBuffer(n, align int) []byte {
	buf := make([]byte, n+align)
	skip := 0
	if rem := int(uintptr(unsafe.Pointer(&buf[0])) % uintptr(align)); rem != 0 {
		skip = align - rem
	}
	return buf[skip : skip+n : skip+n]
}
