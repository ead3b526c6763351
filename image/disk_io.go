package image

import (
	"errors"
	"fmt"
	"io"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/image/backend"
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
	n := pl.N
	if err := pl.run(); err != nil {
		pl.Abort()
		return 0, fmt.Errorf("disk %d read %d bytes at %d: %w", h.d.id, n, off, err)
	}
	pl.Finish()
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
	if err := pl.run(); err != nil {
		pl.Abort()
		return 0, false, fmt.Errorf("disk %d write %d bytes at %d: %w", h.d.id, len(p), off, err)
	}
	durable = pl.Durable
	pl.Finish()
	return len(p), durable, nil
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

// neighbours are what placement aims by (docs/DESIGN.md, rule 7): the
// disk's mapped extents on either side of a request's block range, and the
// disk's size in blocks.
type neighbours struct {
	d                *disk
	prev, next       blockmap.Extent
	hasPrev, hasNext bool
	blocks           uint64
	// cow: a neighbour was dropped because the disk shares its blocks
	// (ownNeighboursLockedMu), so the disk's first layout is where blocks
	// it shares lie: a hole with no neighbour aims at its copy-on-write
	// layout instead (Store.cowBase).
	cow bool
	// lazy: not looked up yet, for blocks [first, first+count): a write
	// whose holes its allocation units cover needs none (allocHoles
	// resolves them for the others).
	lazy         bool
	first, count uint64
}

// resolve looks up lazy neighbours.
func (nb *neighbours) resolve() {
	if !nb.lazy {
		return
	}
	d := nb.d
	d.mu.RLock()
	*nb = d.neighboursLockedMu(nb.first, nb.count)
	d.mu.RUnlock()
}

// neighboursLockedMu returns the neighbours of blocks [first, first+count).
// Caller holds d.mu (either mode).
func (d *disk) neighboursLockedMu(first, count uint64) neighbours {
	nb := neighbours{d: d}
	nb.prev, nb.hasPrev = d.m.Before(first)
	if v, ok := d.m.NextData(first + count); ok {
		nb.next, nb.hasNext = d.m.Before(v + 1)
	}
	nb.blocks = (uint64(d.attr.Size) + d.s.bs - 1) / d.s.bs
	return nb
}

// ownNeighboursLockedMu drops the neighbours that cannot say where the
// request's new blocks belong because the disk does not own their blocks
// alone: an extent before the range whose last block is shared or that
// reaches into the range (its blocks there are being copied on write),
// an extent after it whose first block is shared. Aimed by those, a
// copy-on-write would aim at the shared block itself, which is taken, and
// land wherever the allocator finds room next, one extent per write.
// Caller holds d.mu and s.mu.
func (s *Store) ownNeighboursLockedMu(nb *neighbours, first, count uint64) {
	if nb.hasPrev && (nb.prev.End() > first || s.mu.shared.Shared(nb.prev.PhysEnd()-1, 1)) {
		nb.hasPrev, nb.cow = false, true
	}
	if nb.hasNext && (nb.next.Virt < first+count || s.mu.shared.Shared(nb.next.Phys, 1)) {
		nb.hasNext, nb.cow = false, true
	}
}

// allocHoles fills sc.out with sc.segs (a lookup), every hole given new
// blocks (recorded in sc.allocs, in flight until published or returned
// with unallocate). With mayCommit false it never waits for a commit to
// release quarantined blocks (allocData). On error it has returned what it
// allocated.
//
// Placement follows the virtual offset, not the order of the writes: a
// hole is aimed where its nearest mapped neighbour says it belongs, the
// neighbour's physical block plus the virtual distance (as ext4 aims a new
// block by its logical neighbour): the extent before it, or else the one
// after it, or, for a disk with nothing mapped yet, a base chosen for the
// whole disk (allocator.base). So every block of a disk filled in any
// order is aimed at one linear layout, base + virtual block, and a disk
// written at random reads back in large I/Os wherever that layout was
// free; where another disk holds the goal, the allocator takes the next
// free blocks after it. Neighbours whose blocks are shared do not count
// (ownNeighboursLockedMu), and a copy-on-write with none left aims at a
// second layout of the disk's (Store.cowBase), so a disk rewritten at
// random over a snapshot or a clone is laid out by virtual offset too.
func (s *Store) allocHoles(sc *scratch, nb neighbours, mayCommit bool) error {
	var lastVirt, lastPhys uint64
	hasLast := false
	if nb.hasPrev {
		lastVirt, lastPhys, hasLast = nb.prev.End(), nb.prev.PhysEnd(), true
	}
	for i, sg := range sc.segs {
		if !sg.Hole {
			sc.out = append(sc.out, sg)
			lastVirt, lastPhys, hasLast = sg.Virt+sg.Len, sg.Phys+sg.Len, true
			continue
		}
		// A small hole whose allocation unit is reserved already takes its
		// blocks there and needs no goal, so no neighbours; else the goal
		// is computed, and the unit reserved at it if it can be.
		small := sg.Len*s.bs < prepareBelow
		var given bool
		var err error
		if small {
			given, err = s.fromUnit(sc, nb.d, sg, 0, false, false)
		}
		var goal uint64
		hasGoal := false
		if !given && err == nil {
			if nb.lazy {
				nb.resolve()
				if nb.hasPrev && !hasLast {
					lastVirt, lastPhys, hasLast = nb.prev.End(), nb.prev.PhysEnd(), true
				}
			}
			goal, hasGoal = s.holeGoal(nb, sc.segs, i, lastVirt, lastPhys, hasLast)
			if hasGoal && small {
				given, err = s.fromUnit(sc, nb.d, sg, goal, true, mayCommit)
			}
		}
		if err != nil {
			return s.abandonAllocs(sc, err)
		}
		if given {
			lastVirt, lastPhys, hasLast = sg.Virt+sg.Len, sc.out[len(sc.out)-1].Phys+sg.Len, true
			continue
		}
		start := len(sc.allocs)
		if hasGoal && small { // the blocks aimed at are given after their chunk is prepared
			err = s.prepareBacking([]pext{{Start: goal, Len: sg.Len}}, mayCommit)
		}
		if err == nil {
			sc.allocs, err = s.allocData(sc.allocs, sg.Len, goal, hasGoal, mayCommit)
		}
		if err != nil {
			return s.abandonAllocs(sc, err)
		}
		v := sg.Virt
		for _, e := range sc.allocs[start:] {
			sc.out = append(sc.out, blockmap.Segment{Virt: v, Len: e.Len, Phys: e.Start})
			v += e.Len
		}
		last := sc.allocs[len(sc.allocs)-1]
		lastVirt, lastPhys, hasLast = v, last.end(), true
		// Blocks given away from the goal may lie in a chunk not prepared yet.
		if !small {
			continue
		}
		if err := s.prepareBacking(sc.allocs[start:], mayCommit); err != nil {
			return s.abandonAllocs(sc, err)
		}
	}
	return nil
}

// holeGoal is where allocHoles aims hole sc.segs[i] (see there): by the
// last mapped or given block before it (lastVirt, lastPhys), else by the
// data after it, else by the disk's layout base.
func (s *Store) holeGoal(nb neighbours, segs []blockmap.Segment, i int, lastVirt, lastPhys uint64, hasLast bool) (uint64, bool) {
	sg := segs[i]
	next, hasNext := nb.next, nb.hasNext
	if i+1 < len(segs) { // a hole is followed by data in a lookup
		next, hasNext = blockmap.Extent{Virt: segs[i+1].Virt, Phys: segs[i+1].Phys}, true
	}
	var goal uint64
	hasGoal := hasLast
	switch {
	case hasLast:
		goal = lastPhys + (sg.Virt - lastVirt)
	case hasNext && next.Phys >= next.Virt-sg.Virt:
		goal, hasGoal = next.Phys-(next.Virt-sg.Virt), true
	case !hasNext && nb.cow:
		goal, hasGoal = s.cowBase(nb.d, nb.blocks)
		goal += sg.Virt
	case !hasNext:
		goal, hasGoal = s.diskBase(nb.d, nb.blocks)
		goal += sg.Virt
	}
	return goal, hasGoal
}

// fromUnit gives hole sg its blocks from its allocation unit
// (allocFromUnit, with goal, reserve and wait) and appends its segment to
// sc.out; given false: the hole must be allocated otherwise.
func (s *Store) fromUnit(sc *scratch, d *disk, sg blockmap.Segment, goal uint64, reserve, wait bool) (given bool, err error) {
	sc.allocs, given, err = s.allocFromUnit(sc.allocs, d, sg.Virt, sg.Len, goal, reserve, wait)
	if given {
		e := sc.allocs[len(sc.allocs)-1]
		sc.out = append(sc.out, blockmap.Segment{Virt: sg.Virt, Len: e.Len, Phys: e.Start})
	}
	return given, err
}

// abandonAllocs returns every block allocHoles gave so far and returns err.
func (s *Store) abandonAllocs(sc *scratch, err error) error {
	s.unallocate(sc.allocs)
	sc.allocs = sc.allocs[:0]
	return err
}

// prepareBelow: only holes smaller than this are worth preparing the
// backing for. A large first write pays the host file system's allocation
// once for many blocks, and preparing its chunk would write every block
// twice (zeros, then the data): a 1 MiB sequential stream into holes fell
// below the pass-through with it and stayed above without.
const prepareBelow = 256 << 10

// errUnprepared declines a plan that cannot wait (PlanWrite) whose new
// blocks lie in a part of the backing not yet prepared: WriteAt prepares
// it and writes.
var errUnprepared = errors.New("backing not prepared for the new blocks")

// prepareBacking prepares every chunk of a backend.Preparer backing (a
// store file) that holds blocks of allocs and is not yet prepared
// (prepareChunk), so that their first writes are overwrites for the host
// file system. With wait false it only checks, and returns errUnprepared
// if a chunk needs preparing.
func (s *Store) prepareBacking(allocs []pext, wait bool) error {
	p, ok := s.be.(backend.Preparer)
	if !ok {
		return nil
	}
	chunk := p.PrepareChunk()
	for _, e := range allocs {
		first := (s.dataOff + int64(e.Start*s.bs)) / chunk
		last := (min(s.dataOff+int64(e.end()*s.bs), s.dataEnd) - 1) / chunk
		for c := first; c <= last; c++ {
			if p.Prepared(c) {
				continue
			}
			if !wait {
				return errUnprepared
			}
			s.prepareChunk(p, c)
		}
	}
	return nil
}

// prepareChunk writes zeros over every free block of chunk c of the
// backing, in large writes, and marks the chunk prepared. The free blocks
// are taken from the allocator meanwhile, in flight like a write's
// (no one is given them, Check counts them), and returned after: so no
// block anyone uses, or is given meanwhile, is written, and blocks in
// quarantine (still referenced by the durable maps) are not free. Free
// blocks hold nothing anyone reads (a disk reads its holes as zeros
// without I/O), so writing them changes nothing a reader sees, before or
// after a crash. A chunk holding most of what is free is not prepared
// (taking its blocks away for the while could make a write fail for
// space), and a failed zero write is not retried: either way the chunk is
// marked and its first writes pay the host file system's allocation, as
// before preparation existed.
func (s *Store) prepareChunk(p backend.Preparer, c int64) {
	s.prepMu.Lock()
	defer s.prepMu.Unlock()
	if p.Prepared(c) {
		return
	}
	chunk, bs := p.PrepareChunk(), int64(s.bs)
	lo := uint64(max(c*chunk-s.dataOff+bs-1, 0) / bs)
	hi := uint64(max((c+1)*chunk-s.dataOff, 0) / bs)
	defer p.MarkPrepared(c) // prepared, or not worth trying again
	s.mu.Lock()
	hi = min(hi, s.mu.alloc.total)
	taken := s.mu.alloc.takeRange(lo, hi)
	var n uint64
	for _, e := range taken {
		n += e.Len
	}
	giveBack := func() { // caller holds s.mu
		for _, e := range taken {
			delete(s.mu.inflight, e.Start)
			if err := s.mu.alloc.free(e); err != nil {
				s.log.WithError(err).Error("returning blocks after preparing the backing")
			}
		}
	}
	if s.mu.alloc.freeBlocks < s.ckptReserveLockedMu()+n {
		// Most of what is free is in this chunk: holding it for the
		// while could fail other writes for space. Write without.
		giveBack()
		s.mu.Unlock()
		return
	}
	for _, e := range taken {
		s.mu.inflight[e.Start] = e.Len
	}
	s.mu.Unlock()

	zeros := s.pool.Get(maxRunBytes)
	clear(zeros)
	var err error
	var written uint64
	for _, e := range taken {
		off, end := s.dataOff+int64(e.Start)*bs, s.dataOff+int64(e.end())*bs
		for ; off < end && err == nil; off += int64(len(zeros)) {
			n := min(int64(len(zeros)), end-off)
			_, err = s.be.WriteAt(zeros[:n], off)
			written += uint64(n)
		}
	}
	s.pool.Put(zeros)

	s.mu.Lock()
	giveBack()
	s.mu.Unlock()
	s.stats.PreparedBytes.Add(written)
	if err != nil {
		s.stats.Errors.Add(1)
		s.log.WithError(err).Warn("writing the store file ahead of first writes failed; writing without")
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
// the blocks allocHoles gave it and grows the disk to end, with their
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
				sc.freed = d.m.Insert(blockmap.Extent{Virt: sg.Virt, Phys: sg.Phys, Len: sg.Len}, sc.freed[:0])
				if len(sc.freed) != 0 && !sc.cowed {
					panic(fmt.Sprintf("image: disk %d: write mapped over %v while holding its range lock", d.id, sc.freed))
				}
				sc.unmapped = append(sc.unmapped, sc.freed...)
				recs = append(recs, record{Type: recMap, ID: d.id, Virt: sg.Virt, Phys: sg.Phys, Len: sg.Len})
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

// fillBlock fills dst (one block) with the current content of virtual block
// v: zeros for a hole, else the block read from the backend.
func (s *Store) fillBlock(c *Shard, dst []byte, segs []blockmap.Segment, v uint64) error {
	for _, sg := range segs {
		if v < sg.Virt || v >= sg.Virt+sg.Len {
			continue
		}
		if sg.Hole {
			clear(dst)
			return nil
		}
		return s.readData(c, dst, sg.Phys+v-sg.Virt)
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
