package backend

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// IO is one data transfer between a caller's buffer and the backing: a
// read into Buf, or a write of Buf, of len(Buf) bytes at Off. Off, len(Buf)
// and the address of Buf follow ReadAt's rules (multiples of SectorSize()
// for File and Device, and for Mem and Crash after CheckAlignment).
type IO struct {
	Off   int64
	Buf   []byte
	Write bool
	// Durable (writes only) asks for WriteAtDurable's promise: the bytes
	// are durable when the I/O completes (RWF_DSYNC, a FUA write), and no
	// other write is made durable by it.
	Durable bool
}

// A Submitter is a backend whose data I/O may be issued from a submission
// loop that must not block, such as a FUSE-over-io_uring queue's owner
// thread: it either puts the I/O on the caller's io_uring (PrepareSQE) or
// performs it at once without waiting for a device (Do). See the package
// documentation, "Submission".
type Submitter interface {
	Backend
	// PrepareSQE fills sqe, a zeroed entry of the caller's io_uring, with
	// io: Opcode, Fd, Off, Addr, Len and RWFlags (RWF_DSYNC when
	// io.Durable). The caller sets UserData (and may set Flags), submits
	// it before Close, and keeps io.Buf valid until its completion, whose
	// Res is the bytes transferred or -errno; anything but len(io.Buf) is
	// a failure. False, with sqe untouched: the backend cannot take io on
	// a ring (it has none, it is closed, or io breaks the rules) and the
	// caller uses Do instead.
	PrepareSQE(sqe *iouring.SQE, io IO) bool
	// Do performs io synchronously, transferring all of io.Buf or
	// failing, as ReadAt, WriteAt or WriteAtDurable would. On a backend
	// whose PrepareSQE can say false for a valid io while open (Mem,
	// Crash), Do never waits for a device: it may be called on a thread
	// that must not block.
	Do(io IO) error
}

// An AsyncSubmitter is a backend whose data I/O a submission loop that
// must not block starts itself, without waiting, and whose completions it
// reaps itself from a completion queue of its own (the RBD backend, whose
// every I/O waits for the network). See the package documentation,
// "Submission".
type AsyncSubmitter interface {
	Backend
	// NewCompletionQueue makes a completion queue for one caller, which
	// owns it: it alone reaps it, and closes it once every I/O it
	// started there has been reaped.
	NewCompletionQueue() (CompletionQueue, error)
}

// A CompletionQueue is an AsyncSubmitter's completion queue for one
// caller: I/O started on it completes on it.
type CompletionQueue interface {
	// Start starts io without waiting for it; its completion is reaped
	// with tag. The caller keeps io.Buf valid (and unmoved) until then.
	// An error is an I/O that did not start (a closed backend, one that
	// breaks the rules, a write on a read-only or fenced backing), and
	// then nothing is reaped for it.
	Start(io IO, tag uint64) error
	// Fd is an eventfd that becomes readable (a count above zero) when a
	// completion is waiting: the caller reads it (on its own io_uring,
	// say), then calls Reap. A completion queued after Reap took the
	// waiting ones writes it again.
	Fd() int
	// Reap calls fn with the tag and result of every completion waiting,
	// oldest first, and returns how many. res is the bytes transferred
	// or -errno, as an io_uring completion's Res: anything but len(Buf)
	// is a failure. fn may call Start. One goroutine at a time.
	Reap(fn func(tag uint64, res int64)) int
	// Close frees the queue. Every I/O started on it must have been
	// reaped; if not, it frees nothing and returns an error.
	Close() error
}

// errNotReaped is the complaint of a CompletionQueue's Close about I/O
// started on it and not reaped.
var errNotReaped = errors.New("I/O started and not reaped")

// closeQueueLockedMu is the first step of a CompletionQueue's Close,
// whose caller holds the lock that guards closed and inFlight (the I/Os
// started and not reaped): again for a queue closed already; an error
// with I/O not reaped (the queue stays open: a completion will come into
// it); else it marks the queue closed, and the caller frees it.
func closeQueueLockedMu(closed *bool, inFlight int) (again bool, err error) {
	switch {
	case *closed:
		return true, nil
	case inFlight > 0:
		return false, fmt.Errorf("close a completion queue with %d I/Os running: %w", inFlight, errNotReaped)
	}
	*closed = true
	return false, nil
}

// Compile-time checks that every backend that may stand under a
// submission loop is a Submitter.
var (
	_ Submitter = (*File)(nil)
	_ Submitter = (*Device)(nil)
	_ Submitter = (*Mem)(nil)
	_ Submitter = (*Crash)(nil)
)

// Do performs io synchronously on any backend through its ReadAt, WriteAt
// or WriteAtDurable: the synchronous form of the submission seam, which a
// wrapper that is not a Submitter (a test's gate or delay) implements by
// being a Backend.
func Do(b Backend, io IO) error {
	var err error
	switch {
	case !io.Write:
		_, err = b.ReadAt(io.Buf, io.Off)
	case io.Durable:
		_, err = b.WriteAtDurable(io.Buf, io.Off)
	default:
		_, err = b.WriteAt(io.Buf, io.Off)
	}
	return err
}

// Do performs io with pread or pwrite on the caller's thread.
func (f *File) Do(io IO) error { return Do(f, io) }

// Do performs io with pread or pwrite on the caller's thread.
func (d *Device) Do(io IO) error { return Do(d, io) }

// Do performs io in memory.
func (m *Mem) Do(io IO) error { return Do(m, io) }

// Do performs io in memory, through the fault function and into the op
// log as ReadAt, WriteAt and WriteAtDurable do.
func (c *Crash) Do(io IO) error { return Do(c, io) }

// PrepareSQE always says false: Mem has no descriptor; Do is in memory.
func (m *Mem) PrepareSQE(*iouring.SQE, IO) bool { return false }

// PrepareSQE always says false: every operation must go through the fault
// function and the op log, which Do does.
func (c *Crash) PrepareSQE(*iouring.SQE, IO) bool { return false }

// PrepareSQE puts io on the caller's ring as a read or write of the
// O_DIRECT descriptor. It says false after Close, for an empty or
// misaligned io and for a write on a read-only backing: Do reports those.
func (d *direct) PrepareSQE(sqe *iouring.SQE, io IO) bool {
	n := int64(len(io.Buf))
	if n == 0 || n > math.MaxUint32 || d.checkIO(io.Off, n, io.Buf, io.Write) != nil {
		return false
	}
	d.mu.RLock()
	fd := d.mu.fd
	d.mu.RUnlock()
	if fd < 0 {
		return false
	}
	sqe.Opcode = iouring.OpRead
	if io.Write {
		sqe.Opcode = iouring.OpWrite
		if io.Durable {
			sqe.RWFlags = unix.RWF_DSYNC // durable when it completes
		}
	}
	sqe.Fd, sqe.Off, sqe.Len = int32(fd), uint64(io.Off), uint32(n)
	sqe.Addr = uint64(uintptr(unsafe.Pointer(&io.Buf[0])))
	return true
}
