package backend

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// direct is what File and Device share: an O_DIRECT descriptor, its size and
// sector size, ReadAt, WriteAt and Close. File and Device add Flush, Discard
// and WriteZeroes, which differ between the two.
type direct struct {
	desc       string // Describe()
	size       int64  // bytes, fixed at open
	sectorSize int    // O_DIRECT alignment of offsets, lengths and buffers
	readOnly   bool
	io         reader // issues data reads: pread, or an io_uring (writes are pwrite)
	engine     Engine // which one io is
	engineNote string // why io_uring is not used, when EngineAuto fell back

	// mu is held for reading by every operation that uses fd and for
	// writing by Close, so Close never closes the descriptor under a running
	// operation (its number could be reused by an unrelated open).
	// Operations never wait for each other: they all hold mu for reading.
	mu struct {
		sync.RWMutex
		fd int // -1 once closed
	}
}

func (d *direct) init(fd int, desc string, size int64, sectorSize int, readOnly bool) {
	d.desc, d.size, d.sectorSize, d.readOnly = desc, size, sectorSize, readOnly
	d.io, d.engine = psync{}, EnginePread
	d.mu.fd = fd
}

// reader issues one read, like pread(2): it may transfer less than asked.
// Writes need no such seam: they are always pwrite (see EngineIOUring).
type reader interface {
	Pread(fd int, p []byte, off int64) (int, error)
	Close() error
}

// psync is the default reader: a pread system call on the caller's thread.
type psync struct{}

func (psync) Pread(fd int, p []byte, off int64) (int, error) { return unix.Pread(fd, p, off) }
func (psync) Close() error                                   { return nil }

func (d *direct) Size() int64      { return d.size }
func (d *direct) SectorSize() int  { return d.sectorSize }
func (d *direct) Describe() string { return d.desc }

// ReadAt reads len(p) bytes at off.
func (d *direct) ReadAt(p []byte, off int64) (int, error) {
	n := int64(len(p))
	if err := d.checkIO(off, n, p, false); err != nil {
		return 0, d.opError("read", off, n, err)
	}
	done := 0
	err := d.withFD(func(fd int) (err error) {
		done, err = preadFull(d.io, fd, p, off)
		return err
	})
	if err != nil {
		return done, d.opError("read", off, n, err)
	}
	return done, nil
}

// WriteAt writes len(p) bytes at off.
func (d *direct) WriteAt(p []byte, off int64) (int, error) { return d.write("write", p, off, 0) }

// WriteAtDurable writes len(p) bytes at off with RWF_DSYNC: durable when it
// returns.
func (d *direct) WriteAtDurable(p []byte, off int64) (int, error) {
	return d.write("durable write", p, off, unix.RWF_DSYNC)
}

// write is WriteAt with pwritev2 flags rwf.
func (d *direct) write(op string, p []byte, off int64, rwf int) (int, error) {
	n := int64(len(p))
	if err := d.checkIO(off, n, p, true); err != nil {
		return 0, d.opError(op, off, n, err)
	}
	done := 0
	err := d.withFD(func(fd int) (err error) {
		done, err = pwriteFull(fd, p, off, rwf) // pwrite with either engine: see EngineIOUring
		return err
	})
	if err != nil {
		return done, d.opError(op, off, n, err)
	}
	return done, nil
}

// Close closes the descriptor, which releases the lock. It waits for running
// operations to finish. Calling it again returns nil.
func (d *direct) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.fd < 0 {
		return nil
	}
	ioErr := d.io.Close()
	err := unix.Close(d.mu.fd)
	d.mu.fd = -1
	if err = errors.Join(ioErr, err); err != nil {
		return fmt.Errorf("backend %s: close: %w", d.desc, err)
	}
	return nil
}

// withFD runs f with the open descriptor, holding d.mu for reading. After
// Close it returns ErrClosed.
func (d *direct) withFD(f func(fd int) error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.mu.fd < 0 {
		return ErrClosed
	}
	return f(d.mu.fd)
}

// checkIO checks an operation's range and alignment, and that a write is
// allowed. p is nil for operations without a buffer.
func (d *direct) checkIO(off, n int64, p []byte, write bool) error {
	if write && d.readOnly {
		return ErrReadOnly
	}
	if err := checkRange(off, n, d.size); err != nil {
		return err
	}
	return checkAligned(off, n, p, d.sectorSize)
}

// opError wraps err with the backing, the operation, its length and offset.
func (d *direct) opError(op string, off, n int64, err error) error {
	return fmt.Errorf("backend %s: %s %d bytes at %d: %w", d.desc, op, n, off, err)
}

// preadFull reads len(p) bytes at off through e, retrying on EINTR and
// continuing after partial transfers. Reaching the end of the file early is an
// error wrapping io.ErrUnexpectedEOF.
func preadFull(e reader, fd int, p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		n, err := e.Pread(fd, p[done:], off+int64(done))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, fmt.Errorf("short read of %d bytes: %w", done, io.ErrUnexpectedEOF)
		}
		done += n
	}
	return done, nil
}

// pwriteFull writes len(p) bytes at off with pwrite (pwritev2 with flags rwf
// when rwf is not 0), retrying on EINTR and continuing after partial
// transfers.
func pwriteFull(fd int, p []byte, off int64, rwf int) (int, error) {
	done := 0
	for done < len(p) {
		var n int
		var err error
		if rwf == 0 {
			n, err = unix.Pwrite(fd, p[done:], off+int64(done))
		} else {
			n, err = unix.Pwritev2(fd, [][]byte{p[done:]}, off+int64(done), rwf)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return done, err
		}
		if n == 0 {
			return done, fmt.Errorf("short write of %d bytes: %w", done, io.ErrUnexpectedEOF)
		}
		done += n
	}
	return done, nil
}

// writeZeroBuffers writes zeros over [off, off+n) with pwrite, at most 1 MiB
// at a time from a buffer aligned to align: the last resort of WriteZeroes.
func writeZeroBuffers(fd int, off, n int64, align int) error {
	zeros := alignedBuffer(int(min(n, 1<<20)), align)
	for n > 0 {
		step := min(n, int64(len(zeros)))
		if _, err := pwriteFull(fd, zeros[:step], off, 0); err != nil {
			return fmt.Errorf("write zeros at %d: %w", off, err)
		}
		off += step
		n -= step
	}
	return nil
}

// fallocate is unix.Fallocate retried on EINTR.
func fallocate(fd int, mode uint32, off, n int64) error {
	for {
		err := unix.Fallocate(fd, mode, off, n)
		if err != unix.EINTR {
			return err
		}
	}
}
