package image

import (
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
)

// Shared blocks: clones (CopyFrom) and snapshots (Snapshot) map the same
// physical blocks from more than one disk, with no data I/O. The rules:
//
//   - Store.mu.shared counts the references of every block more than one
//     map holds (package refcount); a block it does not list has one
//     reference if a map holds it.
//   - A shared block is never written in place: a write to it goes to new
//     blocks (the planner treats it like a hole, reading partial blocks
//     from the shared copy), then the map, then the old block loses a
//     reference.
//   - A reference is lost only when the record that unmapped it is
//     durable (quarantineLockedMu, releaseLockedCommit); a block is free
//     only once it has lost its last.
//   - Sharing needs format version 2 (featShared): the store is upgraded,
//     superblock first, before the first record that shares a block.

// ErrReadOnlyDisk says the disk is a snapshot: it cannot be written,
// truncated, punched or copied into.
var ErrReadOnlyDisk = errors.New("image: disk is a read-only snapshot")

// Upgrade makes the store version 2 (shared blocks) if it is not: the
// superblock says so from now on, and builds that only know version 1
// refuse the store. Snapshot and CopyFrom upgrade as needed.
func (s *Store) Upgrade() error { return s.upgradeTo(featShared, sharedVersion) }

// upgradeTo sets the feature bits features (of format version version) in
// the superblock, both copies, unless they are set already.
func (s *Store) upgradeTo(features, version uint32) error {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	if s.sb.Features&features == features {
		return nil
	}
	if err := s.writable(); err != nil {
		return fmt.Errorf("upgrade: %w", err)
	}
	sb := s.sb
	sb.Features |= features
	sb.Generation++
	if err := s.writeSuper(&sb); err != nil {
		return s.fail(fmt.Errorf("upgrade to version %d: %w", version, err))
	}
	s.sb = sb
	return nil
}

// Version is the store's format version: 1, 2 once it shares blocks, 3
// once it holds an encrypted disk.
func (s *Store) Version() int {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return int(s.sb.version())
}

// readOnly returns ErrReadOnlyDisk for a snapshot.
func (d *disk) readOnly() error {
	if d.flags.Load()&diskFlagSnapshot != 0 {
		return fmt.Errorf("disk %q: %w", d.name, ErrReadOnlyDisk)
	}
	return nil
}

// Snapshot makes a read-only disk called name that shares every block of
// the disk src, and commits it: when Snapshot returns, the snapshot holds
// every write to src acknowledged before the call, durably. It is taken in
// one step: it waits for the writes to src in flight and holds off new
// ones while it maps (O(extents), no data I/O). The snapshot has src's
// size, mode and owner; its origin is src.
func (s *Store) Snapshot(src, name string) (DiskInfo, error) {
	return s.shareWhole("snapshot", src, name, diskFlagSnapshot)
}

// Clone makes a writable disk called name that shares every block of the
// disk src, taken and committed as Snapshot takes a snapshot: what
// `cp src name` on a mount makes when the copy can be shared, but in one
// step, for any disk, holes and all (coreutils copies the data of a disk
// with holes itself, FICLONE cannot cross FUSE). Its origin is src, as a
// clone.
func (s *Store) Clone(src, name string) (DiskInfo, error) {
	return s.shareWhole("clone", src, name, diskFlagClone)
}

// shareWhole is Snapshot (flag diskFlagSnapshot) and Clone (diskFlagClone).
func (s *Store) shareWhole(what, src, name string, flag uint32) (DiskInfo, error) {
	if err := ValidateName(name); err != nil {
		return DiskInfo{}, fmt.Errorf("%s %q as %q: %w", what, src, name, err)
	}
	d, err := s.snapshot(src, name, flag)
	if err != nil {
		return DiskInfo{}, fmt.Errorf("%s %q as %q: %w", what, src, name, err)
	}
	if err := s.Commit(); err != nil {
		return DiskInfo{}, fmt.Errorf("%s %q as %q: %w", what, src, name, err)
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.infoLockedMu(), nil
}

// SnapshotHidden makes a read-only snapshot of the disk src, taken as
// Snapshot takes one (holding every write to src acknowledged before the
// call), that has no name and no identity: like a disk of CreateHidden, it
// is open only through the returned handle, and deleted when that closes
// or, after a crash, at the next open of the store. It is not committed:
// nothing needs it to outlive the handle. A disk that may be written while
// it is read whole (a send through a mount) is read from one, so that what
// is read is of one moment.
func (s *Store) SnapshotHidden(src string) (*Disk, error) {
	d, err := s.snapshot(src, "", diskFlagSnapshot)
	if err != nil {
		return nil, fmt.Errorf("hidden snapshot of %q: %w", src, err)
	}
	return &Disk{d: d}, nil
}

// snapshot makes name, a disk sharing every block of srcName, with flag
// (diskFlagSnapshot or diskFlagClone) in its flags record. A snapshot
// gets a new identity (DiskInfo.UUID); a clone, which can be written, gets
// none, so that it is never taken for a stream's base. With name "" the
// disk is hidden instead (SnapshotHidden): an orphan with one open, no
// name and no identity.
func (s *Store) snapshot(srcName, name string, flag uint32) (*disk, error) {
	if err := s.Upgrade(); err != nil {
		return nil, err
	}
	h, err := s.OpenDisk(srcName)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	src := h.d
	lr := src.ranges.lock(0, ^uint64(0), false) // no write in flight, none starts
	defer lr.unlock()

	unlock, err := s.lockCatalog(src)
	if err != nil {
		return nil, err
	}
	defer unlock()
	hidden := name == ""
	if _, ok := s.mu.names[name]; ok && !hidden {
		return nil, ErrExist
	}
	now := time.Now().UnixNano()
	attr := src.attr
	attr.Atime, attr.Mtime, attr.Ctime = src.atime.Load(), src.mtime.Load(), now
	id := s.mu.nextID
	if hidden {
		name = fmt.Sprintf(".hidden-%d", id) // journalled, never visible
	}
	d := s.newDisk(id, name, attr)
	d.flags.Store(flag)
	d.origin = src.id
	var crecs []record // the key state of an encrypted pair: both get fresh tweak bases
	if src.enc != nil {
		d.enc = &diskCrypt{check: src.enc.check, slots: src.enc.slots}
		d.enc.cipher.Store(src.enc.cipher.Load())
		var err error
		if crecs, err = freshTweakBasesLockedMu(nil, d, src); err != nil {
			return nil, err
		}
	}
	if flag == diskFlagSnapshot && !hidden {
		if _, err := rand.Read(d.uuid[:]); err != nil {
			return nil, fmt.Errorf("disk identity: %w", err)
		}
	}
	s.mu.nextID++
	d.m = src.m.Clone()
	s.shareLockedMu(d, src)
	s.mu.extents += d.m.Len()
	s.mu.disks[id] = d
	recs := append([]record{{Type: recCreate, ID: id, Attr: attr, Name: name}}, crecs...)
	if hidden {
		d.orphan, d.opens = true, 1
		recs = append(recs, record{Type: recUnlink, ID: id})
	} else {
		s.mu.names[name] = d
	}
	recs = append(recs, record{Type: recFlags, ID: id, Flags: flag, Src: src.id, UUID: d.uuid})
	if blocks := coalesce.RoundUp(uint64(attr.Size), s.bs) / s.bs; blocks > 0 {
		recs = append(recs, record{Type: recClone, ID: id, Src: src.id, Virt: 0, SrcVirt: 0, Len: blocks})
	}
	s.appendLockedMu(recs...)
	return d, nil
}

// shareLockedMu adds a reference to every block dst's map holds that it
// got from src's (the whole map: a snapshot's), and marks both disks as
// sharing. Caller holds src.mu and s.mu.
func (s *Store) shareLockedMu(dst, src *disk) {
	dst.mayShare.Store(true)
	src.mayShare.Store(true)
	dst.m.Ascend(func(e blockmap.Extent) bool {
		s.mu.shared.Add(e.Phys, e.Len)
		return true
	})
}

// CopyFrom makes [off, off+n) of the disk read as [srcOff, srcOff+n) of
// src reads, like copy_file_range(2): it copies up to n bytes, fewer when
// src ends first (0 at or past its end), grows the disk when the copy ends
// past its size, and returns the bytes copied. Whole blocks are shared,
// not copied, when both offsets are equally placed in their blocks: the
// disk maps src's blocks (each gaining a reference; holes stay holes) and
// its own old blocks in the range lose one. Partial edge blocks, and
// everything when the offsets are placed differently, are copied through
// ReadAt and WriteAt. Copying a range onto itself or an overlapping range
// of the same disk is ErrInvalid. A copy of a whole disk into an empty one
// records it as a clone of src.
func (h *Disk) CopyFrom(src *Disk, srcOff, off, n int64) (int64, error) {
	copied, err := h.copyFrom(src, srcOff, off, n)
	if err != nil {
		return copied, fmt.Errorf("disk %d copy %d bytes from disk %d at %d to %d: %w", h.d.id, n, src.d.id, srcOff, off, err)
	}
	return copied, nil
}

func (h *Disk) copyFrom(src *Disk, srcOff, off, n int64) (int64, error) {
	if err := h.live(); err != nil {
		return 0, err
	}
	if err := src.live(); err != nil {
		return 0, err
	}
	if err := checkRange(srcOff, n); err != nil {
		return 0, err
	}
	if err := checkRange(off, n); err != nil {
		return 0, err
	}
	d, sd, s := h.d, src.d, h.d.s
	if err := d.readOnly(); err != nil {
		return 0, err
	}
	if !sameKey(d, sd) {
		return 0, crossKey(d, sd)
	}
	sd.mu.RLock()
	srcSize := sd.attr.Size
	sd.mu.RUnlock()
	d.mu.RLock()
	empty := d.attr.Size == 0 && d.m.Len() == 0
	d.mu.RUnlock()
	if srcOff >= srcSize || n == 0 {
		return 0, nil
	}
	n = min(n, srcSize-srcOff)
	if d == sd && srcOff < off+n && off < srcOff+n {
		return 0, fmt.Errorf("overlapping ranges of one disk: %w", ErrInvalid)
	}
	bs := int64(s.bs)
	head := (bs - off%bs) % bs
	if (srcOff-off)%bs != 0 || n-head < bs {
		return copyBytes(h, src, srcOff, off, n)
	}
	if head > 0 {
		if _, err := copyBytes(h, src, srcOff, off, head); err != nil {
			return 0, err
		}
	}
	whole := (n - head) / bs * bs
	clone := empty && srcOff == 0 && off == 0 && n == srcSize
	if err := d.share(sd, uint64(srcOff+head)/s.bs, uint64(off+head)/s.bs, uint64(whole)/s.bs, clone); err != nil {
		return head, err
	}
	if tail := n - head - whole; tail > 0 {
		if _, err := copyBytes(h, src, srcOff+head+whole, off+head+whole, tail); err != nil {
			return head + whole, err
		}
	}
	return n, nil
}

// share maps virtual blocks [v, v+count) of d to what [sv, sv+count) of
// src maps, as one mutation with its records (recClone; a growing size;
// recFlags for a clone), dropping d's old blocks there.
func (d *disk) share(src *disk, sv, v, count uint64, clone bool) error {
	s := d.s
	if err := s.Upgrade(); err != nil {
		return err
	}
	// Range locks in one order (disk id, then block), so that two copies
	// between the same disks cannot wait for each other.
	type lockReq struct {
		d         *disk
		first     uint64
		exclusive bool
	}
	reqs := []lockReq{{d: src, first: sv}, {d: d, first: v, exclusive: true}}
	if d.id < src.id || d == src && v < sv {
		reqs[0], reqs[1] = reqs[1], reqs[0]
	}
	for _, r := range reqs {
		lr := r.d.ranges.lock(r.first, count, r.exclusive)
		defer lr.unlock()
	}
	if err := s.writable(); err != nil {
		return err
	}

	err := d.changeMap(src, func() (mapChange, error) {
		if src.deleted || d.deleted {
			return mapChange{}, ErrClosed
		}
		// The store's state is looked at before the map changes, which
		// cannot be undone; a store that fails after this refuses the
		// commit that would hold the change.
		if err := s.writable(); err != nil {
			return mapChange{}, err
		}
		c := mapChange{freed: d.m.Punch(v, count, nil)}
		d.mayShare.Store(true)
		src.mayShare.Store(true)
		if d.enc != nil { // copies on write of the shared blocks must not take their tweaks
			// Within one disk too: after a copy from sv to v, a write
			// at sv under the old base would take the tweak of the
			// blocks now at v, and two ciphertexts of one key and
			// tweak would stand in the store side by side.
			fresh := []*disk{d}
			if src != d && src.readOnly() == nil {
				fresh = append(fresh, src)
			}
			var err error
			if c.recs, err = freshTweakBasesLockedMu(c.recs, fresh...); err != nil {
				return mapChange{}, err
			}
		}
		for _, sg := range src.m.Lookup(nil, sv, count) {
			if sg.Hole {
				continue
			}
			e := d.extentOf(sg, v+(sg.Virt-sv))
			if freed := d.m.Insert(e, nil); len(freed) != 0 {
				panic(fmt.Sprintf("image: disk %d: copy mapped over %v after punching the range", d.id, freed))
			}
			c.shared = append(c.shared, e)
		}
		if d.m.Len() == 0 {
			d.forgetLayouts()
		}
		c.recs = append(c.recs, record{Type: recClone, ID: d.id, Src: src.id, SrcVirt: sv, Virt: v, Len: count})
		if end := int64((v + count) * s.bs); end > d.attr.Size {
			d.attr.Size = end
			c.recs = append(c.recs, record{Type: recSize, ID: d.id, Attr: diskAttr{Size: end}})
		}
		if clone {
			d.flags.Store(d.flags.Load() | diskFlagClone)
			d.origin = src.id
			c.recs = append(c.recs, record{Type: recFlags, ID: d.id, Flags: d.flags.Load(), Src: src.id, UUID: d.uuid})
		}
		return c, nil
	})
	if err != nil {
		return err
	}
	d.touch()
	return nil
}

// copyBytes copies n bytes from src at srcOff to dst at off through a
// buffer, as copy_file_range falls back to.
func copyBytes(dst, src *Disk, srcOff, off, n int64) (int64, error) {
	s := dst.d.s
	buf := s.pool.Get(int(min(n, maxRunBytes)))
	defer s.pool.Put(buf)
	var done int64
	for done < n {
		b := buf[:min(int64(len(buf)), n-done)]
		k, err := src.ReadAt(b, srcOff+done)
		if k == 0 && err != nil {
			return done, err
		}
		if _, err := dst.WriteAt(b[:k], off+done); err != nil {
			return done, err
		}
		done += int64(k)
	}
	return done, nil
}

// replayShared replays a recClone or recFlags record onto d.
func (s *Store) replayShared(d *disk, r *record, bad func(string, ...any)) {
	switch r.Type {
	case recFlags:
		d.flags.Store(r.Flags)
		d.origin, d.uuid = r.Src, r.UUID
	case recClone:
		src := s.mu.disks[r.Src]
		if src == nil {
			bad("disk %d copies from disk %d, which does not exist", d.id, r.Src)
			return
		}
		s.replayFree(d.m.Punch(r.Virt, r.Len, nil), bad)
		for _, sg := range src.m.Lookup(nil, r.SrcVirt, r.Len) {
			if sg.Hole {
				continue
			}
			s.mu.shared.Add(sg.Phys, sg.Len)
			s.replayFree(d.m.Insert(d.extentOf(sg, r.Virt+(sg.Virt-r.SrcVirt)), nil), bad)
		}
		d.mayShare.Store(true)
		src.mayShare.Store(true)
	}
}

// markSharingLockedMu marks the disks whose maps hold shared blocks, after
// the store was loaded. Caller holds s.mu (or owns the store alone).
func (s *Store) markSharingLockedMu() {
	if s.mu.shared.Len() == 0 {
		return
	}
	for _, d := range s.mu.disks {
		if d.mayShare.Load() {
			continue
		}
		d.m.Ascend(func(e blockmap.Extent) bool {
			if s.mu.shared.Shared(e.Phys, e.Len) {
				d.mayShare.Store(true)
				return false
			}
			return true
		})
	}
}

// sharedBlocksLockedMu counts the blocks of d's map that are shared.
// Caller holds d.mu and s.mu.
func (s *Store) sharedBlocksLockedMu(d *disk) uint64 {
	if !d.mayShare.Load() {
		return 0
	}
	var n uint64
	d.m.Ascend(func(e blockmap.Extent) bool {
		s.mu.shared.Pieces(e.Phys, e.Len, func(_, l uint64, refs uint32) {
			if refs > 1 {
				n += l
			}
		})
		return true
	})
	return n
}

// cowLockedMu splits the data segments of sc.segs (a write's lookup) where
// their blocks are shared, into sc.cow: the same segments, with every
// shared piece a hole, so that the write gives it new blocks. It reports
// whether there was any. Caller holds d.mu and s.mu.
func (s *Store) cowLockedMu(d *disk, sc *scratch) bool {
	if !d.mayShare.Load() {
		return false
	}
	var any bool
	sc.cow, any = s.sharedAsHolesLockedMu(sc.cow[:0], sc.segs)
	return any
}

// sharedAsHolesLockedMu appends to dst the segments segs (a lookup) with
// every piece whose blocks are shared turned into a hole, holes next to
// each other merged as a lookup returns them, and reports whether any
// piece was shared. Caller holds s.mu.
func (s *Store) sharedAsHolesLockedMu(dst, segs []blockmap.Segment) ([]blockmap.Segment, bool) {
	any := false
	add := func(sg blockmap.Segment) {
		if sg.Hole {
			sg.Phys = 0
			if n := len(dst); n > 0 && dst[n-1].Hole {
				dst[n-1].Len += sg.Len
				return
			}
		}
		dst = append(dst, sg)
	}
	for _, sg := range segs {
		if sg.Hole || !s.mu.shared.Shared(sg.Phys, sg.Len) {
			add(sg)
			continue
		}
		any = true
		s.mu.shared.Pieces(sg.Phys, sg.Len, func(p, l uint64, refs uint32) {
			add(blockmap.Segment{Virt: sg.Virt + (p - sg.Phys), Len: l, Phys: p, Hole: refs > 1, Tweak: sg.Tweak + (p - sg.Phys)})
		})
	}
	return dst, any
}
