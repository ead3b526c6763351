//go:build rbd

package backend

/*
#include <errno.h>
#include <stdint.h>
#include <rbd/librbd.h>

enum { vdisk_aio_read, vdisk_aio_write, vdisk_aio_flush, vdisk_aio_discard, vdisk_aio_zeroes };

// vdisk_rbd_aio starts one asynchronous operation on img whose completion
// carries id as its argument and has no callback: it is reaped through the
// image's event notification (vdisk_rbd_reap). A negative return is an
// operation that did not start (its completion is released).
static int vdisk_rbd_aio(rbd_image_t img, int op, uint64_t id, uint64_t off, uint64_t len, char *buf) {
	rbd_completion_t c;
	int r = rbd_aio_create_completion((void *)(uintptr_t)id, NULL, &c);
	if (r < 0)
		return r;
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
	if (r < 0)
		rbd_aio_release(c);
	return r;
}

// vdisk_rbd_reap takes up to max completed operations off img's event
// queue, stores each one's id and return value, and releases it; it
// returns how many it took.
static int vdisk_rbd_reap(rbd_image_t img, uint64_t *ids, int64_t *rets, int max) {
	rbd_completion_t comps[max];
	int n = rbd_poll_io_events(img, comps, max);
	for (int i = 0; i < n; i++) {
		ids[i] = (uint64_t)(uintptr_t)rbd_aio_get_arg(comps[i]);
		rets[i] = rbd_aio_get_return_value(comps[i]);
		rbd_aio_release(comps[i]);
	}
	return n;
}
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rbdAIO is the RBD backend's data path: librbd's asynchronous C API on
// the image handle that holds the lock, with completions delivered to Go
// without an OS thread per I/O in flight.
//
// How a completion reaches its caller: every operation is started with
// rbd_aio_* and a completion with no callback whose argument is the
// integer id of a waiting request (never a Go pointer: librbd keeps it
// past the call). The image is set up with rbd_set_image_notification on
// an eventfd, so librbd's completion thread, after an operation
// completes, queues its completion on the image and writes the eventfd.
// One poller goroutine reads the eventfd through Go's netpoller (a
// goroutine parked in epoll, not a thread in a system call), drains the
// queue with rbd_poll_io_events (one cgo call per batch of up to
// rbdReapBatch completions), and hands each return value to the waiting
// goroutine on its channel. A caller so blocks only its goroutine. This
// is the eventfd path fio's rbd engine and QEMU's older rbd driver use.
//
// The alternative, a librbd callback calling an exported Go function,
// would run Go code on librbd's single completion thread (the image's API
// strand): that thread would have to get a P from the Go scheduler for
// every completion and would stall every other completion while waiting
// for one on a busy machine. The eventfd costs one write by librbd and one
// read by the poller per batch, not per I/O.
//
// The buffer of a read or write stays in librbd's hands until the
// operation completes, after the cgo call returned: it is pinned
// (runtime.Pinner) for that long, as the cgo rules require.
//
// Concurrency: start may be called from any number of goroutines at once;
// close must follow every start's return (the RBD backend's mutex orders
// them), and closes the image too.
type rbdAIO struct {
	img  *rbdImage
	efd  *os.File      // the eventfd librbd writes on completion; nonblocking, in the netpoller
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
	pin  runtime.Pinner
}

// rbdReapBatch is how many completions the poller takes per cgo call.
const rbdReapBatch = 64

// The operations of start.
const (
	aioRead    = C.vdisk_aio_read
	aioWrite   = C.vdisk_aio_write
	aioFlush   = C.vdisk_aio_flush
	aioDiscard = C.vdisk_aio_discard
	aioZeroes  = C.vdisk_aio_zeroes
)

// newRBDAIO sets img up for event notification and starts the poller.
func newRBDAIO(img *rbdImage) (*rbdAIO, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd for librbd's completions: %w", err)
	}
	if err := rbdRet(C.rbd_set_image_notification(img.img, C.int(fd), C.EVENT_TYPE_EVENTFD)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("rbd_set_image_notification: %w", err)
	}
	// A nonblocking descriptor given to os.NewFile goes into the
	// netpoller: a Read parks the goroutine, not the thread.
	a := &rbdAIO{img: img, efd: os.NewFile(uintptr(fd), "rbd-completions"), done: make(chan struct{})}
	go a.poll()
	return a, nil
}

// start runs one operation and waits for its completion, parking only
// the calling goroutine. It returns librbd's return value (>= 0: bytes
// for a read, 0 or bytes otherwise) or the errno of a failure, whether
// the operation failed to start or completed with an error.
func (a *rbdAIO) start(op C.int, off, n int64, buf []byte) (int64, error) {
	req := a.get()
	var p *C.char
	if len(buf) > 0 {
		req.pin.Pin(&buf[0])
		p = (*C.char)(unsafe.Pointer(&buf[0]))
	}
	a.started.Add(1)
	ret := C.vdisk_rbd_aio(a.img.img, op, C.uint64_t(req.id), C.uint64_t(off), C.uint64_t(n), p)
	var res int64
	if ret < 0 {
		a.completed.Add(1)
		res = int64(ret)
	} else {
		res = <-req.done
	}
	req.pin.Unpin()
	a.put(req)
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

// poll is the poller goroutine: wait for the eventfd, then drain the
// image's completions, until close. The eventfd is read (reset) before the
// queue is drained, so a completion queued after the drain has written
// it again and wakes the next round.
func (a *rbdAIO) poll() {
	defer close(a.done)
	var ids [rbdReapBatch]C.uint64_t
	var rets [rbdReapBatch]C.int64_t
	var b [8]byte
	for {
		if _, err := a.efd.Read(b[:]); err != nil {
			// Only a closed descriptor fails a read of an eventfd, and
			// close closes it only after the poller returned.
			panic(fmt.Sprintf("rbd: read of the completion eventfd: %v", err))
		}
		for {
			n := int(C.vdisk_rbd_reap(a.img.img, &ids[0], &rets[0], rbdReapBatch))
			for i := range max(n, 0) {
				a.complete(uint64(ids[i]), int64(rets[i]))
			}
			if n < rbdReapBatch {
				break
			}
		}
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

// errAIOInFlight is close's complaint about a caller that broke its rule.
var errAIOInFlight = errors.New("operations still in flight")

// close ends the poller, closes the image and then the eventfd (librbd
// holds the eventfd's number until the image is closed). Every start must
// have returned: no operation is in flight.
func (a *rbdAIO) close() error {
	a.stopping.Store(true)
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, werr := a.efd.Write(one[:])
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
	if cerr := a.efd.Close(); err == nil {
		err = cerr
	}
	if s, c := a.started.Load(), a.completed.Load(); s != c && err == nil {
		err = fmt.Errorf("%d started, %d completed: %w", s, c, errAIOInFlight)
	}
	return err
}
