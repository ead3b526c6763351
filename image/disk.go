package image

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
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

	// Guarded by s.mu:
	opens int

	counters diskCounters

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
	s.cut.RLock()
	defer s.cut.RUnlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	d.opens--
	if d.opens == 0 && d.orphan && !d.deleted && s.usableLocked() == nil {
		s.deleteDiskLocked(d)
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
	shard  uint32 // the counter shard this scratch's requests count into
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
	sc.segs, sc.out, sc.runs, sc.allocs, sc.freed = sc.segs[:0], sc.out[:0], sc.runs[:0], sc.allocs[:0], sc.freed[:0]
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

// writable returns why the store cannot take writes, if it cannot.
func (s *Store) writable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usableLocked()
}

// allocData allocates n data blocks for a write, keeping back the blocks a
// checkpoint will need. When the store is full but blocks are waiting in
// quarantine, it commits once to release them and tries again, if
// mayCommit.
func (s *Store) allocData(dst []pext, n, goal uint64, hasGoal, mayCommit bool) ([]pext, error) {
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if err := s.usableLocked(); err != nil {
			s.mu.Unlock()
			return dst, err
		}
		reserve := s.ckptReserveLocked()
		var err error
		if s.mu.alloc.freeBlocks < n+reserve {
			err = fmt.Errorf("need %d blocks, %d free (%d kept for metadata): %w", n, s.mu.alloc.freeBlocks, reserve, ErrNoSpace)
		} else {
			start := len(dst)
			dst, err = s.mu.alloc.alloc(dst, n, goal, hasGoal)
			for _, e := range dst[start:] {
				s.mu.inflight[e.Start] = e.Len
			}
			if err == nil {
				s.stats.Allocations.Add(1)
				s.stats.AllocatedBlocks.Add(n)
			}
		}
		// Blocks in quarantine, or taken by a commit under way, come free
		// when a commit completes: wait for one and try again.
		canRetry := len(s.mu.pend.quarantine) > 0 || s.mu.releasing > 0
		s.mu.Unlock()
		if err == nil || !errors.Is(err, ErrNoSpace) || !canRetry || !mayCommit || attempt > 0 {
			return dst, err
		}
		if cerr := s.Commit(); cerr != nil {
			return dst, fmt.Errorf("%w (commit to release freed blocks: %v)", err, cerr)
		}
	}
}

// unallocate returns blocks that were allocated but never mapped: no record
// names them, so they go straight back to the free set.
func (s *Store) unallocate(allocs []pext) {
	if len(allocs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range allocs {
		delete(s.mu.inflight, e.Start)
		if err := s.mu.alloc.free(e); err != nil {
			s.log.WithError(err).Error("returning unused blocks")
		}
	}
}

// ckptReserveLocked is the number of blocks kept free so that a full store
// can always checkpoint, and checkpoint again: the blocks a checkpoint of
// the current state needs, plus, when that is more than the current
// checkpoint holds, the difference. The current checkpoint's blocks come
// free only after the next one is written, so without that margin a store
// whose metadata grew since its last checkpoint could write one more
// checkpoint into the reserve and then have too little left for the next.
func (s *Store) ckptReserveLocked() uint64 {
	bytes := ckptSize(len(s.mu.disks), len(s.mu.disks)*MaxNameLen, s.mu.extents, s.mu.alloc.byStart.Len()+maxCkptExtents)
	need := uint64(bytes)/s.bs + 2
	var cur uint64
	for _, e := range s.mu.ckptExts {
		cur += e.Len
	}
	if need > cur {
		need += need - cur
	}
	return need
}
