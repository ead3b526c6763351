package image

import (
	"github.com/vdiskfs/vdiskfs/blockmap"
)

// A mapChange is what one change of a disk's map (and attributes) did,
// for changeMap to finish: the records that journal it, the blocks it
// unmapped, the blocks given in flight that it mapped, and the blocks that
// gained a reference from it.
type mapChange struct {
	recs   []record          // journalled as one mutation
	freed  []blockmap.Extent // unmapped: quarantined until recs are durable
	mapped []pext            // given in flight (fillHoles, defrag), now mapped
	shared []blockmap.Extent // now mapped by one more map (a copy)
	// releaseUnits gives up the disk's allocation units from unit
	// unitsFrom on (0: all of them), as a punch or shrink that forgot the
	// disk's layout, or cut its end, must.
	releaseUnits bool
	unitsFrom    uint64
}

// empty reports whether the change did nothing to journal or account.
func (c *mapChange) empty() bool {
	return len(c.recs) == 0 && len(c.freed) == 0 && len(c.mapped) == 0 && len(c.shared) == 0 && !c.releaseUnits
}

// changeMap is the one way a disk's map changes. With s.cut held shared
// and d.mu (and also.mu, for a copy from another disk: the two in disk id
// order), edit changes d.m and d.attr (and forgets the disk's layouts
// when it empties the map) and says what it did; then, under s.mu and in
// this order, the allocation units it gave up are released, the store's
// extent count follows, the blocks edit
// mapped leave s.mu.inflight, the blocks it shared gain a reference, its
// records are appended, and the blocks it unmapped go to the quarantine
// (crash rule 3: not reused before the records are durable). A commit
// therefore holds all of a change or none of it. edit's error, returned
// before it changed anything, ends the change with nothing done.
//
// The map itself changes outside s.mu, which covers only the bookkeeping:
// edits of two disks' maps do not wait for each other. Callers hold the
// range lock over what they change (a write's, a punch's), or, for a
// copy, over both ranges.
func (d *disk) changeMap(also *disk, edit func() (mapChange, error)) error {
	s := d.s
	s.cut.RLock()
	defer s.cut.RUnlock()
	first, second := d, also
	if also != nil && also.id < d.id {
		first, second = also, d
	}
	first.mu.Lock()
	defer first.mu.Unlock()
	if second != nil && second != first {
		second.mu.Lock()
		defer second.mu.Unlock()
	}
	before := d.m.Len()
	c, err := edit()
	if err != nil {
		return err
	}
	if c.empty() && d.m.Len() == before {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.releaseUnits {
		s.releaseUnitsLockedMu(d, c.unitsFrom)
	}
	s.mu.extents += d.m.Len() - before
	for _, e := range c.mapped {
		delete(s.mu.inflight, e.Start)
	}
	for _, e := range c.shared {
		s.mu.shared.Add(e.Phys, e.Len)
	}
	if len(c.recs) > 0 {
		s.appendLockedMu(c.recs...)
	}
	s.quarantineLockedMu(c.freed)
	return nil
}

// lockCatalog takes the locks of a change to the catalog in the one order
// (s.cut shared, d.mu when d is not nil, s.mu) and checks that the store
// takes changes; on an error nothing is held. unlock releases them all.
func (s *Store) lockCatalog(d *disk) (unlock func(), err error) {
	unlock = s.lockAll(d)
	if err := s.usableLockedMu(); err != nil {
		unlock()
		return nil, err
	}
	return unlock, nil
}

// lockAll is lockCatalog without the check: for a change that is made
// whatever the store's state (a handle's close).
func (s *Store) lockAll(d *disk) (unlock func()) {
	s.cut.RLock()
	if d != nil {
		d.mu.Lock()
	}
	s.mu.Lock()
	return func() {
		s.mu.Unlock()
		if d != nil {
			d.mu.Unlock()
		}
		s.cut.RUnlock()
	}
}
