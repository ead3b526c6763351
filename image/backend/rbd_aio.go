//go:build rbd

package backend

/*
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>
#include <rbd/librbd.h>

enum { vdisk_aio_read, vdisk_aio_write, vdisk_aio_flush, vdisk_aio_discard, vdisk_aio_zeroes };

struct vdisk_slot;

// A vdisk_cq collects the completions of the operations started on it
// (see rbdQueue). It lives in C memory: librbd's completion thread
// writes into it.
struct vdisk_cq {
	pthread_mutex_t mu;      // guards done
	struct vdisk_slot *done; // completed slots not yet taken, newest first
	int efd;                 // the eventfd written after every completion
	// busy counts the operations started whose callback has not yet
	// returned (atomic): the queue may be freed only at zero.
	uint64_t busy;
};

// A vdisk_slot is one operation in flight: the argument of its librbd
// completion. idx names it to the Go side.
struct vdisk_slot {
	struct vdisk_cq *cq;
	struct vdisk_slot *next; // on cq->done
	int64_t ret;             // librbd's return value, once completed
	uint32_t idx;
};

// vdisk_cq_complete is the callback of every completion. It runs on
// librbd's completion thread and is pure C: it records the return value,
// releases the completion, puts the slot on its queue's done list, writes
// the queue's eventfd and, as its last touch of the queue, drops busy.
static void vdisk_cq_complete(rbd_completion_t c, void *arg) {
	struct vdisk_slot *s = arg;
	struct vdisk_cq *q = s->cq;
	uint64_t one = 1;
	s->ret = rbd_aio_get_return_value(c);
	rbd_aio_release(c);
	pthread_mutex_lock(&q->mu);
	s->next = q->done;
	q->done = s;
	pthread_mutex_unlock(&q->mu);
	while (write(q->efd, &one, sizeof one) < 0 && errno == EINTR)
		;
	__atomic_sub_fetch(&q->busy, 1, __ATOMIC_RELEASE);
}

static struct vdisk_cq *vdisk_cq_new(int efd) {
	struct vdisk_cq *q = calloc(1, sizeof *q);
	if (q == NULL)
		return NULL;
	pthread_mutex_init(&q->mu, NULL);
	q->efd = efd;
	return q;
}

static void vdisk_cq_free(struct vdisk_cq *q) {
	pthread_mutex_destroy(&q->mu);
	free(q);
}

static uint64_t vdisk_cq_busy(struct vdisk_cq *q) { return __atomic_load_n(&q->busy, __ATOMIC_ACQUIRE); }

// vdisk_cq_take takes every completed slot off q, newest first.
static struct vdisk_slot *vdisk_cq_take(struct vdisk_cq *q) {
	pthread_mutex_lock(&q->mu);
	struct vdisk_slot *s = q->done;
	q->done = NULL;
	pthread_mutex_unlock(&q->mu);
	return s;
}

static struct vdisk_slot *vdisk_slot_new(struct vdisk_cq *q, uint32_t idx) {
	struct vdisk_slot *s = calloc(1, sizeof *s);
	if (s != NULL) {
		s->cq = q;
		s->idx = idx;
	}
	return s;
}

// vdisk_rbd_aio starts one asynchronous operation on img whose completion
// goes to s's queue. A negative return is an operation that did not start
// (no callback will come).
static int vdisk_rbd_aio(rbd_image_t img, int op, struct vdisk_slot *s, uint64_t off, uint64_t len, char *buf) {
	rbd_completion_t c;
	__atomic_add_fetch(&s->cq->busy, 1, __ATOMIC_RELAXED);
	int r = rbd_aio_create_completion(s, vdisk_cq_complete, &c);
	if (r < 0) {
		__atomic_sub_fetch(&s->cq->busy, 1, __ATOMIC_RELAXED);
		return r;
	}
	switch (op) {
	case vdisk_aio_read:
		r = rbd_aio_read(img, off, len, buf, c);
		break;
	case vdisk_aio_write:
		r = rbd_aio_write(img, off, len, buf, c);
		break;
	case vdisk_aio_flush:
		r = rbd_aio_flush(img, c);
		break;
	case vdisk_aio_discard:
		r = rbd_aio_discard(img, off, len, c);
		break;
	case vdisk_aio_zeroes:
		r = rbd_aio_write_zeroes(img, off, len, c, 0, 0);
		break;
	default:
		r = -EINVAL;
	}
	if (r < 0) {
		rbd_aio_release(c);
		__atomic_sub_fetch(&s->cq->busy, 1, __ATOMIC_RELAXED);
	}
	return r;
}
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rbdQueue is a completion queue of librbd operations: the one mechanism
// by which every data operation of the RBD backend completes, whether a
// goroutine waits for it (rbdAIO, ReadAt and the rest) or a submission
// loop reaps it on its own ring (rbdCompletions, AsyncSubmitter).
//
// How a completion arrives: an operation is started with rbd_aio_* and a
// completion whose callback is vdisk_cq_complete and whose argument is a
// slot of this queue in C memory (never a Go pointer: librbd keeps it
// past the call). librbd runs the callback on its completion thread (the
// image's API strand, one callback at a time); the callback is pure C, so
// that thread never enters the Go runtime: it records the return value,
// releases the completion, pushes the slot on the queue's done list under
// a C mutex and writes the queue's eventfd. Whoever reads the eventfd
// (the poller goroutine through the netpoller, or a FUSE queue's owner
// through a read armed on its io_uring) then calls reap, which takes the
// whole list in one cgo call. The eventfd is read before the list is
// taken, so a completion pushed after the take has written it again.
// This is QEMU's rbd driver's shape (a callback per completion that
// hands it to the caller's event loop).
//
// The buffer of a read or write stays in librbd's hands until the
// operation completes: it is pinned (runtime.Pinner, a no-op for memory
// outside the Go heap such as a FUSE queue's mmap'd payload buffers)
// until reap sees the completion.
//
// Lifetime: the C queue is freed by close only when no operation is in
// flight and every callback has returned (busy is zero), so a callback
// never touches freed memory, whatever the image's state: the queue may
// outlive the image (completions of operations librbd failed when the
// image closed are still reaped) and the image may outlive the queue.
//
// Concurrency: start may be called from any number of goroutines at once;
// reap by one goroutine at a time; close after the last reap that took an
// operation's completion.
type rbdQueue struct {
	c   *C.struct_vdisk_cq
	efd *os.File // librbd's callback writes it; read by the queue's reaper

	// mu guards the slots: which are free and what each one in flight is
	// for. Slots are made on demand and kept until close, so the number
	// of slots is the most operations ever in flight at once.
	mu struct {
		sync.Mutex
		slots    []*rbdSlot // by index
		free     []*rbdSlot
		inFlight int
		closed   bool
	}
	reaped []rbdDone // reap's scratch; only the reaper uses it
}

// rbdSlot is the Go side of a vdisk_slot.
type rbdSlot struct {
	c   *C.struct_vdisk_slot
	tag uint64
	op  C.int
	n   int64 // the operation's length
	pin runtime.Pinner
}

type rbdDone struct {
	idx uint32
	tag uint64
	ret int64
}

// newRBDQueue makes a queue with a new eventfd, nonblocking (for the
// netpoller) or blocking (for a read armed on an io_uring, which waits
// for a count rather than failing with EAGAIN).
func newRBDQueue(nonblocking bool) (*rbdQueue, error) {
	flags := unix.EFD_CLOEXEC
	if nonblocking {
		flags |= unix.EFD_NONBLOCK
	}
	fd, err := unix.Eventfd(0, flags)
	if err != nil {
		return nil, fmt.Errorf("eventfd for librbd's completions: %w", err)
	}
	c := C.vdisk_cq_new(C.int(fd))
	if c == nil {
		unix.Close(fd)
		return nil, fmt.Errorf("completion queue: %w", syscall.ENOMEM)
	}
	// A nonblocking descriptor given to os.NewFile goes into the
	// netpoller: a Read parks the goroutine, not the thread.
	return &rbdQueue{c: c, efd: os.NewFile(uintptr(fd), "rbd-completions")}, nil
}

// The operations of start.
const (
	aioRead    = C.vdisk_aio_read
	aioWrite   = C.vdisk_aio_write
	aioFlush   = C.vdisk_aio_flush
	aioDiscard = C.vdisk_aio_discard
	aioZeroes  = C.vdisk_aio_zeroes
)

// start starts one operation on img, whose completion reap will hand out
// with tag. The caller keeps img open until start returns. An error is an
// operation that did not start: its errno, or ErrClosed for a closed
// queue.
func (q *rbdQueue) start(img C.rbd_image_t, op C.int, off, n int64, buf []byte, tag uint64) error {
	s, err := q.get()
	if err != nil {
		return err
	}
	s.tag, s.op, s.n = tag, op, n
	var p *C.char
	if len(buf) > 0 {
		s.pin.Pin(&buf[0])
		p = (*C.char)(unsafe.Pointer(&buf[0]))
	}
	if ret := C.vdisk_rbd_aio(img, op, s.c, C.uint64_t(off), C.uint64_t(n), p); ret < 0 {
		q.put(s)
		return syscall.Errno(-ret)
	}
	return nil
}

// get takes a free slot, making one if none is free.
func (q *rbdQueue) get() (*rbdSlot, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.mu.closed {
		return nil, ErrClosed
	}
	q.mu.inFlight++
	if k := len(q.mu.free); k > 0 {
		s := q.mu.free[k-1]
		q.mu.free = q.mu.free[:k-1]
		return s, nil
	}
	c := C.vdisk_slot_new(q.c, C.uint32_t(len(q.mu.slots)))
	if c == nil {
		q.mu.inFlight--
		return nil, fmt.Errorf("completion slot: %w", syscall.ENOMEM)
	}
	s := &rbdSlot{c: c}
	q.mu.slots = append(q.mu.slots, s)
	return s, nil
}

// put frees s, whose operation is over (or never started).
func (q *rbdQueue) put(s *rbdSlot) {
	q.mu.Lock()
	q.putLockedMu(s)
	q.mu.Unlock()
}

// putLockedMu is put; the caller holds q.mu.
func (q *rbdQueue) putLockedMu(s *rbdSlot) {
	s.pin.Unpin()
	q.mu.free = append(q.mu.free, s)
	q.mu.inFlight--
}

// reap takes every completion the callback has queued and calls fn with
// each one's tag and result, oldest first, after freeing its slot (so fn
// may start operations again). The result is librbd's return value for a
// read (the bytes read, or -errno) and, for any other operation, its
// length or -errno. It returns how many it took.
func (q *rbdQueue) reap(fn func(tag uint64, res int64)) int {
	head := C.vdisk_cq_take(q.c)
	if head == nil {
		return 0
	}
	q.reaped = q.reaped[:0]
	for s := head; s != nil; s = s.next {
		q.reaped = append(q.reaped, rbdDone{idx: uint32(s.idx), ret: int64(s.ret)})
	}
	q.mu.Lock()
	for i := range q.reaped {
		d := &q.reaped[i]
		s := q.mu.slots[d.idx]
		d.tag = s.tag
		if d.ret >= 0 && s.op != aioRead {
			d.ret = s.n // a write's return value is 0 or its length
		}
		q.putLockedMu(s)
	}
	q.mu.Unlock()
	slices.Reverse(q.reaped) // the list is newest first
	for _, d := range q.reaped {
		fn(d.tag, d.ret)
	}
	return len(q.reaped)
}

// errAIOInFlight is close's complaint about a caller that broke its rule.
var errAIOInFlight = errors.New("operations still in flight")

// rbdCallbackWait bounds close's wait for callbacks that have queued
// their completion but not yet returned (a few instructions each).
const rbdCallbackWait = 10 * time.Second

// close frees the queue and closes its eventfd. With operations still in
// flight it frees nothing and says so (a callback will write into it):
// the caller broke the rule of reaping every operation first.
func (q *rbdQueue) close() error {
	q.mu.Lock()
	again, err := closeQueueLockedMu(&q.mu.closed, q.mu.inFlight)
	q.mu.Unlock()
	if again || err != nil {
		return err
	}
	// Every callback has queued its slot; the last ones may still be on
	// their way out of vdisk_cq_complete.
	for deadline := time.Now().Add(rbdCallbackWait); C.vdisk_cq_busy(q.c) != 0; {
		if time.Now().After(deadline) {
			return fmt.Errorf("close a completion queue: librbd's callbacks did not return in %v (the queue is left allocated)",
				rbdCallbackWait)
		}
		time.Sleep(10 * time.Microsecond)
	}
	for _, s := range q.mu.slots {
		C.free(unsafe.Pointer(s.c))
	}
	q.mu.slots, q.mu.free = nil, nil
	C.vdisk_cq_free(q.c)
	q.c = nil
	return q.efd.Close()
}

// rbdAIO is the RBD backend's synchronous data path (ReadAt, WriteAt,
// Flush, Discard, WriteZeroes): librbd's asynchronous C API on the image
// handle that holds the lock, completing on one rbdQueue of the backend's
// own, without an OS thread per I/O in flight.
//
// Each operation is started with the integer id of a waiting request as
// its tag, and parks its goroutine on the request's channel. One poller
// goroutine reads the queue's eventfd through Go's netpoller (a goroutine
// parked in epoll, not a thread in a system call), reaps the queue and
// hands each return value to its waiter. A caller so blocks only its
// goroutine; the eventfd costs one read per batch of completions.
//
// Concurrency: start may be called from any number of goroutines at once;
// close must follow every start's return (the RBD backend's mutex orders
// them), and closes the image too.
type rbdAIO struct {
	img  *rbdImage
	q    *rbdQueue
	done chan struct{} // closed when the poller has returned
	// stopping tells the poller to return the next time it wakes (close).
	stopping atomic.Bool
	// started and completed count operations, for tests and for close's
	// check that none is left in flight.
	started, completed atomic.Int64

	// mu guards the table of requests by id. The poller looks a request
	// up by id under it; start takes a free one and puts it back.
	mu struct {
		sync.Mutex
		reqs []*aioReq // by id; a request keeps its id forever
		free []*aioReq // requests not in flight
	}
}

// aioReq is one operation in flight, reused from operation to operation.
type aioReq struct {
	id   uint64
	done chan int64 // capacity 1: the poller sends the return value
}

// newRBDAIO makes the backend's own completion queue and starts the poller.
func newRBDAIO(img *rbdImage) (*rbdAIO, error) {
	q, err := newRBDQueue(true)
	if err != nil {
		return nil, err
	}
	a := &rbdAIO{img: img, q: q, done: make(chan struct{})}
	go a.poll()
	return a, nil
}

// start runs one operation and waits for its completion, parking only
// the calling goroutine. It returns librbd's return value (>= 0: bytes
// for a read, the length otherwise) or the errno of a failure, whether
// the operation failed to start or completed with an error.
func (a *rbdAIO) start(op C.int, off, n int64, buf []byte) (int64, error) {
	req := a.get()
	defer a.put(req)
	a.started.Add(1)
	if err := a.q.start(a.img.img, op, off, n, buf, req.id); err != nil {
		a.completed.Add(1)
		return 0, err
	}
	res := <-req.done
	if res < 0 {
		return 0, syscall.Errno(-res)
	}
	return res, nil
}

func (a *rbdAIO) get() *aioReq {
	a.mu.Lock()
	defer a.mu.Unlock()
	if k := len(a.mu.free); k > 0 {
		req := a.mu.free[k-1]
		a.mu.free = a.mu.free[:k-1]
		return req
	}
	req := &aioReq{id: uint64(len(a.mu.reqs)), done: make(chan int64, 1)}
	a.mu.reqs = append(a.mu.reqs, req)
	return req
}

func (a *rbdAIO) put(req *aioReq) {
	a.mu.Lock()
	a.mu.free = append(a.mu.free, req)
	a.mu.Unlock()
}

// poll is the poller goroutine: wait for the eventfd, then reap the
// queue, until close.
func (a *rbdAIO) poll() {
	defer close(a.done)
	var b [8]byte
	for {
		if _, err := a.q.efd.Read(b[:]); err != nil {
			// Only a closed descriptor fails a read of an eventfd, and
			// close closes it only after the poller returned.
			panic(fmt.Sprintf("rbd: read of the completion eventfd: %v", err))
		}
		a.q.reap(a.complete)
		if a.stopping.Load() {
			return
		}
	}
}

// complete hands ret to the request id's waiter.
func (a *rbdAIO) complete(id uint64, ret int64) {
	a.mu.Lock()
	var req *aioReq
	if id < uint64(len(a.mu.reqs)) {
		req = a.mu.reqs[id]
	}
	a.mu.Unlock()
	if req == nil {
		panic(fmt.Sprintf("rbd: completion of unknown request %d", id))
	}
	a.completed.Add(1)
	req.done <- ret
}

// close ends the poller, closes the image and then the queue. Every start
// must have returned: no operation is in flight.
func (a *rbdAIO) close() error {
	a.stopping.Store(true)
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, werr := a.q.efd.Write(one[:])
	if werr == nil {
		<-a.done
	}
	// With the poller still running (the wake-up failed, which an
	// eventfd does not), closing the image under it would be a use
	// after free: leave both open and say so.
	if werr != nil {
		return fmt.Errorf("wake the completion poller: %w", werr)
	}
	err := a.img.close()
	if cerr := a.q.close(); err == nil {
		err = cerr
	}
	if s, c := a.started.Load(), a.completed.Load(); s != c && err == nil {
		err = fmt.Errorf("%d started, %d completed: %w", s, c, errAIOInFlight)
	}
	return err
}

// rbdCompletions is a completion queue of an RBD backend for one
// submission loop (AsyncSubmitter): Start starts a read or write on the
// image without waiting, and the loop reaps its completions when the
// queue's eventfd, which it reads on its own io_uring, says so.
type rbdCompletions struct {
	r *RBD
	q *rbdQueue
}

// Compile-time checks: the RBD backend is an AsyncSubmitter.
var (
	_ AsyncSubmitter  = (*RBD)(nil)
	_ CompletionQueue = (*rbdCompletions)(nil)
)

// NewCompletionQueue makes a completion queue for one submission loop,
// with a blocking eventfd (for a read armed on an io_uring).
func (r *RBD) NewCompletionQueue() (CompletionQueue, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mu.aio == nil {
		return nil, fmt.Errorf("backend %s: completion queue: %w", r.desc, ErrClosed)
	}
	q, err := newRBDQueue(false)
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", r.desc, err)
	}
	return &rbdCompletions{r: r, q: q}, nil
}

// Start starts io (rbd_aio_read or rbd_aio_write) without waiting for it,
// holding r.mu for reading only while librbd takes it, so that Close never
// closes the image under the call. A durable write is a write: with
// librbd's cache off a completed write is durable. With the cache on
// Start refuses one (ErrUnsupported), since it would need a flush after
// it; callers plan those elsewhere.
func (c *rbdCompletions) Start(io IO, tag uint64) error {
	r := c.r
	n := int64(len(io.Buf))
	op, name := C.int(aioRead), "read"
	if io.Write {
		op, name = aioWrite, "write"
		if io.Durable && r.cache {
			return r.opError("durable write", io.Off, n, fmt.Errorf("librbd's cache is on: a durable write needs a flush: %w", ErrUnsupported))
		}
	}
	err := r.with(io.Off, n, io.Buf, io.Write, func(a *rbdAIO) error {
		return rbdErrnoFenced(c.q.start(a.img.img, op, io.Off, n, io.Buf, tag))
	})
	if err != nil {
		return r.opError(name, io.Off, n, err)
	}
	return nil
}

// Fd is the queue's eventfd: readable (a count above zero) once a
// completion waits to be reaped.
func (c *rbdCompletions) Fd() int { return int(c.q.efd.Fd()) }

// Reap hands out every completion waiting: fn(tag, res), res the bytes
// transferred or -errno.
func (c *rbdCompletions) Reap(fn func(tag uint64, res int64)) int { return c.q.reap(fn) }

// Close frees the queue; every I/O started on it must have been reaped.
func (c *rbdCompletions) Close() error {
	if err := c.q.close(); err != nil {
		return fmt.Errorf("backend %s: %w", c.r.desc, err)
	}
	return nil
}
