package image

// This file is the on-disk format: every persistent structure, its encoder and
// its decoder, in one place. FORMAT.md at the repository root documents the
// same layout byte by byte; the two must change together. All integers are
// little-endian. All checksums are CRC-32C (Castagnoli).

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"unicode/utf8"

	"github.com/vdiskfs/vdiskfs/image/placement"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// Format constants. These are part of the on-disk format.
const (
	// pageSize is the unit of every metadata write (superblocks, journal
	// commits): 4096 bytes, aligned for O_DIRECT on 512 B and 4 KiB devices.
	pageSize = 4096

	// formatVersion is the version of a store that shares no block;
	// sharedVersion the version of one that may (featShared): its
	// checkpoints list reference counts, its disks carry an origin, its
	// journal may hold clone and flags records. A store becomes version 2
	// on its first share (or with Upgrade) and never goes back.
	formatVersion = 1
	sharedVersion = 2
	// featShared is the incompatible feature bit of version 2: physical
	// blocks may be referenced by more than one map (clones, snapshots).
	featShared = 1

	superAOffset  = 0        // first superblock copy
	superBOffset  = pageSize // second superblock copy
	journalOffset = 2 * pageSize

	// maxCkptExtents is how many physical extents a checkpoint may occupy:
	// their list lives in the superblock after byte superExtentsOffset.
	superExtentsOffset = 512
	maxCkptExtents     = (pageSize - superExtentsOffset) / 16

	// MinBlockSize and MaxBlockSize bound the store's allocation unit.
	MinBlockSize = 4096
	MaxBlockSize = 1 << 20
	// DefaultBlockSize is the allocation unit of a store formatted without
	// an explicit block size.
	DefaultBlockSize = 4096

	// MaxNameLen is the longest disk name in bytes.
	MaxNameLen = 255
	// MaxDiskSize is the largest size of one disk in bytes (2^62): far
	// beyond any backing, and small enough that offset arithmetic never
	// overflows an int64.
	MaxDiskSize = int64(1) << 62

	dataAlign = 1 << 20 // the data region starts on a 1 MiB boundary
)

var (
	superMagic  = [8]byte{'V', 'D', 'I', 'S', 'K', 'F', 'S', 0}
	commitMagic = [4]byte{'V', 'D', 'J', 'C'}
	ckptMagic   = [4]byte{'V', 'D', 'C', 'P'}
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Store states kept in the superblock's owner record.
const (
	stateClean uint32 = 0 // closed cleanly: nothing to replay beyond the journal
	stateOpen  uint32 = 1 // opened read-write by the owner below
)

// pext is a physical extent: Len blocks from block Start of the data region.
type pext = placement.Extent

// superblock is the root of the store. Two identical copies live at byte 0 and
// byte 4096; the valid copy with the highest generation wins.
type superblock struct {
	Generation  uint64
	UUID        [16]byte
	BlockSize   uint32
	Features    uint32 // incompatible feature bits: featShared (version 2)
	StoreSize   uint64 // bytes of backing the store was formatted on
	JournalOff  uint64 // bytes
	JournalLen  uint64 // bytes
	DataOff     uint64 // bytes
	DataBlocks  uint64
	CkptSeq     uint64 // journal sequence number the checkpoint covers
	CkptLen     uint64 // bytes of checkpoint stream
	CkptCRC     uint32
	CreatedNano int64
	// Owner record: who has the store open, so that a second opener can be
	// told, and a store can later be fenced between hosts.
	State      uint32
	OwnerPID   uint32
	MountGen   uint64
	OpenedNano int64
	Host       string // at most 63 bytes
	Program    string // at most 63 bytes
	CkptExts   []pext // physical extents holding the checkpoint stream, in order
}

func putString(b []byte, s string) {
	copy(b, s)
}

func getString(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// encode writes the superblock into a 4096-byte page.
func (sb *superblock) encode(p []byte) {
	clear(p[:pageSize])
	le := binary.LittleEndian
	copy(p[0:8], superMagic[:])
	le.PutUint32(p[8:], sb.version())
	le.PutUint64(p[16:], sb.Generation)
	copy(p[24:40], sb.UUID[:])
	le.PutUint32(p[40:], sb.BlockSize)
	le.PutUint32(p[44:], sb.Features)
	le.PutUint64(p[48:], sb.StoreSize)
	le.PutUint64(p[56:], sb.JournalOff)
	le.PutUint64(p[64:], sb.JournalLen)
	le.PutUint64(p[72:], sb.DataOff)
	le.PutUint64(p[80:], sb.DataBlocks)
	le.PutUint64(p[88:], sb.CkptSeq)
	le.PutUint64(p[96:], sb.CkptLen)
	le.PutUint32(p[104:], sb.CkptCRC)
	le.PutUint32(p[108:], uint32(len(sb.CkptExts)))
	le.PutUint64(p[112:], uint64(sb.CreatedNano))
	le.PutUint32(p[120:], sb.State)
	le.PutUint32(p[124:], sb.OwnerPID)
	le.PutUint64(p[128:], sb.MountGen)
	le.PutUint64(p[136:], uint64(sb.OpenedNano))
	putString(p[144:207], sb.Host)
	putString(p[208:271], sb.Program)
	for i, e := range sb.CkptExts {
		o := superExtentsOffset + 16*i
		le.PutUint64(p[o:], e.Start)
		le.PutUint64(p[o+8:], e.Len)
	}
	le.PutUint32(p[12:], crc(p[16:pageSize]))
}

// decodeSuperblock validates a superblock page: magic, then version, then
// checksum, then the consistency of its fields, each with its own error.
func decodeSuperblock(p []byte) (*superblock, error) {
	if len(p) < pageSize {
		return nil, fmt.Errorf("superblock: %d bytes, want %d: %w", len(p), pageSize, ErrCorrupt)
	}
	le := binary.LittleEndian
	if !bytes.Equal(p[0:8], superMagic[:]) {
		return nil, fmt.Errorf("superblock: bad magic %q: %w", p[0:8], ErrNotStore)
	}
	v := le.Uint32(p[8:])
	if v != formatVersion && v != sharedVersion {
		return nil, fmt.Errorf("superblock: format version %d, this build reads versions %d and %d: %w", v, formatVersion, sharedVersion, ErrVersion)
	}
	if got, want := crc(p[16:pageSize]), le.Uint32(p[12:]); got != want {
		return nil, fmt.Errorf("superblock: checksum %#08x, stored %#08x: %w", got, want, ErrCorrupt)
	}
	sb := &superblock{
		Generation:  le.Uint64(p[16:]),
		BlockSize:   le.Uint32(p[40:]),
		Features:    le.Uint32(p[44:]),
		StoreSize:   le.Uint64(p[48:]),
		JournalOff:  le.Uint64(p[56:]),
		JournalLen:  le.Uint64(p[64:]),
		DataOff:     le.Uint64(p[72:]),
		DataBlocks:  le.Uint64(p[80:]),
		CkptSeq:     le.Uint64(p[88:]),
		CkptLen:     le.Uint64(p[96:]),
		CkptCRC:     le.Uint32(p[104:]),
		CreatedNano: int64(le.Uint64(p[112:])),
		State:       le.Uint32(p[120:]),
		OwnerPID:    le.Uint32(p[124:]),
		MountGen:    le.Uint64(p[128:]),
		OpenedNano:  int64(le.Uint64(p[136:])),
		Host:        getString(p[144:207]),
		Program:     getString(p[208:271]),
	}
	copy(sb.UUID[:], p[24:40])
	if sb.version() != v {
		return nil, fmt.Errorf("superblock: version %d with features %#x: %w", v, sb.Features, ErrCorrupt)
	}
	n := le.Uint32(p[108:])
	if n > maxCkptExtents {
		return nil, fmt.Errorf("superblock: %d checkpoint extents, at most %d: %w", n, maxCkptExtents, ErrCorrupt)
	}
	for i := 0; i < int(n); i++ {
		o := superExtentsOffset + 16*i
		sb.CkptExts = append(sb.CkptExts, pext{Start: le.Uint64(p[o:]), Len: le.Uint64(p[o+8:])})
	}
	if err := sb.validate(); err != nil {
		return nil, fmt.Errorf("superblock: %w", err)
	}
	return sb, nil
}

// version is the format version the superblock's features make it.
func (sb *superblock) version() uint32 {
	if sb.Features&featShared != 0 {
		return sharedVersion
	}
	return formatVersion
}

// validate checks that the layout the superblock describes is possible.
func (sb *superblock) validate() error {
	bs := uint64(sb.BlockSize)
	switch {
	case bs < MinBlockSize || bs > MaxBlockSize || bs&(bs-1) != 0:
		return fmt.Errorf("block size %d is not a power of two in [%d, %d]: %w", bs, MinBlockSize, MaxBlockSize, ErrCorrupt)
	case sb.Features&^featShared != 0:
		return fmt.Errorf("unknown incompatible features %#x: %w", sb.Features&^featShared, ErrVersion)
	case sb.JournalOff != journalOffset || sb.JournalLen < pageSize || sb.JournalLen%pageSize != 0:
		return fmt.Errorf("journal at %d length %d is malformed: %w", sb.JournalOff, sb.JournalLen, ErrCorrupt)
	case sb.DataOff < sb.JournalOff+sb.JournalLen || sb.DataOff%pageSize != 0:
		return fmt.Errorf("data region at %d overlaps the journal: %w", sb.DataOff, ErrCorrupt)
	case sb.DataBlocks == 0 || sb.DataBlocks > (1<<62)/bs:
		return fmt.Errorf("data region of %d blocks: %w", sb.DataBlocks, ErrCorrupt)
	case sb.DataOff+sb.DataBlocks*bs > sb.StoreSize:
		return fmt.Errorf("data region ends at %d, past the store size %d: %w", sb.DataOff+sb.DataBlocks*bs, sb.StoreSize, ErrCorrupt)
	case sb.State != stateClean && sb.State != stateOpen:
		return fmt.Errorf("unknown state %d: %w", sb.State, ErrCorrupt)
	}
	var blocks uint64
	for _, e := range sb.CkptExts {
		if e.Len == 0 || e.Start >= sb.DataBlocks || e.Len > sb.DataBlocks-e.Start {
			return fmt.Errorf("checkpoint extent [%d,+%d) outside the data region (%d blocks): %w", e.Start, e.Len, sb.DataBlocks, ErrCorrupt)
		}
		blocks += e.Len
	}
	if sb.CkptLen == 0 || sb.CkptLen > blocks*bs {
		return fmt.Errorf("checkpoint of %d bytes does not fit its %d blocks: %w", sb.CkptLen, blocks, ErrCorrupt)
	}
	return nil
}

// Journal commit header: one commit is one page-aligned, checksummed unit
// holding every record of one group commit. Replay applies whole commits.
const commitHeaderLen = 32

// encodeCommit lays out a commit of the given records payload into a buffer
// whose length is rounded up to whole pages.
func encodeCommit(dst []byte, seq uint64, uuid [16]byte, count uint32, payload []byte) []byte {
	n := commitHeaderLen + len(payload)
	size := (n + pageSize - 1) / pageSize * pageSize
	if cap(dst) < size {
		dst = make([]byte, size)
	}
	dst = dst[:size]
	le := binary.LittleEndian
	copy(dst[0:4], commitMagic[:])
	le.PutUint64(dst[8:], seq)
	copy(dst[16:24], uuid[:8])
	le.PutUint32(dst[24:], uint32(len(payload)))
	le.PutUint32(dst[28:], count)
	copy(dst[commitHeaderLen:], payload)
	clear(dst[n:])
	le.PutUint32(dst[4:], crc(dst[8:n]))
	return dst
}

// commitHeader is a decoded journal commit header.
type commitHeader struct {
	Seq        uint64
	PayloadLen uint32
	Count      uint32
}

// pages returns how many journal pages the commit occupies.
func (h commitHeader) pages() int64 {
	return (commitHeaderLen + int64(h.PayloadLen) + pageSize - 1) / pageSize
}

// decodeCommitHeader checks the magic and store identity of the page p. It
// does not verify the checksum, which covers the payload too (see verifyCommit).
func decodeCommitHeader(p []byte, uuid [16]byte) (commitHeader, bool) {
	le := binary.LittleEndian
	if len(p) < commitHeaderLen || !bytes.Equal(p[0:4], commitMagic[:]) || !bytes.Equal(p[16:24], uuid[:8]) {
		return commitHeader{}, false
	}
	return commitHeader{Seq: le.Uint64(p[8:]), PayloadLen: le.Uint32(p[24:]), Count: le.Uint32(p[28:])}, true
}

// verifyCommit checks the checksum of a whole commit held in b (header first)
// and returns its payload.
func verifyCommit(b []byte, h commitHeader) ([]byte, bool) {
	n := commitHeaderLen + int(h.PayloadLen)
	if len(b) < n {
		return nil, false
	}
	if crc(b[8:n]) != binary.LittleEndian.Uint32(b[4:]) {
		return nil, false
	}
	return b[commitHeaderLen:n], true
}

// Journal record types. Part of the format.
const (
	recCreate = 1 // a new disk: id, attributes, name
	recAttr   = 2 // mode, uid, gid and times of a disk (not its size)
	recSize   = 3 // a disk's size; a shrink also unmaps every block past it
	recRename = 4 // a disk's new name
	recUnlink = 5 // the name is gone; the disk lives on until recDelete
	recDelete = 6 // the disk and all its blocks are freed
	recMap    = 7 // virtual blocks [virt, virt+len) now map to physical [phys, phys+len)
	recPunch  = 8 // virtual blocks [virt, virt+len) are unmapped
	// Version 2 (featShared):
	recClone = 9  // [virt, virt+len) is unmapped, then maps what [srcVirt, +len) of disk src maps, sharing it
	recFlags = 10 // a disk's flags (diskFlagSnapshot, diskFlagClone), origin disk and identity
)

// diskAttr is what the catalog keeps of a disk besides its map.
type diskAttr struct {
	Size                int64
	Mode                uint32
	UID, GID            uint32
	Atime, Mtime, Ctime int64 // Unix nanoseconds
}

// record is one decoded journal record. Fields not used by its type are zero.
type record struct {
	Type      uint8
	ID        uint64
	Attr      diskAttr // recCreate, recAttr (Size used by recCreate and recSize)
	Name      string   // recCreate, recRename
	Virt, Len uint64   // recMap, recPunch, recClone
	Phys      uint64   // recMap
	Src       uint64   // recClone: the source disk; recFlags: the origin disk (0: none)
	SrcVirt   uint64   // recClone
	Flags     uint32   // recFlags
	UUID      [16]byte // recFlags: the disk's identity (zero: none)
}

// appendRecord encodes r onto b.
func appendRecord(b []byte, r *record) []byte {
	le := binary.LittleEndian
	b = append(b, r.Type)
	b = le.AppendUint64(b, r.ID)
	switch r.Type {
	case recCreate:
		b = appendAttr(b, &r.Attr, true)
		b = appendName(b, r.Name)
	case recAttr:
		b = appendAttr(b, &r.Attr, false)
	case recSize:
		b = le.AppendUint64(b, uint64(r.Attr.Size))
	case recRename:
		b = appendName(b, r.Name)
	case recUnlink, recDelete:
	case recMap:
		b = appendUint64s(b, r.Virt, r.Phys, r.Len)
	case recPunch:
		b = appendUint64s(b, r.Virt, r.Len)
	case recClone:
		b = appendUint64s(b, r.Src, r.SrcVirt, r.Virt, r.Len)
	case recFlags:
		b = le.AppendUint32(b, r.Flags)
		b = le.AppendUint64(b, r.Src)
		b = append(b, r.UUID[:]...)
	default:
		panic(fmt.Sprintf("image: encoding unknown record type %d", r.Type))
	}
	return b
}

// appendUint64s encodes vs onto b, in order, each little-endian.
func appendUint64s(b []byte, vs ...uint64) []byte {
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, v)
	}
	return b
}

func appendAttr(b []byte, a *diskAttr, withSize bool) []byte {
	le := binary.LittleEndian
	if withSize {
		b = le.AppendUint64(b, uint64(a.Size))
	}
	b = le.AppendUint32(b, a.Mode)
	b = le.AppendUint32(b, a.UID)
	b = le.AppendUint32(b, a.GID)
	b = le.AppendUint64(b, uint64(a.Atime))
	b = le.AppendUint64(b, uint64(a.Mtime))
	b = le.AppendUint64(b, uint64(a.Ctime))
	return b
}

func appendName(b []byte, name string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

// decoder reads little-endian fields from a byte slice and remembers the
// first overrun, so decoding code stays linear and checks once.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b)-d.off < n {
		d.err = fmt.Errorf("truncated at byte %d (need %d more, have %d): %w", d.off, n, len(d.b)-d.off, ErrCorrupt)
		return nil
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if p := d.take(2); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) attr(withSize bool) diskAttr {
	var a diskAttr
	if withSize {
		a.Size = int64(d.u64())
	}
	a.Mode = d.u32()
	a.UID = d.u32()
	a.GID = d.u32()
	a.Atime = int64(d.u64())
	a.Mtime = int64(d.u64())
	a.Ctime = int64(d.u64())
	return a
}

func (d *decoder) name() string {
	n := int(d.u16())
	return string(d.take(n))
}

// decodeRecords decodes a commit payload holding count records.
func decodeRecords(payload []byte, count uint32) ([]record, error) {
	d := &decoder{b: payload}
	recs := make([]record, 0, min(int(count), len(payload)/9))
	for i := uint32(0); i < count; i++ {
		var r record
		r.Type = d.u8()
		r.ID = d.u64()
		switch r.Type {
		case recCreate:
			r.Attr = d.attr(true)
			r.Name = d.name()
		case recAttr:
			r.Attr = d.attr(false)
		case recSize:
			r.Attr.Size = int64(d.u64())
		case recRename:
			r.Name = d.name()
		case recUnlink, recDelete:
		case recMap:
			r.Virt, r.Phys, r.Len = d.u64(), d.u64(), d.u64()
		case recPunch:
			r.Virt, r.Len = d.u64(), d.u64()
		case recClone:
			r.Src, r.SrcVirt, r.Virt, r.Len = d.u64(), d.u64(), d.u64(), d.u64()
		case recFlags:
			r.Flags, r.Src = d.u32(), d.u64()
			copy(r.UUID[:], d.take(16))
		default:
			if d.err == nil {
				return nil, fmt.Errorf("record %d: unknown type %d: %w", i, r.Type, ErrCorrupt)
			}
		}
		if d.err != nil {
			return nil, fmt.Errorf("record %d: %w", i, d.err)
		}
		if err := r.validate(); err != nil {
			return nil, fmt.Errorf("record %d: %w", i, err)
		}
		recs = append(recs, r)
	}
	if d.off != len(payload) {
		return nil, fmt.Errorf("%d bytes after the last record: %w", len(payload)-d.off, ErrCorrupt)
	}
	return recs, nil
}

// validate rejects values no writer produces. Names are checked loosely
// (length only) so that fsck can load and report a bad name instead of
// refusing the whole store.
func (r *record) validate() error {
	switch r.Type {
	case recCreate, recSize:
		if r.Attr.Size < 0 || r.Attr.Size > MaxDiskSize {
			return fmt.Errorf("disk %d size %d out of range: %w", r.ID, r.Attr.Size, ErrCorrupt)
		}
	case recMap, recPunch:
		if r.Len == 0 || r.Virt+r.Len < r.Virt || r.Phys+r.Len < r.Phys {
			return fmt.Errorf("disk %d extent [%d,+%d) overflows: %w", r.ID, r.Virt, r.Len, ErrCorrupt)
		}
	case recClone:
		if r.Len == 0 || r.Virt+r.Len < r.Virt || r.SrcVirt+r.Len < r.SrcVirt {
			return fmt.Errorf("disk %d clone of [%d,+%d) overflows: %w", r.ID, r.SrcVirt, r.Len, ErrCorrupt)
		}
	case recFlags:
		if r.Flags&^(diskFlagSnapshot|diskFlagClone) != 0 {
			return fmt.Errorf("disk %d flags %#x: %w", r.ID, r.Flags, ErrCorrupt)
		}
	}
	return nil
}

// ValidateName reports whether name can be a disk name: 1 to MaxNameLen
// bytes of UTF-8, no '/', no NUL or other control character, not "." or "..".
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("empty name: %w", ErrInvalidName)
	case len(name) > MaxNameLen:
		return fmt.Errorf("name of %d bytes, at most %d: %w", len(name), MaxNameLen, ErrInvalidName)
	case name == "." || name == "..":
		return fmt.Errorf("name %q: %w", name, ErrInvalidName)
	case !utf8.ValidString(name):
		return fmt.Errorf("name %q is not UTF-8: %w", name, ErrInvalidName)
	}
	for i := 0; i < len(name); i++ {
		// '/' and NUL cannot be in a file name; control characters could,
		// but would garble every listing and log line that shows the name.
		if c := name[i]; c == '/' || c < 0x20 || c == 0x7f {
			return fmt.Errorf("name %q contains %q: %w", name, c, ErrInvalidName)
		}
	}
	return nil
}

// Checkpoint stream: the whole catalog, every disk's map and the free-space
// map, as of journal sequence number Seq. Its length and checksum live in
// the superblock; it is stored across the superblock's checkpoint extents.
const ckptHeaderLen = 64

// Disk flags in the checkpoint (and, but for the orphan flag, in recFlags).
const (
	diskFlagOrphan   = 1 // unlinked while open: no name, freed at next open
	diskFlagSnapshot = 2 // a snapshot: read only (version 2)
	diskFlagClone    = 4 // made by copying the whole of its origin (version 2)
)

type ckptDisk struct {
	ID      uint64
	Attr    diskAttr
	Flags   uint32
	Origin  uint64   // version 2: the disk it is a snapshot or clone of (0: none)
	UUID    [16]byte // version 2: the disk's identity across stores (zero: none)
	Name    string
	Extents []extentRec
}

// extentRec is a map extent as stored: virtual block, physical block, length.
type extentRec struct {
	Virt, Phys, Len uint64
}

type checkpoint struct {
	Version uint32 // formatVersion, or sharedVersion
	Seq     uint64
	UUID    [16]byte
	NextID  uint64
	Disks   []ckptDisk
	Free    []pext
	Shared  []refcount.Extent // version 2: blocks referenced more than once
}

// ckptSize returns the exact length of the encoded checkpoint of a version
// for given counts of disks, name bytes, extents, free and shared extents.
func ckptSize(version uint32, disks, nameBytes, extents, free, shared int) int {
	n := ckptHeaderLen + disks*(8+8+4+4+4+4+24+2+8) + nameBytes + extents*24 + free*16
	if version == sharedVersion {
		n += disks*(8+16) + shared*20
	}
	return n
}

func (c *checkpoint) encode(b []byte) []byte {
	le := binary.LittleEndian
	b = append(b, ckptMagic[:]...)
	b = le.AppendUint32(b, c.Version)
	b = le.AppendUint64(b, c.Seq)
	b = append(b, c.UUID[:]...)
	b = le.AppendUint64(b, c.NextID)
	b = le.AppendUint32(b, uint32(len(c.Disks)))
	b = le.AppendUint32(b, uint32(len(c.Free)))
	b = le.AppendUint32(b, uint32(len(c.Shared))) // none in version 1
	b = le.AppendUint32(b, 0)
	b = le.AppendUint64(b, 0)
	for i := range c.Disks {
		d := &c.Disks[i]
		b = le.AppendUint64(b, d.ID)
		b = le.AppendUint64(b, uint64(d.Attr.Size))
		b = le.AppendUint32(b, d.Attr.Mode)
		b = le.AppendUint32(b, d.Attr.UID)
		b = le.AppendUint32(b, d.Attr.GID)
		b = le.AppendUint32(b, d.Flags)
		if c.Version == sharedVersion {
			b = le.AppendUint64(b, d.Origin)
			b = append(b, d.UUID[:]...)
		}
		b = le.AppendUint64(b, uint64(d.Attr.Atime))
		b = le.AppendUint64(b, uint64(d.Attr.Mtime))
		b = le.AppendUint64(b, uint64(d.Attr.Ctime))
		b = appendName(b, d.Name)
		b = le.AppendUint64(b, uint64(len(d.Extents)))
		for _, e := range d.Extents {
			b = le.AppendUint64(b, e.Virt)
			b = le.AppendUint64(b, e.Phys)
			b = le.AppendUint64(b, e.Len)
		}
	}
	for _, f := range c.Free {
		b = le.AppendUint64(b, f.Start)
		b = le.AppendUint64(b, f.Len)
	}
	for _, e := range c.Shared {
		b = le.AppendUint64(b, e.Start)
		b = le.AppendUint64(b, e.Len)
		b = le.AppendUint32(b, e.Refs)
	}
	return b
}

// decodeCheckpoint parses a checkpoint stream. It checks the structure
// (lengths, counts, overflow) but not the meaning of extents: overlaps and
// references outside the data region are findings for Check, not reasons to
// refuse the store, so fsck can report and repair them.
func decodeCheckpoint(b []byte, uuid [16]byte) (*checkpoint, error) {
	le := binary.LittleEndian
	if len(b) < ckptHeaderLen {
		return nil, fmt.Errorf("checkpoint: %d bytes, shorter than its header: %w", len(b), ErrCorrupt)
	}
	if !bytes.Equal(b[0:4], ckptMagic[:]) {
		return nil, fmt.Errorf("checkpoint: bad magic %q: %w", b[0:4], ErrCorrupt)
	}
	c := &checkpoint{Version: le.Uint32(b[4:]), Seq: le.Uint64(b[8:]), NextID: le.Uint64(b[32:])}
	if c.Version != formatVersion && c.Version != sharedVersion {
		return nil, fmt.Errorf("checkpoint: version %d: %w", c.Version, ErrVersion)
	}
	copy(c.UUID[:], b[16:32])
	if c.UUID != uuid {
		return nil, fmt.Errorf("checkpoint: belongs to another store (uuid %x): %w", c.UUID, ErrCorrupt)
	}
	if !allZero(b[52:ckptHeaderLen]) {
		return nil, fmt.Errorf("checkpoint: reserved header bytes are not zero: %w", ErrCorrupt)
	}
	ndisks, nfree, nshared := le.Uint32(b[40:]), le.Uint32(b[44:]), le.Uint32(b[48:])
	if nshared != 0 && c.Version == formatVersion {
		return nil, fmt.Errorf("checkpoint: %d shared extents in version 1: %w", nshared, ErrCorrupt)
	}
	d := &decoder{b: b, off: ckptHeaderLen}
	// Every disk takes at least 74 bytes: a count larger than the stream
	// allows is corrupt, and must not drive a huge allocation.
	if int(ndisks) > len(b)/74 {
		return nil, fmt.Errorf("checkpoint: %d disks cannot fit in %d bytes: %w", ndisks, len(b), ErrCorrupt)
	}
	c.Disks = make([]ckptDisk, ndisks)
	for i := range c.Disks {
		cd := &c.Disks[i]
		cd.ID = d.u64()
		cd.Attr.Size = int64(d.u64())
		cd.Attr.Mode = d.u32()
		cd.Attr.UID = d.u32()
		cd.Attr.GID = d.u32()
		cd.Flags = d.u32()
		if c.Version == sharedVersion {
			cd.Origin = d.u64()
			copy(cd.UUID[:], d.take(16))
		}
		cd.Attr.Atime = int64(d.u64())
		cd.Attr.Mtime = int64(d.u64())
		cd.Attr.Ctime = int64(d.u64())
		cd.Name = d.name()
		n := d.u64()
		if d.err != nil {
			return nil, fmt.Errorf("checkpoint: disk %d: %w", i, d.err)
		}
		if n > uint64(len(b)-d.off)/24 {
			return nil, fmt.Errorf("checkpoint: disk %d claims %d extents, more than the stream holds: %w", cd.ID, n, ErrCorrupt)
		}
		if cd.Attr.Size < 0 || cd.Attr.Size > MaxDiskSize {
			return nil, fmt.Errorf("checkpoint: disk %d size %d out of range: %w", cd.ID, cd.Attr.Size, ErrCorrupt)
		}
		cd.Extents = make([]extentRec, n)
		for j := range cd.Extents {
			e := extentRec{Virt: d.u64(), Phys: d.u64(), Len: d.u64()}
			if e.Len == 0 || e.Virt+e.Len < e.Virt || e.Phys+e.Len < e.Phys {
				return nil, fmt.Errorf("checkpoint: disk %d extent %d [%d,+%d) is empty or overflows: %w", cd.ID, j, e.Virt, e.Len, ErrCorrupt)
			}
			if j > 0 && e.Virt < cd.Extents[j-1].Virt+cd.Extents[j-1].Len {
				return nil, fmt.Errorf("checkpoint: disk %d extent %d at virtual block %d overlaps or precedes the one before: %w", cd.ID, j, e.Virt, ErrCorrupt)
			}
			cd.Extents[j] = e
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("checkpoint: %w", d.err)
	}
	if uint64(nfree) > uint64(len(b)-d.off)/16 {
		return nil, fmt.Errorf("checkpoint: %d free extents, more than the stream holds: %w", nfree, ErrCorrupt)
	}
	c.Free = make([]pext, nfree)
	for i := range c.Free {
		c.Free[i] = pext{Start: d.u64(), Len: d.u64()}
	}
	if uint64(nshared) > uint64(len(b)-d.off)/20 {
		return nil, fmt.Errorf("checkpoint: %d shared extents, more than the stream holds: %w", nshared, ErrCorrupt)
	}
	c.Shared = make([]refcount.Extent, nshared)
	for i := range c.Shared {
		c.Shared[i] = refcount.Extent{Start: d.u64(), Len: d.u64(), Refs: d.u32()}
	}
	if d.err != nil {
		return nil, fmt.Errorf("checkpoint: %w", d.err)
	}
	if d.off != len(b) {
		return nil, fmt.Errorf("checkpoint: %d bytes after the free and shared maps: %w", len(b)-d.off, ErrCorrupt)
	}
	return c, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
