package image

import (
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/crypt"
)

// rmwBlockLockedRange rewrites the mapped virtual block v with fn applied to
// its content; a hole is left alone. Caller holds an exclusive range lock on
// v.
func (d *disk) rmwBlockLockedRange(v uint64, fn func(block []byte)) error {
	s := d.s
	off := int64(v * s.bs)
	d.mu.RLock()
	hole := d.m.Lookup(nil, v, 1)[0].Hole
	n := min(int64(s.bs), d.attr.Size-off) // only up to the size: the write must not grow the disk
	d.mu.RUnlock()
	if hole || n <= 0 {
		return nil // nothing there to keep
	}
	buf := s.pool.Get(int(s.bs))
	defer s.pool.Put(buf)
	// A read and a write planned like any other (the write gives a shared
	// block a new one, as every write does).
	if _, err := d.runLockedRange(buf[:n], off, false); err != nil {
		return err
	}
	fn(buf)
	if _, err := d.runLockedRange(buf[:n], off, true); err != nil {
		return err
	}
	// The caller's size or punch record relies on this write: the commit
	// that makes the record durable must flush it first.
	s.mu.Lock()
	s.mu.pend.dataFirst()
	s.mu.Unlock()
	return nil
}

// runLockedRange reads len(p) bytes at off into p, or writes p there, through
// a plan the store makes for itself (no handle), and returns the bytes it
// read or wrote: a read stops at the disk's size. Caller holds a range
// lock over the range, exclusive for a write.
func (d *disk) runLockedRange(p []byte, off int64, write bool) (int, error) {
	return d.runModeLockedRange(p, off, planMode{write: write, wait: true, locked: true})
}

// runModeLockedRange is runLockedRange with the plan's mode m (raw or not).
func (d *disk) runModeLockedRange(p []byte, off int64, m planMode) (int, error) {
	write := m.write
	var pl IOPlan
	switch err := d.prepare(&pl, p, off, m, nil); {
	case err == io.EOF && !write:
		return 0, nil
	case err != nil:
		return 0, err
	}
	if err := pl.perform(); err != nil {
		return 0, err
	}
	return pl.N, nil
}

// readLockedRange reads len(p) bytes at off into p through a plan of the
// store's own (runLockedRange). What lies past the disk's size reads as
// zeros, as a block's tail past the size holds on the backing. Caller
// holds a range lock over the range.
func (d *disk) readLockedRange(p []byte, off int64) error {
	return d.readModeLockedRange(p, off, planMode{wait: true, locked: true})
}

// readRawLockedRange is readLockedRange of the blocks as stored: an
// encrypted disk's ciphertext, which needs no key (defrag).
func (d *disk) readRawLockedRange(p []byte, off int64) error {
	return d.readModeLockedRange(p, off, planMode{wait: true, locked: true, raw: true})
}

func (d *disk) readModeLockedRange(p []byte, off int64, m planMode) error {
	n, err := d.runModeLockedRange(p, off, m)
	if err != nil {
		return err
	}
	clear(p[n:])
	return nil
}

// zeroSpanLockedRange zeroes the bytes of a partial span (coalesce.Split) in
// place: [sp.Off, sp.Off+sp.Len) of block sp.Block. Caller holds an
// exclusive range lock on sp.Block.
func (d *disk) zeroSpanLockedRange(sp coalesce.Span) error {
	return d.rmwBlockLockedRange(sp.Block, func(b []byte) { clear(b[sp.Off : sp.Off+sp.Len]) })
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

// lockChange starts a punch, zero range or allocation (op) of [off, off+n):
// it checks the range and that the store takes writes, locks the range's
// blocks exclusively and returns the disk's size under that lock. With
// n == 0 it holds nothing and returns no error: there is nothing to do.
func (d *disk) lockChange(op string, off, n int64) (lr lockedRange, size int64, err error) {
	s := d.s
	if err := checkRange(off, n); err != nil {
		return lockedRange{}, 0, fmt.Errorf("disk %d %s: %w", d.id, op, err)
	}
	if err := d.readOnly(); err != nil {
		return lockedRange{}, 0, fmt.Errorf("disk %d %s: %w", d.id, op, err)
	}
	if n == 0 {
		return lockedRange{}, 0, nil
	}
	if err := s.writable(); err != nil {
		return lockedRange{}, 0, fmt.Errorf("disk %d %s: %w", d.id, op, err)
	}
	first, count := coalesce.BlockRange(uint64(off), uint64(n), s.bs)
	lr = d.ranges.lock(first, count, true)
	d.mu.RLock()
	size = d.attr.Size
	d.mu.RUnlock()
	return lr, size, nil
}

func (d *disk) punch(off, n int64, keepSize bool) error {
	s := d.s
	lr, size, err := d.lockChange("punch", off, n)
	if err != nil || n == 0 {
		return err
	}
	defer lr.unlock()

	end := min(off+n, size)
	if off < end {
		// Partial spans of [off, end) are zeroed in place and whole blocks
		// freed, in one unmap. A partial span that starts on a block
		// boundary (Off 0: the tail) and ends at the size counts as whole:
		// the bytes past the size are zeros already. The blocks to free
		// are therefore one run: the whole span and such a tail after it.
		var freeFirst, freeEnd uint64
		spans := coalesce.Split(uint64(off), uint64(end-off), s.bs)
		for _, sp := range spans.All() {
			if sp.Partial && (sp.Off != 0 || end != size) {
				if err := d.zeroSpanLockedRange(sp); err != nil {
					return fmt.Errorf("disk %d punch at %d: %w", d.id, off, err)
				}
				continue
			}
			if freeFirst == freeEnd {
				freeFirst = sp.Block
			}
			freeEnd = sp.Block + sp.Blocks
		}
		if freeFirst < freeEnd {
			d.unmapLockedRange(freeFirst, freeEnd-freeFirst)
		}
	}
	if !keepSize && off+n > size {
		d.growSizeLockedRange(off + n)
	}
	d.touch()
	return nil
}

// unmapLockedRange frees virtual blocks [v, v+n) and journals it. Caller
// holds an exclusive range lock over them.
func (d *disk) unmapLockedRange(v, n uint64) {
	d.changeMap(nil, func() (mapChange, error) {
		freed := d.m.Punch(v, n, nil)
		if len(freed) == 0 {
			return mapChange{}, nil
		}
		c := mapChange{recs: []record{{Type: recPunch, ID: d.id, Virt: v, Len: n}}, freed: freed}
		if d.m.Len() == 0 {
			d.forgetLayouts()     // the next first write chooses afresh
			c.releaseUnits = true // they follow the layout just forgotten
		}
		return c, nil
	})
}

// setSizeLockedRange sets the size and journals it; a shrink unmaps every
// block past the new size. Caller holds an exclusive range lock from the new
// size on.
func (d *disk) setSizeLockedRange(size int64) {
	s := d.s
	d.changeMap(nil, func() (mapChange, error) {
		keep := coalesce.RoundUp(uint64(size), s.bs) / s.bs
		c := mapChange{
			recs:  []record{{Type: recSize, ID: d.id, Attr: diskAttr{Size: size}}},
			freed: d.m.Punch(keep, ^uint64(0)-keep, nil),
		}
		d.attr.Size = size
		d.attr.Ctime = time.Now().UnixNano()
		switch {
		case d.m.Len() == 0:
			d.forgetLayouts()     // the next first write chooses afresh
			c.releaseUnits = true // they follow the layout just forgotten
		case s.unitBlocks != 0:
			c.releaseUnits, c.unitsFrom = true, (keep+s.unitBlocks-1)/s.unitBlocks // past the end
		}
		return c, nil
	})
}

// growSizeLockedRange raises the size to size and journals it; it never
// lowers it. A grower (Allocate, ZeroRange) reads the size when it starts
// and holds only its own range, so a write past that range may have grown
// the disk further meanwhile: that size, and the write's blocks, stay.
// Caller holds an exclusive range lock over its own range.
func (d *disk) growSizeLockedRange(size int64) {
	d.changeMap(nil, func() (mapChange, error) {
		if size <= d.attr.Size {
			return mapChange{}, nil
		}
		d.attr.Size = size
		d.attr.Ctime = time.Now().UnixNano()
		return mapChange{recs: []record{{Type: recSize, ID: d.id, Attr: diskAttr{Size: size}}}}, nil
	})
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
	if err := d.readOnly(); err != nil {
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
	if size < old {
		// The head of the range cut off, when it starts inside a block, is
		// the rest of the block the disk now ends in: zero it in place.
		cut := coalesce.Split(uint64(size), uint64(old-size), s.bs)
		if head := cut.S[0]; head.Off != 0 {
			if err := d.zeroSpanLockedRange(head); err != nil {
				return fmt.Errorf("disk %d truncate to %d: %w", d.id, size, err)
			}
		}
	}
	d.setSizeLockedRange(size)
	d.touch()
	return nil
}

// zeroStaleTails zeroes, on the backing, the bytes past the end of every
// disk whose last block is mapped and only partly inside its size, where
// they are not zeros already. An encrypted disk's wait for its key: Unlock
// does them (zeroEncryptedTails). Those bytes must read as zeros once the disk
// grows again (Truncate zeroes them when it shrinks a disk), and in memory
// nothing puts anything else there; but a write that grew the disk from
// inside that block went in place, so after a crash that lost the record
// of its size (the write was never promised) its bytes stay in the block,
// past the end the disk was left with, and the next growth would show
// them. Open calls it, once Check found the maps sound, before anything
// can grow a disk.
//
// Such a block is never shared: the write went in place, so the block had
// one reference then (references are dropped only once durable), and any
// record that shared it later comes after the lost one in the journal, so
// it is lost too. One is left alone with a warning all the same rather
// than written under another disk. Caller owns the store alone (Open).
func (s *Store) zeroStaleTails() error {
	bs := s.bs
	ds := make([]*disk, 0, len(s.mu.disks))
	for _, d := range s.mu.disks {
		if uint64(d.attr.Size)%bs != 0 && d.enc == nil {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return nil
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].id < ds[j].id })
	buf := s.pool.Get(int(bs))
	defer s.pool.Put(buf)
	sc := getScratch()
	defer putScratch(sc)
	c := s.stats.shard(sc)
	for _, d := range ds {
		size := uint64(d.attr.Size)
		sg := d.m.Lookup(sc.segs[:0], size/bs, 1)[0]
		if sg.Hole {
			continue
		}
		fields := logrus.Fields{"disk_id": d.id, "disk": d.name, "size": size, "block": sg.Phys}
		if err := s.zeroTail(c, buf, size, sg, s.mu.shared.Shared(sg.Phys, 1), nil, fields); err != nil {
			return fmt.Errorf("disk %d: %w", d.id, err)
		}
	}
	return nil
}

// zeroTail zeroes, in place, the bytes past size in the block of data
// segment sg, a disk's last, where anything else is there: it reads the
// block into buf (one block), decrypts it with ci unless ci is nil (a
// plain disk), and when its tail is not zeros writes it back with the tail
// zeroed (encrypted again under the segment's tweak), unless shared says
// the block is shared, which it leaves alone with a warning. fields name
// the disk in the log. The caller keeps the block from changing meanwhile
// (it owns the store, or holds the block's range lock).
func (s *Store) zeroTail(c *Shard, buf []byte, size uint64, sg blockmap.Segment, shared bool, ci *crypt.Cipher, fields logrus.Fields) error {
	if err := s.readData(c, buf, sg.Phys); err != nil {
		return fmt.Errorf("read its last block: %w", err)
	}
	if ci != nil {
		ci.DecryptBlocks(buf, buf, sg.Tweak)
	}
	tail := buf[size%s.bs:]
	if allZero(tail) {
		return nil
	}
	if shared {
		s.log.WithFields(fields).Warn("bytes past the end of a disk are not zeros, in a shared block: left as they are")
		return nil
	}
	clear(tail)
	if ci != nil {
		ci.EncryptBlocks(buf, buf, sg.Tweak)
	}
	if err := s.writeData(c, buf, sg.Phys, false); err != nil {
		return fmt.Errorf("zero past its end: %w", err)
	}
	s.writeGen.Add(1)
	s.log.WithFields(fields).Info("zeroed bytes past the end of a disk, left by a growing write that a crash lost")
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
	lr, size, err := d.lockChange("allocate", off, n)
	if err != nil || n == 0 {
		return err
	}
	defer lr.unlock()
	end := off + n
	if keepSize {
		end = min(end, size)
	}
	if off < end {
		first, count := coalesce.BlockRange(uint64(off), uint64(end-off), s.bs)
		if err := d.allocateZeroedLockedRange(first, count); err != nil {
			return fmt.Errorf("disk %d allocate [%d,+%d): %w", d.id, off, n, err)
		}
	}
	if !keepSize && off+n > size {
		d.growSizeLockedRange(off + n)
	}
	return nil
}

// allocateZeroedLockedRange gives the holes in virtual blocks [first,
// first+count) zeroed blocks, placed as a write's are (placement.Fill: by the
// virtual offset of the nearest mapped neighbour, else the disk's layout
// base), so a disk fallocated in any order is laid out as one written in
// order. Blocks it shares stay shared (fallocate does not unshare). Caller
// holds an exclusive range lock over them.
func (d *disk) allocateZeroedLockedRange(first, count uint64) error {
	s := d.s
	bs := s.bs
	ciph, err := d.cipher() // an encrypted disk's zeros are written encrypted
	if err != nil {
		return err
	}
	sc := getScratch()
	defer putScratch(sc)
	d.mu.RLock()
	sc.segs = d.m.Lookup(sc.segs, first, count)
	if !hasHole(sc) {
		d.mu.RUnlock()
		return nil
	}
	var base uint64
	if d.enc != nil {
		base = d.enc.tweakBase
	}
	nb := d.neighboursLockedMu(first, count)
	if d.mayShare.Load() {
		s.mu.Lock()
		nb.DropShared(first, count, s.mu.shared)
		s.mu.Unlock()
	}
	d.mu.RUnlock()
	// A disk that grows by this call has no size yet to size its layout.
	nb.Blocks = max(nb.Blocks, first+count)
	if err := d.fillHoles(sc, nb, true); err != nil {
		s.unallocate(sc.allocs)
		return err
	}
	if d.enc != nil {
		tweakNew(sc.out, sc.allocs, base)
	}
	for _, sg := range sc.out {
		if !isAllocated(sg, sc.allocs) {
			continue
		}
		var err error
		if ciph != nil {
			err = s.writeEncryptedZeros(ciph, sg)
		} else {
			err = s.be.WriteZeroes(s.dataOff+int64(sg.Phys*bs), int64(sg.Len*bs))
		}
		if err != nil {
			s.stats.Errors.Add(1)
			s.unallocate(sc.allocs)
			return err
		}
	}
	s.writeGen.Add(1)
	d.publishWriteLockedRange(sc, 0) // maps and journals the new blocks; the size is Allocate's
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
