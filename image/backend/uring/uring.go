// Package uring issues the preads and pwrites of many goroutines through one
// Linux io_uring, so that requests arriving together reach the block layer
// together: one io_uring_enter submits them all under one plug, and the
// device is notified once for the batch instead of once per request (on a
// virtio disk each notification is a VM exit).
//
// # Design
//
// io_uring completes a read or write as task work of the thread that
// submitted it. Go runs goroutines on whatever thread is free, so a ring
// shared by goroutines would have its completions run by threads that are
// busy or asleep elsewhere. Instead one goroutine, locked to its own thread,
// owns the ring (IORING_SETUP_SINGLE_ISSUER|IORING_SETUP_DEFER_TASKRUN): it
// is the only one to submit, and completions wait until it asks for them.
//
// Callers queue an operation under Ring.mu and block on the operation's
// channel. The owner loops: take the queued operations, write their SQEs,
// and call io_uring_enter to submit them and, when nothing is queued, to
// wait for at least one completion. A read of an eventfd is always armed in
// the ring; a caller that queues while the owner sleeps writes the eventfd,
// whose completion wakes the owner. The owner hands each completion's
// result to its operation's channel.
//
// Invariants: only the owner touches the ring's memory; the owner exits only
// after Close, with nothing queued or in flight; at most
// len(cqes) operations (the eventfd read included) are in flight, so the
// completion queue never overflows; a buffer passed to Pread or Pwrite stays
// referenced by the blocked caller until its operation completes.
package uring

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux ABI (include/uapi/linux/io_uring.h).
const (
	sysSetup = 425
	sysEnter = 426

	setupSingleIssuer = 1 << 12
	setupDeferTaskrun = 1 << 13
	setupSubmitAll    = 1 << 7

	featSingleMmap = 1 << 0

	enterGetevents = 1 << 0

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	opRead  = 22
	opWrite = 23
)

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

type sqe struct {
	opcode      uint8
	flags       uint8
	ioprio      uint16
	fd          int32
	off         uint64
	addr        uint64
	len         uint32
	rwFlags     uint32
	userData    uint64
	bufIndex    uint16
	personality uint16
	spliceFdIn  int32
	addr3       uint64
	_           uint64
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// wakeTag is the user data of the eventfd read; operations use their slot.
const wakeTag = ^uint64(0)

// Ring is an io_uring owned by one goroutine. Its methods are safe for
// concurrent use.
type Ring struct {
	efd int // eventfd that wakes the owner

	// mu guards the queue and the owner's state as callers see it.
	mu struct {
		sync.Mutex
		queue    []*op
		sleeping bool // the owner waits in io_uring_enter for a completion
		closing  bool
	}
	exited chan struct{} // closed when the owner returns

	ops sync.Pool // of *op
}

// op is one read or write waiting for the owner.
type op struct {
	opcode uint8
	fd     int32
	buf    []byte
	off    int64
	res    int32
	done   chan struct{}
}

// ring is the owner's view of the ring's memory. Only the owner uses it.
type ring struct {
	fd             int
	sqMem, cqMem   []byte
	sqeMem         []byte
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	sqes           []sqe
	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []cqe
	tail           uint32 // SQEs written, published to *sqTail before each enter
	slots          []*op  // in flight, by slot; nil when free
	free           []uint64
	efdBuf         [8]byte
	wakeArmed      bool
	maxOps         int // operations in flight at most
}

// New creates a ring of the given depth (a power of two; 256 is plenty for
// a FUSE server) and starts its owner. It fails when the kernel has no
// io_uring, refuses it (kernel.io_uring_disabled), or predates
// DEFER_TASKRUN (Linux 6.1).
func New(entries uint32) (*Ring, error) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("io_uring: eventfd: %w", err)
	}
	r := &Ring{efd: efd, exited: make(chan struct{})}
	r.ops.New = func() any { return &op{done: make(chan struct{}, 1)} }
	started := make(chan error, 1)
	go r.own(entries, started)
	if err := <-started; err != nil {
		unix.Close(efd)
		return nil, err
	}
	return r, nil
}

// Pread reads into p at off from fd, like pread(2): one call, which may
// transfer less than len(p).
func (r *Ring) Pread(fd int, p []byte, off int64) (int, error) {
	return r.do(opRead, fd, p, off)
}

// Pwrite writes p at off to fd, like pwrite(2).
func (r *Ring) Pwrite(fd int, p []byte, off int64) (int, error) {
	return r.do(opWrite, fd, p, off)
}

// ErrClosed is returned by operations on a closed ring.
var ErrClosed = errors.New("io_uring: ring closed")

func (r *Ring) do(opcode uint8, fd int, p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	o := r.ops.Get().(*op)
	o.opcode, o.fd, o.buf, o.off = opcode, int32(fd), p, off
	r.mu.Lock()
	if r.mu.closing {
		r.mu.Unlock()
		r.ops.Put(o)
		return 0, ErrClosed
	}
	r.mu.queue = append(r.mu.queue, o)
	wake := r.mu.sleeping
	r.mu.sleeping = false
	r.mu.Unlock()
	if wake {
		r.wake()
	}
	<-o.done
	res := o.res
	o.buf = nil
	r.ops.Put(o)
	runtime.KeepAlive(p)
	if res < 0 {
		return 0, unix.Errno(-res)
	}
	return int(res), nil
}

// wake writes the eventfd, completing the owner's armed read.
func (r *Ring) wake() {
	one := [8]byte{1}
	for {
		_, err := unix.Write(r.efd, one[:])
		if err != unix.EINTR {
			return
		}
	}
}

// Close stops the owner once every queued operation has completed, and
// frees the ring. Callers must not start operations during or after Close;
// those that do get ErrClosed.
func (r *Ring) Close() error {
	r.mu.Lock()
	if r.mu.closing {
		r.mu.Unlock()
		<-r.exited
		return nil
	}
	r.mu.closing = true
	r.mu.Unlock()
	r.wake()
	<-r.exited
	return unix.Close(r.efd)
}

// own is the owner goroutine: it creates the ring on its locked thread (the
// single issuer), reports the setup's outcome on started, then serves
// operations until Close.
func (r *Ring) own(entries uint32, started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	defer close(r.exited)
	rg, err := setup(entries)
	started <- err
	if err != nil {
		return
	}
	defer rg.unmap()
	r.serve(rg)
}

// serve runs operations until Close has been called and none is left.
func (r *Ring) serve(rg *ring) {
	for {
		r.mu.Lock()
		room := rg.maxOps - (len(rg.slots) - len(rg.free))
		n := min(room, len(r.mu.queue))
		if r.mu.closing && len(r.mu.queue) == 0 && len(rg.slots) == len(rg.free) {
			r.mu.Unlock()
			return
		}
		for _, o := range r.mu.queue[:n] {
			rg.push(o)
		}
		r.mu.queue = r.mu.queue[n:]
		if len(r.mu.queue) == 0 {
			r.mu.queue = nil
		}
		// Sleep in the kernel when nothing was queued: a caller that queues
		// from now on wakes us through the eventfd. (Queued operations that
		// found no room wait for completions, which wake us too.)
		wait := n == 0
		r.mu.sleeping = wait
		r.mu.Unlock()

		if !rg.wakeArmed {
			rg.armWake(r.efd)
		}
		rg.enter(wait)
		r.mu.Lock()
		r.mu.sleeping = false
		r.mu.Unlock()
		rg.reap(r.efd)
	}
}

// setup creates the ring and maps its memory.
func setup(entries uint32) (*ring, error) {
	var p params
	p.flags = setupSingleIssuer | setupDeferTaskrun | setupSubmitAll
	fd, _, errno := unix.Syscall(sysSetup, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	rg := &ring{fd: int(fd)}
	fail := func(what string, err error) (*ring, error) {
		rg.unmap()
		return nil, fmt.Errorf("io_uring: %s: %w", what, err)
	}
	sqSize := int(p.sqOff.array + p.sqEntries*4)
	cqSize := int(p.cqOff.cqes + p.cqEntries*uint32(unsafe.Sizeof(cqe{})))
	if p.features&featSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	rg.sqMem, err = unix.Mmap(rg.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fail("map submission ring", err)
	}
	if p.features&featSingleMmap != 0 {
		rg.cqMem = rg.sqMem
	} else if rg.cqMem, err = unix.Mmap(rg.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail("map completion ring", err)
	}
	sqeSize := int(p.sqEntries) * int(unsafe.Sizeof(sqe{}))
	if rg.sqeMem, err = unix.Mmap(rg.fd, offSQEs, sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail("map submission entries", err)
	}
	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	rg.sqHead, rg.sqTail = u32(rg.sqMem, p.sqOff.head), u32(rg.sqMem, p.sqOff.tail)
	rg.sqMask = *u32(rg.sqMem, p.sqOff.ringMask)
	rg.sqArray = unsafe.Slice(u32(rg.sqMem, p.sqOff.array), p.sqEntries)
	rg.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&rg.sqeMem[0])), p.sqEntries)
	rg.cqHead, rg.cqTail = u32(rg.cqMem, p.cqOff.head), u32(rg.cqMem, p.cqOff.tail)
	rg.cqMask = *u32(rg.cqMem, p.cqOff.ringMask)
	rg.cqes = unsafe.Slice((*cqe)(unsafe.Pointer(&rg.cqMem[p.cqOff.cqes])), p.cqEntries)
	rg.tail = atomic.LoadUint32(rg.sqTail)
	// At most as many in flight as the submission queue holds (minus the
	// eventfd read), so that every queued operation has an SQE; the
	// completion queue is twice as deep and cannot overflow.
	rg.maxOps = int(p.sqEntries) - 1
	return rg, nil
}

func (rg *ring) unmap() {
	if rg.sqeMem != nil {
		unix.Munmap(rg.sqeMem)
	}
	if rg.cqMem != nil && unsafe.SliceData(rg.cqMem) != unsafe.SliceData(rg.sqMem) {
		unix.Munmap(rg.cqMem)
	}
	if rg.sqMem != nil {
		unix.Munmap(rg.sqMem)
	}
	rg.sqeMem, rg.cqMem, rg.sqMem = nil, nil, nil
	unix.Close(rg.fd)
}

// push writes o's SQE into a free slot.
func (rg *ring) push(o *op) {
	var slot uint64
	if n := len(rg.free); n > 0 {
		slot = rg.free[n-1]
		rg.free = rg.free[:n-1]
	} else {
		slot = uint64(len(rg.slots))
		rg.slots = append(rg.slots, nil)
	}
	rg.slots[slot] = o
	rg.put(sqe{opcode: o.opcode, fd: o.fd, off: uint64(o.off),
		addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(o.buf)))), len: uint32(len(o.buf)), userData: slot})
}

// armWake queues the read of the eventfd that wakes the owner.
func (rg *ring) armWake(efd int) {
	rg.put(sqe{opcode: opRead, fd: int32(efd), addr: uint64(uintptr(unsafe.Pointer(&rg.efdBuf[0]))),
		len: uint32(len(rg.efdBuf)), off: ^uint64(0), userData: wakeTag})
	rg.wakeArmed = true
}

func (rg *ring) put(e sqe) {
	i := rg.tail & rg.sqMask
	rg.sqes[i] = e
	rg.sqArray[i] = i
	rg.tail++
}

// enter publishes the written SQEs, submits them and, with wait, sleeps
// until at least one completion is ready. Without wait it still runs the
// deferred completions, so reap finds them.
//
// An error other than EINTR, EAGAIN or EBUSY means the ring itself is
// broken (a bad descriptor or address of ours): the kernel still owns the
// buffers of the operations in flight, so neither failing them nor waiting
// for them is safe, and enter panics.
func (rg *ring) enter(wait bool) {
	atomic.StoreUint32(rg.sqTail, rg.tail)
	minComplete := uintptr(0)
	if wait {
		minComplete = 1
	}
	for {
		toSubmit := rg.tail - atomic.LoadUint32(rg.sqHead)
		_, _, errno := unix.Syscall6(sysEnter, uintptr(rg.fd), uintptr(toSubmit), minComplete, enterGetevents, 0, 0)
		switch errno {
		case 0:
			return
		case unix.EINTR:
			if atomic.LoadUint32(rg.sqHead) != rg.tail {
				continue
			}
			return // submitted; the serve loop comes back for completions
		case unix.EAGAIN, unix.EBUSY:
			return // short of resources: reap, then submit the rest
		default:
			panic(fmt.Sprintf("uring: io_uring_enter(%d, %d, %d, GETEVENTS): %v", rg.fd, toSubmit, minComplete, errno))
		}
	}
}

// reap hands every ready completion to its operation.
func (rg *ring) reap(efd int) {
	head := atomic.LoadUint32(rg.cqHead)
	tail := atomic.LoadUint32(rg.cqTail)
	for ; head != tail; head++ {
		c := rg.cqes[head&rg.cqMask]
		if c.userData == wakeTag {
			rg.wakeArmed = false
			continue
		}
		o := rg.slots[c.userData]
		rg.slots[c.userData] = nil
		rg.free = append(rg.free, c.userData)
		o.res = c.res
		o.done <- struct{}{}
	}
	atomic.StoreUint32(rg.cqHead, head)
}
