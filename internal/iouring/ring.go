// Package iouring is the small part of Linux io_uring that vdiskfs needs:
// create a ring, write submission entries, submit and wait, and reap
// completions, and wake a ring's owner through an eventfd. It has no
// policy; its users (the backend's read engine, the FUSE-over-io_uring
// transport and the vhost-user queue owners) decide who may touch a ring
// and when.
//
// Invariants: a Ring is not safe for concurrent use; its owner (one
// goroutine) writes SQEs with Next, publishes and submits them with Enter,
// and reads completions with Reap. The kernel may read the memory an SQE
// points at until the SQE's completion has been reaped.
package iouring

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux ABI (include/uapi/linux/io_uring.h).
const (
	sysSetup = 425
	sysEnter = 426

	SetupCQSize       = 1 << 3
	SetupSubmitAll    = 1 << 7
	SetupSQE128       = 1 << 10
	SetupSingleIssuer = 1 << 12
	SetupDeferTaskrun = 1 << 13
	featSingleMmap    = 1 << 0
	enterGetevents    = 1 << 0
	offSQRing         = 0
	offCQRing         = 0x8000000
	offSQEs           = 0x10000000
	OpReadv           = 1
	OpWritev          = 2
	OpRead            = 22
	OpWrite           = 23
	OpURingCmd        = 46
	sqeSize           = 64
	sqe128CmdArea     = 80 // bytes of command data in a 128-byte SQE
	sqeCmdOffset      = 48
	sqe64CmdArea      = sqeSize - sqeCmdOffset
)

// SQE is a submission queue entry (the first 64 bytes when the ring has
// 128-byte entries; Ring.Cmd gives the command area that spans both halves).
type SQE struct {
	Opcode      uint8
	Flags       uint8
	Ioprio      uint16
	Fd          int32
	Off         uint64 // for IORING_OP_URING_CMD: cmd_op in the low 32 bits
	Addr        uint64
	Len         uint32
	RWFlags     uint32
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	SpliceFdIn  int32
	Addr3       uint64
	_           uint64
}

// CQE is a completion queue entry.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

// Ring is one io_uring and the mapping of its queues.
type Ring struct {
	fd             int
	sqMem, cqMem   []byte
	sqeMem         []byte
	entrySize      int // 64, or 128 with SetupSQE128
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []CQE
	tail           uint32 // SQEs written; published to *sqTail by Enter
	sqEntries      uint32
}

// Setup creates a ring with room for entries SQEs (rounded up to a power of
// two by the kernel) and, when cqEntries > 0, that many CQEs.
func Setup(entries, cqEntries, flags uint32) (*Ring, error) {
	var p params
	p.flags = flags
	if cqEntries > 0 {
		p.flags |= SetupCQSize
		p.cqEntries = cqEntries
	}
	fd, _, errno := unix.Syscall(sysSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r := &Ring{fd: int(fd), entrySize: sqeSize, sqEntries: p.sqEntries}
	if flags&SetupSQE128 != 0 {
		r.entrySize = 2 * sqeSize
	}
	fail := func(what string, err error) (*Ring, error) {
		r.Close()
		return nil, fmt.Errorf("io_uring: %s: %w", what, err)
	}
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(CQE{})))
	if p.features&featSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	prot, flagsMap := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, prot, flagsMap); err != nil {
		return fail("map submission ring", err)
	}
	if p.features&featSingleMmap != 0 {
		r.cqMem = r.sqMem
	} else if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, prot, flagsMap); err != nil {
		return fail("map completion ring", err)
	}
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(p.sqEntries)*r.entrySize, prot, flagsMap); err != nil {
		return fail("map submission entries", err)
	}
	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead, r.sqTail = u32(r.sqMem, p.sqOff.head), u32(r.sqMem, p.sqOff.tail)
	r.sqMask = *u32(r.sqMem, p.sqOff.ringMask)
	r.sqArray = unsafe.Slice(u32(r.sqMem, p.sqOff.array), p.sqEntries)
	r.cqHead, r.cqTail = u32(r.cqMem, p.cqOff.head), u32(r.cqMem, p.cqOff.tail)
	r.cqMask = *u32(r.cqMem, p.cqOff.ringMask)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&r.cqMem[p.cqOff.cqes])), p.cqEntries)
	r.tail = atomic.LoadUint32(r.sqTail)
	return r, nil
}

// SQEntries is the submission queue size the kernel chose.
func (r *Ring) SQEntries() uint32 { return r.sqEntries }

// Pending is how many SQEs have been written and not yet consumed by the
// kernel; Next must not be called when it equals SQEntries.
func (r *Ring) Pending() uint32 { return r.tail - atomic.LoadUint32(r.sqHead) }

// Next returns the next free SQE, zeroed, and its command area (80 bytes
// with SetupSQE128, else 16).
func (r *Ring) Next() (*SQE, []byte) {
	i := r.tail & r.sqMask
	ent := r.sqeMem[int(i)*r.entrySize : int(i+1)*r.entrySize]
	clear(ent)
	r.sqArray[i] = i
	r.tail++
	return (*SQE)(unsafe.Pointer(&ent[0])), ent[sqeCmdOffset:]
}

// Put writes e as the next SQE.
func (r *Ring) Put(e SQE) {
	s, _ := r.Next()
	*s = e
}

// Enter publishes the written SQEs, submits them and, with wait, sleeps
// until at least one completion is ready. It returns EINTR, EAGAIN or EBUSY
// as they come (the caller reaps and calls again) and any other errno as a
// broken ring.
func (r *Ring) Enter(wait bool) error {
	atomic.StoreUint32(r.sqTail, r.tail)
	minComplete := uintptr(0)
	if wait {
		minComplete = 1
	}
	toSubmit := r.tail - atomic.LoadUint32(r.sqHead)
	_, _, errno := unix.Syscall6(sysEnter, uintptr(r.fd), uintptr(toSubmit), minComplete, enterGetevents, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// Reap calls fn for every completion ready and then frees their slots.
func (r *Ring) Reap(fn func(CQE)) int {
	head := atomic.LoadUint32(r.cqHead)
	tail := atomic.LoadUint32(r.cqTail)
	n := int(tail - head)
	for ; head != tail; head++ {
		fn(r.cqes[head&r.cqMask])
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// Close unmaps the ring and closes it; the kernel cancels what is in flight.
func (r *Ring) Close() error {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && unsafe.SliceData(r.cqMem) != unsafe.SliceData(r.sqMem) {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	return unix.Close(r.fd)
}

// ReadEventfd is the SQE of a read of the eventfd efd's counter into the
// first 8 bytes of buf, tagged tag: armed on a ring, it completes when
// another goroutine calls Notify(efd), which wakes an owner sleeping in
// Enter. buf must stay put until the completion is reaped.
func ReadEventfd(efd int, buf []byte, tag uint64) SQE {
	return SQE{Opcode: OpRead, Fd: int32(efd), Off: ^uint64(0),
		Addr: uint64(uintptr(unsafe.Pointer(&buf[:8][0]))), Len: 8, UserData: tag}
}

// Vectored turns sqe, a read or write of one buffer (OpRead, OpWrite),
// into the same I/O from or into iov (OpReadv, OpWritev), whose lengths
// must add up to the entry's: same file, offset, flags and tag. False,
// with sqe unchanged, for an entry of another kind. iov must stay put
// until the completion is reaped.
func Vectored(sqe *SQE, iov []unix.Iovec) bool {
	switch sqe.Opcode {
	case OpRead:
		sqe.Opcode = OpReadv
	case OpWrite:
		sqe.Opcode = OpWritev
	default:
		return false
	}
	sqe.Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(iov))))
	sqe.Len = uint32(len(iov))
	return true
}

// Notify adds one to the eventfd efd, completing a read of it armed in a
// ring: how a goroutine wakes a ring's owner sleeping in Enter.
func Notify(efd int) {
	one := [8]byte{1}
	for {
		_, err := unix.Write(efd, one[:])
		if err != unix.EINTR {
			return // EAGAIN: the counter is full, the owner is awake anyway
		}
	}
}

// Transient says whether an error of Enter leaves the ring as it was
// (EINTR, EAGAIN, EBUSY): reap, then call again. Any other is a broken ring.
func Transient(err error) bool {
	return err == unix.EINTR || err == unix.EAGAIN || err == unix.EBUSY
}
