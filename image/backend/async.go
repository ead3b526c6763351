package backend

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// Async is a test backend: any Backend made an AsyncSubmitter whose I/O
// started on a completion queue is performed on a goroutine of its own
// (with ReadAt, WriteAt or WriteAtDurable of the wrapped backend) and
// completes through the queue's eventfd, the shape of the RBD backend's
// data path without Ceph. Tests stand it where the RBD backend stands to
// run a submission loop's asynchronous path on memory or a file. Its other
// methods are the wrapped backend's. It is not a Submitter.
type Async struct {
	Backend
	fault atomic.Pointer[func(IO) error]
}

// Compile-time check: Async is an AsyncSubmitter.
var _ AsyncSubmitter = (*Async)(nil)

// NewAsync wraps b.
func NewAsync(b Backend) *Async { return &Async{Backend: b} }

// SetFault makes every I/O started on a completion queue from now on go
// through f first: an error from f fails the I/O (its errno, else EIO)
// without performing it. nil removes the fault.
func (a *Async) SetFault(f func(IO) error) {
	if f == nil {
		a.fault.Store(nil)
		return
	}
	a.fault.Store(&f)
}

// NewCompletionQueue makes a completion queue with a blocking eventfd.
func (a *Async) NewCompletionQueue() (CompletionQueue, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("backend %s: eventfd: %w", a.Describe(), err)
	}
	return &asyncQueue{a: a, efd: fd}, nil
}

// asyncQueue is Async's CompletionQueue.
type asyncQueue struct {
	a   *Async
	efd int
	// running counts the I/O goroutines that have not returned: close
	// waits for them before closing the eventfd they write.
	running sync.WaitGroup
	// mu guards the completions waiting and the count of I/Os not reaped.
	mu struct {
		sync.Mutex
		done     []asyncDone
		inFlight int
		closed   bool
	}
	reaped []asyncDone // Reap's scratch; only the reaper uses it
}

type asyncDone struct {
	tag uint64
	res int64
}

// Start performs io on a goroutine of its own.
func (q *asyncQueue) Start(io IO, tag uint64) error {
	q.mu.Lock()
	if q.mu.closed {
		q.mu.Unlock()
		return fmt.Errorf("backend %s: start on a closed completion queue: %w", q.a.Describe(), ErrClosed)
	}
	q.mu.inFlight++
	q.mu.Unlock()
	q.running.Add(1)
	go func() {
		defer q.running.Done()
		res := int64(len(io.Buf))
		var err error
		if f := q.a.fault.Load(); f != nil {
			err = (*f)(io)
		}
		if err == nil {
			err = Do(q.a.Backend, io)
		}
		if err != nil {
			res = -int64(syscall.EIO)
			if errno := syscall.Errno(0); errors.As(err, &errno) {
				res = -int64(errno)
			}
		}
		q.mu.Lock()
		q.mu.done = append(q.mu.done, asyncDone{tag: tag, res: res})
		q.mu.Unlock()
		iouring.Notify(q.efd)
	}()
	return nil
}

func (q *asyncQueue) Fd() int { return q.efd }

func (q *asyncQueue) Reap(fn func(tag uint64, res int64)) int {
	q.mu.Lock()
	q.reaped, q.mu.done = q.mu.done, q.reaped[:0]
	q.mu.inFlight -= len(q.reaped)
	q.mu.Unlock()
	for _, d := range q.reaped {
		fn(d.tag, d.res)
	}
	return len(q.reaped)
}

// asyncCloseWait bounds Close's wait for goroutines that have queued
// their completion but not yet returned.
const asyncCloseWait = 10 * time.Second

func (q *asyncQueue) Close() error {
	q.mu.Lock()
	again, err := closeQueueLockedMu(&q.mu.closed, q.mu.inFlight)
	q.mu.Unlock()
	if err != nil {
		return fmt.Errorf("backend %s: %w", q.a.Describe(), err)
	}
	if again {
		return nil
	}
	done := make(chan struct{})
	go func() { q.running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(asyncCloseWait):
		return fmt.Errorf("backend %s: close a completion queue: its goroutines did not return in %v", q.a.Describe(), asyncCloseWait)
	}
	return unix.Close(q.efd)
}
