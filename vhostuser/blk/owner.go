package blk

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
	"github.com/vdiskfs/vdiskfs/vhostuser"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

const (
	// Tags of the owner ring's completions.
	kickTag = ^uint64(0)     // the read of the queue's kick eventfd
	wakeTag = ^uint64(0) - 1 // the read of the owner's wake eventfd
	reapTag = ^uint64(0) - 2 // the read of the completion queue's eventfd
	// ioTag marks a backing I/O: ioTag | slot<<24 | piece<<12 | the I/O's
	// index in the piece's plan.
	ioTag = uint64(1) << 62

	// maxPieces is the most contiguous data pieces a request may have
	// for its owner to plan it (a piece per data descriptor at most);
	// maxPlanIOs the most backing I/Os per piece. More fragmented
	// requests go to a worker.
	maxPieces  = segMax
	maxPlanIOs = 8
	// workersPerQueue serve a queue's requests that may block (FLUSH,
	// DISCARD, WRITE_ZEROES, and reads and writes the planner declined).
	workersPerQueue = 4
	// ringEntries is the size of an owner's submission queue.
	ringEntries = 512
)

// owner serves one virtqueue on a goroutine locked to its thread, with an
// io_uring of its own: it waits there for the kick eventfd, for its wake
// eventfd (workers' completions, stop) and for the backend's completion
// queue, takes requests off the ring, issues their backing I/O on its
// ring (planned through the Disk's IO, straight into guest memory), and
// returns them on the used ring. Requests that may block go to its
// workers.
type owner struct {
	d    *device
	q    *vhostuser.Queue
	ring *virtq.Ring
	log  logrus.FieldLogger
	efd  int // the owner's wake eventfd
	cq   door.Completions

	// Only the owner uses these.
	reqs     []request
	free     []int // free request slots
	taken    int   // requests taken off the ring and not returned
	pushed   bool  // returned since the last NeedSignal
	broken   bool  // the ring broke the rules: take nothing more
	sqe      iouring.SQE
	sqes     [maxPlanIOs]iouring.SQE // a direct request's entries (issueDirect)
	spareIOs []IO                    // plans not in use, shared by the slots' pieces
	// bufs is a page of its own (mmap) holding the targets of the
	// eventfd reads (kick, wake, reap; 8 bytes each): a read the kernel
	// completes while tearing the ring down then lands in a mapping
	// unmapped after the ring is closed (EFAULT), never in Go's heap.
	bufs     []byte
	armed    [3]bool
	stopping bool
	yielder  iouring.Yielder

	// mu guards the requests workers have done and the owner's sleep.
	mu struct {
		sync.Mutex
		done, spare []*request
		sleeping    bool
		stop        bool
		exited      bool // efd is closed
	}
	work   chan *request
	wg     sync.WaitGroup // workers
	exited chan struct{}
}

func startOwner(d *device, q *vhostuser.Queue) (*owner, error) {
	n := int(q.Ring.Size())
	o := &owner{d: d, q: q, ring: q.Ring, log: d.log.WithField("queue", q.Index),
		reqs: make([]request, n), free: make([]int, 0, n), work: make(chan *request, n), exited: make(chan struct{})}
	var err error
	if o.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	if o.cq, err = d.disk.NewCompletions(); err != nil {
		unix.Close(o.efd)
		return nil, err
	}
	for i := n - 1; i >= 0; i-- {
		o.reqs[i].o, o.reqs[i].slot = o, i
		o.free = append(o.free, i)
	}
	for range workersPerQueue {
		o.wg.Add(1)
		go func() {
			defer o.wg.Done()
			for r := range o.work {
				o.d.serveBlocking(r)
				o.finish(r)
			}
		}()
	}
	started := make(chan error, 1)
	go o.own(started)
	if err := <-started; err != nil {
		<-o.exited
		return nil, err
	}
	return o, nil
}

// stop makes the owner take no more requests, waits until every request
// it took is returned, and for it to exit.
func (o *owner) stop() {
	o.mu.Lock()
	o.mu.stop = true
	if !o.mu.exited { // as in finish
		iouring.Notify(o.efd)
	}
	o.mu.Unlock()
	<-o.exited
}

// finish hands a request a worker served back to the owner.
func (o *owner) finish(r *request) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.mu.done = append(o.mu.done, r)
	// Under mu: the owner closes the eventfd under mu too, and a finish
	// that lost the race with the owner's exit must not write to a
	// descriptor number that may have been reused.
	if o.mu.sleeping && !o.mu.exited {
		iouring.Notify(o.efd)
	}
}

func (o *owner) own(started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
	defer close(o.exited)
	defer func() {
		o.mu.Lock()
		o.mu.exited = true
		unix.Close(o.efd)
		o.mu.Unlock()
	}()
	defer func() {
		close(o.work)
		o.wg.Wait()
	}()
	if o.cq != nil {
		defer func() { // after the ring is closed: nothing in flight
			if err := o.cq.Close(); err != nil {
				o.log.WithError(err).Warn("vhost-user: close the completion queue")
			}
		}()
	}
	var err error
	if o.bufs, err = unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS); err != nil {
		started <- fmt.Errorf("queue %d: %w", o.q.Index, err)
		return
	}
	defer unix.Munmap(o.bufs) // after the ring is closed
	rg, err := iouring.Setup(ringEntries, 4*ringEntries, iouring.SetupSingleIssuer|iouring.SetupDeferTaskrun)
	if err != nil {
		started <- fmt.Errorf("queue %d: %w", o.q.Index, err)
		return
	}
	defer rg.Close()
	started <- nil
	o.serve(rg)
}

// serve is the owner's loop.
func (o *owner) serve(rg *iouring.Ring) {
	for {
		o.mu.Lock()
		done := o.mu.done
		o.mu.done = o.mu.spare[:0]
		o.mu.spare = done
		o.stopping = o.mu.stop
		o.mu.Unlock()
		for _, r := range done {
			o.complete(r)
		}
		more := false
		if !o.stopping && !o.broken {
			o.take(rg)
			// Ask for a kick before sleeping, and look again: the driver
			// may have added entries before it saw the request.
			more = len(o.free) > 0 && o.ring.EnableNotify()
		}
		if o.pushed {
			o.pushed = false
			if o.ring.NeedSignal() && o.q.Call >= 0 {
				iouring.Notify(o.q.Call)
			}
		}
		if o.stopping && o.taken == 0 {
			return
		}
		o.arm(rg)
		o.yield(rg)
		// Sleep unless there is more to do now; a worker that finishes a
		// request meanwhile wakes a sleeping owner (finish).
		o.mu.Lock()
		sleep := !more && len(o.mu.done) == 0 && o.mu.stop == o.stopping
		o.mu.sleeping = sleep
		o.mu.Unlock()
		o.enter(rg, sleep)
		if sleep {
			o.mu.Lock()
			o.mu.sleeping = false
			o.mu.Unlock()
		}
		rg.Reap(func(c iouring.CQE) {
			switch c.UserData {
			case kickTag:
				o.armed[0] = false
			case wakeTag:
				o.armed[1] = false
			case reapTag:
				o.armed[2] = false
				o.cq.Reap(o.ioDone)
			default:
				o.ioDone(c.UserData, int64(c.Res))
			}
		})
	}
}

// yield passes through the Go scheduler when the owner's Yielder says
// so, after submitting what is on the ring so that no I/O waits for it.
func (o *owner) yield(rg *iouring.Ring) {
	if o.yielder.Due() {
		o.enter(rg, false)
		o.yielder.Yield()
	}
}

// arm keeps a read armed on each eventfd the owner waits for.
func (o *owner) arm(rg *iouring.Ring) {
	fds := [3]int{o.q.Kick, o.efd, -1}
	tags := [3]uint64{kickTag, wakeTag, reapTag}
	if o.cq != nil {
		fds[2] = o.cq.Fd()
	}
	for i, fd := range fds {
		if fd < 0 || o.armed[i] || (i == 0 && (o.stopping || o.broken)) {
			continue
		}
		o.room(rg, 1)
		rg.Put(iouring.ReadEventfd(fd, o.bufs[8*i:], tags[i]))
		o.armed[i] = true
	}
}

// room makes sure n entries can be put on rg.
func (o *owner) room(rg *iouring.Ring, n uint32) {
	for rg.Pending()+n > rg.SQEntries() {
		o.enter(rg, false)
	}
}

func (o *owner) enter(rg *iouring.Ring, wait bool) {
	// A broken ring's memory may still be written by the kernel into
	// guest memory: neither going on nor stopping is safe.
	if err := rg.Enter(wait); err != nil && !iouring.Transient(err) {
		panic(fmt.Sprintf("vhost-user queue %d: io_uring_enter: %v", o.q.Index, err))
	}
}

// take takes available requests while there are free slots, and submits
// the backing I/O of small ones as it goes (package door: "Submitting a
// burst").
func (o *owner) take(rg *iouring.Ring) {
	for len(o.free) > 0 {
		r := &o.reqs[o.free[len(o.free)-1]]
		ok, err := o.ring.Pop(&r.chain)
		if errors.Is(err, virtq.ErrBadRing) {
			o.log.WithError(err).Error("vhost-user: queue broken: no more requests taken")
			o.broken = true
			return
		}
		if !ok {
			return
		}
		o.free = o.free[:len(o.free)-1]
		o.taken++
		o.d.st.inflight.Add(1)
		r.start = time.Now()
		if err != nil {
			o.bad(r, err)
			continue
		}
		if size := o.startRequest(rg, r); door.SubmitNow(size, rg.Pending()) {
			o.enter(rg, false)
		}
	}
}

// bad answers a request whose chain or header broke the rules.
func (o *owner) bad(r *request, err error) {
	// A guest can send bad requests as fast as good ones: the first few
	// are logged, then only every power of two, with the count.
	if n := o.d.st.bad.Add(1); n <= 8 || n&(n-1) == 0 {
		o.log.WithError(err).WithField("bad_requests", n).Warn("vhost-user: bad request")
	}
	r.op, r.status = -1, statusIOErr
	o.complete(r)
}

// complete writes r's status and returns it on the used ring; a write
// that a daemon started after this one dies would not read back waits
// for a commit first (Restartable).
func (o *owner) complete(r *request) {
	r.unstage(o.d, r.status == statusOK)
	if c := o.d.commit; c != nil && !r.committed && r.status == statusOK &&
		(r.op == opWrite || r.op == opDiscard || r.op == opWriteZeroes) && !c.disk.WritesRecoverable() {
		o.d.st.held.Add(1)
		c.hold(r)
		return
	}
	written := uint32(0)
	if st := r.statusByte(); st != nil {
		st[0] = r.status
		written = 1
		if r.status == statusOK {
			written += r.written
		}
	}
	o.ring.Push(r.chain.Head, written)
	o.pushed = true
	if r.op >= 0 {
		o.d.st.ops[r.op].observe(time.Since(r.start), r.bytes, r.status == statusIOErr)
	}
	o.d.st.inflight.Add(-1)
	o.taken--
	o.free = append(o.free, r.slot)
}

// toWorker hands r to a worker (never blocks: room for every slot).
func (o *owner) toWorker(r *request) { o.work <- r }

// startRequest serves r on the owner if it can, else hands it to a
// worker. It returns the bytes r covers, read before r may have gone to
// a worker (from then on the worker owns it).
func (o *owner) startRequest(rg *iouring.Ring, r *request) (size int) {
	if err := r.parse(o.d); err != nil {
		o.bad(r, err)
		return 0
	}
	size = int(r.bytes)
	if r.status == statusPending {
		r.stageIn(o.d)
	}
	switch {
	case r.status != statusPending: // answered by parse (GET_ID, UNSUPP, out of range)
		if r.status == statusUnsupp {
			o.d.st.unsupported.Add(1)
		}
		o.complete(r)
	case (r.op == opRead || r.op == opWrite) && o.plan(rg, r):
	default:
		if r.op == opRead || r.op == opWrite {
			o.d.st.fallbacks.Add(1)
		}
		r.undirect(o.d)
		o.toWorker(r)
	}
	return size
}

// plan plans r's data (its stage, or its pieces) and issues their
// backing I/O. False, with nothing held: a worker serves r.
func (o *owner) plan(rg *iouring.Ring, r *request) bool {
	data := r.data()
	if len(data) > maxPieces {
		return false
	}
	off := r.off
	r.ios = r.ios[:0]
	for _, p := range data {
		io := o.takeIO()
		r.ios = append(r.ios, io)
		if !io.Start(p, off, r.op == opWrite, maxPlanIOs) {
			r.ios = r.ios[:len(r.ios)-1]
			o.spareIOs = append(o.spareIOs, io)
			o.endIOs(r, false)
			return false
		}
		off += int64(len(p))
	}
	if r.direct {
		if o.issueDirect(rg, r) {
			return true
		}
		r.undirect(o.d)
	}
	r.pending, r.failed = 0, false
	for i := range data {
		pl := r.ios[i].Plan()
		if pl.Bytes() != len(data[i]) {
			r.failed = true
		}
		for k := range pl.IOs() {
			tag := ioTag | uint64(r.slot)<<24 | uint64(i)<<12 | uint64(k)
			o.sqe = iouring.SQE{}
			switch {
			case pl.Async():
				if pl.Start(k, tag) == nil {
					r.pending++
				} else {
					r.failed = true
				}
			case pl.PrepareSQE(&o.sqe, k):
				o.sqe.UserData = tag
				o.room(rg, 1)
				rg.Put(o.sqe)
				r.pending++
			default:
				if pl.Do(k) != nil {
					r.failed = true
				}
			}
		}
	}
	if r.pending == 0 {
		o.endPlanned(r)
	}
	return true
}

// issueDirect issues a direct request's plan (one piece: its stage) as
// vectored I/O straight from and into the request's pieces, if every I/O
// of the plan can go so: on the owner's ring (neither Async nor Do), a
// plain read or write within the stage, the I/Os covering the whole stage
// (a read of holes has them zeroed in the stage). False, with nothing
// issued: the caller issues the plan through the stage (undirect).
func (o *owner) issueDirect(rg *iouring.Ring, r *request) bool {
	pl := r.ios[0].Plan()
	n := pl.IOs()
	if pl.Async() || n > len(o.sqes) || pl.Bytes() != len(r.stage) || pl.CipherBytes() != 0 {
		return false
	}
	base := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(r.stage))))
	covered := 0
	for k := range n {
		s := &o.sqes[k]
		*s = iouring.SQE{}
		if !pl.PrepareSQE(s, k) || (s.Opcode != iouring.OpRead && s.Opcode != iouring.OpWrite) ||
			int(s.Len) != pl.IOLen(k) || s.Addr < base || s.Addr+uint64(s.Len) > base+uint64(len(r.stage)) {
			return false
		}
		covered += int(s.Len)
	}
	if covered != len(r.stage) {
		return false
	}
	if cap(r.iov) == 0 {
		r.iov = make([]unix.Iovec, 0, maxPieces+maxPlanIOs) // a piece each, and a split at each I/O's end
	}
	r.iov = r.iov[:0]
	for k := range n {
		s := &o.sqes[k]
		iouring.Vectored(s, r.vectors(int(s.Addr-base), int(s.Len)))
		s.UserData = ioTag | uint64(r.slot)<<24 | uint64(k) // piece 0
		o.room(rg, 1)
		rg.Put(*s)
	}
	r.pending, r.failed = n, false
	o.d.st.vectored.Add(1)
	return true
}

// takeIO returns a plan from the owner's spares, or a new one: the
// spares grow to the most pieces in flight at once, then allocate no more.
func (o *owner) takeIO() IO {
	if k := len(o.spareIOs); k > 0 {
		io := o.spareIOs[k-1]
		o.spareIOs = o.spareIOs[:k-1]
		return io
	}
	return o.d.disk.NewIO(o.cq)
}

// endIOs ends r's plans (ok: every I/O transferred in full) and keeps
// them as spares.
func (o *owner) endIOs(r *request, ok bool) {
	for _, io := range r.ios {
		io.End(ok)
	}
	o.spareIOs = append(o.spareIOs, r.ios...)
	r.ios = r.ios[:0]
}

// ioDone takes the completion of one backing I/O.
func (o *owner) ioDone(tag uint64, res int64) {
	if tag&ioTag == 0 {
		return
	}
	r := &o.reqs[(tag&^ioTag)>>24]
	piece, k := int(tag>>12&0xfff), int(tag&0xfff)
	if res < 0 || res != int64(r.ios[piece].Plan().IOLen(k)) {
		r.failed = true
	}
	if r.pending--; r.pending == 0 {
		o.endPlanned(r)
	}
}

// endPlanned ends a planned request whose I/O has all completed: it is
// answered, or served again by a worker (which reports) if any failed.
func (o *owner) endPlanned(r *request) {
	o.endIOs(r, !r.failed)
	if r.failed {
		o.d.st.fallbacks.Add(1)
		r.undirect(o.d)
		o.toWorker(r)
		return
	}
	r.status = statusOK
	o.complete(r)
}
