package blk

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/vhostuser"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// Limits the device advertises in its config space.
const (
	// segMax is the most data segments per request (seg_max): with the
	// header and status, a chain of 256 buffers.
	segMax = 254
	// sizeMax is the largest segment (size_max).
	sizeMax = 1 << 20
	// maxChainBytes bounds a whole chain: every segment at its largest,
	// and the header and status.
	maxChainBytes = segMax*sizeMax + 4096
	// maxDiscardSectors, maxDiscardSeg: the largest DISCARD and
	// WRITE_ZEROES, in 512-byte sectors and in segments.
	maxDiscardSectors = 1 << 23 // 4 GiB
	maxDiscardSeg     = 32
	// maxStaged is the largest read or write staged through one buffer
	// when its data is scattered over several pieces of guest memory
	// (request.stage); a larger one is planned piece by piece.
	maxStaged = 4 << 20
	// vectorMinPiece is the least average piece of a staged request
	// whose backing I/O goes straight from and into its pieces (vectored):
	// smaller pieces (a guest's 4 KiB pages) are copied through the stage,
	// which the backing device takes as a few large segments where a
	// vector of small pieces is one segment each, which a virtual device
	// below may serve one by one (docs/BENCHMARKS.md, the vhost-user door).
	vectorMinPiece = 64 << 10
)

// device is the virtio-blk device a session serves (vhostuser.Device).
type device struct {
	disk   Disk
	id     [proto.BlkIDBytes]byte
	queues int
	log    logrus.FieldLogger

	// mu guards owners (by queue index; nil when the queue is stopped).
	mu     sync.Mutex
	owners []*owner

	commit *committer // nil: the Disk is not Restartable
	st     counters
	// stages are the buffers of staged requests (request.stage); safe
	// for concurrent use.
	stages *coalesce.Pool
	// vectorAlign is what a staged request's pieces and range must be
	// multiples of for its backing I/O to go straight from and into the
	// pieces (request.direct): the disk's block size; 0 for an encrypted
	// disk, whose writes are encrypted from the stage as they are planned.
	vectorAlign uint64
}

// Compile-time check: a device is what a session serves.
var _ vhostuser.Device = (*device)(nil)

func newDevice(d Disk, cfg Config) *device {
	dev := &device{disk: d, queues: cfg.Queues, log: cfg.Log, stages: coalesce.NewPool(maxStaged)}
	if dev.queues <= 0 {
		dev.queues = runtime.NumCPU()
	}
	dev.queues = min(dev.queues, 255) // a vring index is 8 bits in SET_VRING_KICK
	copy(dev.id[:], cfg.ID)
	if !d.Encrypted() {
		dev.vectorAlign = uint64(max(d.BlockSize(), proto.SectorSize))
	}
	dev.owners = make([]*owner, dev.queues)
	if r, ok := d.(Restartable); ok {
		dev.commit = newCommitter(r)
	}
	return dev
}

func (d *device) Features() uint64 {
	f := uint64(0)
	for _, b := range []uint{proto.VirtioFVersion1, proto.VirtioFRingIndirectDesc, proto.VirtioFRingEventIdx,
		proto.BlkFSizeMax, proto.BlkFSegMax, proto.BlkFBlkSize, proto.BlkFFlush, proto.BlkFTopology,
		proto.BlkFMQ, proto.BlkFDiscard, proto.BlkFWriteZeroes} {
		f |= proto.Bit(b)
	}
	return f
}

func (d *device) ProtocolFeatures() uint64 {
	return proto.Bit(proto.ProtocolMQ) | proto.Bit(proto.ProtocolConfig)
}

func (d *device) NumQueues() int { return d.queues }

func (d *device) QueueLimits() virtq.Options {
	return virtq.Options{MaxBufs: segMax + 2, MaxBytes: maxChainBytes}
}

// Config is the virtio-blk config space. The logical block is 512 bytes
// (so that 512-byte-aligned I/O works, as on a disk); the store's block
// size is the physical block, the minimum I/O and the discard alignment:
// requests aligned to it go to the backing without a bounce.
func (d *device) Config() []byte {
	bs := uint32(max(d.disk.BlockSize(), proto.SectorSize))
	per := bs / proto.SectorSize
	return proto.BlkConfig{
		Capacity:               uint64(d.disk.Size()) / proto.SectorSize,
		SizeMax:                sizeMax,
		SegMax:                 segMax,
		BlkSize:                proto.SectorSize,
		PhysicalBlockExp:       uint8(bits.TrailingZeros32(per)),
		MinIOSize:              uint16(min(per, 1<<15)),
		WCE:                    1,
		NumQueues:              uint16(d.queues),
		MaxDiscardSectors:      maxDiscardSectors,
		MaxDiscardSeg:          maxDiscardSeg,
		DiscardSectorAlignment: per,
		MaxWriteZeroesSectors:  maxDiscardSectors,
		MaxWriteZeroesSeg:      maxDiscardSeg,
		WriteZeroesMayUnmap:    1,
	}.Encode()
}

// SetConfig accepts nothing: no field is writable without
// VIRTIO_BLK_F_CONFIG_WCE, which the device does not offer (its cache is
// always write-back; FLUSH makes it durable).
func (d *device) SetConfig(offset uint32, data []byte) error {
	return fmt.Errorf("config write of %d bytes at %d: %w", len(data), offset, vhostuser.ErrProtocol)
}

func (d *device) StartQueue(q *vhostuser.Queue) error {
	o, err := startOwner(d, q)
	if err != nil {
		return err
	}
	d.st.resubmitted.Add(uint64(q.Resubmitted))
	d.mu.Lock()
	d.owners[q.Index] = o
	d.mu.Unlock()
	return nil
}

func (d *device) StopQueue(index int) {
	d.mu.Lock()
	o := d.owners[index]
	d.owners[index] = nil
	d.mu.Unlock()
	if o != nil {
		o.stop()
	}
}

func (d *device) Reset() {}

// counters are the device's Stats, updated by every queue.
type counters struct {
	ops                                                              [numOps]opCounters
	unsupported, bad, fallbacks, resubmitted, held, staged, vectored atomic.Uint64
	inflight                                                         atomic.Int64
}

// Request kinds counted apart (Stats' OpStats).
const (
	opRead = iota
	opWrite
	opFlush
	opDiscard
	opWriteZeroes
	opGetID
	numOps
)

type opCounters struct {
	requests, errors, bytes atomic.Uint64
	buckets                 [len(LatencyBounds) + 1]atomic.Uint64
	sum                     atomic.Int64
}

func (c *opCounters) observe(d time.Duration, bytes uint64, failed bool) {
	c.requests.Add(1)
	c.bytes.Add(bytes)
	if failed {
		c.errors.Add(1)
	}
	i := 0
	for i < len(LatencyBounds) && d > LatencyBounds[i] {
		i++
	}
	c.buckets[i].Add(1)
	c.sum.Add(int64(d))
}

func (c *opCounters) snapshot() OpStats {
	s := OpStats{Requests: c.requests.Load(), Errors: c.errors.Load(), Bytes: c.bytes.Load()}
	for i := range c.buckets {
		s.Latency.Buckets[i] = c.buckets[i].Load()
	}
	s.Latency.Sum = time.Duration(c.sum.Load())
	return s
}

func (c *counters) snapshot() Stats {
	return Stats{
		Read: c.ops[opRead].snapshot(), Write: c.ops[opWrite].snapshot(), Flush: c.ops[opFlush].snapshot(),
		Discard: c.ops[opDiscard].snapshot(), WriteZeroes: c.ops[opWriteZeroes].snapshot(), GetID: c.ops[opGetID].snapshot(),
		Unsupported: c.unsupported.Load(), Bad: c.bad.Load(), Inflight: c.inflight.Load(),
		Fallbacks: c.fallbacks.Load(), Resubmitted: c.resubmitted.Load(), Held: c.held.Load(),
		Staged: c.staged.Load(), Vectored: c.vectored.Load(),
	}
}
