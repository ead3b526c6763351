package image

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

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

// Stat describes the disk.
func (h *Disk) Stat() DiskInfo { return h.d.info() }

// Size returns the disk's size in bytes.
func (h *Disk) Size() int64 {
	h.d.mu.RLock()
	defer h.d.mu.RUnlock()
	return h.d.attr.Size
}

func (d *disk) info() DiskInfo {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.infoUnlocked()
}

// infoUnlocked builds a DiskInfo; caller holds d.mu (either mode) or owns d.
func (d *disk) infoUnlocked() DiskInfo {
	return DiskInfo{
		ID:        d.id,
		Name:      d.name,
		Size:      d.attr.Size,
		Mode:      d.attr.Mode,
		UID:       d.attr.UID,
		GID:       d.attr.GID,
		Atime:     time.Unix(0, d.atime.Load()),
		Mtime:     time.Unix(0, d.mtime.Load()),
		Ctime:     time.Unix(0, d.attr.Ctime),
		Allocated: int64(d.m.Blocks() * d.s.bs),
		Extents:   d.m.Len(),
	}
}

func (d *disk) touch() {
	d.mtime.Store(time.Now().UnixNano())
	d.timesDirty.Store(true)
}

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

// rmwBlock rewrites the mapped virtual block v with fn applied to its
// content; a hole is left alone. Caller holds an exclusive range lock on v.
func (d *disk) rmwBlock(v uint64, fn func(block []byte)) error {
	s := d.s
	d.mu.RLock()
	segs := d.m.Lookup(nil, v, 1)
	d.mu.RUnlock()
	if segs[0].Hole {
		return nil
	}
	buf := s.pool.Get(int(s.bs))
	defer s.pool.Put(buf)
	sc := getScratch()
	defer putScratch(sc)
	c := s.stats.shard(sc)
	if err := s.readData(c, buf, segs[0].Phys); err != nil {
		return err
	}
	fn(buf)
	if err := s.writeData(c, buf, segs[0].Phys, false); err != nil {
		return err
	}
	s.writeGen.Add(1)
	// The caller's size or punch record relies on this write: the commit
	// that makes the record durable must flush it first.
	s.mu.Lock()
	s.mu.pend.dataFirst()
	s.mu.Unlock()
	return nil
}

// zeroPartial zeroes bytes [from, to) of the disk, which lie in one block.
func (d *disk) zeroPartial(from, to int64) error {
	bs := int64(d.s.bs)
	v := from / bs
	lo, hi := from-v*bs, to-v*bs
	return d.rmwBlock(uint64(v), func(b []byte) { clear(b[lo:hi]) })
}

// Punch makes [off, off+n) read as zeros and frees the whole blocks in it.
// The size does not change; the range is clipped to the size.
func (h *Disk) Punch(off, n int64) error {
	if err := h.live(); err != nil {
		return err
	}
	return h.d.punch(off, n, true)
}

// ZeroRange makes [off, off+n) read as zeros, freeing whole blocks. Unless
// keepSize, a range ending past the size grows the disk.
func (h *Disk) ZeroRange(off, n int64, keepSize bool) error {
	if err := h.live(); err != nil {
		return err
	}
	return h.d.punch(off, n, keepSize)
}

func (d *disk) punch(off, n int64, keepSize bool) error {
	s := d.s
	if err := checkRange(off, n); err != nil {
		return fmt.Errorf("disk %d punch: %w", d.id, err)
	}
	if n == 0 {
		return nil
	}
	if err := s.writable(); err != nil {
		return fmt.Errorf("disk %d punch: %w", d.id, err)
	}
	bs := int64(s.bs)
	first, count := coalesce.BlockRange(uint64(off), uint64(n), s.bs)
	lr := d.ranges.lock(first, count, true)
	defer lr.unlock()
	d.mu.RLock()
	size := d.attr.Size
	d.mu.RUnlock()

	end := min(off+n, size)
	if off < end {
		// Whole blocks to free: those inside [off, end), where a last
		// partial block ending at the size counts as whole (the bytes past
		// the size are zeros already).
		wFirst := (off + bs - 1) / bs
		wEnd := end / bs
		if end == size {
			wEnd = (size + bs - 1) / bs
		}
		if off%bs != 0 {
			if err := d.zeroPartial(off, min(end, (off/bs+1)*bs)); err != nil {
				return fmt.Errorf("disk %d punch at %d: %w", d.id, off, err)
			}
		}
		if end%bs != 0 && end != size && end/bs >= wFirst && (off/bs != end/bs || off%bs == 0) {
			if err := d.zeroPartial(end/bs*bs, end); err != nil {
				return fmt.Errorf("disk %d punch at %d: %w", d.id, off, err)
			}
		}
		if wFirst < wEnd {
			d.unmap(uint64(wFirst), uint64(wEnd-wFirst))
		}
	}
	if !keepSize && off+n > size {
		d.growSize(off + n)
	}
	d.touch()
	return nil
}

// unmap frees virtual blocks [v, v+n) and journals it. Caller holds an
// exclusive range lock over them.
func (d *disk) unmap(v, n uint64) {
	s := d.s
	s.cut.RLock()
	defer s.cut.RUnlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	before := d.m.Len()
	freed := d.m.Punch(v, n, nil)
	if len(freed) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.extents += d.m.Len() - before
	s.appendLocked(record{Type: recPunch, ID: d.id, Virt: v, Len: n})
	s.quarantineLocked(freed)
}

// setSize sets the size and journals it; a shrink unmaps every block past
// the new size. Caller holds an exclusive range lock from the new size on.
func (d *disk) setSize(size int64) {
	s := d.s
	s.cut.RLock()
	defer s.cut.RUnlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	before := d.m.Len()
	keep := coalesce.RoundUp(uint64(size), s.bs) / s.bs
	freed := d.m.Punch(keep, ^uint64(0)-keep, nil)
	d.attr.Size = size
	d.attr.Ctime = time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.extents += d.m.Len() - before
	s.appendLocked(record{Type: recSize, ID: d.id, Attr: diskAttr{Size: size}})
	s.quarantineLocked(freed)
}

// growSize raises the size to size and journals it; it never lowers it.
// A grower (Allocate, ZeroRange) reads the size when it starts and holds
// only its own range, so a write past that range may have grown the disk
// further meanwhile: that size, and the write's blocks, stay. Caller holds
// an exclusive range lock over its own range.
func (d *disk) growSize(size int64) {
	s := d.s
	s.cut.RLock()
	defer s.cut.RUnlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if size <= d.attr.Size {
		return
	}
	d.attr.Size = size
	d.attr.Ctime = time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.appendLocked(record{Type: recSize, ID: d.id, Attr: diskAttr{Size: size}})
}

// Truncate sets the disk's size. Shrinking frees every block past the new
// size and zeroes the rest of the last partial block, so growing again
// reads zeros there.
func (h *Disk) Truncate(size int64) error {
	if err := h.live(); err != nil {
		return err
	}
	d, s := h.d, h.d.s
	if size < 0 || size > MaxDiskSize {
		return fmt.Errorf("disk %d truncate to %d: %w", d.id, size, ErrTooLarge)
	}
	if err := s.writable(); err != nil {
		return fmt.Errorf("disk %d truncate: %w", d.id, err)
	}
	bs := int64(s.bs)
	first := uint64(size / bs)
	lr := d.ranges.lock(first, ^uint64(0)-first, true)
	defer lr.unlock()
	d.mu.RLock()
	old := d.attr.Size
	d.mu.RUnlock()
	if size == old {
		return nil
	}
	if size < old && size%bs != 0 {
		if err := d.zeroPartial(size, min(old, (size/bs+1)*bs)); err != nil {
			return fmt.Errorf("disk %d truncate to %d: %w", d.id, size, err)
		}
	}
	d.setSize(size)
	d.touch()
	return nil
}

// Allocate makes sure [off, off+n) has blocks (fallocate mode 0): holes get
// new zeroed blocks. Unless keepSize the disk grows to cover the range; with
// keepSize nothing is allocated past the size.
func (h *Disk) Allocate(off, n int64, keepSize bool) error {
	if err := h.live(); err != nil {
		return err
	}
	d, s := h.d, h.d.s
	if err := checkRange(off, n); err != nil {
		return fmt.Errorf("disk %d allocate: %w", d.id, err)
	}
	if n == 0 {
		return nil
	}
	if err := s.writable(); err != nil {
		return fmt.Errorf("disk %d allocate: %w", d.id, err)
	}
	first, count := coalesce.BlockRange(uint64(off), uint64(n), s.bs)
	lr := d.ranges.lock(first, count, true)
	defer lr.unlock()
	d.mu.RLock()
	size := d.attr.Size
	d.mu.RUnlock()
	end := off + n
	if keepSize {
		end = min(end, size)
	}
	if off < end {
		first, count = coalesce.BlockRange(uint64(off), uint64(end-off), s.bs)
		if err := d.allocateZeroed(first, count); err != nil {
			return fmt.Errorf("disk %d allocate [%d,+%d): %w", d.id, off, n, err)
		}
	}
	if !keepSize && off+n > size {
		d.growSize(off + n)
	}
	return nil
}

// allocateZeroed gives the holes in virtual blocks [first, first+count)
// zeroed blocks. Caller holds an exclusive range lock over them.
func (d *disk) allocateZeroed(first, count uint64) error {
	s := d.s
	bs := s.bs
	d.mu.RLock()
	segs := d.m.Lookup(nil, first, count)
	d.mu.RUnlock()
	for _, sg := range segs {
		if !sg.Hole {
			continue
		}
		goal, hasGoal := uint64(0), false
		d.mu.RLock()
		if prev, ok := d.m.Before(sg.Virt); ok {
			goal, hasGoal = prev.Phys+(sg.Virt-prev.Virt), true
		}
		d.mu.RUnlock()
		allocs, err := s.allocData(nil, sg.Len, goal, hasGoal, true)
		if err != nil {
			s.unallocate(allocs)
			return err
		}
		for _, e := range allocs {
			if err := s.be.WriteZeroes(s.dataOff+int64(e.Start*bs), int64(e.Len*bs)); err != nil {
				s.stats.Errors.Add(1)
				s.unallocate(allocs)
				return err
			}
		}
		s.writeGen.Add(1)
		s.cut.RLock()
		d.mu.Lock()
		before := d.m.Len()
		v := sg.Virt
		recs := make([]record, 0, len(allocs))
		for _, e := range allocs {
			d.m.Insert(blockmap.Extent{Virt: v, Phys: e.Start, Len: e.Len}, nil)
			recs = append(recs, record{Type: recMap, ID: d.id, Virt: v, Phys: e.Start, Len: e.Len})
			v += e.Len
		}
		s.mu.Lock()
		s.mu.extents += d.m.Len() - before
		for _, e := range allocs {
			delete(s.mu.inflight, e.Start)
		}
		s.appendLocked(recs...)
		s.mu.Unlock()
		d.mu.Unlock()
		s.cut.RUnlock()
	}
	return nil
}

// SeekData returns the first offset >= off that holds data (SEEK_DATA);
// ErrNoData when there is none before the end of the disk.
func (h *Disk) SeekData(off int64) (int64, error) {
	return h.seek("seek data", off, func(d *disk, bs int64) (int64, error) {
		v, ok := d.m.NextData(uint64(off / bs))
		if !ok || int64(v) >= (d.attr.Size+bs-1)/bs {
			return 0, ErrNoData
		}
		return max(off, int64(v)*bs), nil
	})
}

// SeekHole returns the first offset >= off in a hole (SEEK_HOLE); the end
// of the disk counts as a hole. ErrNoData (ENXIO) when off is past the end.
func (h *Disk) SeekHole(off int64) (int64, error) {
	return h.seek("seek hole", off, func(d *disk, bs int64) (int64, error) {
		v := d.m.NextHole(uint64(off / bs))
		return min(max(off, int64(v)*bs), d.attr.Size), nil
	})
}

// seek runs find under the disk's read lock for an offset inside the disk.
func (h *Disk) seek(what string, off int64, find func(d *disk, bs int64) (int64, error)) (int64, error) {
	if err := h.live(); err != nil {
		return 0, err
	}
	d := h.d
	d.mu.RLock()
	defer d.mu.RUnlock()
	if off < 0 {
		return 0, fmt.Errorf("%s at %d: %w", what, off, ErrInvalid)
	}
	if off >= d.attr.Size {
		return 0, ErrNoData
	}
	return find(d, int64(d.s.bs))
}

// AttrChange lists attribute changes; nil fields stay as they are.
type AttrChange struct {
	Mode     *uint32
	UID, GID *uint32
	Atime    *time.Time
	Mtime    *time.Time
}

// SetAttr changes mode, owner or times; the change time becomes now.
func (h *Disk) SetAttr(c AttrChange) error {
	if err := h.live(); err != nil {
		return err
	}
	d, s := h.d, h.d.s
	s.cut.RLock()
	defer s.cut.RUnlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil {
		return fmt.Errorf("disk %d setattr: %w", d.id, err)
	}
	if c.Mode != nil {
		d.attr.Mode = *c.Mode
	}
	if c.UID != nil {
		d.attr.UID = *c.UID
	}
	if c.GID != nil {
		d.attr.GID = *c.GID
	}
	if c.Atime != nil {
		d.atime.Store(c.Atime.UnixNano())
	}
	if c.Mtime != nil {
		d.mtime.Store(c.Mtime.UnixNano())
	}
	d.attr.Ctime = time.Now().UnixNano()
	s.appendLocked(d.attrRecordLocked())
	return nil
}

// attrRecordLocked returns a record of d's current attributes. Caller holds
// d.mu.
func (d *disk) attrRecordLocked() record {
	a := d.attr
	a.Atime, a.Mtime = d.atime.Load(), d.mtime.Load()
	return record{Type: recAttr, ID: d.id, Attr: a}
}
