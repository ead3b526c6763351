package backend

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error a backend returns is wrapped with context (the
// backing, the operation, the offset and the length); test for these with
// errors.Is. Errors from the kernel keep their syscall.Errno reachable too, so
// errors.Is(err, syscall.EIO) and errors.Is(err, syscall.ENOSPC) work.
var (
	// ErrUnsupported: the backing can't do this operation (Discard on tmpfs,
	// on a device without discard support, etc.).
	ErrUnsupported = errors.New("backend: operation not supported")

	// ErrLocked: another opener holds the lock on the backing (or, for a block
	// device, the kernel reports it busy: mounted, or claimed exclusively).
	ErrLocked = errors.New("backend: store is locked by another opener")

	// ErrNoDirectIO: the backing file system refuses O_DIRECT (ramfs), or
	// accepts it without honouring it (tmpfs, which keeps the data in memory).
	ErrNoDirectIO = errors.New("backend: O_DIRECT not supported by the backing file system")

	// ErrUnaligned: an offset, length or buffer address is not a multiple of
	// SectorSize(). O_DIRECT would refuse the I/O, so every backend (Mem and
	// Crash too, when asked to check) refuses it up front.
	ErrUnaligned = errors.New("backend: unaligned I/O")

	// ErrOutOfRange: the I/O does not lie inside [0, Size()).
	ErrOutOfRange = errors.New("backend: I/O beyond the end of the backing")

	// ErrReadOnly: a write, discard or write-zeroes on a backend opened read-only.
	ErrReadOnly = errors.New("backend: opened read-only")

	// ErrClosed: an operation on a closed backend.
	ErrClosed = errors.New("backend: closed")

	// ErrFenced: another client took the backing over, and this one can
	// never write to it again (an RBD image whose exclusive lock was broken:
	// the cluster blocklisted this client).
	ErrFenced = errors.New("backend: fenced off by another client")
)

// noDirectIOError is ErrNoDirectIO worded for the operator: it names the path
// and the file system and says what to do instead.
type noDirectIOError struct {
	path   string
	fsName string // "tmpfs", "ramfs", or "type 0x…" when unknown
	// inMemory: the file system accepts O_DIRECT but keeps the data in
	// memory (tmpfs since Linux 6.6), rather than refusing it.
	inMemory bool
}

func (e *noDirectIOError) Error() string {
	why := ""
	if e.inMemory {
		why = " (it accepts the flag but keeps the data in memory only)"
	}
	return fmt.Sprintf("open %q: the file system (%s) does not support O_DIRECT%s; "+
		"put the store on a disk file system such as ext4 or xfs, or on a block device",
		e.path, e.fsName, why)
}

func (e *noDirectIOError) Unwrap() error { return ErrNoDirectIO }
