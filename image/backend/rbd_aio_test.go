//go:build rbd

package backend

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The asynchronous data path (rbd_aio.go) under load: many goroutines at
// once mixing reads, writes, write-zeroes, discards and flushes on their
// own stripes of the image, against a model; every operation started is
// completed, and requests are reused rather than one made per operation.
func TestRBDAIOConcurrentMixed(t *testing.T) {
	const size, bs, workers, perWorker = 32 << 20, 64 << 10, 48, 40
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	model := make([]byte, size)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			p, q := alignedBuffer(bs, 4096), alignedBuffer(bs, 4096)
			for i := range perWorker {
				// Worker w owns the blocks b with b % workers == w: its
				// part of the model is its own.
				blk := int64(rng.IntN(size/bs/workers)*workers + w)
				off := blk * bs
				var err error
				switch op := rng.IntN(10); {
				case op < 5:
					for j := range p {
						p[j] = byte(w*7 + i + j)
					}
					_, err = r.WriteAt(p, off)
					copy(model[off:], p)
				case op < 7:
					// Zero part of the block, sector-aligned.
					zo, zn := int64(rng.IntN(64))*512, int64(1+rng.IntN(64))*512
					err = r.WriteZeroes(off+zo, zn)
					clear(model[off+zo : off+zo+zn])
				case op < 8:
					err = r.Flush()
				default:
					_, err = r.ReadAt(q, off)
					if err == nil && !bytes.Equal(q, model[off:off+bs]) {
						err = fmt.Errorf("worker %d: block %d reads back other bytes (byte %d)", w, blk, firstDiff(q, model[off:off+bs]))
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := alignedBuffer(size, 4096)
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("byte %d is %d, want %d", i, got[i], model[i])
	}
	a := r.mu.aio
	if s, c := a.started.Load(), a.completed.Load(); s != c || s < workers*perWorker {
		t.Errorf("started %d, completed %d operations", s, c)
	}
	a.mu.Lock()
	reqs := len(a.mu.reqs)
	a.mu.Unlock()
	if reqs > workers+1 {
		t.Errorf("%d requests made for %d goroutines", reqs, workers)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// An I/O in flight parks a goroutine, not an OS thread: 256 reads at once
// make the runtime create no threads (a few at most), where go-ceph's
// synchronous ReadAt, each call blocked in cgo holding its thread, made
// the runtime create 19 on the test cluster.
func TestRBDAIONoThreadPerIO(t *testing.T) {
	const size, n = 16 << 20, 256
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	buf := alignedBuffer(4096, 4096)
	if _, err := r.ReadAt(buf, 0); err != nil { // warm up: the first I/O starts librbd's threads
		t.Fatal(err)
	}
	threads := pprof.Lookup("threadcreate")
	before := threads.Count()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			p := alignedBuffer(4096, 4096)
			<-start
			if _, err := r.ReadAt(p, int64(i%(size/4096))*4096); err != nil {
				mu.Lock()
				firstErr = errors.Join(firstErr, err)
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	if grown := threads.Count() - before; grown > 4 {
		t.Errorf("%d reads at once created %d threads", n, grown)
	} else {
		t.Logf("%d reads at once created %d threads", n, grown)
	}
}

// What librbd itself says about a range past the end of the image,
// through the asynchronous path without the backend's range check: a read
// that starts inside and ends outside is cut short (its return value says
// so, and ReadAt would report io.ErrUnexpectedEOF), one wholly outside
// reads nothing or fails. ReadAt's range check refuses both first.
func TestRBDAIOPastEnd(t *testing.T) {
	const size = 8 << 20
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	a := r.mu.aio
	buf := alignedBuffer(4096, 4096)
	ret, err := a.start(aioRead, size-512, 4096, buf)
	if err != nil || ret != 512 {
		t.Errorf("aio read of 4096 bytes at %d of %d: %d, %v; want 512 bytes", size-512, size, ret, err)
	}
	ret, err = a.start(aioRead, size+4096, 4096, buf)
	if err == nil && ret != 0 {
		t.Errorf("aio read wholly past the end: %d, %v", ret, err)
	}
	t.Logf("aio read wholly past the end: %d, %v", ret, err)
	// Through ReadAt the range check refuses both, before librbd.
	for _, off := range []int64{size - 512, size + 4096} {
		if _, err := r.ReadAt(buf, off); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("ReadAt at %d: %v, want ErrOutOfRange", off, err)
		}
	}
	if s, c := a.started.Load(), a.completed.Load(); s != c {
		t.Errorf("started %d, completed %d", s, c)
	}
}

// Write-zeroes and discard through the asynchronous path: zeroes of whole
// objects, of pieces of objects and of single sectors read as zeros, the
// rest keeps its bytes; an empty range is a no-op.
func TestRBDAIOZeroesDiscard(t *testing.T) {
	const size = 20 << 20
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	model := make([]byte, size)
	for i := range model {
		model[i] = byte(i%253 + 1)
	}
	p := alignedBuffer(size, 4096)
	copy(p, model)
	if _, err := r.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	for _, z := range [][2]int64{{0, 4 << 20}, {8 << 20, 512}, {9<<20 + 4096, 3<<20 - 8192}, {size - 1024, 1024}, {100 * 512, 0}} {
		if err := r.WriteZeroes(z[0], z[1]); err != nil {
			t.Fatalf("write zeroes %d at %d: %v", z[1], z[0], err)
		}
		clear(model[z[0] : z[0]+z[1]])
	}
	if err := r.Discard(12<<20, 0); err != nil {
		t.Fatalf("empty discard: %v", err)
	}
	got := alignedBuffer(size, 4096)
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, model); i >= 0 {
		t.Fatalf("byte %d is %d, want %d", i, got[i], model[i])
	}
	if err := r.Discard(16<<20, 4<<20); err != nil {
		t.Fatalf("discard: %v", err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
}

// After another client broke the lock (blocklisting this one), every
// operation of the old holder fails with the real errno, ESHUTDOWN, and
// ErrFenced: writes, writes in flight at the moment of the break (none
// hangs), write-zeroes, discards and flushes; Close does not hang.
func TestRBDAIOFencedErrors(t *testing.T) {
	const size = 16 << 20
	name := newRBDImage(t, size)
	a := openRBDTest(t, name, OpenOptions{})
	p := alignedBuffer(64<<10, 4096)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}

	// Writers keep going while the lock is broken under them.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	fenced := make(chan error, 16)
	for w := range 16 {
		wg.Go(func() {
			q := alignedBuffer(4096, 4096)
			for i := 0; ; i++ {
				_, err := a.WriteAt(q, int64((w*64+i%64)*4096))
				if err != nil {
					fenced <- err
					return
				}
				select {
				case <-stop:
					fenced <- nil
					return
				default:
				}
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	if _, err := BreakLock(name); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		close(stop)
		t.Fatal("writers of the blocklisted holder hang")
	}
	close(fenced)
	for err := range fenced {
		if !errors.Is(err, ErrFenced) || !errors.Is(err, syscall.ESHUTDOWN) {
			t.Errorf("a writer of the blocklisted holder ended with %v; want ErrFenced, ESHUTDOWN", err)
		}
	}

	for what, err := range map[string]error{
		"write":        firstErr(a.WriteAt(p, 0)),
		"write zeroes": a.WriteZeroes(0, 4096),
		"discard":      a.Discard(0, 4<<20),
		"flush":        a.Flush(),
	} {
		if !errors.Is(err, ErrFenced) || !errors.Is(err, syscall.ESHUTDOWN) {
			t.Errorf("%s of the blocklisted holder: %v; want ErrFenced, ESHUTDOWN", what, err)
		}
	}
	if _, err := a.ReadAt(p[:4096], 0); err == nil {
		t.Logf("read of the blocklisted holder succeeded")
	} else if !errors.Is(err, syscall.ESHUTDOWN) {
		t.Errorf("read of the blocklisted holder: %v; want ESHUTDOWN", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-closed:
		t.Logf("close of the blocklisted holder: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("close of the blocklisted holder hangs")
	}
}

// reapCQ waits (at most a minute in all) on cq's eventfd, as a FUSE
// queue's owner does on its ring, until n completions have been reaped,
// and returns their results by tag.
func reapCQ(t *testing.T, cq CompletionQueue, n int) map[uint64]int64 {
	t.Helper()
	res := make(map[uint64]int64, n)
	var b [8]byte
	deadline := time.Now().Add(time.Minute)
	for len(res) < n {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatalf("waited a minute for %d completions; %d came", n, len(res))
		}
		fds := []unix.PollFd{{Fd: int32(cq.Fd()), Events: unix.POLLIN}}
		if k, err := unix.Poll(fds, int(left.Milliseconds())+1); err == unix.EINTR || k == 0 {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		if _, err := unix.Read(cq.Fd(), b[:]); err != nil {
			t.Fatal(err)
		}
		cq.Reap(func(tag uint64, r int64) {
			if _, dup := res[tag]; dup {
				t.Errorf("tag %d completed twice", tag)
			}
			res[tag] = r
		})
	}
	return res
}

// newRBDQueueTest opens a new image of size bytes and makes a completion
// queue on it, and n buffers of bs bytes.
func newRBDQueueTest(t *testing.T, size int64, n, bs int) (string, *RBD, CompletionQueue, [][]byte) {
	t.Helper()
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	cq, err := r.NewCompletionQueue()
	if err != nil {
		t.Fatal(err)
	}
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = alignedBuffer(bs, 4096)
	}
	return name, r, cq, bufs
}

// closeWithin runs close and returns its error, failing the test if it
// has not returned within a minute.
func closeWithin(t *testing.T, what string, close func() error) error {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- close() }()
	select {
	case err := <-closed:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s hangs", what)
		return nil
	}
}

// A completion queue (AsyncSubmitter, the FUSE queue owner's path): I/O
// started from one goroutine without waiting completes through the
// queue's eventfd with its tag and its length as result; writes read
// back right, through the queue and through ReadAt; the checks refuse
// what they refuse elsewhere without starting anything; Close refuses a
// queue with I/O not reaped. Closing the backend with the queue's reads
// in flight does not hang, and they are still reaped afterwards.
func TestRBDCompletionQueue(t *testing.T) {
	const size, bs, n = 16 << 20, 4096, 64
	_, r, cq, bufs := newRBDQueueTest(t, size, n, bs)
	for i := range bufs {
		for j := range bufs[i] {
			bufs[i][j] = byte(i + 1)
		}
		if err := cq.Start(IO{Off: int64(i) * 3 * bs, Buf: bufs[i], Write: true, Durable: i%2 == 0}, uint64(1000+i)); err != nil {
			t.Fatalf("start write %d: %v", i, err)
		}
	}
	if err := cq.Close(); !errors.Is(err, errNotReaped) {
		t.Errorf("close with writes in flight: %v, want errNotReaped", err)
	}
	for tag, res := range reapCQ(t, cq, n) {
		if tag < 1000 || tag >= 1000+n || res != bs {
			t.Errorf("write tag %d: result %d, want %d", tag, res, bs)
		}
	}
	for i := range bufs {
		clear(bufs[i])
		if err := cq.Start(IO{Off: int64(i) * 3 * bs, Buf: bufs[i]}, uint64(i)); err != nil {
			t.Fatalf("start read %d: %v", i, err)
		}
	}
	for tag, res := range reapCQ(t, cq, n) {
		if res != bs || !bytes.Equal(bufs[tag], bytes.Repeat([]byte{byte(tag + 1)}, bs)) {
			t.Errorf("read tag %d: result %d, bytes %x...", tag, res, bufs[tag][:4])
		}
	}
	got := alignedBuffer(bs, 4096)
	if _, err := r.ReadAt(got, 5*3*bs); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{6}, bs)) {
		t.Errorf("ReadAt of a block written through the queue: %v, %x...", err, got[:4])
	}
	for what, io := range map[string]IO{
		"past the end":     {Off: size, Buf: bufs[0]},
		"unaligned offset": {Off: 100, Buf: bufs[0]},
		"unaligned length": {Off: 0, Buf: bufs[0][:100]},
	} {
		if err := cq.Start(io, 7); err == nil {
			t.Errorf("start %s: started", what)
			reapCQ(t, cq, 1)
		}
	}

	// Close the backend under reads in flight: it returns, the reads
	// complete (done or failed) and are reaped, the queue then closes,
	// and nothing starts on a closed backend.
	for i := range bufs {
		if err := cq.Start(IO{Off: int64(i) * bs, Buf: bufs[i]}, uint64(i)); err != nil {
			t.Fatalf("start read %d: %v", i, err)
		}
	}
	if err := closeWithin(t, "close with the queue's reads in flight", r.Close); err != nil {
		t.Errorf("close with the queue's reads in flight: %v", err)
	}
	reapCQ(t, cq, n)
	if err := cq.Start(IO{Off: 0, Buf: bufs[0]}, 0); !errors.Is(err, ErrClosed) {
		t.Errorf("start on a closed backend: %v, want ErrClosed", err)
	}
	if err := cq.Close(); err != nil {
		t.Errorf("close the queue: %v", err)
	}
	if _, err := r.NewCompletionQueue(); !errors.Is(err, ErrClosed) {
		t.Errorf("completion queue of a closed backend: %v, want ErrClosed", err)
	}
}

// After another client broke the lock (blocklisting this one), I/O on a
// completion queue fails, at its start (ErrFenced) or at its completion
// (-ESHUTDOWN), and none hangs: writes in flight at the moment of the
// break complete one way or the other, every later one fails, and Close
// of the backend and of the queue return.
func TestRBDCompletionQueueFenced(t *testing.T) {
	const size, bs, n = 16 << 20, 4096, 32
	name, a, cq, bufs := newRBDQueueTest(t, size, n, bs)
	startAll := func() (started int) {
		for i := range bufs {
			err := cq.Start(IO{Off: int64(i) * bs, Buf: bufs[i], Write: true}, uint64(i))
			switch {
			case err == nil:
				started++
			case !errors.Is(err, ErrFenced) || !errors.Is(err, syscall.ESHUTDOWN):
				t.Errorf("start write %d of the blocklisted holder: %v; want ErrFenced, ESHUTDOWN", i, err)
			}
		}
		return started
	}
	started := startAll() // in flight while the lock is broken
	if _, err := BreakLock(name); err != nil {
		t.Fatal(err)
	}
	ok := 0
	for _, res := range reapCQ(t, cq, started) {
		if res == bs {
			ok++
		} else if res != -int64(syscall.ESHUTDOWN) {
			t.Errorf("a write in flight at the break: result %d", res)
		}
	}
	t.Logf("%d of %d writes in flight at the break completed", ok, started)
	started = startAll()
	for _, res := range reapCQ(t, cq, started) {
		if res != -int64(syscall.ESHUTDOWN) {
			t.Errorf("a write of the blocklisted holder: result %d; want -ESHUTDOWN", res)
		}
	}
	started = startAll() // in flight at Close
	t.Logf("close of the blocklisted holder: %v", closeWithin(t, "close of the blocklisted holder", a.Close))
	reapCQ(t, cq, started)
	if err := cq.Close(); err != nil {
		t.Errorf("close the queue: %v", err)
	}
}
