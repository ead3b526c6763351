package proto

import (
	"encoding/binary"
	"fmt"
)

// Virtio-blk feature bits (virtio 1.2, 5.2.3; Linux virtio_blk.h). Part of
// the format.
const (
	BlkFSizeMax     = 1  // config size_max: the largest segment
	BlkFSegMax      = 2  // config seg_max: the most segments per request
	BlkFGeometry    = 4  // config geometry (legacy)
	BlkFRO          = 5  // the disk is read-only
	BlkFBlkSize     = 6  // config blk_size: the logical block size
	BlkFFlush       = 9  // VIRTIO_BLK_T_FLUSH: the device has a volatile write cache
	BlkFTopology    = 10 // config topology fields
	BlkFConfigWCE   = 11 // config wce: the write-cache mode can be read and set
	BlkFMQ          = 12 // config num_queues: more than one request queue
	BlkFDiscard     = 13 // VIRTIO_BLK_T_DISCARD and its config limits
	BlkFWriteZeroes = 14 // VIRTIO_BLK_T_WRITE_ZEROES and its config limits
	BlkFLifetime    = 15
	BlkFSecureErase = 16
)

// Virtio-blk request types (the type field of the request header). Part
// of the format.
const (
	BlkTIn          = 0  // read: the data descriptors are device-writable
	BlkTOut         = 1  // write: the data descriptors are device-readable
	BlkTFlush       = 4  // make every completed write durable
	BlkTGetID       = 8  // write the device ID string (BlkIDBytes) into the data
	BlkTGetLifetime = 10 // wear information
	BlkTDiscard     = 11 // the data is BlkSegSize-byte segments
	BlkTWriteZeroes = 13 // the data is BlkSegSize-byte segments
	BlkTSecureErase = 14
)

// Virtio-blk request statuses (the last, device-writable byte of a
// request). Part of the format.
const (
	BlkSOK     = 0
	BlkSIOErr  = 1
	BlkSUnsupp = 2
)

// Sizes of the virtio-blk format.
const (
	SectorSize      = 512 // the unit of capacity and of a request's sector, whatever blk_size is
	BlkIDBytes      = 20  // the GET_ID string, NUL-padded, not NUL-terminated when 20 long
	BlkOutHdrSize   = 16  // struct virtio_blk_outhdr
	BlkSegSize      = 16  // struct virtio_blk_discard_write_zeroes
	BlkSegFlagUnmap = 1   // the segment's flags bit 0: the device may deallocate
	BlkStatusSize   = 1
	// BlkConfigSize is the config space this package knows: struct
	// virtio_blk_config up to and including unused1 (the write-zeroes
	// fields). Bytes past it read as zero.
	BlkConfigSize = 60
)

// BlkOutHdr is struct virtio_blk_outhdr, the first, device-readable 16
// bytes of every request:
//
//	0  u32 type
//	4  u32 ioprio
//	8  u64 sector (512-byte units)
type BlkOutHdr struct {
	Type   uint32
	IOPrio uint32
	Sector uint64
}

// Put writes h into b, which must hold BlkOutHdrSize bytes.
func (h BlkOutHdr) Put(b []byte) {
	_ = b[BlkOutHdrSize-1]
	binary.LittleEndian.PutUint32(b[0:], h.Type)
	binary.LittleEndian.PutUint32(b[4:], h.IOPrio)
	binary.LittleEndian.PutUint64(b[8:], h.Sector)
}

// DecodeBlkOutHdr reads a request header from b.
func DecodeBlkOutHdr(b []byte) (BlkOutHdr, error) {
	if len(b) < BlkOutHdrSize {
		return BlkOutHdr{}, fmt.Errorf("%w: virtio-blk header of %d bytes, want %d", ErrMalformed, len(b), BlkOutHdrSize)
	}
	return BlkOutHdr{
		Type:   binary.LittleEndian.Uint32(b[0:]),
		IOPrio: binary.LittleEndian.Uint32(b[4:]),
		Sector: binary.LittleEndian.Uint64(b[8:]),
	}, nil
}

// BlkSeg is struct virtio_blk_discard_write_zeroes, one range of a discard
// or write-zeroes request:
//
//	0  u64 sector
//	8  u32 num_sectors
//	12 u32 flags (bit 0: unmap)
type BlkSeg struct {
	Sector     uint64
	NumSectors uint32
	Flags      uint32
}

// Put writes s into b, which must hold BlkSegSize bytes.
func (s BlkSeg) Put(b []byte) { copy(b[:BlkSegSize], encodeFixed(s)) }

// DecodeBlkSeg reads one segment from b.
func DecodeBlkSeg(b []byte) (s BlkSeg, err error) {
	err = decodeFixed("virtio-blk segment", b, &s)
	return s, err
}

// BlkConfig is struct virtio_blk_config (packed, little endian) up to
// BlkConfigSize:
//
//	0  u64 capacity (512-byte sectors)
//	8  u32 size_max
//	12 u32 seg_max
//	16 u16 geometry.cylinders, 18 u8 heads, 19 u8 sectors
//	20 u32 blk_size
//	24 u8  physical_block_exp, 25 u8 alignment_offset
//	26 u16 min_io_size, 28 u32 opt_io_size (logical blocks)
//	32 u8  wce, 33 u8 unused
//	34 u16 num_queues
//	36 u32 max_discard_sectors, 40 u32 max_discard_seg
//	44 u32 discard_sector_alignment
//	48 u32 max_write_zeroes_sectors, 52 u32 max_write_zeroes_seg
//	56 u8  write_zeroes_may_unmap, 57 u8[3] unused1
type BlkConfig struct {
	Capacity               uint64
	SizeMax                uint32
	SegMax                 uint32
	Cylinders              uint16
	Heads                  uint8
	Sectors                uint8
	BlkSize                uint32
	PhysicalBlockExp       uint8
	AlignmentOffset        uint8
	MinIOSize              uint16
	OptIOSize              uint32
	WCE                    uint8
	_                      uint8
	NumQueues              uint16
	MaxDiscardSectors      uint32
	MaxDiscardSeg          uint32
	DiscardSectorAlignment uint32
	MaxWriteZeroesSectors  uint32
	MaxWriteZeroesSeg      uint32
	WriteZeroesMayUnmap    uint8
	_                      [3]uint8
}

// Encode returns the config space, BlkConfigSize bytes.
func (c BlkConfig) Encode() []byte { return encodeFixed(c) }

// DecodeBlkConfig reads a config space of any length: a frontend reads as
// much as the features it negotiated need (QEMU asks for less than
// BlkConfigSize when DISCARD and WRITE_ZEROES are off), so fields past the
// end of b are left zero.
func DecodeBlkConfig(b []byte) BlkConfig {
	var full [BlkConfigSize]byte
	copy(full[:], b)
	var c BlkConfig
	if err := decodeFixed("virtio-blk config", full[:], &c); err != nil {
		panic(err) // full holds all of it
	}
	return c
}
