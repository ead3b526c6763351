package image

import (
	"fmt"
	"io"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
)

// ReadAt reads len(p) bytes at off. Like a file, it returns io.EOF when the
// read reaches the end of the disk. Holes read as zeros without I/O.
//
// It is a plan (IOPlan) made waiting as needed, whose I/O the caller's
// goroutine performs through the backend.
func (h *Disk) ReadAt(p []byte, off int64) (int, error) {
	var pl IOPlan
	switch err := h.prepare(&pl, p, off, planMode{wait: true}); {
	case err == errEmpty:
		return 0, nil
	case err != nil:
		return 0, err
	}
	if err := pl.perform(); err != nil {
		return 0, fmt.Errorf("disk %d read %d bytes at %d: %w", h.d.id, pl.N, off, err)
	}
	n := pl.N
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off, growing the disk if the write ends past its size.
// Blocks never written before are allocated where their mapped neighbours
// in the disk aim them (docs/DESIGN.md, rule 7), and their unwritten bytes
// are zeros; mapped blocks are overwritten in place. On error nothing of
// the write is mapped; bytes of already-mapped blocks may have changed, as
// on a disk.
func (h *Disk) WriteAt(p []byte, off int64) (int, error) {
	n, _, err := h.write(p, off, false)
	return n, err
}

// WriteAtSync is WriteAt for a synchronous write: it returns once the write
// is durable together with what is needed to read it back, its mapping and
// the disk's size (O_DSYNC, RWF_DSYNC), and with all the times too (O_SYNC).
//
// An O_DSYNC overwrite in place of blocks whose mappings are all durable
// (no journal record of the store but the disks' dirty times is pending,
// Store.mappingsDurable) goes to the backing as
// durable writes (Backend.WriteAtDurable, a FUA write) and needs no
// commit, so concurrent ones do not wait for each other or for a flush.
// Any other synchronous write (into a hole, growing the disk, while
// records are pending, O_SYNC) is written as WriteAt writes and then
// committed (CommitData, or Commit with all), sharing that commit with
// concurrent committers. Either way, like a disk's FUA write, it makes
// no promise for other writes that are not yet durable.
func (h *Disk) WriteAtSync(p []byte, off int64, all bool) (int, error) {
	n, durable, err := h.write(p, off, !all)
	if err != nil || durable || n == 0 {
		return n, err
	}
	commit := h.d.s.CommitData
	if all {
		commit = h.d.s.Commit
	}
	if err := commit(); err != nil {
		return 0, fmt.Errorf("disk %d synchronous write of %d bytes at %d: %w", h.d.id, len(p), off, err)
	}
	return n, nil
}

// write is WriteAt; with fua an overwrite in place of blocks whose
// mappings are durable uses durable writes, and durable says it did. Like
// ReadAt, it is a plan made waiting as needed and performed on the
// caller's goroutine.
func (h *Disk) write(p []byte, off int64, fua bool) (n int, durable bool, err error) {
	var pl IOPlan
	switch err := h.prepare(&pl, p, off, planMode{write: true, fua: fua, wait: true}); {
	case err == errEmpty:
		return 0, false, nil
	case err != nil:
		return 0, false, err
	}
	if err := pl.perform(); err != nil {
		return 0, false, fmt.Errorf("disk %d write %d bytes at %d: %w", h.d.id, len(p), off, err)
	}
	return len(p), pl.Durable, nil
}

// countRequest counts one read or write request of n bytes, served, into
// the store's and the disk's counter shards of sc.
func (d *disk) countRequest(sc *scratch, write bool, n uint64) {
	c, dc := d.s.stats.shard(sc), d.counters.shard(sc)
	if write {
		c.WriteRequestSize.Observe(n)
		dc.writes.Add(1)
		dc.writeBytes.Add(n)
	} else {
		c.ReadRequestSize.Observe(n)
		dc.reads.Add(1)
		dc.readBytes.Add(n)
	}
}

// zeroHoles clears the parts of buf (covering virtual blocks from first on)
// that segs say are holes.
func zeroHoles(buf []byte, segs []blockmap.Segment, first, bs uint64) {
	for _, sg := range segs {
		if sg.Hole {
			lo := (sg.Virt - first) * bs
			clear(buf[lo:min(lo+sg.Len*bs, uint64(len(buf)))])
		}
	}
}

// grows reports whether a write ending at end grows the disk.
func (d *disk) grows(end int64) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return end > d.attr.Size
}

// mappingsDurable reports whether every journal record appended so far
// but the disks' dirty times is durable: then every mapping in memory is
// on the backing too, which a synchronous overwrite in place needs before
// it may go to the backing as a durable write alone. O_DSYNC does not
// promise the times (an O_SYNC write commits them), and the commit timer's
// unflushed commit holds nothing else (Store.lazy), so an O_DSYNC writer
// does not pay a flush after every tick of the timer.
func (s *Store) mappingsDurable() bool {
	s.mu.Lock()
	appended := s.mu.moreGen
	s.mu.Unlock()
	return s.durableRec.Load() >= appended
}

// publishWriteLockedRange ends a write whose data is on the backing: it maps
// the blocks fillHoles gave it and grows the disk to end, with their
// records. Caller holds the write's range lock.
func (d *disk) publishWriteLockedRange(sc *scratch, end int64) {
	if len(sc.allocs) == 0 && !d.grows(end) {
		return
	}
	d.changeMap(nil, func() (mapChange, error) {
		var recs []record
		sc.unmapped = sc.unmapped[:0] // shared blocks this write gave new ones
		for _, sg := range sc.out {
			if isAllocated(sg, sc.allocs) {
				e := d.extentOf(sg, sg.Virt)
				sc.freed = d.m.Insert(e, sc.freed[:0])
				if len(sc.freed) != 0 && !sc.cowed {
					panic(fmt.Sprintf("image: disk %d: write mapped over %v while holding its range lock", d.id, sc.freed))
				}
				sc.unmapped = append(sc.unmapped, sc.freed...)
				recs = append(recs, d.mapRecord(e))
			}
		}
		if end > d.attr.Size {
			d.attr.Size = end
			recs = append(recs, record{Type: recSize, ID: d.id, Attr: diskAttr{Size: end}})
		}
		// The shared blocks lose this disk's reference.
		return mapChange{recs: recs, freed: sc.unmapped, mapped: sc.allocs}, nil
	})
}

// isAllocated reports whether segment sg was carved from allocs.
func isAllocated(sg blockmap.Segment, allocs []pext) bool {
	for _, a := range allocs {
		if sg.Phys == a.Start && sg.Len == a.Len {
			return true
		}
	}
	return false
}

// fillBlock fills dst (one block) with the current content of virtual
// block v: zeros for a hole (segs, a lookup of the range, says which),
// else what a read plan of the store's own reads (readLockedRange).
// Caller holds a range lock over v.
func (d *disk) fillBlock(dst []byte, segs []blockmap.Segment, v uint64) error {
	for _, sg := range segs {
		if v < sg.Virt || v >= sg.Virt+sg.Len {
			continue
		}
		if sg.Hole {
			clear(dst)
			return nil
		}
		return d.readLockedRange(dst, int64(v*d.s.bs))
	}
	panic(fmt.Sprintf("image: block %d not in lookup segments", v))
}

func countLookup(c *Shard, segs []blockmap.Segment) {
	c.Lookups.Add(1)
	c.LookupSegments.Add(uint64(len(segs)))
}

func countCoalesce(c *Shard, segs []blockmap.Segment, runs []coalesce.Run) {
	pieces := 0
	for _, sg := range segs {
		if !sg.Hole {
			pieces++
		}
	}
	c.CoalescePieces.Add(uint64(pieces))
	c.CoalesceRuns.Add(uint64(len(runs)))
}

// Sync makes every write acknowledged before it durable, data and mapping
// alike (fsync). After a failed flush it keeps failing (ErrFailed).
func (h *Disk) Sync() error {
	if err := h.live(); err != nil {
		return err
	}
	if err := h.d.s.Commit(); err != nil {
		return fmt.Errorf("disk %d sync: %w", h.d.id, err)
	}
	return nil
}

// SyncData makes every write acknowledged before it durable with the
// metadata needed to read it back, but not the access and modification
// times (fdatasync, O_DSYNC): after overwrites in place it is one flush of
// the backing. After a failed flush it keeps failing (ErrFailed).
func (h *Disk) SyncData() error {
	if err := h.live(); err != nil {
		return err
	}
	if err := h.d.s.CommitData(); err != nil {
		return fmt.Errorf("disk %d sync data: %w", h.d.id, err)
	}
	return nil
}

// MappingsDurable says whether every mapping change made so far (by
// writes, punches, truncates) is durable: a process that opens the store
// after this one dies reads back every write completed before the call.
// False means a commit (CommitData) is needed for that.
func (s *Store) MappingsDurable() bool { return s.mappingsDurable() }
