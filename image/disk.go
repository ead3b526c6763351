package image

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/image/placement"
)

// disk is the shared state of one virtual disk; handles (Disk) point to it.
type disk struct {
	s      *Store
	id     uint64
	ranges *rangeLock // orders overlapping requests; held across data I/O

	mu sync.RWMutex
	// Guarded by mu:
	m       *blockmap.Map
	attr    diskAttr // Size, Mode, UID, GID, Ctime (times below are atomics)
	name    string
	orphan  bool // unlinked while open: no name, deleted at the last Close
	deleted bool

	origin uint64   // the disk it is a snapshot or clone of (0: none)
	uuid   [16]byte // identity across stores, given to snapshots (zero: none)

	// Guarded by s.mu:
	opens int
	units map[uint64]*placement.Unit // allocation units reserved, by unit index (placement.go)

	// flags are diskFlagSnapshot (read only) and diskFlagClone; set at
	// creation, or at the first whole-disk copy into it.
	flags atomic.Uint32
	// mayShare says the map may reference shared blocks (a snapshot or
	// copy involved the disk): only then do writes look for blocks to
	// copy on write. Set under s.mu before any of its blocks is shared;
	// never cleared.
	mayShare atomic.Bool

	counters diskCounters

	// layout is the base of the disk's layout plus one (0: none chosen),
	// for the first writes of a disk with nothing mapped: chosen by the
	// first of them and kept, so that concurrent first writes aim at one
	// layout (Store.diskBase); forgotten when the map empties.
	layout atomic.Uint64
	// cowLayout is the same for the blocks the disk gets by copy-on-write
	// where no block of its own is near (Store.cowBase): its first layout
	// holds blocks it shares. Forgotten when the map empties.
	cowLayout atomic.Uint64

	// Access and modification times change on every I/O; they are kept
	// outside mu and journalled lazily, at the next commit.
	atime, mtime atomic.Int64
	timesDirty   atomic.Bool
}

// Disk is an open handle on a disk. All methods are safe for concurrent use.
// A handle keeps its disk alive after Remove until Close.
type Disk struct {
	d      *disk
	closed atomic.Bool
}

// OpenDisk opens a handle on the disk called name.
func (s *Store) OpenDisk(name string) (*Disk, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, fmt.Errorf("open disk %q: %w", name, ErrClosed)
	}
	d, ok := s.mu.names[name]
	if !ok {
		return nil, fmt.Errorf("open disk %q: %w", name, ErrNotExist)
	}
	d.opens++
	return &Disk{d: d}, nil
}

// Close releases the handle. Closing the last handle of a removed disk
// frees its blocks.
func (h *Disk) Close() error {
	if !h.closed.CompareAndSwap(false, true) {
		return ErrClosed
	}
	d, s := h.d, h.d.s
	defer s.lockAll(d)()
	d.opens--
	if d.opens == 0 && d.orphan && !d.deleted && s.usableLockedMu() == nil {
		s.deleteDiskLockedMu(d)
	}
	return nil
}

func (h *Disk) live() error {
	if h.closed.Load() {
		return ErrClosed
	}
	return nil
}

// ID returns the disk's stable identifier (it survives renames).
func (h *Disk) ID() uint64 { return h.d.id }

// scratch holds the per-request slices of the I/O path, pooled so that the
// hot path does not allocate.
type scratch struct {
	segs   []blockmap.Segment
	out    []blockmap.Segment
	runs   []coalesce.Run
	allocs []pext
	freed  []blockmap.Extent
	ios    []BackingIO        // an IOPlan's, while it is held
	lat    []time.Duration    // each of an IOPlan's I/Os' own latency, when run one after another (IOPlan.run)
	cow    []blockmap.Segment // a write's segments with its shared pieces as holes (Store.cowLockedMu)
	cowed  bool               // the write gives shared blocks new ones: publishing unmaps them
	shard  uint32             // the counter shard this scratch's requests count into

	unmapped []blockmap.Extent // the shared blocks a copy-on-write unmaps, while it publishes
}

// scratchPool keeps scratches per P (sync.Pool's own rule), and each
// scratch numbers its counter shard in the order the scratches were made,
// so requests on different CPUs count into different shards.
var (
	scratchPool = sync.Pool{New: newScratch}
	scratches   atomic.Uint32
)

func newScratch() any {
	return &scratch{
		shard:  scratches.Add(1),
		segs:   make([]blockmap.Segment, 0, 16),
		out:    make([]blockmap.Segment, 0, 16),
		runs:   make([]coalesce.Run, 0, 16),
		allocs: make([]pext, 0, 8),
	}
}

func getScratch() *scratch { return scratchPool.Get().(*scratch) }

func putScratch(sc *scratch) {
	sc.segs, sc.out, sc.runs, sc.allocs, sc.freed, sc.ios, sc.cow, sc.cowed = sc.segs[:0], sc.out[:0], sc.runs[:0], sc.allocs[:0], sc.freed[:0], sc.ios[:0], sc.cow[:0], false
	scratchPool.Put(sc)
}

// checkRange validates an I/O range.
func checkRange(off, n int64) error {
	if off < 0 || n < 0 {
		return fmt.Errorf("offset %d length %d: %w", off, n, ErrInvalid)
	}
	if off > MaxDiskSize || n > MaxDiskSize-off {
		return fmt.Errorf("range [%d,+%d) beyond the largest disk size %d: %w", off, n, MaxDiskSize, ErrTooLarge)
	}
	return nil
}

// forgetLayouts makes the next write into a disk whose map emptied choose
// its layouts afresh.
func (d *disk) forgetLayouts() {
	d.layout.Store(0)
	d.cowLayout.Store(0)
}
