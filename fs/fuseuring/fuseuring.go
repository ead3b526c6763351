// Package fuseuring carries a FUSE connection's requests over io_uring
// (FUSE-over-io_uring, Linux 6.14 and later) instead of read(2) and
// writev(2) on /dev/fuse.
//
// # Why
//
// On /dev/fuse every request costs the server a read and a writev, and the
// kernel hands each request to whichever server thread is reading, usually
// on another CPU than the application that issued it. With io_uring the
// kernel keeps one queue per CPU: a request is delivered to the queue of
// the CPU it was issued on, as the completion of a command the server
// submitted in advance, and the reply goes back in the next submission,
// together with the request to fetch the next one. No syscall per request.
//
// # Design
//
// One Queue per possible CPU (the kernel requires all of them). Each has a
// goroutine locked to its own thread, pinned to the next CPU (ownerCPU:
// the kernel copies a request into its entry in this thread, which then
// runs beside the application instead of taking turns with it), that owns
// the queue's io_uring, set up with DEFER_TASKRUN: it registers Depth
// entries (a header buffer and a payload buffer each), and loops
// submitting and reaping. A completed entry holds a request.
//
// READ and WRITE requests the IOServer can map without waiting (aligned,
// the range free, blocks for any holes at hand) the owner serves itself: it
// submits their backing I/O on the same ring, straight into or out of the
// entry's payload buffer, and when that completes it queues the reply. The
// store prepares each ring entry (door.Plan.PrepareSQE; the backing's
// descriptor stays inside the store's backend); a backend without a
// ring (the memory and crash backends of tests) performs the I/O at once
// on the owner instead (Do), and the reply is queued right away.
//
// A backend whose I/O waits for the network (RBD: backend.AsyncSubmitter)
// gives each queue a completion queue of its own (door.Completions): the
// owner starts the request's I/O there without waiting (Plan.Start, an
// rbd_aio_* call), librbd's completion callback (pure C) queues the
// result and writes the completion queue's eventfd, and the owner keeps a
// read of that eventfd armed in its ring (reapTag) beside the wake read:
// when it completes, the owner reaps every completion (one cgo call),
// queues the replies, and arms the read again. So a request costs no
// goroutine and no thread wake-up in the server beyond the owner's own,
// as on a file.
// Small requests' backing I/O goes to the device a few requests at a
// time, larger requests' in one io_uring_enter per pass (package door,
// "Submitting a burst").
// Replies go in the next batch of commits. No goroutine and no thread is
// woken for such a request; 4 KiB random reads and writes cost the server
// a third of the CPU they cost through a worker.
//
// A large read of an encrypted disk (door.Plan.CipherBytes, bigCipher
// bytes and more) the owner hands, its I/O done, to a worker, which
// decrypts it and queues its reply like any worker's: meanwhile the owner
// goes on reaping and submitting the other requests' I/O, and the
// decryption runs on whichever CPU is free. A small write is encrypted as
// it is planned, on the owner; the IOServer may decline a large one (fs
// does, image's DeclineCipher), which a worker then serves whole.
//
// Every other request (and one whose backing I/O failed or came back
// short) goes to one of the queue's long-lived worker goroutines, which
// runs it through go-fuse's ProtocolServer (the same RawFileSystem as the
// /dev/fuse server, which still carries INIT, FORGET, INTERRUPT and
// notifications) with the reply written straight into the entry's buffers,
// then queues the entry for commit and wakes the owner through an eventfd
// read kept armed in the ring. The owner submits all queued commits in one
// io_uring_enter.
//
// Payload buffers are page-aligned mmap memory, so O_DIRECT backend I/O
// needs no copy on either path, backed by transparent huge pages where the
// kernel offers them (internal/hugepage). Two costs of a large request follow
// the buffer's pages: the kernel copies a WRITE's payload into the buffer
// pinning it a page at a time, and the backing I/O out of it takes a
// segment per physically contiguous piece. With 4 KiB pages a 1 MiB write
// was 256 segments, more than virtio-blk's 254 per request, so the device
// got two requests for it; with huge pages it gets one, and its copy pins
// a few large pages instead of 256 small ones. That is what brought large
// writes at iodepth 1 up to the raw file's speed.
//
// Invariants: only a queue's owner touches its ring and its completion
// queue; an entry is either with the kernel (registered or committed and
// fetching), with the owner (its backing I/O in flight, on the ring or on
// the completion queue), or with exactly one worker; the owner exits only
// when every entry has been given back by the kernel (unmount aborts the
// connection and completes them with ENOTCONN), or Close was called and no
// backing I/O is in flight; its completion queue is closed after the ring
// (so only once every I/O started there has been reaped), and its buffers
// are unmapped after the ring is closed.
package fuseuring

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/internal/hugepage"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// Linux ABI (include/uapi/linux/fuse.h).
const (
	cmdRegister       = 1 // FUSE_IO_URING_CMD_REGISTER
	cmdCommitAndFetch = 2 // FUSE_IO_URING_CMD_COMMIT_AND_FETCH

	inOutSize     = 128 // fuse_uring_req_header.in_out
	opInSize      = 128 // fuse_uring_req_header.op_in
	entInOutOff   = inOutSize + opInSize
	reqHeaderSize = entInOutOff + 32 // + struct fuse_uring_ent_in_out
	inHeaderSize  = int(unsafe.Sizeof(fuse.InHeader{}))
	outHeaderSize = int(unsafe.Sizeof(fuse.OutHeader{}))

	opRead  = 15
	opWrite = 16

	// headerStride is the room each entry has in the header mapping: the
	// request header, then the entry's two iovecs.
	headerStride = 512
	iovOff       = 384

	wakeTag = ^uint64(0)
	// reapTag marks the read of the completion queue's eventfd (an
	// AsyncSubmitter backend's completions are waiting).
	reapTag = ^uint64(0) - 1
	// ioTag marks the user data of a backing I/O issued by the owner:
	// ioTag | entry<<16 | the I/O's index in its plan.
	ioTag = uint64(1) << 62

	// maxPlanIOs is the most backing I/Os one READ or WRITE may take on
	// the owner; more fragmented requests go to a worker.
	maxPlanIOs = 8

	// bigCipher: a read of an encrypted disk with at least this many
	// bytes to decrypt (door.Plan.CipherBytes) is ended (decrypted) by a
	// worker, not the owner, so that the owner goes on feeding the device
	// and the ring while it runs, and the work spreads over the CPUs.
	// Below it the hand-off costs more than the work.
	bigCipher = 64 << 10

	writeOutSize = 8 // struct fuse_write_out

	// EnableParam is the module parameter that lets FUSE servers use io_uring.
	EnableParam = "/sys/module/fuse/parameters/enable_uring"
)

// entInOut is struct fuse_uring_ent_in_out.
type entInOut struct {
	flags     uint64
	commitID  uint64
	payloadSz uint32
	_         uint32
	_         uint64
}

// cmdReq is struct fuse_uring_cmd_req, the command area of each SQE.
type cmdReq struct {
	flags    uint64
	commitID uint64
	qid      uint16
	_        [6]byte
}

// Options configure Start.
type Options struct {
	// Depth is the number of entries (requests in the server at once) per
	// queue; 0 means 64.
	Depth int
	// MaxWrite is the mount's max_write (go-fuse MountOptions.MaxWrite).
	MaxWrite int
	// Logger receives errors; nil means logrus.StandardLogger().
	Logger logrus.FieldLogger
	// IO, if set, lets each queue's owner serve READ and WRITE requests
	// itself (see IOServer).
	IO IOServer
}

// IOServer lets a queue's owner serve READ and WRITE requests without a
// worker: the request is mapped to a door.Plan, I/O on the store's
// backing, which the owner puts on its own ring together with the replies
// (Plan.PrepareSQE), or starts on its own completion queue (Plan.Start,
// reaped when the queue's eventfd read on the ring completes), or, on a
// memory backend, has the backend perform at once (Plan.Do), so the
// commonest requests cost no goroutine hand-off and no thread blocked in
// pread or pwrite (package door describes the seam). Requests it declines,
// and requests whose backing I/O fails or comes back short, go to a worker
// as usual.
type IOServer interface {
	// NewCompletions returns the completion queue of one queue's owner
	// on the store's backend, or nil when the backend needs none. The
	// owner closes it when it exits.
	NewCompletions() (door.Completions, error)
	// NewIO returns the state one entry reuses for its requests; only the
	// queue's owner uses it. cq is the queue's completion queue (or nil),
	// on which the entry's plans start their I/O when they are Async.
	NewIO(cq door.Completions) IO
}

// IO is one entry's READ or WRITE on the owner thread. Start must not
// block.
type IO interface {
	// Start maps the request on node nodeID at off: a READ of len(buf)
	// bytes into buf, or a WRITE of buf; flags are the request's open
	// flags (fuse_read_in.flags, fuse_write_in.flags: for a WRITE they
	// include O_DSYNC or O_SYNC for RWF_DSYNC or RWF_SYNC). False, with
	// nothing held: a worker serves the request.
	Start(nodeID, off uint64, buf []byte, write bool, flags uint32, maxIOs int) bool
	// Plan is the started request: the I/O to issue through the backend
	// (Start when it is Async, else PrepareSQE, else Do), and the reply's
	// byte count once all of it has transferred in full.
	Plan() door.Plan
	// End ends a started request; ok says whether every I/O completed in
	// full (false: a worker serves the request again).
	End(ok bool)
}

// Transport is the set of queues serving one connection.
type Transport struct {
	fd     int // our dup of the connection's /dev/fuse descriptor
	ps     *fuse.ProtocolServer
	log    logrus.FieldLogger
	io     IOServer // nil: every request goes to a worker
	queues []*queue

	ownerReads, ownerWrites atomic.Uint64 // requests served on the owner threads
	ownerRetries            atomic.Uint64 // owner requests whose I/O failed, handed to a worker
}

// OwnerIO is the number of READ and WRITE requests the queues' owners
// served themselves (Options.IO).
func (t *Transport) OwnerIO() (reads, writes uint64) {
	return t.ownerReads.Load(), t.ownerWrites.Load()
}

// OwnerRetries is the number of READ and WRITE requests the queues'
// owners started whose backing I/O failed or came back short, and which a
// worker then served again (with ReadAt or WriteAt, which report).
func (t *Transport) OwnerRetries() uint64 { return t.ownerRetries.Load() }

// Available says whether this kernel offers FUSE-over-io_uring to servers
// (the fuse module's enable_uring parameter), and why not when it does not.
func Available() error {
	b, err := os.ReadFile(EnableParam)
	if err != nil {
		return fmt.Errorf("kernel without FUSE-over-io_uring (%w)", err)
	}
	if v := strings.TrimSpace(string(b)); v != "Y" && v != "1" {
		return fmt.Errorf("%s is %s", EnableParam, v)
	}
	return nil
}

// Enable turns the fuse module's enable_uring parameter on (root only). It
// only lets servers ask for io_uring; servers that do not ask are unaffected.
func Enable() error {
	if Available() == nil {
		return nil
	}
	if err := os.WriteFile(EnableParam, []byte("1"), 0); err != nil {
		return fmt.Errorf("enable FUSE-over-io_uring: %w", err)
	}
	return Available()
}

// Start registers the queues of the connection whose /dev/fuse descriptor
// is fd and serves them with ps. The Transport owns fd from then on, also
// when Start fails. The connection must have finished INIT with
// fuse.CAP_OVER_IO_URING agreed, and ps must have seen the same INIT (see
// InitProtocolServer).
func Start(fd int, ps *fuse.ProtocolServer, opts Options) (*Transport, error) {
	if opts.Depth <= 0 {
		opts.Depth = 64
	}
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	t := &Transport{fd: fd, ps: ps, log: opts.Logger, io: opts.IO}
	nq, err := possibleCPUs()
	if err != nil {
		t.Close()
		return nil, err
	}
	// The kernel's payload size: max(FUSE_MIN_READ_BUFFER, max_write,
	// max_pages * PAGE_SIZE); go-fuse asks for max_pages = max_write/page.
	page := unix.Getpagesize()
	payload := max(8192, (opts.MaxWrite+page-1)/page*page)
	for qid := range nq {
		q, err := startQueue(t, qid, ownerCPU(qid, nq), opts.Depth, payload)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("FUSE-over-io_uring queue %d: %w", qid, err)
		}
		t.queues = append(t.queues, q)
	}
	return t, nil
}

// Close stops the queues (the kernel cancels the commands they have
// registered) and waits for their owners. Unmounting first lets the queues
// end on their own; Close after that only releases the descriptor.
func (t *Transport) Close() error {
	for _, q := range t.queues {
		q.close()
	}
	return unix.Close(t.fd)
}

// InitProtocolServer hands ps the INIT the kernel sent (kernel, from
// fuse.Server.KernelSettings), so that it agrees on the same capabilities
// as the /dev/fuse server did.
func InitProtocolServer(ps *fuse.ProtocolServer, kernel *fuse.InitIn) error {
	const opInit = 26
	// go-fuse's InitIn starts with the request header.
	init := *kernel
	init.Length = uint32(unsafe.Sizeof(init))
	init.Opcode = opInit
	init.Unique = 1
	in := unsafe.Slice((*byte)(unsafe.Pointer(&init)), unsafe.Sizeof(init))
	out := make([]byte, 4096)
	if _, st := ps.HandleRequest([][]byte{in}, [][]byte{out}); !st.Ok() {
		return fmt.Errorf("protocol server INIT: %v", st)
	}
	return nil
}

// possibleCPUs is the kernel's num_possible_cpus() as queue ids: one more
// than the highest possible CPU.
func possibleCPUs() (int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/possible")
	if err != nil {
		return 0, fmt.Errorf("possible CPUs: %w", err)
	}
	return parseCPUList(string(b))
}

// parseCPUList returns one more than the highest CPU of a kernel CPU list
// ("0-1", "0", "0-3,6-7").
func parseCPUList(s string) (int, error) {
	s = strings.TrimSpace(s)
	last := s[strings.LastIndexAny(s, ",-")+1:]
	n, err := strconv.Atoi(last)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("possible CPUs %q: not a CPU list", s)
	}
	return n + 1, nil
}

// queue is one CPU's io_uring and its entries.
type queue struct {
	t       *Transport
	qid     int
	cpu     int // the CPU the owner is pinned to (ownerCPU)
	efd     int // eventfd whose armed read wakes the owner
	headers []byte
	payload []byte
	ents    []entry

	// mu guards the commits waiting for the owner and the owner's state
	// as handlers see it.
	mu struct {
		sync.Mutex
		commits  []*entry
		spare    []*entry
		sleeping bool // the owner waits in io_uring_enter
		closing  bool
	}
	// work hands requests from the owner to the queue's workers, one per
	// entry: long-lived goroutines keep the stack a request needs, where a
	// goroutine per request spent a large share of the server's CPU
	// growing its stack. Closed by the owner when it exits.
	work     chan *entry
	handlers sync.WaitGroup // requests being handled
	exited   chan struct{}

	// ownerIO is the number of entries whose request the owner is serving
	// (backing I/O in flight), replies the entries whose request it has
	// served, to be committed. Only the owner uses them.
	ownerIO int
	replies []*entry
	sqe     iouring.SQE // scratch for the backend's PrepareSQE (no allocation per I/O)
	// cq is the completion queue of the I/O the owner starts on an
	// AsyncSubmitter backend (nil for others): only the owner uses it,
	// and closes it when it exits.
	cq        door.Completions
	reapArmed bool // a read of cq's eventfd is in the ring
	yielder   iouring.Yielder
}

// entry is one registered request slot.
type entry struct {
	q       *queue
	idx     int
	hdr     []byte // reqHeaderSize bytes of q.headers
	payload []byte // the kernel's payload size, page-aligned
	cmd     uint32 // the command to (re)submit: register or commit

	// The owner's READ or WRITE in progress (Options.IO): its state, how
	// many of its backing I/Os are still in flight, and whether any
	// failed. Only the owner uses these.
	io        IO
	ioPending int
	ioFailed  bool

	// ending: the owner handed the request, its I/O done, to a worker
	// to end (bigCipher). Set by the owner before the hand-off, cleared
	// by the worker.
	ending bool
}

func startQueue(t *Transport, qid, cpu, depth, payloadSize int) (*queue, error) {
	q := &queue{t: t, qid: qid, cpu: cpu, exited: make(chan struct{}), work: make(chan *entry, depth)}
	var err error
	if q.efd, err = unix.Eventfd(0, unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	prot, flags := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS
	if q.headers, err = unix.Mmap(-1, 0, (depth+1)*headerStride, prot, flags); err != nil {
		unix.Close(q.efd)
		return nil, fmt.Errorf("map headers: %w", err)
	}
	// Payload buffers on transparent huge pages (see the package doc: a
	// large request's copy and its backing I/O cost less on them).
	if q.payload, err = hugepage.Map(depth * payloadSize); err != nil {
		unix.Munmap(q.headers)
		unix.Close(q.efd)
		return nil, fmt.Errorf("map payload buffers: %w", err)
	}
	if t.io != nil {
		if q.cq, err = t.io.NewCompletions(); err != nil {
			hugepage.Unmap(q.payload)
			unix.Munmap(q.headers)
			unix.Close(q.efd)
			return nil, err
		}
	}
	q.ents = make([]entry, depth)
	for i := range q.ents {
		e := &q.ents[i]
		*e = entry{q: q, idx: i, cmd: cmdRegister,
			hdr:     q.headers[i*headerStride : i*headerStride+reqHeaderSize],
			payload: q.payload[i*payloadSize : (i+1)*payloadSize]}
		iov := (*[2]unix.Iovec)(unsafe.Pointer(&q.headers[i*headerStride+iovOff]))
		iov[0].Base, iov[0].Len = &e.hdr[0], uint64(len(e.hdr))
		iov[1].Base, iov[1].Len = &e.payload[0], uint64(len(e.payload))
	}
	if t.io != nil {
		for i := range q.ents {
			q.ents[i].io = t.io.NewIO(q.cq)
		}
	}
	for range depth {
		go func() {
			for e := range q.work {
				e.handle()
			}
		}()
	}
	started := make(chan error, 1)
	go q.own(started)
	if err := <-started; err != nil {
		<-q.exited
		unix.Close(q.efd)
		return nil, err
	}
	return q, nil
}

// ownerCPU is the CPU the owner of queue qid (of nq) is pinned to: the next
// one, not the queue's own. The kernel queues a request on the ring of the
// CPU its application issued it on, and copies its payload into the
// entry in the owner's thread; on the queue's own CPU that copy took
// turns with the application: fio sent its 16 writes of 1 MiB, the owner
// then copied all 16 (the device idle), submitted them, and the device
// wrote them (the owner idle), and since the device completed them
// together the next 16 came together again. On the next CPU the copy runs
// beside the application, and with DEFER_TASKRUN the owner takes the
// requests that have arrived each time it asks, so copies and device
// writes overlap. In paired runs against the owner on its own CPU without
// DEFER_TASKRUN, large writes at depth and 4 KiB random I/O gained; 1 MiB
// reads at depth lost some (the reply's copy and a wake-up across CPUs per
// batch) and stayed above the raw file. DEFER_TASKRUN alone changed
// nothing: the application still sent its burst before the owner ran. On
// the next CPU without DEFER_TASKRUN, 4 KiB reads lost: an interrupt and a
// wake-up per request.
func ownerCPU(qid, nq int) int { return (qid + 1) % nq }

// own is the owner goroutine of the queue.
func (q *queue) own(started chan<- error) {
	runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
	defer close(q.exited)
	defer close(q.work)
	defer func() {
		hugepage.Unmap(q.payload)
		unix.Munmap(q.headers)
	}()
	if q.cq != nil {
		// After the ring is closed (deferred below): the owner exits
		// with no I/O in flight, so every one started has been reaped.
		defer func() {
			if err := q.cq.Close(); err != nil {
				q.t.log.WithError(err).WithField("queue", q.qid).Warn("FUSE-over-io_uring: close the completion queue")
			}
		}()
	}
	var cpus unix.CPUSet
	cpus.Set(q.cpu)
	_ = unix.SchedSetaffinity(0, &cpus) // an offline CPU's owner runs anywhere

	depth := uint32(len(q.ents))
	// Room for every entry's command and backing I/O, the wake and the
	// completion queue's read.
	sq := depth + 2
	if q.t.io != nil {
		sq += depth * maxPlanIOs
	}
	// DEFER_TASKRUN (with SINGLE_ISSUER: only this thread submits): the
	// kernel's work for this ring, above all copying a request into its
	// entry, runs when the owner asks for completions, only what has
	// arrived by then, and no request interrupts the owner (why: ownerCPU).
	rg, err := iouring.Setup(sq, 2*sq, iouring.SetupSQE128|iouring.SetupSingleIssuer|iouring.SetupDeferTaskrun)
	if err != nil {
		started <- err
		return
	}
	defer rg.Close()
	for i := range q.ents {
		q.submit(rg, &q.ents[i])
	}
	q.armWake(rg)
	if q.cq != nil {
		q.armReap(rg)
	}
	if err := rg.Enter(false); err != nil {
		started <- fmt.Errorf("register: io_uring_enter: %w", err)
		return
	}
	// A refused REGISTER completes at once; an accepted one only when a
	// request arrives.
	var regErr error
	rg.Reap(func(c iouring.CQE) {
		if c.UserData == reapTag {
			q.reapArmed = false // re-armed by serve
			q.cq.Reap(q.asyncDone)
			return
		}
		if c.UserData != wakeTag && c.Res < 0 && regErr == nil {
			regErr = fmt.Errorf("register: %w", unix.Errno(-c.Res))
		}
	})
	if regErr != nil {
		started <- regErr
		return
	}
	started <- nil
	q.serve(rg)
}

// serve submits commits and hands out requests until every entry is back
// from the kernel or the queue is closing.
func (q *queue) serve(rg *iouring.Ring) {
	live := len(q.ents)
	wakeArmed := true
	var resubmit []*entry
	for live > 0 {
		q.mu.Lock()
		if q.mu.closing && q.ownerIO == 0 {
			q.mu.Unlock()
			q.handlers.Wait() // they write into the buffers about to go
			return
		}
		commits := q.mu.commits
		q.mu.commits = q.mu.spare[:0]
		q.mu.spare = commits
		wait := len(commits) == 0 && len(resubmit) == 0 && len(q.replies) == 0
		q.mu.sleeping = wait
		q.mu.Unlock()

		for _, e := range commits {
			q.submit(rg, e)
		}
		for _, e := range resubmit {
			q.submit(rg, e)
		}
		for _, e := range q.replies {
			q.submit(rg, e)
		}
		resubmit, q.replies = resubmit[:0], q.replies[:0]
		if !wakeArmed {
			q.armWake(rg)
			wakeArmed = true
		}
		if q.cq != nil && !q.reapArmed {
			q.armReap(rg)
		}
		if q.yielder.Due() {
			q.enter(rg, false)
			q.yielder.Yield()
		}
		q.enter(rg, wait)
		if wait {
			q.mu.Lock()
			q.mu.sleeping = false
			q.mu.Unlock()
		}
		rg.Reap(func(c iouring.CQE) {
			if c.UserData == wakeTag {
				wakeArmed = false
				return
			}
			if c.UserData == reapTag {
				// The completion queue's eventfd was read (reset):
				// take what it announced; a later completion writes it
				// again and completes the read armed next.
				q.reapArmed = false
				q.cq.Reap(q.asyncDone)
				return
			}
			if c.UserData&ioTag != 0 {
				q.ioDone(c.UserData, int64(c.Res))
				return
			}
			e := &q.ents[c.UserData]
			switch {
			case c.Res == 0:
				if !q.startIO(rg, e) {
					q.toWorker(e)
				}
			case c.Res == -int32(unix.EAGAIN) || c.Res == -int32(unix.EINTR):
				resubmit = append(resubmit, e)
			default:
				// ENOTCONN/ECONNABORTED: the connection is gone (unmount);
				// anything else is a protocol error on our side.
				if c.Res != -int32(unix.ENOTCONN) && c.Res != -int32(unix.ECONNABORTED) && c.Res != -int32(unix.ENODEV) {
					q.t.log.WithError(unix.Errno(-c.Res)).WithField("queue", q.qid).Warn("FUSE-over-io_uring entry failed")
				}
				live--
			}
		})
		if rg.Pending() > 0 {
			// Backing I/O just queued goes to the device now, on its
			// own, not in the next batch behind commits that each copy
			// a reply.
			q.enter(rg, false)
		}
	}
}

// enter submits what is queued on rg and, with wait, sleeps until a
// completion is ready. EINTR, EAGAIN and EBUSY leave the rest queued for
// the next call.
func (q *queue) enter(rg *iouring.Ring, wait bool) {
	err := rg.Enter(wait)
	if err != nil && !iouring.Transient(err) {
		// Our ring memory is broken; the kernel still owns the
		// entries, so neither going on nor unmapping is safe.
		panic(fmt.Sprintf("fuseuring: queue %d: io_uring_enter: %v", q.qid, err))
	}
}

// toWorker hands e's request to a worker goroutine.
func (q *queue) toWorker(e *entry) {
	q.handlers.Add(1)
	q.work <- e // never blocks: room for every entry
}

// startIO serves e's request on the owner if it is a READ or WRITE the
// IOServer can map: it queues the backing I/O (or, for a read of holes
// only, the reply). False: a worker must serve it.
func (q *queue) startIO(rg *iouring.Ring, e *entry) bool {
	in := (*fuse.InHeader)(unsafe.Pointer(&e.hdr[0]))
	if e.io == nil || in.Opcode != opRead && in.Opcode != opWrite {
		return false
	}
	op := e.hdr[inOutSize:]
	// fuse_read_in and fuse_write_in both start with fh, offset and
	// size, and have the open flags at byte 32.
	off := *(*uint64)(unsafe.Pointer(&op[8]))
	size := int(*(*uint32)(unsafe.Pointer(&op[16])))
	flags := *(*uint32)(unsafe.Pointer(&op[32]))
	write := in.Opcode == opWrite
	if write && size != int((*entInOut)(unsafe.Pointer(&e.hdr[entInOutOff])).payloadSz) ||
		size > len(e.payload) || !e.io.Start(in.NodeId, off, e.payload[:size], write, flags, maxPlanIOs) {
		return false
	}
	plan := e.io.Plan()
	// Each I/O starts on the queue's completion queue when the backend
	// waits for the network (Async: RBD), goes on the ring where the
	// backend prepares it an entry (the store's file or device), or else
	// the backend performs it now (memory backends: no device to wait
	// for), and a request done that way is replied to at once.
	e.ioPending, e.ioFailed = 0, false
	queued := false
	for i := range plan.IOs() {
		tag := ioTag | uint64(e.idx)<<16 | uint64(i)
		q.sqe = iouring.SQE{}
		switch {
		case plan.Async():
			if plan.Start(i, tag) == nil {
				e.ioPending++
			} else {
				e.ioFailed = true // not started: the worker retries and reports
			}
		case plan.PrepareSQE(&q.sqe, i):
			q.sqe.UserData = tag
			rg.Put(q.sqe)
			e.ioPending++
			queued = true
		default:
			if plan.Do(i) != nil {
				e.ioFailed = true // the worker's ReadAt or WriteAt retries and reports
			}
		}
	}
	if e.ioPending == 0 {
		q.endIO(e)
		return true
	}
	q.ownerIO++
	if queued && door.SubmitNow(size, rg.Pending()) { // package door: "Submitting a burst"
		q.enter(rg, false)
	}
	return true
}

// asyncDone takes the completion of a backing I/O started on the
// completion queue (Reap's callback).
func (q *queue) asyncDone(tag uint64, res int64) { q.ioDone(tag, res) }

// ioDone takes the completion of one backing I/O of an owner's request:
// its tag (ioTag, the entry, the I/O's index) and its result, bytes or
// -errno.
func (q *queue) ioDone(tag uint64, res int64) {
	e := &q.ents[(tag&^ioTag)>>16]
	plan := e.io.Plan()
	if res < 0 || res != int64(plan.IOLen(int(tag&0xffff))) {
		e.ioFailed = true // the worker's ReadAt or WriteAt retries and reports
	}
	if e.ioPending--; e.ioPending > 0 {
		return
	}
	q.ownerIO--
	q.endIO(e)
}

// endIO queues the reply to an owner's request whose backing I/O is all
// done, or hands the request to a worker if any failed, or to end it if
// that is much work (bigCipher).
func (q *queue) endIO(e *entry) {
	if e.ioFailed {
		e.io.End(false)
		q.t.ownerRetries.Add(1)
		q.toWorker(e)
		return
	}
	if in := (*fuse.InHeader)(unsafe.Pointer(&e.hdr[0])); in.Opcode == opRead && e.io.Plan().CipherBytes() >= bigCipher {
		e.ending = true
		q.toWorker(e)
		return
	}
	e.endReply()
	q.replies = append(q.replies, e)
}

// endReply ends an owner's request whose backing I/O all completed in
// full and writes its reply into the entry, ready to commit. Its caller
// owns e: the owner, or the worker it handed e to.
func (e *entry) endReply() {
	q := e.q
	n := e.io.Plan().Bytes()
	e.io.End(true)
	hdr := e.hdr
	in := (*fuse.InHeader)(unsafe.Pointer(&hdr[0]))
	payloadSz := n // READ: the data, already in the payload buffer
	if in.Opcode == opWrite {
		*(*fuse.WriteOut)(unsafe.Pointer(&e.payload[0])) = fuse.WriteOut{Size: uint32(n)}
		payloadSz = writeOutSize
		q.t.ownerWrites.Add(1)
	} else {
		q.t.ownerReads.Add(1)
	}
	*(*fuse.OutHeader)(unsafe.Pointer(&hdr[0])) = fuse.OutHeader{
		Length: uint32(outHeaderSize + payloadSz), Unique: in.Unique}
	(*entInOut)(unsafe.Pointer(&hdr[entInOutOff])).payloadSz = uint32(payloadSz)
	e.cmd = cmdCommitAndFetch
}

// submit writes e's command (register or commit-and-fetch) into the ring.
func (q *queue) submit(rg *iouring.Ring, e *entry) {
	s, cmdArea := rg.Next()
	s.Opcode = iouring.OpURingCmd
	s.Fd = int32(q.t.fd)
	s.Off = uint64(e.cmd)
	s.UserData = uint64(e.idx)
	c := (*cmdReq)(unsafe.Pointer(&cmdArea[0]))
	c.qid = uint16(q.qid)
	if e.cmd == cmdRegister {
		s.Addr = uint64(uintptr(unsafe.Pointer(&q.headers[e.idx*headerStride+iovOff])))
		s.Len = 2
	} else {
		c.commitID = (*entInOut)(unsafe.Pointer(&e.hdr[entInOutOff])).commitID
	}
}

// armWake queues the eventfd read whose completion wakes the owner.
func (q *queue) armWake(rg *iouring.Ring) {
	buf := q.headers[len(q.ents)*headerStride:]
	rg.Put(iouring.ReadEventfd(q.efd, buf, wakeTag))
}

// armReap queues the read of the completion queue's eventfd whose
// completion says that async I/O completions are waiting (reapTag).
func (q *queue) armReap(rg *iouring.Ring) {
	buf := q.headers[len(q.ents)*headerStride+8:]
	rg.Put(iouring.ReadEventfd(q.cq.Fd(), buf, reapTag))
	q.reapArmed = true
}

// commit queues e's reply for the owner to submit.
func (q *queue) commit(e *entry) {
	e.cmd = cmdCommitAndFetch
	q.mu.Lock()
	q.mu.commits = append(q.mu.commits, e)
	wake := q.mu.sleeping
	q.mu.sleeping = false
	q.mu.Unlock()
	if wake {
		q.wake()
	}
}

func (q *queue) wake() { iouring.Notify(q.efd) }

func (q *queue) close() {
	q.mu.Lock()
	q.mu.closing = true
	q.mu.Unlock()
	q.wake()
	<-q.exited
	unix.Close(q.efd)
}

// handle runs the request in e and queues the reply; or, for a request
// the owner served and handed over to end (ending), ends it and queues
// its reply.
func (e *entry) handle() {
	if e.ending {
		e.ending = false
		e.endReply()
		e.q.commit(e)
		e.q.handlers.Done()
		return
	}
	hdr := e.hdr
	in := (*fuse.InHeader)(unsafe.Pointer(&hdr[0]))
	io := (*entInOut)(unsafe.Pointer(&hdr[entInOutOff]))
	unique, opcode := in.Unique, in.Opcode
	payloadSz := int(io.payloadSz)
	opSize := int(in.Length) - inHeaderSize - payloadSz
	status := fuse.OK
	n := 0
	if opSize < 0 || opSize > opInSize || payloadSz > len(e.payload) {
		status = fuse.EIO
	} else {
		payload := e.payload[:payloadSz]
		if opcode != opRead && opcode != opWrite && payloadSz > 0 {
			// The reply is written over the payload buffer; only READ
			// (no request payload) and WRITE (a small reply written
			// after the data is used) may share it.
			payload = append([]byte(nil), payload...)
		}
		n, status = e.q.t.ps.HandleRequest(
			[][]byte{hdr[:inHeaderSize], hdr[inOutSize : inOutSize+opSize], payload},
			[][]byte{hdr[:outHeaderSize], e.payload})
	}
	if n < outHeaderSize {
		// No reply made (a malformed request, or one go-fuse answers
		// with silence): the kernel still waits for this one.
		if status.Ok() {
			status = fuse.EINTR
		}
		*(*fuse.OutHeader)(unsafe.Pointer(&hdr[0])) = fuse.OutHeader{
			Length: uint32(outHeaderSize), Status: -int32(status), Unique: unique}
		n = outHeaderSize
	}
	io.payloadSz = uint32(n - outHeaderSize)
	e.q.commit(e)
	e.q.handlers.Done()
}
