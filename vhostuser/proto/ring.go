package proto

import (
	"encoding/binary"
	"fmt"
)

// Split virtqueue layout (virtio 1.2, 2.7; Linux virtio_ring.h). All
// fields are little endian (VERSION_1). Part of the format.
//
// Descriptor table: num entries of DescSize bytes, aligned to DescAlign:
//
//	0  u64 addr (guest physical)
//	8  u32 len
//	12 u16 flags (DescFNext, DescFWrite, DescFIndirect)
//	14 u16 next
//
// Available ring (driver to device), aligned to AvailAlign:
//
//	0  u16 flags (AvailFNoInterrupt)
//	2  u16 idx (free-running: the next slot the driver fills)
//	4  u16 ring[num] (descriptor heads)
//	4+2*num u16 used_event (with EVENT_IDX)
//
// Used ring (device to driver), aligned to UsedAlign:
//
//	0  u16 flags (UsedFNoNotify)
//	2  u16 idx (free-running)
//	4  {u32 id; u32 len} ring[num] (id: the head; len: bytes written)
//	4+8*num u16 avail_event (with EVENT_IDX)
const (
	DescSize   = 16
	DescAlign  = 16
	AvailAlign = 2
	UsedAlign  = 4

	DescFNext     = 1 // the chain continues at next
	DescFWrite    = 2 // device-writable (otherwise device-readable)
	DescFIndirect = 4 // addr/len is a table of descriptors

	AvailFNoInterrupt = 1 // VRING_AVAIL_F_NO_INTERRUPT: driver asks for no call (without EVENT_IDX)
	UsedFNoNotify     = 1 // VRING_USED_F_NO_NOTIFY: device asks for no kick (without EVENT_IDX)

	RingFlagsOff = 0 // offset of flags in the avail and used rings
	RingIdxOff   = 2 // offset of idx in the avail and used rings
	RingArrayOff = 4 // offset of ring[0] in the avail and used rings
	UsedElemSize = 8

	// MaxQueueSize is the largest split virtqueue: num is a power of two
	// up to 32768.
	MaxQueueSize = 32768
)

// VRING_DESC_F_* and vring_addr flags of SET_VRING_ADDR.
const VringAddrFLog = 1 // VHOST_VRING_F_LOG: log used-ring writes

// DescTableSize is the byte size of a descriptor table of num entries.
func DescTableSize(num int) int { return DescSize * num }

// AvailRingSize is the byte size of an available ring of num entries,
// used_event included.
func AvailRingSize(num int) int { return RingArrayOff + 2*num + 2 }

// UsedRingSize is the byte size of a used ring of num entries,
// avail_event included.
func UsedRingSize(num int) int { return RingArrayOff + UsedElemSize*num + 2 }

// UsedEventOff is the offset of used_event in the available ring.
func UsedEventOff(num int) int { return RingArrayOff + 2*num }

// AvailEventOff is the offset of avail_event in the used ring.
func AvailEventOff(num int) int { return RingArrayOff + UsedElemSize*num }

// ValidQueueSize says whether num is a split virtqueue size: a power of
// two from 1 to MaxQueueSize.
func ValidQueueSize(num int) bool {
	return num > 0 && num <= MaxQueueSize && num&(num-1) == 0
}

// NeedEvent is vring_need_event: with EVENT_IDX, whether moving an index
// from old to new passed event, the index the other side asked to be told
// of (all arithmetic modulo 2^16).
func NeedEvent(event, new, old uint16) bool {
	return new-event-1 < new-old
}

// Desc is one descriptor of a split virtqueue.
type Desc struct {
	Addr  uint64
	Len   uint32
	Flags uint16
	Next  uint16
}

// Put writes d into b, which must hold DescSize bytes.
func (d Desc) Put(b []byte) {
	_ = b[DescSize-1]
	binary.LittleEndian.PutUint64(b[0:], d.Addr)
	binary.LittleEndian.PutUint32(b[8:], d.Len)
	binary.LittleEndian.PutUint16(b[12:], d.Flags)
	binary.LittleEndian.PutUint16(b[14:], d.Next)
}

// DecodeDesc reads one descriptor from b.
func DecodeDesc(b []byte) (Desc, error) {
	if len(b) < DescSize {
		return Desc{}, fmt.Errorf("%w: descriptor of %d bytes, want %d", ErrMalformed, len(b), DescSize)
	}
	return Desc{
		Addr:  binary.LittleEndian.Uint64(b[0:]),
		Len:   binary.LittleEndian.Uint32(b[8:]),
		Flags: binary.LittleEndian.Uint16(b[12:]),
		Next:  binary.LittleEndian.Uint16(b[14:]),
	}, nil
}

// Inflight region of a split virtqueue (INFLIGHT_SHMFD; the layout of
// QEMU's libvhost-user, which the frontend keeps without reading). The
// region GET_INFLIGHT_FD returns holds one such queue region per queue,
// each InflightQueueSize(num) bytes, little endian:
//
//	0  u64 features (0)
//	8  u16 version (1; 0: the guest reset the device)
//	10 u16 desc_num (the queue size)
//	12 u16 last_batch_head
//	14 u16 used_idx (the used ring's idx as the backend last wrote it)
//	16 desc[desc_num], InflightDescSize bytes each:
//	   0 u8 inflight (1: the head's request was fetched and not yet used)
//	   1 u8[5] padding
//	   6 u16 next
//	   8 u64 counter (fetch order, for resubmission in order)
const (
	InflightHeaderSize = 16
	InflightDescSize   = 16
	InflightAlign      = 64
	InflightVersion    = 1
)

// InflightQueueSize is the bytes one queue of num entries takes in the
// inflight region: libvhost-user's vu_inflight_queue_size,
// ALIGN_UP(16*num + 2, 64). For num a multiple of 4 (every ring size from
// 4 up) it holds the 16-byte header as well.
func InflightQueueSize(num int) int {
	n := InflightDescSize*num + 2
	return (n + InflightAlign - 1) &^ (InflightAlign - 1)
}
