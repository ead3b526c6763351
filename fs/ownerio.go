package fs

import (
	"math"
	"time"

	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/door/storeplan"
	"github.com/vdiskfs/vdiskfs/fs/fuseuring"
)

// ownerIO lets the FUSE-over-io_uring queues serve READ and WRITE requests
// on their owner threads (fuseuring.IOServer): the request is planned
// against the disk's map (image.Disk.PlanRead, PlanWrite) into a
// door.Plan (package door/storeplan), whose backing I/O the queue puts on
// its own ring with the replies (or, on RBD, starts on the queue's own
// completion queue, reaped through the same ring; on a memory backend, has
// done at once), so it costs no goroutine hand-off and no thread blocked in
// pread or pwrite. What cannot
// be planned without waiting (unaligned I/O, growing writes, writes a full
// store must commit for, ranges held by other requests) takes the usual
// path through go-fuse, and so do the synchronous writes (O_SYNC, O_DSYNC)
// that need a commit before their reply (sync.go); an O_DSYNC overwrite in
// place of durable mappings is a durable write on the ring and is served
// here.
//
// The kernel's request names the node (the disk's inode number, as the
// mount uses ExternalNodeID) and the file handle; go-fuse keeps the handle
// to itself, so the request uses any open handle of the disk, pinned so
// that its Release waits for the request.
type ownerIO struct {
	v     *vfs
	timed *timedFS
}

// NewCompletions is the store's completion queue for one queue's owner,
// on a backend whose I/O the owner starts without waiting (RBD); nil for
// others.
func (o ownerIO) NewCompletions() (door.Completions, error) {
	return storeplan.NewCompletions(o.v.store)
}

func (o ownerIO) NewIO(cq door.Completions) fuseuring.IO {
	p := storeplan.NewPlan(cq)
	p.IOPlan.MaxCipherWrite = ownerMaxCipherWrite
	return &ownerRequest{v: o.v, timed: o.timed, plan: p}
}

// ownerMaxCipherWrite is the largest write of an encrypted disk a queue's
// owner encrypts itself; a larger one goes to a worker (image's
// DeclineCipher), which plans, encrypts and writes it while the owner
// goes on copying the other requests' payloads and feeding the device,
// so the encryption of a deep queue of large writes runs on every CPU
// instead of on the owner's alone.
const ownerMaxCipherWrite = 32 << 10

// ownerRequest is one ring entry's request; only its queue's owner uses
// it, or the worker the owner hands it over to for End (door.Plan.CipherBytes).
type ownerRequest struct {
	v     *vfs
	timed *timedFS
	plan  *storeplan.Plan
	op    string    // "READ" or "WRITE", for the latency histograms
	file  *diskFile // pinned between Start and End
	start time.Time
}

func (r *ownerRequest) Start(nodeID, off uint64, buf []byte, write bool, flags uint32, maxIOs int) bool {
	sync := syncModeOf(flags)
	if off > math.MaxInt64 || write && sync == syncAll {
		return false // O_SYNC waits for a commit of the times: a worker's (syncFS)
	}
	f := r.v.pin(nodeID)
	if f == nil {
		return false
	}
	planned := false
	switch {
	case write && sync == syncData:
		planned, r.op = f.disk.PlanWriteSync(&r.plan.IOPlan, buf, int64(off), maxIOs), "WRITE"
	case write:
		planned, r.op = f.disk.PlanWrite(&r.plan.IOPlan, buf, int64(off), maxIOs), "WRITE"
	default:
		planned, r.op = f.disk.PlanRead(&r.plan.IOPlan, buf, int64(off), maxIOs), "READ"
	}
	if !planned {
		r.v.unpin(f)
		return false
	}
	r.file, r.start = f, time.Now()
	return true
}

func (r *ownerRequest) Plan() door.Plan { return r.plan }

func (r *ownerRequest) End(ok bool) {
	if ok {
		durable := r.plan.IOPlan.Durable
		r.plan.IOPlan.Finish()
		r.timed.since(r.op, r.start)
		if durable {
			r.timed.since("SYNC_WRITE", r.start)
		}
	} else {
		r.plan.IOPlan.Abort()
	}
	r.v.unpin(r.file)
	r.file = nil
}
