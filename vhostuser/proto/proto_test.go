package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"golang.org/x/sys/unix"
)

// openFDs counts this process's open descriptors.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestPayloadRoundTrips(t *testing.T) {
	u, err := DecodeU64(EncodeU64(0x0102030405060708))
	if err != nil || u != 0x0102030405060708 {
		t.Fatalf("u64: %#x %v", u, err)
	}
	st := VringState{Index: 3, Num: 256}
	if got, err := DecodeVringState(st.Encode()); err != nil || got != st {
		t.Fatalf("vring state: %+v %v", got, err)
	}
	addr := VringAddr{Index: 1, Flags: VringAddrFLog, Desc: 0x1000, Used: 0x3000, Avail: 0x2000, Log: 0x4000}
	if got, err := DecodeVringAddr(addr.Encode()); err != nil || got != addr {
		t.Fatalf("vring addr: %+v %v", got, err)
	}
	regions := []MemRegion{{GuestAddr: 0, Size: 1 << 20, UserAddr: 0x7f0000000000, MmapOffset: 0}, {GuestAddr: 1 << 32, Size: 4096, UserAddr: 5, MmapOffset: 4096}}
	p, err := EncodeMemTable(regions)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 8+2*32 {
		t.Fatalf("memory table of 2 regions is %d bytes", len(p))
	}
	if got, err := DecodeMemTable(p); err != nil || !reflect.DeepEqual(got, regions) {
		t.Fatalf("memory table: %+v %v", got, err)
	}
	if got, err := DecodeMemRegMsg(EncodeMemRegMsg(regions[1])); err != nil || got != regions[1] {
		t.Fatalf("mem reg: %+v %v", got, err)
	}
	lg := Log{MmapSize: 9, MmapOffset: 10}
	if got, err := DecodeLog(lg.Encode()); err != nil || got != lg {
		t.Fatalf("log: %+v %v", got, err)
	}
	cfg := Config{Offset: 4, Flags: ConfigTypeMigration, Data: []byte{1, 2, 3}}
	p, err = cfg.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := DecodeConfig(p); err != nil || !reflect.DeepEqual(got, cfg) {
		t.Fatalf("config: %+v %v", got, err)
	}
	area := VringArea{U64: 2 | VringNoFDMask, Size: 4096, Offset: 8192}
	if got, err := DecodeVringArea(area.Encode()); err != nil || got != area {
		t.Fatalf("vring area: %+v %v", got, err)
	}
	inf := Inflight{MmapSize: 1 << 16, MmapOffset: 0, NumQueues: 2, QueueSize: 128}
	p = inf.Encode()
	if len(p) != InflightSize {
		t.Fatalf("inflight is %d bytes", len(p))
	}
	if got, err := DecodeInflight(p); err != nil || got != inf {
		t.Fatalf("inflight: %+v %v", got, err)
	}
	if got, err := DecodeInflight(p[:20]); err != nil || got != inf {
		t.Fatalf("inflight without padding: %+v %v", got, err)
	}
	d := Desc{Addr: 0x1234, Len: 512, Flags: DescFNext | DescFWrite, Next: 7}
	var db [DescSize]byte
	d.Put(db[:])
	if got, err := DecodeDesc(db[:]); err != nil || got != d {
		t.Fatalf("desc: %+v %v", got, err)
	}
	h := BlkOutHdr{Type: BlkTOut, IOPrio: 1, Sector: 99}
	var hb [BlkOutHdrSize]byte
	h.Put(hb[:])
	if got, err := DecodeBlkOutHdr(hb[:]); err != nil || got != h {
		t.Fatalf("blk header: %+v %v", got, err)
	}
	s := BlkSeg{Sector: 8, NumSectors: 16, Flags: BlkSegFlagUnmap}
	var sb [BlkSegSize]byte
	s.Put(sb[:])
	if got, err := DecodeBlkSeg(sb[:]); err != nil || got != s {
		t.Fatalf("blk seg: %+v %v", got, err)
	}
}

// TestLayouts pins the byte offsets of the format against literal values,
// so a struct copied wrongly cannot pass its own round trip.
func TestLayouts(t *testing.T) {
	// Each fixed structure's declaration is its layout: its size must be
	// the format's.
	for _, c := range []struct {
		v    any
		want int
	}{
		{VringState{}, VringStateSize}, {VringAddr{}, VringAddrSize}, {MemRegion{}, MemRegionSize},
		{Log{}, LogSize}, {configHdr{}, ConfigHdrSize}, {VringArea{}, VringAreaSize},
		{Inflight{}, InflightSize}, {BlkSeg{}, BlkSegSize}, {BlkConfig{}, BlkConfigSize},
	} {
		if got := binary.Size(c.v); got != c.want {
			t.Errorf("%T is %d bytes on the wire, want %d", c.v, got, c.want)
		}
	}
	seg := BlkSeg{Sector: 0x11, NumSectors: 0x22, Flags: 0x33}
	var sb [BlkSegSize]byte
	seg.Put(sb[:])
	for off, want := range map[int]byte{0: 0x11, 8: 0x22, 12: 0x33} {
		if sb[off] != want {
			t.Errorf("blk seg byte %d = %#x, want %#x", off, sb[off], want)
		}
	}
	inf := Inflight{MmapSize: 0x11, MmapOffset: 0x22, NumQueues: 0x33, QueueSize: 0x44}.Encode()
	for off, want := range map[int]byte{0: 0x11, 8: 0x22, 16: 0x33, 18: 0x44} {
		if inf[off] != want {
			t.Errorf("inflight byte %d = %#x, want %#x", off, inf[off], want)
		}
	}
	addr := VringAddr{Index: 0x11, Flags: 0x22, Desc: 0x33, Used: 0x44, Avail: 0x55, Log: 0x66}.Encode()
	for off, want := range map[int]byte{0: 0x11, 4: 0x22, 8: 0x33, 16: 0x44, 24: 0x55, 32: 0x66} {
		if addr[off] != want {
			t.Errorf("vring addr byte %d = %#x, want %#x", off, addr[off], want)
		}
	}
	c := BlkConfig{Capacity: 1, SizeMax: 2, SegMax: 3, Cylinders: 4, Heads: 5, Sectors: 6, BlkSize: 7,
		PhysicalBlockExp: 8, AlignmentOffset: 9, MinIOSize: 10, OptIOSize: 11, WCE: 12, NumQueues: 13,
		MaxDiscardSectors: 14, MaxDiscardSeg: 15, DiscardSectorAlignment: 16, MaxWriteZeroesSectors: 17,
		MaxWriteZeroesSeg: 18, WriteZeroesMayUnmap: 19}
	b := c.Encode()
	for off, want := range map[int]byte{0: 1, 8: 2, 12: 3, 16: 4, 18: 5, 19: 6, 20: 7, 24: 8, 25: 9, 26: 10,
		28: 11, 32: 12, 34: 13, 36: 14, 40: 15, 44: 16, 48: 17, 52: 18, 56: 19} {
		if b[off] != want {
			t.Errorf("blk config byte %d = %d, want %d", off, b[off], want)
		}
	}
	if got := DecodeBlkConfig(b); got != c {
		t.Errorf("blk config round trip: %+v", got)
	}
	// A short read (QEMU without DISCARD/WRITE_ZEROES reads 36 bytes)
	// leaves the later fields zero.
	if got := DecodeBlkConfig(b[:36]); got.NumQueues != 13 || got.MaxDiscardSectors != 0 {
		t.Errorf("short blk config: %+v", got)
	}
	if AvailRingSize(256) != 4+512+2 || UsedRingSize(256) != 4+2048+2 || DescTableSize(256) != 4096 {
		t.Error("ring sizes")
	}
	if InflightQueueSize(128) != 2112 || InflightQueueSize(128) < InflightHeaderSize+InflightDescSize*128 {
		t.Errorf("inflight queue size %d", InflightQueueSize(128))
	}
	for _, n := range []int{1, 2, 256, 32768} {
		if !ValidQueueSize(n) {
			t.Errorf("queue size %d refused", n)
		}
	}
	for _, n := range []int{0, 3, 65536, -4} {
		if ValidQueueSize(n) {
			t.Errorf("queue size %d accepted", n)
		}
	}
}

func TestNeedEvent(t *testing.T) {
	for _, tc := range []struct {
		event, new, old uint16
		want            bool
	}{
		{event: 5, new: 6, old: 5, want: true},
		{event: 5, new: 5, old: 4, want: false},
		{event: 5, new: 10, old: 0, want: true},
		{event: 10, new: 5, old: 0, want: false},
		{event: 0xffff, new: 1, old: 0xfffe, want: true},
	} {
		if got := NeedEvent(tc.event, tc.new, tc.old); got != tc.want {
			t.Errorf("NeedEvent(%d, %d, %d) = %v", tc.event, tc.new, tc.old, got)
		}
	}
}

func TestDecodeShort(t *testing.T) {
	checks := map[string]func([]byte) error{
		"u64":      func(p []byte) error { _, err := DecodeU64(p); return err },
		"state":    func(p []byte) error { _, err := DecodeVringState(p); return err },
		"addr":     func(p []byte) error { _, err := DecodeVringAddr(p); return err },
		"memtable": func(p []byte) error { _, err := DecodeMemTable(p); return err },
		"memreg":   func(p []byte) error { _, err := DecodeMemRegMsg(p); return err },
		"log":      func(p []byte) error { _, err := DecodeLog(p); return err },
		"config":   func(p []byte) error { _, err := DecodeConfig(p); return err },
		"area":     func(p []byte) error { _, err := DecodeVringArea(p); return err },
		"inflight": func(p []byte) error { _, err := DecodeInflight(p); return err },
		"desc":     func(p []byte) error { _, err := DecodeDesc(p); return err },
		"blkhdr":   func(p []byte) error { _, err := DecodeBlkOutHdr(p); return err },
		"blkseg":   func(p []byte) error { _, err := DecodeBlkSeg(p); return err },
	}
	for name, f := range checks {
		if err := f(make([]byte, 3)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s of 3 bytes: %v", name, err)
		}
	}
	// A memory table that claims more regions than it carries, or too many.
	p, _ := EncodeMemTable([]MemRegion{{Size: 1}})
	p[0] = 2
	if _, err := DecodeMemTable(p); !errors.Is(err, ErrMalformed) {
		t.Errorf("memory table claiming 2 regions: %v", err)
	}
	p[0] = MaxMemRegions + 1
	if _, err := DecodeMemTable(append(p, make([]byte, 32*MaxMemRegions)...)); !errors.Is(err, ErrMalformed) {
		t.Errorf("memory table of 9 regions: %v", err)
	}
	if _, err := EncodeMemTable(nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty memory table: %v", err)
	}
	cfg, _ := Config{Data: make([]byte, 8)}.Encode()
	if _, err := DecodeConfig(cfg[:15]); !errors.Is(err, ErrMalformed) {
		t.Errorf("config shorter than its size: %v", err)
	}
	cfg[5] = 2 // size 520
	if _, err := DecodeConfig(cfg); !errors.Is(err, ErrMalformed) {
		t.Errorf("config over 256 bytes: %v", err)
	}
	if _, err := (Config{Data: make([]byte, 257)}).Encode(); !errors.Is(err, ErrMalformed) {
		t.Errorf("encode config over 256 bytes: %v", err)
	}
}

func TestMessageWithFDs(t *testing.T) {
	a, b := testutil.SocketPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	before := openFDs(t)
	p, _ := EncodeMemTable([]MemRegion{{Size: 4096}})
	sent := Message{Request: uint32(SetMemTable), Flags: Version | FlagNeedReply, Payload: p, FDs: []int{int(w.Fd())}}
	if err := WriteMessage(a, sent); err != nil {
		t.Fatal(err)
	}
	got, err := ReadMessage(b)
	if err != nil {
		t.Fatal(err)
	}
	if got.Request != sent.Request || got.Flags != sent.Flags || !bytes.Equal(got.Payload, p) || len(got.FDs) != 1 || !got.NeedReply() || got.IsReply() {
		t.Fatalf("got %v, sent %v", got, sent)
	}
	// The received descriptor is the pipe's write end.
	if _, err := unix.Write(got.FDs[0], []byte("x")); err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	if _, err := r.Read(one[:]); err != nil || one[0] != 'x' {
		t.Fatalf("read through passed fd: %v %q", err, one)
	}
	unix.Close(got.FDs[0])
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open before, %d after", before, after)
	}

	// A message with no payload and no fds; then a clean end of stream.
	if err := WriteMessage(a, Message{Request: uint32(GetFeatures)}); err != nil {
		t.Fatal(err)
	}
	got, err = ReadMessage(b)
	if err != nil || got.Request != uint32(GetFeatures) || got.Flags != Version || len(got.Payload) != 0 {
		t.Fatalf("GET_FEATURES: %v %v", got, err)
	}
	a.CloseWrite()
	if _, err := ReadMessage(b); err != io.EOF {
		t.Fatalf("end of stream: %v", err)
	}
}

// rawSend writes bytes and descriptors as one sendmsg, bypassing
// WriteMessage's checks.
func rawSend(t *testing.T, c *net.UnixConn, b []byte, fds []int) {
	t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.WriteMsgUnix(b, oob, nil); err != nil {
		t.Fatal(err)
	}
}

func header(request, flags, size uint32) []byte {
	b := make([]byte, HeaderSize)
	encodeHeader(b, request, flags, int(size))
	return b
}

func TestReadMalformed(t *testing.T) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	nine := make([]int, MaxFDs+1)
	for i := range nine {
		nine[i] = int(devnull.Fd())
	}
	for _, tc := range []struct {
		name  string
		bytes []byte
		fds   []int
		want  error
	}{
		{name: "version 0", bytes: header(1, 0, 0), want: ErrMalformed},
		{name: "version 2", bytes: header(1, 2, 0), want: ErrMalformed},
		{name: "payload over bound", bytes: header(5, Version, MaxPayload+1), want: ErrMalformed},
		{name: "payload size 4 GiB", bytes: header(5, Version, 0xffffffff), want: ErrMalformed},
		{name: "short header", bytes: header(1, Version, 0)[:7], want: io.ErrUnexpectedEOF},
		{name: "short payload", bytes: append(header(1, Version, 8), 1, 2, 3), want: io.ErrUnexpectedEOF},
		{name: "short payload with fd", bytes: append(header(5, Version, 40), 1), fds: nine[:1], want: io.ErrUnexpectedEOF},
		{name: "too many fds", bytes: header(5, Version, 0), fds: nine, want: ErrMalformed},
		{name: "bad version with fds", bytes: header(5, 0, 0), fds: nine[:3], want: ErrMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := testutil.SocketPair(t)
			before := openFDs(t)
			rawSend(t, a, tc.bytes, tc.fds)
			a.CloseWrite()
			_, err := ReadMessage(b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if after := openFDs(t); after != before {
				t.Errorf("%d descriptors open before, %d after: received ones leaked", before, after)
			}
		})
	}
}

func TestWriteRefuses(t *testing.T) {
	a, _ := testutil.SocketPair(t)
	if err := WriteMessage(a, Message{Request: 1, Payload: make([]byte, MaxPayload+1)}); !errors.Is(err, ErrMalformed) {
		t.Errorf("payload over bound: %v", err)
	}
	if err := WriteMessage(a, Message{Request: 1, FDs: make([]int, MaxFDs+1)}); !errors.Is(err, ErrMalformed) {
		t.Errorf("too many fds: %v", err)
	}
}

func TestRequestString(t *testing.T) {
	if SetMemTable.String() != "SET_MEM_TABLE" || Request(99).String() != "REQUEST_99" {
		t.Errorf("%v %v", SetMemTable, Request(99))
	}
}
