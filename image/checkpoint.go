package image

import (
	"fmt"
	"sort"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/image/placement"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// Checkpoint writes the whole state (catalog, every map, the free map) to
// newly allocated blocks, points both superblocks at it and empties the
// journal. It bounds replay time and is taken when the journal is three
// quarters full and at Close.
func (s *Store) Checkpoint() error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.checkpointLockedCommit()
}

// checkpointLockedCommit captures a consistent cut under s.cut (maps are
// cloned in O(1), so writers wait only for the capture), then writes it
// outside every lock but commitMu. Order: flush data, write the checkpoint,
// flush, write superblock A, flush, B, flush; only then release the blocks
// of the old checkpoint and of the records it covers. A crash at any point
// leaves either the old checkpoint plus its journal, or the new one. Caller
// holds commitMu.
func (s *Store) checkpointLockedCommit() error {
	if s.opts.ReadOnly {
		return nil
	}
	s.appendDirtyTimes()
	writes := s.writeGen.Load()

	s.cut.Lock()
	s.mu.Lock()
	if err := s.mu.failed; err != nil {
		s.mu.Unlock()
		s.cut.Unlock()
		return err
	}
	ds := make([]*disk, 0, len(s.mu.disks))
	for _, d := range s.mu.disks {
		ds = append(ds, d)
	}
	taken, rec := s.mu.pend.take(), s.mu.recGen
	seq, nextID, oldExts := s.mu.nextSeq, s.mu.nextID, s.mu.ckptExts
	s.mu.nextSeq = seq + 1
	s.mu.releasing++
	s.mu.Unlock()
	defer s.doneReleasing()
	sort.Slice(ds, func(i, j int) bool { return ds[i].id < ds[j].id })
	c := &checkpoint{Version: s.sb.version(), Seq: seq, UUID: s.uuid, NextID: nextID, Disks: make([]ckptDisk, len(ds))}
	maps := make([]*blockmap.Map, len(ds))
	for i, d := range ds {
		d.mu.Lock()
		maps[i] = d.m.Clone()
		r := d.attrRecordLockedMu()
		c.Disks[i] = ckptDisk{ID: d.id, Attr: r.Attr, Name: d.name, Flags: d.flags.Load(), Origin: d.origin, UUID: d.uuid}
		c.Disks[i].Attr.Size = d.attr.Size
		if d.orphan {
			c.Disks[i].Flags |= diskFlagOrphan
		}
		d.mu.Unlock()
	}
	s.cut.Unlock()

	var uses []refcount.Range
	for i, m := range maps {
		exts := make([]extentRec, 0, m.Len())
		m.Ascend(func(e blockmap.Extent) bool {
			exts = append(exts, extentRec{Virt: e.Virt, Phys: e.Phys, Len: e.Len})
			if c.Version == sharedVersion {
				uses = append(uses, refcount.Range{Start: e.Phys, Len: e.Len})
			}
			return true
		})
		c.Disks[i].Extents = exts
	}
	// The counts as of the cut, from the maps themselves: the references
	// the captured records drop are gone from them, while the live table
	// keeps those until the checkpoint is durable (quarantineLockedMu).
	c.Shared = refcount.Depths(uses)
	if err := s.flushData(); err != nil {
		return err
	}
	s.lazy = lazyCommit{} // durable now; the checkpoint supersedes it anyway
	exts, stream, err := s.writeCheckpointStream(c)
	if err != nil {
		// Nothing durable changed: put the captured work back in front of
		// whatever came since, so the next commit carries it.
		s.mu.Lock()
		s.mu.pend.prepend(taken)
		s.mu.nextSeq = seq
		s.mu.Unlock()
		if s.isFailed() {
			return err
		}
		return fmt.Errorf("checkpoint: %w", err)
	}
	if err := s.flush(); err != nil {
		return s.fail(fmt.Errorf("flush checkpoint %d: %w", seq, err))
	}
	sb := s.sb
	sb.Generation++
	sb.CkptSeq, sb.CkptLen, sb.CkptCRC, sb.CkptExts = seq, uint64(len(stream)), crc(stream), exts
	if err := s.writeSuper(&sb); err != nil {
		return s.fail(fmt.Errorf("checkpoint %d: %w", seq, err))
	}
	s.sb = sb
	s.jOff = 0
	s.durableRec.Store(rec)
	s.flushedWrites = writes
	s.mu.Lock()
	s.mu.ckptExts = exts
	s.mu.Unlock()
	s.stats.Checkpoints.Add(1)
	s.releaseLockedCommit(append(taken.quarantine, oldExts...))
	return s.strictCheckLockedCommit()
}

func (s *Store) flushData() error {
	if err := s.flush(); err != nil {
		return s.fail(fmt.Errorf("flush data: %w", err))
	}
	return nil
}

func (s *Store) isFailed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.failed != nil
}

// writeCheckpointStream allocates blocks for c (from the top of the data
// region), completes c's free map (everything no map and no checkpoint block
// uses), encodes it and writes it. It does not flush.
func (s *Store) writeCheckpointStream(c *checkpoint) ([]pext, []byte, error) {
	var used []pext
	nameBytes, extents := 0, 0
	for i := range c.Disks {
		nameBytes += len(c.Disks[i].Name)
		extents += len(c.Disks[i].Extents)
		for _, e := range c.Disks[i].Extents {
			used = append(used, pext{Start: e.Phys, Len: e.Len})
		}
	}
	sort.Slice(used, func(i, j int) bool { return used[i].Start < used[j].Start })
	dataBlocks := s.sb.DataBlocks
	// Allocating the checkpoint can split at most one free extent per
	// checkpoint extent, so this bound holds for the final free map.
	est := ckptSize(c.Version, len(c.Disks), nameBytes, extents, len(placement.Complement(used, dataBlocks))+maxCkptExtents+1, len(c.Shared))
	nblocks := (uint64(est) + s.bs - 1) / s.bs
	s.mu.Lock()
	exts, err := s.mu.alloc.AllocHigh(nblocks, maxCkptExtents)
	if err != nil && s.mu.reserved > 0 {
		s.releaseUnitsLockedMu(nil, 0) // placement gives way to space
		exts, err = s.mu.alloc.AllocHigh(nblocks, maxCkptExtents)
	}
	s.mu.Unlock()
	if err != nil {
		return nil, nil, placementErr(err)
	}
	used = append(used, exts...)
	sort.Slice(used, func(i, j int) bool { return used[i].Start < used[j].Start })
	c.Free = placement.Complement(used, dataBlocks)
	stream := c.encode(make([]byte, 0, est))
	if uint64(len(stream)) > nblocks*s.bs {
		panic(fmt.Sprintf("image: checkpoint of %d bytes exceeds its estimate %d", len(stream), est))
	}
	total := int(nblocks * s.bs)
	buf := make([]byte, total+pageSize)
	out := alignedPage(buf, total)
	copy(out, stream)
	off := 0
	for _, e := range exts {
		n := int(e.Len * s.bs)
		for done := 0; done < n; done += maxRunBytes {
			chunk := min(maxRunBytes, n-done)
			at := s.dataOff + int64(e.Start*s.bs) + int64(done)
			if _, err := s.be.WriteAt(out[off+done:off+done+chunk], at); err != nil {
				s.unallocate(exts)
				return nil, nil, s.fail(fmt.Errorf("write checkpoint at %d: %w", at, err))
			}
			s.stats.metaWrite(chunk)
		}
		off += n
	}
	return exts, stream, nil
}

// loadCheckpoint reads the checkpoint the superblock points to and builds
// the catalog, the maps and the allocator from it.
func (s *Store) loadCheckpoint() error {
	var total uint64
	for _, e := range s.sb.CkptExts {
		total += e.Len * s.bs
	}
	buf := make([]byte, total+pageSize)
	in := alignedPage(buf, int(total))
	off := uint64(0)
	for _, e := range s.sb.CkptExts {
		n := e.Len * s.bs
		for done := uint64(0); done < n; done += maxRunBytes {
			chunk := min(maxRunBytes, n-done)
			at := s.dataOff + int64(e.Start*s.bs+done)
			if _, err := s.be.ReadAt(in[off+done:off+done+chunk], at); err != nil {
				return fmt.Errorf("read checkpoint at %d: %w", at, err)
			}
			s.stats.metaRead(int(chunk))
		}
		off += n
	}
	stream := in[:s.sb.CkptLen]
	if got := crc(stream); got != s.sb.CkptCRC {
		return fmt.Errorf("checkpoint %d: checksum %#08x, superblock says %#08x: %w", s.sb.CkptSeq, got, s.sb.CkptCRC, ErrCorrupt)
	}
	c, err := decodeCheckpoint(stream, s.uuid)
	if err != nil {
		return err
	}
	if c.Seq != s.sb.CkptSeq {
		return fmt.Errorf("checkpoint covers commit %d, superblock says %d: %w", c.Seq, s.sb.CkptSeq, ErrCorrupt)
	}
	if c.Version > s.sb.version() {
		return fmt.Errorf("checkpoint of version %d in a store of version %d: %w", c.Version, s.sb.version(), ErrCorrupt)
	}
	s.mu.nextID = c.NextID
	for i := range c.Disks {
		cd := &c.Disks[i]
		if _, dup := s.mu.disks[cd.ID]; dup {
			return fmt.Errorf("checkpoint: disk id %d appears twice: %w", cd.ID, ErrCorrupt)
		}
		d := s.newDisk(cd.ID, cd.Name, cd.Attr)
		d.orphan = cd.Flags&diskFlagOrphan != 0
		d.flags.Store(cd.Flags &^ diskFlagOrphan)
		d.origin, d.uuid = cd.Origin, cd.UUID
		for _, e := range cd.Extents { // sorted and disjoint: decodeCheckpoint checked
			if err := d.m.Append(blockmap.Extent{Virt: e.Virt, Phys: e.Phys, Len: e.Len}); err != nil {
				return fmt.Errorf("checkpoint: disk %d: %w: %w", cd.ID, err, ErrCorrupt)
			}
		}
		s.mu.disks[cd.ID] = d
		if _, taken := s.mu.names[cd.Name]; !taken && !d.orphan {
			s.mu.names[cd.Name] = d
		}
		s.mu.nextID = max(s.mu.nextID, cd.ID+1)
	}
	for _, f := range c.Free {
		if err := s.mu.alloc.Free(f); err != nil {
			s.openFindings = append(s.openFindings, Finding{Severity: Fatal, Code: CodeFreeMap,
				Message: fmt.Sprintf("checkpoint free map entry [%d,+%d): %v", f.Start, f.Len, err)})
		}
	}
	for _, e := range c.Shared {
		if err := s.mu.shared.Set(e); err != nil {
			s.openFindings = append(s.openFindings, Finding{Severity: Fatal, Code: CodeRefCount,
				Message: fmt.Sprintf("checkpoint reference counts: %v", err)})
		}
	}

	s.mu.ckptExts = s.sb.CkptExts
	s.mu.nextSeq = s.sb.CkptSeq + 1
	return nil
}
