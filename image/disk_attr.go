package image

import (
	"fmt"
	"time"
)

// Stat describes the disk.
func (h *Disk) Stat() DiskInfo {
	h.d.mu.RLock()
	defer h.d.mu.RUnlock()
	return h.d.infoLockedMu()
}

// Size returns the disk's size in bytes.
func (h *Disk) Size() int64 {
	h.d.mu.RLock()
	defer h.d.mu.RUnlock()
	return h.d.attr.Size
}

// info is Stat with the sharing: shared bytes and the origin's name.
func (d *disk) info() DiskInfo {
	d.mu.RLock()
	defer d.mu.RUnlock()
	i := d.infoLockedMu()
	s := d.s
	s.mu.Lock()
	defer s.mu.Unlock()
	i.Shared = int64(s.sharedBlocksLockedMu(d) * s.bs)
	if o := s.mu.disks[d.origin]; o != nil && !o.orphan {
		i.Origin = o.name
	}
	return i
}

// infoLockedMu builds a DiskInfo; caller holds d.mu (either mode) or owns d.
func (d *disk) infoLockedMu() DiskInfo {
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
		Snapshot:  d.flags.Load()&diskFlagSnapshot != 0,
		Clone:     d.flags.Load()&diskFlagClone != 0,
		OriginID:  d.origin,
		UUID:      d.uuid,
		Encrypted: d.enc != nil,
		Locked:    d.enc != nil && d.enc.cipher.Load() == nil,
	}
}

func (d *disk) touch() {
	d.mtime.Store(time.Now().UnixNano())
	d.timesDirty.Store(true)
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
	unlock, err := s.lockCatalog(d)
	if err != nil {
		return fmt.Errorf("disk %d setattr: %w", d.id, err)
	}
	defer unlock()
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
	s.appendLockedMu(d.attrRecordLockedMu())
	return nil
}

// attrRecordLockedMu returns a record of d's current attributes. Caller holds
// d.mu.
func (d *disk) attrRecordLockedMu() record {
	a := d.attr
	a.Atime, a.Mtime = d.atime.Load(), d.mtime.Load()
	return record{Type: recAttr, ID: d.id, Attr: a}
}
