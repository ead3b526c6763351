package image

import (
	"fmt"
	"sort"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/image/placement"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// Repair fixes what Check finds and returns a sentence per change. It never
// invents data: a range it cannot trust is unmapped (reads zeros from then
// on) and named in the result. What it does:
//
//   - a disk with an invalid or duplicate name is renamed "recovered-ID.raw";
//   - extents outside the data region, and extents past their disk's size,
//     are dropped;
//   - where two disks share physical blocks in a store of version 1 (which
//     never shares), the disk with the lower id keeps them and the other
//     loses that range (no disk can then read another's bytes); in a store
//     of version 2 disks may share, and only a disk sharing blocks with the
//     checkpoint loses them;
//   - the reference counts of shared blocks are rebuilt from the maps (a
//     count too high leaks the blocks, one too low would free them while
//     mapped);
//   - the free map is rebuilt from the maps (this fixes leaks and
//     used-but-free blocks);
//   - a fresh checkpoint is written through both superblock copies, which
//     also replaces a bad superblock copy and ends a broken journal.
//
// Repair must run with no disk handles doing I/O (vdisk fsck --repair opens
// the store offline). It returns an error if findings remain afterwards.
func (s *Store) Repair() ([]string, error) {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if s.opts.ReadOnly {
		return nil, fmt.Errorf("repair: %w", ErrReadOnly)
	}
	if rep := s.checkLockedCommit(); rep.Clean() {
		return nil, nil
	}
	actions := s.repairStateLockedCommit()
	s.openFindings = nil
	if err := s.checkpointLockedCommit(); err != nil {
		return actions, fmt.Errorf("repair: write checkpoint: %w", err)
	}
	actions = append(actions, "wrote a new checkpoint and both superblock copies")
	if rep := s.checkLockedCommit(); !rep.Clean() {
		return actions, fmt.Errorf("repair left %d finding(s), first: %s: %w", len(rep.Findings), rep.Findings[0], ErrCorrupt)
	}
	return actions, nil
}

// repairStateLockedCommit fixes the in-memory state. Caller holds commitMu.
func (s *Store) repairStateLockedCommit() []string {
	s.cut.Lock()
	defer s.cut.Unlock()
	s.mu.Lock()
	ds := make([]*disk, 0, len(s.mu.disks))
	for _, d := range s.mu.disks {
		ds = append(ds, d)
	}
	s.mu.Unlock()
	sort.Slice(ds, func(i, j int) bool { return ds[i].id < ds[j].id })
	var actions []string
	say := func(format string, args ...any) { actions = append(actions, fmt.Sprintf(format, args...)) }
	total, bs := s.sb.DataBlocks, s.bs

	// Names.
	s.mu.Lock()
	seen := map[string]bool{}
	s.mu.names = map[string]*disk{}
	for _, d := range ds {
		if d.orphan {
			continue
		}
		if ValidateName(d.name) != nil || seen[d.name] {
			newName := fmt.Sprintf("recovered-%d.raw", d.id)
			for i := 2; seen[newName]; i++ {
				newName = fmt.Sprintf("recovered-%d-%d.raw", d.id, i)
			}
			say("disk %d: renamed %q to %q (the name was invalid or taken)", d.id, d.name, newName)
			d.name = newName
		}
		seen[d.name] = true
		s.mu.names[d.name] = d
	}
	s.mu.Unlock()

	// Extents outside the data region or past the size.
	for _, d := range ds {
		sizeBlocks := (uint64(d.attr.Size) + bs - 1) / bs
		var drop []blockmap.Extent
		d.m.Ascend(func(e blockmap.Extent) bool {
			if e.Phys >= total || e.Len > total-e.Phys {
				drop = append(drop, e)
			}
			return true
		})
		for _, e := range drop {
			d.m.Punch(e.Virt, e.Len, nil)
			say("disk %s: dropped bytes [%d,%d): they pointed outside the data region; they read as zeros now", diskName(d), e.Virt*bs, e.End()*bs)
		}
		if freed := d.m.Punch(sizeBlocks, ^uint64(0)-sizeBlocks, nil); len(freed) > 0 {
			say("disk %s: dropped %d extent(s) past the disk's size of %d bytes", diskName(d), len(freed), d.attr.Size)
		}
	}

	// Shared blocks: the first user (checkpoint, then disks by id and
	// virtual block) keeps them.
	type owner struct {
		pext
		d    *disk
		virt uint64
	}
	var owners []owner
	for _, e := range s.mu.ckptExts {
		owners = append(owners, owner{pext: e})
	}
	for _, d := range ds {
		d.m.Ascend(func(e blockmap.Extent) bool {
			owners = append(owners, owner{pext: pext{Start: e.Phys, Len: e.Len}, d: d, virt: e.Virt})
			return true
		})
	}
	sort.SliceStable(owners, func(i, j int) bool { return owners[i].Start < owners[j].Start })
	sharing := s.sb.version() == sharedVersion
	var claimedEnd uint64
	var claimedBy string
	for _, o := range owners {
		if o.Start < claimedEnd && o.d != nil && (!sharing || claimedBy == "the checkpoint") {
			lo, hi := o.Start, min(o.End(), claimedEnd)
			v := o.virt + (lo - o.Start)
			o.d.m.Punch(v, hi-lo, nil)
			say("disk %s: dropped bytes [%d,%d): their blocks also belong to %s", diskName(o.d), v*bs, (v+hi-lo)*bs, claimedBy)
		}
		if o.End() > claimedEnd {
			claimedEnd = o.End()
			if o.d == nil {
				claimedBy = "the checkpoint"
			} else {
				claimedBy = "disk " + diskName(o.d)
			}
		}
	}

	// Free map: exactly what nobody uses.
	var used []pext
	var uses []refcount.Range
	used = append(used, s.mu.ckptExts...)
	extents := 0
	for _, d := range ds {
		extents += d.m.Len()
		d.m.Ascend(func(e blockmap.Extent) bool {
			used = append(used, pext{Start: e.Phys, Len: e.Len})
			uses = append(uses, refcount.Range{Start: e.Phys, Len: e.Len})
			return true
		})
	}
	counts := refcount.New()
	for _, e := range refcount.Depths(uses) {
		if err := counts.Set(e); err != nil {
			panic(fmt.Sprintf("image: repair: rebuilding the reference counts: %v", err))
		}
	}
	sort.Slice(used, func(i, j int) bool { return used[i].Start < used[j].Start })
	a := placement.NewAllocator(total)
	for _, f := range placement.Complement(used, total) {
		if err := a.Free(f); err != nil {
			panic(fmt.Sprintf("image: repair: rebuilding the free map: %v", err))
		}
	}
	s.mu.Lock()
	// Allocation units hold blocks of the free map being replaced.
	lost := s.mu.alloc.FreeBlocks() + s.mu.reserved
	for _, d := range s.mu.disks {
		d.units = nil
	}
	s.mu.reserved = 0
	if lost != a.FreeBlocks() {
		say("rebuilt the free map: %d free blocks (was %d)", a.FreeBlocks(), lost)
	}
	if high, low := countDiff(s.mu.shared, counts); high+low > 0 {
		say("rebuilt the reference counts of shared blocks from the maps: %d block(s) counted above their users, %d below; %d stretch(es) shared now (were %d)",
			high, low, counts.Len(), s.mu.shared.Len())
	}
	s.mu.shared = counts
	s.markSharingLockedMu()
	s.mu.alloc = a
	s.mu.pend.quarantine = nil
	s.mu.inflight = map[uint64]uint64{}
	s.mu.extents = extents
	s.mu.Unlock()
	return actions
}

// countDiff counts the blocks whose count in old is above, and below,
// their count in rebuilt (a block a table does not list counts 1). Such a
// block has a count of at least 2 in the table that says more, so one
// walk over each table finds them all.
func countDiff(old, rebuilt *refcount.Table) (high, low uint64) {
	above := func(a, b *refcount.Table) uint64 {
		var n uint64
		a.Ascend(func(e refcount.Extent) bool {
			b.Pieces(e.Start, e.Len, func(_, l uint64, refs uint32) {
				if refs < e.Refs {
					n += l
				}
			})
			return true
		})
		return n
	}
	return above(old, rebuilt), above(rebuilt, old)
}
