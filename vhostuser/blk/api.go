package blk

import (
	"errors"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/door"
)

// Config says where and how Serve serves a disk.
type Config struct {
	// Socket is the Unix socket path the frontend connects to. Serve
	// creates it (it must not exist, or be a stale socket nobody
	// listens on) and Close removes it.
	Socket string
	// ID is the disk's name as VIRTIO_BLK_T_GET_ID returns it: at most
	// 20 bytes, truncated, NUL-padded when shorter.
	ID string
	// Queues is the most request queues the device offers (VIRTIO_BLK_F_MQ,
	// VHOST_USER_GET_QUEUE_NUM); 0 means one per CPU.
	Queues int
	// SocketGroup: -1 leaves the socket 0600; otherwise it is 0660 and
	// owned by this group.
	SocketGroup int
	// Log receives the server's events (connects, refusals, bad
	// descriptors); nil means logrus.StandardLogger().
	Log logrus.FieldLogger
}

// Disk is what a device needs of the disk it serves. An adapter provides
// it from an *image.Disk (package door/storeplan), so that package
// vhostuser and its subpackages import nothing of package image.
//
// The blocking methods (ReadAt, WriteAt, Flush, Discard, WriteZeroes) are
// called from the server's worker goroutines, concurrently; Size and
// BlockSize from any goroutine; NewCompletions and NewIO from a queue's
// owner as it starts.
type Disk interface {
	// Size is the disk's size in bytes; the device's capacity is Size/512
	// sectors. ConfigChanged tells the frontend it changed.
	Size() int64
	// BlockSize is the logical block size the device advertises
	// (VIRTIO_BLK_F_BLK_SIZE), a power of two of at least 512: requests
	// aligned to it are the ones PlanIO can take without a bounce.
	BlockSize() int
	// Encrypted says the disk encrypts a write from its buffer as the
	// write is planned (IO.Start): the buffer must hold the data by then.
	Encrypted() bool
	// NewCompletions returns the completion queue of one queue owner on
	// the disk's backend, or nil when the backend needs none (package
	// door). The owner closes it when it stops.
	NewCompletions() (door.Completions, error)
	// NewIO returns the planning state one request slot of a queue owner
	// reuses from request to request; cq is the owner's completion queue
	// (or nil). Only that owner uses it.
	NewIO(cq door.Completions) IO

	// ReadAt and WriteAt are the blocking path: unaligned requests,
	// requests the planner declined, and requests whose planned I/O
	// failed (which these then report).
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Flush makes every write completed before it durable: exactly what
	// fsync(2) on the disk's file does.
	Flush() error
	// Discard frees [off, off+n): it reads as zeros afterwards.
	Discard(off, n int64) error
	// WriteZeroes makes [off, off+n) read as zeros; with unmap the
	// blocks may be freed (and are, where whole).
	WriteZeroes(off, n int64, unmap bool) error
}

// Restartable is what a Disk offers so that every write the device
// returned to the guest survives the daemon's death (kill -9): Serve uses
// it when the Disk has it. A frontend that reconnects (QEMU's reconnect=)
// hides a daemon restart from the guest, which then flushes on the new
// daemon and must find every write the old one acknowledged; so, with a
// Restartable Disk, a write (OUT, DISCARD, WRITE_ZEROES) is returned on
// the used ring only once WritesRecoverable, after a commit the device
// asks for (CommitWrites, shared by every write waiting).
type Restartable interface {
	// WritesRecoverable says whether every write completed so far would
	// be read back by a daemon started after this one died.
	WritesRecoverable() bool
	// CommitWrites makes every write completed before the call
	// recoverable. It may block; the device calls it from one goroutine.
	CommitWrites() error
}

// IO is one request slot's planned read or write, on its queue's owner
// thread. Its methods must not block.
type IO interface {
	// Start plans a read of len(buf) bytes at off into buf, or a write of
	// buf at off, with at most maxIOs backing I/Os, without waiting.
	// False, with nothing held: the request goes to the blocking path.
	Start(buf []byte, off int64, write bool, maxIOs int) bool
	// Plan is the started request's backing I/O (package door says how
	// to issue it).
	Plan() door.Plan
	// End ends a started request once all its I/O has completed; ok says
	// whether every I/O transferred in full (false: the blocking path
	// serves the request again).
	End(ok bool)
}

// Server serves one disk on one socket, to one frontend at a time.
type Server struct {
	srv *server
}

// ErrClosed is returned by operations on a closed Server.
var ErrClosed = errors.New("vhostuser/blk: server closed")

// Serve creates cfg.Socket and serves d on it: it returns once the socket
// listens. A frontend that disconnects leaves the server listening for the
// next one (QEMU's reconnect=); a second frontend that connects while one
// is served is refused and logged.
func Serve(d Disk, cfg Config) (*Server, error) {
	srv, err := serve(d, cfg)
	if err != nil {
		return nil, err
	}
	return &Server{srv: srv}, nil
}

// ConfigChanged tells the connected frontend that the device's
// configuration (the disk's size) changed (VHOST_USER_BACKEND_CONFIG_CHANGE_MSG,
// when the frontend agreed to the backend request channel). Without a
// frontend, or without that channel, the next GET_CONFIG carries the new
// size.
func (s *Server) ConfigChanged() { s.srv.configChanged() }

// Close disconnects the frontend, stops listening, removes the socket and
// waits for every request in flight to end.
func (s *Server) Close() error { return s.srv.close() }

// Stats returns the server's counters since Serve.
func (s *Server) Stats() Stats { return s.srv.stats() }

// Stats are the counters of one Server.
type Stats struct {
	// Per request type: IN, OUT, FLUSH, DISCARD, WRITE_ZEROES, GET_ID.
	Read, Write, Flush, Discard, WriteZeroes, GetID OpStats
	// Unsupported counts requests of other types (answered UNSUPP); Bad
	// those whose descriptors broke the rules (answered IOERR or not at
	// all, when the queue itself was broken).
	Unsupported, Bad uint64
	// Inflight is the number of requests taken from the queues and not
	// yet completed.
	Inflight int64
	// Fallbacks counts requests served on the blocking path (declined by
	// the planner, unaligned, or whose planned I/O failed).
	Fallbacks uint64
	// Held counts the writes returned only after a commit made them
	// recoverable (Restartable).
	Held uint64
	// Vectored counts the reads and writes whose data, scattered over
	// several pieces of guest memory, was planned as one range and went
	// to the backing straight from and into those pieces (vectored I/O);
	// Staged those whose data was copied through one buffer instead
	// (small pieces such as a guest's 4 KiB pages, pieces or a range not
	// aligned to the block size, an encrypted disk, holes read, a backend
	// that takes no vectors).
	Vectored, Staged uint64
	// Connects counts frontends served; Reconnects those after the
	// first; Refused the connections refused while one was served;
	// Resubmitted the requests resubmitted from the inflight region
	// after a reconnect.
	Connects, Reconnects, Refused, Resubmitted uint64
	// Connected says a frontend is connected now.
	Connected bool
}

// OpStats are the counters of one request type.
type OpStats struct {
	Requests uint64 // completed
	Errors   uint64 // completed with VIRTIO_BLK_S_IOERR
	Bytes    uint64 // data bytes transferred (IN, OUT) or covered (DISCARD, WRITE_ZEROES)
	Latency  Latency
}

// LatencyBounds are the upper bounds of the Latency buckets; the last
// bucket, past them, counts the rest.
var LatencyBounds = [...]time.Duration{
	10 * time.Microsecond, 25 * time.Microsecond, 50 * time.Microsecond, 100 * time.Microsecond,
	250 * time.Microsecond, 500 * time.Microsecond, time.Millisecond, 2500 * time.Microsecond,
	5 * time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond, 50 * time.Millisecond,
	100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second,
}

// Latency is a histogram of request latencies, from the request's pop off
// the available ring to its push on the used ring.
type Latency struct {
	// Buckets[i] counts latencies ≤ LatencyBounds[i] (and above the
	// previous bound); the last counts the rest. Not cumulative.
	Buckets [len(LatencyBounds) + 1]uint64
	Sum     time.Duration
}
