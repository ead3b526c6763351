package image

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// A Change is a byte range where one disk differs from another: bytes to
// read from the newer disk, or zeros.
type Change struct {
	Off, Len int64
	Zero     bool
}

// DiffStats says how Diff found the changes.
type DiffStats struct {
	// Related: the disks share blocks (a snapshot, a clone), so the maps
	// alone told the changes; otherwise data was compared where both map
	// different blocks.
	Related bool
	// ComparedBytes is how much data was read to compare (from each disk).
	ComparedBytes int64
}

// Diff returns, in offset order, the ranges of the disk new that differ
// from the disk old, up to new's size: where old maps a block and new has
// a hole, zeros; where new maps a block old does not map (a hole, or past
// old's size) or maps another block than old does, new's bytes. Blocks both
// map to the same physical block (shared by a snapshot or clone) and holes
// of both are unchanged, and cost nothing. So for disks related by a
// snapshot or clone Diff reads no data: a block written since was copied
// on write, so it maps elsewhere. For unrelated disks (no block shared)
// it compares the data where both map blocks, and reports what differs,
// block by block. old may be nil: then every mapped range of new is a
// change (a complete copy). new's size is not a change; the caller sends
// it.
func Diff(old, new *Disk) ([]Change, DiffStats, error) {
	if err := new.live(); err != nil {
		return nil, DiffStats{}, err
	}
	s := new.d.s
	bs := s.bs
	nm, size := new.d.mapAndSize()
	om, oldSize := blockmap.New(), int64(0)
	if old != nil {
		if err := old.live(); err != nil {
			return nil, DiffStats{}, err
		}
		om, oldSize = old.d.mapAndSize()
	}
	blocks := (uint64(size) + bs - 1) / bs
	var changes []Change
	var st DiffStats
	var both []piece // blocks both map, elsewhere
	add := func(v, n uint64, zero bool) {
		off, end := int64(v*bs), min(int64((v+n)*bs), size)
		if k := len(changes); k > 0 && changes[k-1].Zero == zero && changes[k-1].Off+changes[k-1].Len == off {
			changes[k-1].Len = end - changes[k-1].Off
			return
		}
		changes = append(changes, Change{Off: off, Len: end - off, Zero: zero})
	}
	if blocks > 0 {
		newSegs := nm.Lookup(nil, 0, blocks)
		oldBlocks := (uint64(oldSize) + bs - 1) / bs
		oldSegs := om.Lookup(nil, 0, blocks)
		walkPieces(newSegs, oldSegs, func(v, n uint64, nsg, osg blockmap.Segment) {
			inOld := v < oldBlocks
			switch {
			case nsg.Hole && (osg.Hole || !inOld):
			case nsg.Hole:
				add(v, n, true)
			case osg.Hole || !inOld:
				add(v, n, false)
			case nsg.Phys+(v-nsg.Virt) == osg.Phys+(v-osg.Virt):
				st.Related = true
			default:
				both = append(both, piece{v: v, n: n})
				add(v, n, false)
			}
		})
	}
	// An encrypted disk's blocks are not compared: that needs its key,
	// which a raw send does not have; what both map elsewhere counts as
	// changed.
	if st.Related || len(both) == 0 || new.d.enc != nil {
		return changes, st, nil
	}
	// Unrelated disks: what both map may still be equal. Compare it and
	// keep only the blocks that differ.
	refined, cmp, err := refine(old, new, changes, both)
	st.ComparedBytes = cmp
	if err != nil {
		return nil, st, fmt.Errorf("diff: compare data: %w", err)
	}
	return refined, st, nil
}

// piece is a stretch of blocks both disks map, to different blocks.
type piece struct {
	v, n uint64
}

// walkPieces calls fn for each stretch [v, v+n) over which both lookups'
// segments stay the same, in order. Both cover the same range.
func walkPieces(a, b []blockmap.Segment, fn func(v, n uint64, sa, sb blockmap.Segment)) {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		sa, sb := a[i], b[j]
		v := max(sa.Virt, sb.Virt)
		end := min(sa.End(), sb.End())
		if end > v {
			fn(v, end-v, sa, sb)
		}
		if sa.End() == end {
			i++
		}
		if sb.End() == end {
			j++
		}
	}
}

// refine replaces the parts of changes that both disks map (the pieces in
// both, in order) with the blocks whose data really differ, reading both
// disks there; the rest of changes stays as it is.
func refine(old, new *Disk, changes []Change, both []piece) ([]Change, int64, error) {
	s := new.d.s
	bs := int64(s.bs)
	_, size := new.d.mapAndSize()
	start := func(p piece) int64 { return int64(p.v) * bs }
	end := func(p piece) int64 { return min(int64(p.v+p.n)*bs, size) }
	var out []Change
	add := func(c Change) {
		if k := len(out); k > 0 && out[k-1].Zero == c.Zero && out[k-1].Off+out[k-1].Len == c.Off {
			out[k-1].Len += c.Len
			return
		}
		out = append(out, c)
	}
	a, b := s.pool.Get(1<<20), s.pool.Get(1<<20)
	defer s.pool.Put(a)
	defer s.pool.Put(b)
	var compared int64
	bi := 0
	for _, c := range changes {
		for off, stop := c.Off, c.Off+c.Len; off < stop; {
			for bi < len(both) && end(both[bi]) <= off {
				bi++
			}
			if bi == len(both) || start(both[bi]) > off {
				e := stop
				if bi < len(both) {
					e = min(e, start(both[bi]))
				}
				add(Change{Off: off, Len: e - off, Zero: c.Zero})
				off = e
				continue
			}
			for e := min(stop, end(both[bi])); off < e; {
				n := min(int64(len(a)), e-off)
				if _, err := new.ReadAt(a[:n], off); err != nil {
					return nil, compared, err
				}
				if k, err := old.ReadAt(b[:n], off); err != nil {
					clear(b[k:n]) // past old's end: zeros
				}
				compared += n
				for k := int64(0); k < n; k += bs {
					m := min(bs, n-k)
					if !bytes.Equal(a[k:k+m], b[k:k+m]) {
						add(Change{Off: off + k, Len: m})
					}
				}
				off += n
			}
		}
	}
	return out, compared, nil
}

// mapAndSize returns a copy of the disk's map (O(1)) and its size, taken
// together.
func (d *disk) mapAndSize() (*blockmap.Map, int64) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.m.Clone(), d.attr.Size
}

// FindUUID returns the name of the snapshot whose identity is uuid. Only a
// read-only snapshot matches: a writable disk that carries an identity (a
// clone made by a build that gave clones one) may have been written since
// it got it, so its identity no longer says what it holds.
func (s *Store) FindUUID(uuid [16]byte) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if uuid == ([16]byte{}) {
		return "", false
	}
	for name, d := range s.mu.names {
		if d.uuid == uuid && d.flags.Load()&diskFlagSnapshot != 0 {
			return name, true
		}
	}
	return "", false
}

// CreateHidden makes a new empty disk of size bytes that has no name and is
// open only through the returned handle, like a file made with O_TMPFILE:
// closing the handle deletes it, and so does the next open of the store
// after a crash, unless Publish names it first. A disk built from a stream
// is made this way, so that an interrupted stream leaves nothing behind.
func (s *Store) CreateHidden(size int64, a Attr) (*Disk, error) {
	return s.createHidden(size, a, nil)
}

// createHidden is CreateHidden, and CreateHiddenEncrypted with enc.
func (s *Store) createHidden(size int64, a Attr, enc *diskCrypt) (*Disk, error) {
	if size < 0 || size > MaxDiskSize {
		return nil, fmt.Errorf("create hidden disk: size %d: %w", size, ErrTooLarge)
	}
	now := time.Now().UnixNano()
	attr := diskAttr{Size: size, Mode: a.Mode, UID: a.UID, GID: a.GID, Atime: nanos(a.Atime, now), Mtime: nanos(a.Mtime, now), Ctime: now}
	unlock, err := s.lockCatalog(nil)
	if err != nil {
		return nil, fmt.Errorf("create hidden disk: %w", err)
	}
	defer unlock()
	id := s.mu.nextID
	s.mu.nextID++
	name := fmt.Sprintf(".hidden-%d", id) // journalled, never visible
	d := s.newDisk(id, name, attr)
	d.orphan, d.opens = true, 1
	d.enc = enc
	s.mu.disks[id] = d
	recs := []record{{Type: recCreate, ID: id, Attr: attr, Name: name}}
	if enc != nil {
		recs = append(recs, d.cryptRecordLockedMu())
	}
	s.appendLockedMu(append(recs, record{Type: recUnlink, ID: id})...)
	return &Disk{d: d}, nil
}

// Publish gives a hidden disk (CreateHidden) the name name, which must be
// free, in one mutation; with snapshot it also becomes a read-only
// snapshot with the identity uuid (a new one when uuid is zero). The
// handle stays open; the disk now outlives it.
func (h *Disk) Publish(name string, snapshot bool, uuid [16]byte) error {
	if err := ValidateName(name); err != nil {
		return fmt.Errorf("publish disk: %w", err)
	}
	if err := h.live(); err != nil {
		return err
	}
	d, s := h.d, h.d.s
	if snapshot {
		if err := s.Upgrade(); err != nil {
			return fmt.Errorf("publish disk %q: %w", name, err)
		}
		if uuid == ([16]byte{}) {
			if _, err := rand.Read(uuid[:]); err != nil {
				return fmt.Errorf("publish disk %q: identity: %w", name, err)
			}
		}
	}
	unlock, err := s.lockCatalog(d)
	if err != nil {
		return fmt.Errorf("publish disk %q: %w", name, err)
	}
	defer unlock()
	if !d.orphan || d.deleted {
		return fmt.Errorf("publish disk %q: disk %d is not hidden: %w", name, d.id, ErrInvalid)
	}
	if _, taken := s.mu.names[name]; taken {
		return fmt.Errorf("publish disk %q: %w", name, ErrExist)
	}
	d.orphan, d.name = false, name
	s.mu.names[name] = d
	recs := []record{{Type: recRename, ID: d.id, Name: name}}
	if snapshot {
		d.uuid = uuid
		d.flags.Store(d.flags.Load() | diskFlagSnapshot)
		recs = append(recs, record{Type: recFlags, ID: d.id, Flags: d.flags.Load(), Src: d.origin, UUID: uuid})
	}
	s.appendLockedMu(recs...)
	return nil
}
