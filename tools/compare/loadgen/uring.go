package loadgen

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/iouring"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
)

// File is an Engine on a plain file or block device: O_DIRECT reads and
// writes through an io_uring of the queue's depth, as fio's io_uring
// engine does without its options. Its Queue must stay on the thread that
// opened it (Run locks it).
type File struct {
	Path string
	// HugePages puts the buffers on 2 MiB hugetlb pages from the kernel's
	// pool, as fio's iomem=shmhuge does.
	HugePages bool
}

type fileQueue struct {
	fd   int
	ring *iouring.Ring
	mem  []byte
	bs   int
}

// Open opens the file O_DIRECT and sets a ring up.
func (f File) Open(depth, bs int) (Queue, error) {
	fd, err := unix.Open(f.Path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", f.Path, err)
	}
	q := &fileQueue{fd: fd, bs: bs}
	// As fio's io_uring engine sets its ring up: one issuer, completion
	// work run when the issuer waits (the caller's thread is locked).
	if q.ring, err = iouring.Setup(uint32(depth), 0, iouring.SetupSingleIssuer|iouring.SetupDeferTaskrun); err != nil {
		if q.ring, err = iouring.Setup(uint32(depth), 0, 0); err != nil {
			unix.Close(fd)
			return nil, err
		}
	}
	size, flags := depth*bs, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE
	if f.HugePages {
		size, flags = (size+frontend.HugePageSize-1)&^(frontend.HugePageSize-1), flags|unix.MAP_HUGETLB|unix.MAP_HUGE_2MB
	}
	if q.mem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, flags); err != nil {
		q.Close()
		return nil, fmt.Errorf("buffers: %w", err)
	}
	return q, nil
}

func (q *fileQueue) Buffer(slot int) []byte { return q.mem[slot*q.bs : (slot+1)*q.bs] }

func (q *fileQueue) Submit(slot int, write bool, off int64) error {
	sqe, _ := q.ring.Next()
	sqe.Opcode = iouring.OpRead
	if write {
		sqe.Opcode = iouring.OpWrite
	}
	sqe.Fd = int32(q.fd)
	sqe.Off = uint64(off)
	sqe.Addr = uint64(uintptr(unsafe.Pointer(&q.mem[slot*q.bs])))
	sqe.Len = uint32(q.bs)
	sqe.UserData = uint64(slot)
	return nil
}

func (q *fileQueue) Flush(wait bool) error {
	switch err := q.ring.Enter(wait); err {
	case nil, unix.EINTR, unix.EAGAIN, unix.EBUSY:
		return nil // the caller reaps and comes back
	default:
		return fmt.Errorf("io_uring_enter: %w", err)
	}
}

func (q *fileQueue) Reap(fn func(slot int)) (int, error) {
	var fail error
	n := q.ring.Reap(func(c iouring.CQE) {
		if c.Res != int32(q.bs) && fail == nil {
			fail = fmt.Errorf("I/O of %d bytes: result %d", q.bs, c.Res)
		}
		fn(int(c.UserData))
	})
	return n, fail
}

func (q *fileQueue) Close() error {
	if q.mem != nil {
		unix.Munmap(q.mem)
	}
	if q.ring != nil {
		q.ring.Close()
	}
	return unix.Close(q.fd)
}
