// Package uring issues the preads of many goroutines (the store's data
// reads with the io_uring engine) through one Linux io_uring, so that
// requests arriving together reach the block layer together: one io_uring_enter submits them all under one plug, and the
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
// completion queue never overflows; a buffer passed to Pread stays
// referenced by the blocked caller until its operation completes.
package uring

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

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

// ring is the owner's io_uring and its bookkeeping. Only the owner uses it.
type ring struct {
	*iouring.Ring
	slots     []*op // in flight, by slot; nil when free
	free      []uint64
	efdBuf    [8]byte
	wakeArmed bool
	maxOps    int // operations in flight at most
	yielder   iouring.Yielder
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
	return r.do(iouring.OpRead, fd, p, off)
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
func (r *Ring) wake() { iouring.Notify(r.efd) }

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
	defer rg.Close()
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
		if rg.yielder.Due() {
			rg.enter(false)
			rg.yielder.Yield()
		}
		rg.enter(wait)
		r.mu.Lock()
		r.mu.sleeping = false
		r.mu.Unlock()
		rg.reap()
	}
}

// setup creates the ring.
func setup(entries uint32) (*ring, error) {
	r, err := iouring.Setup(entries, 0, iouring.SetupSingleIssuer|iouring.SetupDeferTaskrun|iouring.SetupSubmitAll)
	if err != nil {
		return nil, err
	}
	// At most as many in flight as the submission queue holds (minus the
	// eventfd read), so that every queued operation has an SQE; the
	// completion queue is twice as deep and cannot overflow.
	return &ring{Ring: r, maxOps: int(r.SQEntries()) - 1}, nil
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
	rg.Put(iouring.SQE{Opcode: o.opcode, Fd: o.fd, Off: uint64(o.off),
		Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(o.buf)))), Len: uint32(len(o.buf)), UserData: slot})
}

// armWake queues the read of the eventfd that wakes the owner.
func (rg *ring) armWake(efd int) {
	rg.Put(iouring.ReadEventfd(efd, rg.efdBuf[:], wakeTag))
	rg.wakeArmed = true
}

// enter submits the written SQEs and, with wait, sleeps until at least
// one completion is ready. Without wait it still runs the deferred
// completions, so reap finds them.
//
// An error other than EINTR, EAGAIN or EBUSY means the ring itself is
// broken (a bad descriptor or address of ours): the kernel still owns the
// buffers of the operations in flight, so neither failing them nor waiting
// for them is safe, and enter panics.
func (rg *ring) enter(wait bool) {
	for {
		switch err := rg.Enter(wait); err {
		case nil:
			return
		case unix.EINTR:
			if rg.Pending() != 0 {
				continue
			}
			return // submitted; the serve loop comes back for completions
		case unix.EAGAIN, unix.EBUSY:
			return // short of resources: reap, then submit the rest
		default:
			panic(fmt.Sprintf("uring: io_uring_enter(wait %v): %v", wait, err))
		}
	}
}

// reap hands every ready completion to its operation.
func (rg *ring) reap() {
	rg.Reap(func(c iouring.CQE) {
		if c.UserData == wakeTag {
			rg.wakeArmed = false
			return
		}
		o := rg.slots[c.UserData]
		rg.slots[c.UserData] = nil
		rg.free = append(rg.free, c.UserData)
		o.res = c.Res
		o.done <- struct{}{}
	})
}
