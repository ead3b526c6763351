package proto

import (
	"encoding/binary"
	"fmt"
)

// Message bounds and sizes. Part of the format.
const (
	HeaderSize = 12 // u32 request, u32 flags, u32 size
	// MaxPayload bounds a payload. The largest a vhost-user-blk session
	// sends is a config message (12 + 256 bytes) or a memory table of
	// MaxMemRegions regions (8 + 8*32); the bound leaves room for more.
	MaxPayload = 4096
	// MaxFDs bounds the descriptors of one message:
	// VHOST_MEMORY_BASELINE_NREGIONS, one per memory-table region.
	MaxFDs = 8
	// MaxMemRegions is the most regions SET_MEM_TABLE carries.
	MaxMemRegions = 8
	// MaxConfigSize is VHOST_USER_MAX_CONFIG_SIZE, the most config space
	// one GET/SET_CONFIG moves.
	MaxConfigSize = 256

	U64Size             = 8
	VringStateSize      = 8
	VringAddrSize       = 40
	MemRegionSize       = 32
	memTableHdrSize     = 8
	MemRegMsgSize       = 8 + MemRegionSize
	LogSize             = 16
	ConfigHdrSize       = 12
	VringAreaSize       = 24
	InflightSize        = 24 // VhostUserInflight: 20 bytes of fields, padded to 8
	inflightMinSize     = 20
	VringIndexMask      = 0xff  // SET_VRING_KICK/CALL/ERR payload: the queue index
	VringNoFDMask       = 0x100 // ... and this bit: no fd (polling / no notification)
	ConfigTypeFrontend  = 0     // SET_CONFIG flags: VHOST_SET_CONFIG_TYPE_FRONTEND
	ConfigTypeMigration = 1     // SET_CONFIG flags: VHOST_SET_CONFIG_TYPE_MIGRATION
)

// Message is one vhost-user message: a header's request and flags, the
// payload, and the file descriptors that came with it. The receiver owns
// FDs and closes those it does not keep.
type Message struct {
	Request uint32 // a Request or, on the backend channel, a BackendRequest
	Flags   uint32
	Payload []byte
	FDs     []int
}

// IsReply says whether m has the reply flag.
func (m Message) IsReply() bool { return m.Flags&FlagReply != 0 }

// NeedReply says whether m asks for a REPLY_ACK reply.
func (m Message) NeedReply() bool { return m.Flags&FlagNeedReply != 0 }

func (m Message) String() string {
	return fmt.Sprintf("%v flags %#x size %d fds %d", Request(m.Request), m.Flags, len(m.Payload), len(m.FDs))
}

// short returns an ErrMalformed error when p is shorter than want.
func short(what string, p []byte, want int) error {
	if len(p) < want {
		return fmt.Errorf("%w: %s payload of %d bytes, want %d", ErrMalformed, what, len(p), want)
	}
	return nil
}

// encodeFixed returns the wire bytes of v, a fixed structure (see the
// package doc).
func encodeFixed(v any) []byte {
	b, err := binary.Append(nil, binary.LittleEndian, v)
	if err != nil {
		panic(fmt.Sprintf("proto: %T is not a fixed structure: %v", v, err))
	}
	return b
}

// decodeFixed reads v, a pointer to a fixed structure, from the start of
// p, which must hold all of it.
func decodeFixed(what string, p []byte, v any) error {
	if err := short(what, p, binary.Size(v)); err != nil {
		return err
	}
	if _, err := binary.Decode(p, binary.LittleEndian, v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
	}
	return nil
}

// EncodeU64 is the payload of a u64 message (features, a vring index with
// VringNoFDMask, a REPLY_ACK status).
func EncodeU64(v uint64) []byte {
	return binary.LittleEndian.AppendUint64(make([]byte, 0, U64Size), v)
}

// DecodeU64 reads a u64 payload.
func DecodeU64(p []byte) (uint64, error) {
	if err := short("u64", p, U64Size); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

// VringState is struct vhost_vring_state (SET_VRING_NUM, SET/GET_VRING_BASE,
// SET_VRING_ENABLE):
//
//	0 u32 index
//	4 u32 num
type VringState struct {
	Index uint32
	Num   uint32
}

// Encode returns the payload.
func (s VringState) Encode() []byte { return encodeFixed(s) }

// DecodeVringState reads a vring state payload.
func DecodeVringState(p []byte) (s VringState, err error) {
	err = decodeFixed("vring state", p, &s)
	return s, err
}

// VringAddr is struct vhost_vring_addr (SET_VRING_ADDR); the addresses
// are the frontend's user addresses (translated through the memory
// table's UserAddr), not guest physical ones:
//
//	0  u32 index
//	4  u32 flags (VringAddrFLog)
//	8  u64 desc_user_addr
//	16 u64 used_user_addr
//	24 u64 avail_user_addr
//	32 u64 log_guest_addr
type VringAddr struct {
	Index uint32
	Flags uint32
	Desc  uint64
	Used  uint64
	Avail uint64
	Log   uint64
}

// Encode returns the payload.
func (a VringAddr) Encode() []byte { return encodeFixed(a) }

// DecodeVringAddr reads a vring address payload.
func DecodeVringAddr(p []byte) (a VringAddr, err error) {
	err = decodeFixed("vring addr", p, &a)
	return a, err
}

// MemRegion is VhostUserMemoryRegion, one region of guest memory; its fd
// travels beside the message and is mapped from MmapOffset for Size
// bytes:
//
//	0  u64 guest_phys_addr
//	8  u64 memory_size
//	16 u64 userspace_addr (the frontend's address, used by SET_VRING_ADDR)
//	24 u64 mmap_offset
type MemRegion struct {
	GuestAddr  uint64
	Size       uint64
	UserAddr   uint64
	MmapOffset uint64
}

// EncodeMemTable is the payload of SET_MEM_TABLE (VhostUserMemory): u32
// nregions, u32 padding, then the regions; one fd per region goes with it,
// in order. As QEMU does, only the regions present are sent.
func EncodeMemTable(regions []MemRegion) ([]byte, error) {
	if len(regions) == 0 || len(regions) > MaxMemRegions {
		return nil, fmt.Errorf("%w: memory table of %d regions (1 to %d)", ErrMalformed, len(regions), MaxMemRegions)
	}
	b := make([]byte, memTableHdrSize, memTableHdrSize+MemRegionSize*len(regions))
	binary.LittleEndian.PutUint32(b[0:], uint32(len(regions)))
	for _, r := range regions {
		b = append(b, encodeFixed(r)...)
	}
	return b, nil
}

// DecodeMemTable reads a SET_MEM_TABLE payload.
func DecodeMemTable(p []byte) ([]MemRegion, error) {
	if err := short("memory table", p, memTableHdrSize); err != nil {
		return nil, err
	}
	n := binary.LittleEndian.Uint32(p)
	if n == 0 || n > MaxMemRegions {
		return nil, fmt.Errorf("%w: memory table of %d regions (1 to %d)", ErrMalformed, n, MaxMemRegions)
	}
	if err := short("memory table", p, memTableHdrSize+MemRegionSize*int(n)); err != nil {
		return nil, err
	}
	regions := make([]MemRegion, n)
	for i := range regions {
		if err := decodeFixed("memory region", p[memTableHdrSize+MemRegionSize*i:], &regions[i]); err != nil {
			return nil, err
		}
	}
	return regions, nil
}

// EncodeMemRegMsg is the payload of ADD_MEM_REG and REM_MEM_REG
// (VhostUserMemRegMsg): u64 padding, then one region.
func EncodeMemRegMsg(r MemRegion) []byte {
	return append(make([]byte, MemRegMsgSize-MemRegionSize), encodeFixed(r)...)
}

// DecodeMemRegMsg reads an ADD_MEM_REG or REM_MEM_REG payload.
func DecodeMemRegMsg(p []byte) (r MemRegion, err error) {
	if err := short("memory region", p, MemRegMsgSize); err != nil {
		return MemRegion{}, err
	}
	err = decodeFixed("memory region", p[MemRegMsgSize-MemRegionSize:], &r)
	return r, err
}

// Log is VhostUserLog (SET_LOG_BASE): u64 mmap_size, u64 mmap_offset.
type Log struct {
	MmapSize   uint64
	MmapOffset uint64
}

// Encode returns the payload.
func (l Log) Encode() []byte { return encodeFixed(l) }

// DecodeLog reads a SET_LOG_BASE payload.
func DecodeLog(p []byte) (l Log, err error) {
	err = decodeFixed("log", p, &l)
	return l, err
}

// Config is VhostUserConfig (GET_CONFIG, SET_CONFIG and their replies):
//
//	0  u32 offset (into the device's config space)
//	4  u32 size (bytes of Data, at most MaxConfigSize)
//	8  u32 flags (ConfigTypeFrontend, ConfigTypeMigration)
//	12 u8  region[size]
//
// A GET_CONFIG request carries size zeroed bytes; the reply fills them.
type Config struct {
	Offset uint32
	Flags  uint32
	Data   []byte
}

// configHdr is Config's fixed part on the wire.
type configHdr struct {
	Offset uint32
	Size   uint32
	Flags  uint32
}

// Encode returns the payload.
func (c Config) Encode() ([]byte, error) {
	if len(c.Data) > MaxConfigSize {
		return nil, fmt.Errorf("%w: config of %d bytes (most %d)", ErrMalformed, len(c.Data), MaxConfigSize)
	}
	return append(encodeFixed(configHdr{Offset: c.Offset, Size: uint32(len(c.Data)), Flags: c.Flags}), c.Data...), nil
}

// DecodeConfig reads a config payload; Data aliases p.
func DecodeConfig(p []byte) (Config, error) {
	var h configHdr
	if err := decodeFixed("config", p, &h); err != nil {
		return Config{}, err
	}
	if h.Size > MaxConfigSize {
		return Config{}, fmt.Errorf("%w: config of %d bytes (most %d)", ErrMalformed, h.Size, MaxConfigSize)
	}
	if err := short("config", p, ConfigHdrSize+int(h.Size)); err != nil {
		return Config{}, err
	}
	return Config{Offset: h.Offset, Flags: h.Flags, Data: p[ConfigHdrSize : ConfigHdrSize+int(h.Size)]}, nil
}

// VringArea is VhostUserVringArea (the backend's
// VRING_HOST_NOTIFIER_MSG): u64 u64 (index and VringNoFDMask), u64 size,
// u64 offset.
type VringArea struct {
	U64    uint64
	Size   uint64
	Offset uint64
}

// Encode returns the payload.
func (a VringArea) Encode() []byte { return encodeFixed(a) }

// DecodeVringArea reads a vring area payload.
func DecodeVringArea(p []byte) (a VringArea, err error) {
	err = decodeFixed("vring area", p, &a)
	return a, err
}

// Inflight is VhostUserInflight (GET_INFLIGHT_FD request and reply,
// SET_INFLIGHT_FD); the region's fd goes with the reply and with
// SET_INFLIGHT_FD:
//
//	0  u64 mmap_size
//	8  u64 mmap_offset
//	16 u16 num_queues
//	18 u16 queue_size
//	20 u8[4] padding (QEMU sends the C struct's 24 bytes)
type Inflight struct {
	MmapSize   uint64
	MmapOffset uint64
	NumQueues  uint16
	QueueSize  uint16
	_          [InflightSize - inflightMinSize]byte
}

// Encode returns the payload, InflightSize bytes.
func (f Inflight) Encode() []byte { return encodeFixed(f) }

// DecodeInflight reads an inflight payload; the padding may be absent.
func DecodeInflight(p []byte) (f Inflight, err error) {
	if err := short("inflight", p, inflightMinSize); err != nil {
		return Inflight{}, err
	}
	var full [InflightSize]byte
	copy(full[:], p)
	err = decodeFixed("inflight", full[:], &f)
	return f, err
}

// encodeHeader writes a message header into b (HeaderSize bytes).
func encodeHeader(b []byte, request, flags uint32, size int) {
	binary.LittleEndian.PutUint32(b[0:], request)
	binary.LittleEndian.PutUint32(b[4:], flags)
	binary.LittleEndian.PutUint32(b[8:], uint32(size))
}

// decodeHeader reads and checks a message header: version 1, payload at
// most MaxPayload.
func decodeHeader(b []byte) (request, flags uint32, size int, err error) {
	request = binary.LittleEndian.Uint32(b[0:])
	flags = binary.LittleEndian.Uint32(b[4:])
	sz := binary.LittleEndian.Uint32(b[8:])
	if flags&FlagVersionMask != Version {
		return 0, 0, 0, fmt.Errorf("%w: %v: version %d, want %d", ErrMalformed, Request(request), flags&FlagVersionMask, Version)
	}
	if sz > MaxPayload {
		return 0, 0, 0, fmt.Errorf("%w: %v: payload of %d bytes (most %d)", ErrMalformed, Request(request), sz, MaxPayload)
	}
	return request, flags, int(sz), nil
}
