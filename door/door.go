// Package door is the seam between the store and a door: a transport whose
// own threads carry disk reads and writes without blocking (the
// FUSE-over-io_uring queues of package fs/fuseuring and the vhost-user-blk
// queues of package vhostuser/blk). A door knows its requests and its
// ring; the store knows maps and backings; neither imports the other. A
// door depends on the two interfaces here, and an adapter (package
// door/storeplan) provides them from package image.
//
// # A request's life
//
// The door maps a request to a Plan (how depends on the door: a FUSE node
// and offset, a virtio-blk sector), then issues each of the plan's
// backing I/Os in one of three ways, and ends the request once all have
// completed:
//
//   - Async: Start it on the loop's own Completions (a network backend,
//     RBD), and reap its completion when Completions.Fd is readable;
//   - else PrepareSQE: put it on the door's own io_uring (a file or block
//     device backing), with a tag in UserData;
//   - else Do: the backend performs it at once without waiting for a
//     device (memory and crash-test backends).
//
// A completion whose result is not IOLen(i) is a failure; the door then
// ends the request as failed and serves it again on a path that may block,
// which reports the error.
//
// # Submitting a burst
//
// A loop takes its requests in bursts: a queue's worth of random 4 KiB
// reads comes back together and is sent again together. io_uring plugs
// the block layer for a batch of three or more entries, so no I/O of a
// batch reaches the device until the kernel has built them all: a burst
// submitted at the end of the loop's pass reaches the device only once
// its last request is planned, the device idles meanwhile, and the
// requests come back together again, round after round, as a convoy. So
// a loop submits the ring entries of small requests (below SmallIO) as
// soon as SmallGroup of them wait (SubmitNow). One system call per request
// would cost a system call each, dear in a virtual machine; larger
// requests stay batched per pass, where the plug merges the neighbours of
// a sequential stream into larger device requests.
//
// # Concurrency
//
// A Plan and a Completions belong to one submission loop (a queue's owner
// thread): none of their methods may be called from two goroutines at
// once, and none of them blocks. A request whose I/O has all completed may
// be handed over whole to another goroutine to end (CipherBytes), which
// then owns it until the request is ended.
package door

import "github.com/vdiskfs/vdiskfs/internal/iouring"

// SmallIO and SmallGroup: a loop submits the ring entries of requests
// smaller than SmallIO bytes as soon as SmallGroup entries wait
// ("Submitting a burst"). Groups of four beat one entry per system call
// and one batch per pass in paired runs of 4 KiB random I/O at iodepth
// 32, on both doors.
const (
	SmallIO    = 64 << 10
	SmallGroup = 4
)

// SubmitNow says whether a loop that has just put on its ring the entries
// of a request of size bytes, pending entries now waiting, submits them
// at once rather than at the end of its pass.
func SubmitNow(size int, pending uint32) bool { return size < SmallIO && pending >= SmallGroup }

// A Plan is one planned request: the backing I/Os to issue, valid from a
// successful plan until the request ends.
type Plan interface {
	// IOs is how many backing I/Os the plan has (0: nothing to issue,
	// as for a read of holes only).
	IOs() int
	// IOLen is the byte count of the i-th I/O: its completion must
	// transfer exactly that many.
	IOLen(i int) int
	// Async says every I/O goes through Start on the loop's Completions.
	Async() bool
	// Start starts the i-th I/O on the loop's Completions; its completion
	// is reaped with tag. An error is an I/O that did not start.
	Start(i int, tag uint64) error
	// PrepareSQE fills sqe, a zeroed entry of the door's ring, with the
	// i-th I/O; the door sets UserData and submits it. False: use Do. A
	// door may turn a plain read or write entry into a vectored one
	// (iouring.Vectored) over other memory that stands for the same
	// bytes: the vhost-user door plans a scattered request over a buffer
	// of its own and issues its I/O over the guest's pieces.
	PrepareSQE(sqe *iouring.SQE, i int) bool
	// Do performs the i-th I/O at once, without waiting for a device.
	Do(i int) error
	// Bytes is what the request covers once every I/O has transferred
	// in full: the byte count of its reply.
	Bytes() int
	// CipherBytes is how many bytes of the request the store encrypts
	// or decrypts (0 on a plain disk): a write's were encrypted when it
	// was planned, a read's are decrypted when it ends. That takes the
	// loop's time from its other requests: a door may end such a read
	// on another goroutine than its loop's, handing the request over
	// whole.
	CipherBytes() int
}

// Completions is one submission loop's completion queue on a backend
// whose I/O the loop starts itself (Plan.Async).
type Completions interface {
	// Fd is an eventfd, readable once a completion waits: read it, then
	// Reap.
	Fd() int
	// Reap calls fn with the tag and result (bytes, or -errno) of every
	// completion waiting, oldest first, and returns how many.
	Reap(fn func(tag uint64, res int64)) int
	// Close frees the queue once every I/O started on it was reaped.
	Close() error
}
