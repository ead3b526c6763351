package image

import (
	"fmt"
	"sort"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// DiskInfo describes a disk.
type DiskInfo struct {
	ID        uint64
	Name      string
	Size      int64
	Mode      uint32
	UID, GID  uint32
	Atime     time.Time
	Mtime     time.Time
	Ctime     time.Time
	Allocated int64 // bytes of blocks mapped (shared ones included, as XFS counts reflinked files)
	Extents   int
	// Shared is the part of Allocated whose blocks other disks map too;
	// the rest is the disk's own. Filled in by Store.List and Store.Stat,
	// not by Disk.Stat (it walks the map).
	Shared int64
	// Snapshot: a read-only snapshot. Clone: made by copying the whole of
	// another disk. Origin names the disk it is a snapshot or clone of,
	// when that still exists (Store.List, Store.Stat).
	Snapshot, Clone bool
	OriginID        uint64
	Origin          string
	// UUID is the disk's identity across stores: given to a snapshot when
	// it is taken (and to a disk received from a stream, its sender's),
	// so that an incremental stream can name the snapshot it starts from.
	// Zero for other disks: a clone has none, since it can be written
	// (clones made by earlier builds may carry one; FindUUID ignores it).
	UUID [16]byte
	// Encrypted: the disk's data is encrypted (CreateEncrypted). Locked:
	// its key has not been given since the store opened (Store.Unlock).
	Encrypted, Locked bool
}

// Attr are the attributes given to a new disk. Zero times mean "now".
type Attr struct {
	Mode     uint32
	UID, GID uint32
	Atime    time.Time
	Mtime    time.Time
}

// Create makes a new empty disk of size bytes.
func (s *Store) Create(name string, size int64, a Attr) (DiskInfo, error) {
	return s.create(name, size, a, nil)
}

// create is Create, and CreateEncrypted with enc: the disk's key state,
// journalled with its creation in one unit.
func (s *Store) create(name string, size int64, a Attr, enc *diskCrypt) (DiskInfo, error) {
	if err := ValidateName(name); err != nil {
		return DiskInfo{}, fmt.Errorf("create disk: %w", err)
	}
	if size < 0 || size > MaxDiskSize {
		return DiskInfo{}, fmt.Errorf("create disk %q: size %d: %w", name, size, ErrTooLarge)
	}
	now := time.Now().UnixNano()
	attr := diskAttr{Size: size, Mode: a.Mode, UID: a.UID, GID: a.GID, Atime: nanos(a.Atime, now), Mtime: nanos(a.Mtime, now), Ctime: now}
	unlock, err := s.lockCatalog(nil)
	if err != nil {
		return DiskInfo{}, fmt.Errorf("create disk %q: %w", name, err)
	}
	defer unlock()
	if _, ok := s.mu.names[name]; ok {
		return DiskInfo{}, fmt.Errorf("create disk %q: %w", name, ErrExist)
	}
	id := s.mu.nextID
	s.mu.nextID++
	d := s.newDisk(id, name, attr)
	d.enc = enc
	s.mu.disks[id] = d
	s.mu.names[name] = d
	recs := []record{{Type: recCreate, ID: id, Attr: attr, Name: name}}
	if enc != nil {
		recs = append(recs, d.cryptRecordLockedMu())
	}
	s.appendLockedMu(recs...)
	return d.infoLockedMu(), nil
}

func nanos(t time.Time, def int64) int64 {
	if t.IsZero() {
		return def
	}
	return t.UnixNano()
}

func (s *Store) newDisk(id uint64, name string, attr diskAttr) *disk {
	d := &disk{s: s, id: id, name: name, attr: attr, m: blockmap.New(), ranges: newRangeLock()}
	d.mtime.Store(attr.Mtime)
	d.atime.Store(attr.Atime)
	return d
}

// Remove deletes a disk by name. If handles are open on it, the name goes
// now and the blocks when the last handle closes (like unlink of an open
// file); otherwise both go now. Freed blocks are reused only after the
// removal is committed.
func (s *Store) Remove(name string) error {
	s.cut.RLock()
	defer s.cut.RUnlock()
	d, unlock, err := s.lockNamedLockedCut(name)
	if err != nil {
		return fmt.Errorf("remove disk %q: %w", name, err)
	}
	defer unlock()
	if d.opens > 0 {
		d.orphan = true
		delete(s.mu.names, name)
		s.appendLockedMu(record{Type: recUnlink, ID: d.id})
		return nil
	}
	s.deleteDiskLockedMu(d)
	return nil
}

// lockNamedLockedCut finds the disk called name and locks it and the store,
// in the lock order (d.mu, then s.mu), checking once both are held that the
// disk still has that name (a rename in between makes it look again). It
// fails when there is no such disk or the store takes no changes. Caller
// holds s.cut shared, and calls unlock when done.
func (s *Store) lockNamedLockedCut(name string) (d *disk, unlock func(), err error) {
	for {
		s.mu.Lock()
		d, ok := s.mu.names[name]
		s.mu.Unlock()
		if !ok {
			return nil, nil, ErrNotExist
		}
		d.mu.Lock()
		s.mu.Lock()
		if s.mu.names[name] == d {
			if err := s.usableLockedMu(); err != nil {
				s.mu.Unlock()
				d.mu.Unlock()
				return nil, nil, err
			}
			return d, func() { s.mu.Unlock(); d.mu.Unlock() }, nil
		}
		s.mu.Unlock()
		d.mu.Unlock()
	}
}

// deleteDiskLockedMu frees every block of d and forgets it. with are more
// records of the same mutation, journalled after the delete in one unit (a
// rename over d). Caller holds s.cut shared, d.mu and s.mu; d has no open
// handles.
func (s *Store) deleteDiskLockedMu(d *disk, with ...record) {
	s.mu.extents -= d.m.Len()
	freed := d.m.Punch(0, ^uint64(0), nil)
	d.deleted = true
	s.releaseUnitsLockedMu(d, 0)
	if s.mu.names[d.name] == d {
		delete(s.mu.names, d.name)
	}
	delete(s.mu.disks, d.id)
	s.appendLockedMu(append([]record{{Type: recDelete, ID: d.id}}, with...)...)
	s.quarantineLockedMu(freed)
}

// deleteOrphans deletes disks that were unlinked while open when the store
// last went down.
func (s *Store) deleteOrphans() {
	s.cut.RLock()
	defer s.cut.RUnlock()
	s.mu.Lock()
	var orphans []*disk
	for _, d := range s.mu.disks {
		if d.orphan {
			orphans = append(orphans, d)
		}
	}
	s.mu.Unlock()
	for _, d := range orphans {
		s.log.WithField("disk_id", d.id).Info("deleting disk unlinked while open")
		d.mu.Lock()
		s.mu.Lock()
		s.deleteDiskLockedMu(d)
		s.mu.Unlock()
		d.mu.Unlock()
	}
}

// Rename renames a disk; a disk already called newName is removed (like
// rename(2)), in the same mutation: its removal and the rename are
// journalled in one unit, so no crash, commit or checkpoint shows one
// without the other, and nothing is removed when oldName does not exist.
func (s *Store) Rename(oldName, newName string) error {
	if err := ValidateName(newName); err != nil {
		return fmt.Errorf("rename %q: %w", oldName, err)
	}
	if oldName == newName {
		if _, err := s.Stat(oldName); err != nil {
			return fmt.Errorf("rename: %w", err)
		}
		return nil
	}
	s.cut.RLock()
	defer s.cut.RUnlock()
	d, target, unlock, err := s.lockRenameLockedCut(oldName, newName)
	if err != nil {
		return fmt.Errorf("rename %q: %w", oldName, err)
	}
	defer unlock()
	if target != nil {
		delete(s.mu.names, newName)
	}
	delete(s.mu.names, oldName)
	s.mu.names[newName] = d
	d.name = newName
	d.attr.Ctime = time.Now().UnixNano()
	rename := record{Type: recRename, ID: d.id, Name: newName}
	switch {
	case target == nil:
		s.appendLockedMu(rename)
	case target.opens > 0:
		// Open handles keep the replaced disk until the last closes, as
		// Remove does.
		target.orphan = true
		s.appendLockedMu(record{Type: recUnlink, ID: target.id}, rename)
	default:
		s.deleteDiskLockedMu(target, rename)
	}
	return nil
}

// lockRenameLockedCut finds the disk called oldName and the one called
// newName (target, nil when there is none) and locks them, the lower id
// first, then the store, checking once all are held that the names still
// name them (else it looks again). It fails when there is no disk called
// oldName or the store takes no changes. Caller holds s.cut shared, and
// calls unlock when done.
func (s *Store) lockRenameLockedCut(oldName, newName string) (d, target *disk, unlock func(), err error) {
	for {
		s.mu.Lock()
		d, ok := s.mu.names[oldName]
		target := s.mu.names[newName]
		s.mu.Unlock()
		if !ok {
			return nil, nil, nil, ErrNotExist
		}
		first, second := d, target
		if target != nil && target.id < d.id {
			first, second = target, d
		}
		first.mu.Lock()
		if second != nil {
			second.mu.Lock()
		}
		unlock := func() {
			s.mu.Unlock()
			if second != nil {
				second.mu.Unlock()
			}
			first.mu.Unlock()
		}
		s.mu.Lock()
		if s.mu.names[oldName] == d && s.mu.names[newName] == target {
			if err := s.usableLockedMu(); err != nil {
				unlock()
				return nil, nil, nil, err
			}
			return d, target, unlock, nil
		}
		unlock()
	}
}

// List returns every named disk, sorted by name.
func (s *Store) List() []DiskInfo {
	s.mu.Lock()
	ds := make([]*disk, 0, len(s.mu.names))
	for _, d := range s.mu.names {
		ds = append(ds, d)
	}
	s.mu.Unlock()
	out := make([]DiskInfo, 0, len(ds))
	for _, d := range ds {
		out = append(out, d.info())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Stat describes the disk called name.
func (s *Store) Stat(name string) (DiskInfo, error) {
	s.mu.Lock()
	d, ok := s.mu.names[name]
	s.mu.Unlock()
	if !ok {
		return DiskInfo{}, fmt.Errorf("disk %q: %w", name, ErrNotExist)
	}
	return d.info(), nil
}
