package virtq

import (
	"encoding/binary"
	"fmt"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Offsets in one queue's inflight region (its layout is package proto's,
// InflightQueueSize bytes per queue): the header's fields, then each
// descriptor's state (InflightDescSize bytes) and, in it, its fields.
const (
	inflightOffVer    = 8
	inflightOffNum    = 10
	inflightOffBatch  = 12
	inflightOffUsed   = 14
	inflightOffFlight = 0
	inflightOffCount  = 8
)

// InflightQueueSize is the bytes of one queue's inflight region for a
// ring of size entries.
func InflightQueueSize(size uint16) int { return proto.InflightQueueSize(int(size)) }

// Inflight is one queue's inflight region.
type Inflight struct {
	b       []byte
	size    uint16
	counter uint64 // the next head's counter (its order of taking)
}

// NewInflight returns the inflight record of a ring of size entries in b,
// which is InflightQueueSize(size) bytes of the shared region. A region
// never used is all zeros; one a previous backend used says its size.
func NewInflight(b []byte, size uint16) (*Inflight, error) {
	if len(b) < InflightQueueSize(size) {
		return nil, fmt.Errorf("inflight region of %d bytes for %d descriptors: %w", len(b), size, ErrBadInflight)
	}
	in := &Inflight{b: b[:InflightQueueSize(size)], size: size}
	if v := in.version(); v != 0 {
		if v != proto.InflightVersion {
			return nil, fmt.Errorf("inflight region version %d: %w", v, ErrBadInflight)
		}
		if n := binary.LittleEndian.Uint16(in.b[inflightOffNum:]); n != size {
			return nil, fmt.Errorf("inflight region of %d descriptors for a ring of %d: %w", n, size, ErrBadInflight)
		}
	}
	return in, nil
}

// Size is the ring size the record is for.
func (in *Inflight) Size() uint16 { return in.size }

func (in *Inflight) version() uint16 { return binary.LittleEndian.Uint16(in.b[inflightOffVer:]) }

func (in *Inflight) init() {
	binary.LittleEndian.PutUint16(in.b[inflightOffNum:], in.size)
	binary.LittleEndian.PutUint16(in.b[inflightOffVer:], proto.InflightVersion)
}

func (in *Inflight) desc(h uint16) []byte {
	o := proto.InflightHeaderSize + proto.InflightDescSize*int(h)
	return in.b[o : o+proto.InflightDescSize]
}

func (in *Inflight) isInflight(h uint16) bool { return in.desc(h)[inflightOffFlight] == 1 }

func (in *Inflight) setInflight(h uint16, on bool) {
	if h >= in.size {
		return // a record a frontend corrupted: nothing to clear
	}
	v := byte(0)
	if on {
		v = 1
	}
	in.desc(h)[inflightOffFlight] = v
}

func (in *Inflight) counterOf(h uint16) uint64 {
	return binary.LittleEndian.Uint64(in.desc(h)[inflightOffCount:])
}

func (in *Inflight) lastBatchHead() uint16 {
	return binary.LittleEndian.Uint16(in.b[inflightOffBatch:])
}
func (in *Inflight) usedIdx() uint16     { return binary.LittleEndian.Uint16(in.b[inflightOffUsed:]) }
func (in *Inflight) setUsedIdx(v uint16) { store16(in.b[inflightOffUsed:], v) }

// get records head h as taken (vu_queue_inflight_get).
func (in *Inflight) get(h uint16) {
	d := in.desc(h)
	binary.LittleEndian.PutUint64(d[inflightOffCount:], in.counter)
	in.counter++
	d[inflightOffFlight] = 1
}

// prePut names h as the head being returned (vu_queue_inflight_pre_put).
func (in *Inflight) prePut(h uint16) { binary.LittleEndian.PutUint16(in.b[inflightOffBatch:], h) }

// postPut records h as returned once the used index is usedIdx
// (vu_queue_inflight_post_put).
func (in *Inflight) postPut(h uint16, usedIdx uint16) {
	in.desc(h)[inflightOffFlight] = 0
	in.setUsedIdx(usedIdx) // stores are ordered: the flag first
}
