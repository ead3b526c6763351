package virtq

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// testMem is guest memory for tests: one region of a Go byte slice at
// guest address base (user address base+userDelta), with the ring at
// its start and buffers after it.
const (
	base      = 0x10000
	userDelta = 0x7f0000000000
	ringSize  = 8
	descAt    = base
	availAt   = base + 16*ringSize
	usedAt    = base + 0x1000
	dataAt    = base + 0x2000
	memSize   = 0x10000
)

type driver struct {
	t     testing.TB
	mem   []byte
	m     *Memory
	avail uint16
}

func newDriver(t testing.TB) *driver {
	d := &driver{t: t, mem: make([]byte, memSize)}
	m, err := NewMemory([]Region{{GuestAddr: base, UserAddr: base + userDelta, Data: d.mem}})
	if err != nil {
		t.Fatal(err)
	}
	d.m = m
	return d
}

func (d *driver) ring(o Options) *Ring {
	d.t.Helper()
	r, err := NewRing(d.m, Addrs{Size: ringSize, Desc: descAt + userDelta, Avail: availAt + userDelta, Used: usedAt + userDelta, User: true}, o)
	if err != nil {
		d.t.Fatal(err)
	}
	return r
}

func (d *driver) at(addr uint64) []byte { return d.mem[addr-base:] }

// desc writes descriptor i of the table at table.
func (d *driver) desc(table uint64, i int, addr uint64, n uint32, flags, next uint16) {
	b := d.at(table + uint64(16*i))
	binary.LittleEndian.PutUint64(b, addr)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
}

// offer makes head available.
func (d *driver) offer(head uint16) {
	binary.LittleEndian.PutUint16(d.at(availAt+4+2*uint64(d.avail%ringSize)), head)
	d.avail++
	binary.LittleEndian.PutUint16(d.at(availAt+2), d.avail)
}

func (d *driver) used(i uint16) (id, n uint32) {
	b := d.at(usedAt + 4 + 8*uint64(i%ringSize))
	return binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:])
}

func (d *driver) usedIdx() uint16 { return binary.LittleEndian.Uint16(d.at(usedAt + 2)) }

func TestMemoryTranslate(t *testing.T) {
	d := newDriver(t)
	for _, c := range []struct {
		addr, n uint64
		ok      bool
	}{
		{base, memSize, true}, {base - 1, 1, false}, {base + memSize - 1, 1, true}, {base + memSize - 1, 2, false},
		{base + memSize, 0, true}, {base + memSize, 1, false}, {base + 10, 1 << 63, false}, {^uint64(0), 2, false},
	} {
		b, ok := d.m.Guest(c.addr, c.n)
		if ok != c.ok || ok && uint64(len(b)) != c.n {
			t.Errorf("Guest(%#x, %d) = %d bytes, %v; want %v", c.addr, c.n, len(b), ok, c.ok)
		}
		if _, ok := d.m.User(c.addr+userDelta, c.n); ok != c.ok {
			t.Errorf("User(%#x, %d) = %v; want %v", c.addr+userDelta, c.n, ok, c.ok)
		}
	}
	_, err := NewMemory([]Region{{GuestAddr: 0, Data: make([]byte, 8192)}, {GuestAddr: 4096, UserAddr: 1 << 20, Data: make([]byte, 4096)}})
	if !errors.Is(err, ErrBadMemory) {
		t.Errorf("overlapping regions: %v", err)
	}
}

func TestPopPush(t *testing.T) {
	d := newDriver(t)
	r := d.ring(Options{})
	if ok, err := r.Pop(&Chain{}); ok || err != nil {
		t.Fatalf("empty ring: %v %v", ok, err)
	}
	// A virtio-blk shaped chain: header, data, status, not in table order.
	d.desc(descAt, 3, dataAt, 16, proto.DescFNext, 5)
	d.desc(descAt, 5, dataAt+4096, 4096, proto.DescFNext|proto.DescFWrite, 0)
	d.desc(descAt, 0, dataAt+16, 1, proto.DescFWrite, 0)
	d.offer(3)
	var c Chain
	ok, err := r.Pop(&c)
	if !ok || err != nil || c.Head != 3 || len(c.Bufs) != 3 || c.NumRead != 1 || c.ReadLen != 16 || c.WriteLen != 4097 {
		t.Fatalf("Pop = %v %v: %+v", ok, err, c)
	}
	c.Bufs[1].Data[0] = 0xab
	if d.at(dataAt + 4096)[0] != 0xab {
		t.Fatal("buffer is not the guest's memory")
	}
	r.Push(c.Head, 4097)
	if id, n := d.used(0); d.usedIdx() != 1 || id != 3 || n != 4097 {
		t.Fatalf("used: idx %d, %d %d", d.usedIdx(), id, n)
	}
	if !r.NeedSignal() {
		t.Fatal("no signal without NO_INTERRUPT")
	}
	binary.LittleEndian.PutUint16(d.at(availAt), proto.AvailFNoInterrupt)
	if r.NeedSignal() {
		t.Fatal("signal despite NO_INTERRUPT")
	}
	if r.EnableNotify() {
		t.Fatal("more available on an empty ring")
	}
	d.offer(0)
	if !r.EnableNotify() {
		t.Fatal("new entry not seen")
	}
}

func TestIndirect(t *testing.T) {
	d := newDriver(t)
	table := uint64(dataAt + 0x8000)
	d.desc(table, 0, dataAt, 16, proto.DescFNext, 1)
	d.desc(table, 1, dataAt+512, 512, proto.DescFNext, 2)
	d.desc(table, 2, dataAt+1024, 1, proto.DescFWrite, 0)
	d.desc(descAt, 2, table, 3*16, proto.DescFIndirect, 0)
	d.offer(2)
	var c Chain
	if _, err := d.ring(Options{}).Pop(&c); !errors.Is(err, ErrBadChain) {
		t.Fatalf("indirect without the feature: %v", err)
	}
	d.offer(2)
	r := d.ring(Options{Indirect: true})
	if ok, err := r.Pop(&c); !ok || err != nil || len(c.Bufs) != 3 || c.ReadLen != 528 || c.WriteLen != 1 {
		t.Fatalf("Pop = %v %v: %+v", ok, err, c)
	}
}

func TestBadChains(t *testing.T) {
	table := uint64(dataAt + 0x8000)
	for _, c := range []struct {
		name  string
		setup func(d *driver)
	}{
		{"outside", func(d *driver) { d.desc(descAt, 0, base+memSize-8, 16, 0, 0) }},
		{"below", func(d *driver) { d.desc(descAt, 0, 0, 16, 0, 0) }},
		{"wraps", func(d *driver) { d.desc(descAt, 0, ^uint64(0)-4, 16, 0, 0) }},
		{"loop", func(d *driver) {
			d.desc(descAt, 0, dataAt, 16, proto.DescFNext, 1)
			d.desc(descAt, 1, dataAt+16, 16, proto.DescFNext, 0)
		}},
		{"self loop", func(d *driver) { d.desc(descAt, 0, dataAt, 16, proto.DescFNext, 0) }},
		{"next past table", func(d *driver) { d.desc(descAt, 0, dataAt, 16, proto.DescFNext, ringSize) }},
		{"read after write", func(d *driver) {
			d.desc(descAt, 0, dataAt, 16, proto.DescFNext|proto.DescFWrite, 1)
			d.desc(descAt, 1, dataAt+16, 16, 0, 0)
		}},
		{"overlap", func(d *driver) {
			d.desc(descAt, 0, dataAt, 16, proto.DescFNext, 1)
			d.desc(descAt, 1, dataAt+8, 16, proto.DescFWrite, 0)
		}},
		{"overlaps the ring", func(d *driver) {
			// Allowed: the device does not police where buffers point
			// inside shared memory, only that they are inside it.
		}},
		{"indirect with next", func(d *driver) {
			d.desc(descAt, 0, table, 16, proto.DescFIndirect|proto.DescFNext, 1)
			d.desc(table, 0, dataAt, 16, 0, 0)
		}},
		{"nested indirect", func(d *driver) {
			d.desc(descAt, 0, table, 16, proto.DescFIndirect, 0)
			d.desc(table, 0, table, 16, proto.DescFIndirect, 0)
		}},
		{"indirect odd size", func(d *driver) { d.desc(descAt, 0, table, 15, proto.DescFIndirect, 0) }},
		{"indirect empty", func(d *driver) { d.desc(descAt, 0, table, 0, proto.DescFIndirect, 0) }},
		{"indirect outside", func(d *driver) { d.desc(descAt, 0, base+memSize-16, 32, proto.DescFIndirect, 0) }},
		{"indirect loop", func(d *driver) {
			d.desc(descAt, 0, table, 32, proto.DescFIndirect, 0)
			d.desc(table, 0, dataAt, 16, proto.DescFNext, 1)
			d.desc(table, 1, dataAt+16, 16, proto.DescFNext, 0)
		}},
		{"too long", func(d *driver) { d.desc(descAt, 0, dataAt, 0x8000, 0, 0) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDriver(t)
			d.desc(descAt, 0, dataAt, 16, 0, 0)
			c.setup(d)
			d.offer(0)
			r := d.ring(Options{Indirect: true, MaxBytes: 0x4000})
			var ch Chain
			ok, err := r.Pop(&ch)
			if c.name == "overlaps the ring" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !ok || !errors.Is(err, ErrBadChain) || ch.Head != 0 {
				t.Fatalf("Pop = %v, %v, head %d; want ErrBadChain on head 0", ok, err, ch.Head)
			}
			r.Push(ch.Head, 0)
			if d.usedIdx() != 1 {
				t.Fatal("bad chain not returned")
			}
		})
	}
}

func TestBadRing(t *testing.T) {
	d := newDriver(t)
	for _, a := range []Addrs{
		{Size: 0, Desc: descAt, Avail: availAt, Used: usedAt},
		{Size: 6, Desc: descAt, Avail: availAt, Used: usedAt},
		{Size: ringSize, Desc: base + memSize - 16, Avail: availAt, Used: usedAt},
		{Size: ringSize, Desc: descAt, Avail: availAt, Used: usedAt + 2},
		{Size: ringSize, Desc: descAt + userDelta, Avail: availAt, Used: usedAt},
	} {
		if _, err := NewRing(d.m, a, Options{}); !errors.Is(err, ErrBadRing) {
			t.Errorf("%+v: %v", a, err)
		}
	}
	r := d.ring(Options{})
	binary.LittleEndian.PutUint16(d.at(availAt+2), ringSize+1)
	if _, err := r.Pop(&Chain{}); !errors.Is(err, ErrBadRing) {
		t.Errorf("avail index past the ring: %v", err)
	}
	d.offer(ringSize) // head past the ring
	binary.LittleEndian.PutUint16(d.at(availAt+2), 1)
	var c Chain
	if ok, err := r.Pop(&c); !ok || !errors.Is(err, ErrBadChain) {
		t.Errorf("head past the ring: %v %v", ok, err)
	}
}

func TestEventIdx(t *testing.T) {
	d := newDriver(t)
	r := d.ring(Options{EventIdx: true})
	for i := range uint16(4) {
		d.desc(descAt, int(i), dataAt+uint64(i)*16, 16, 0, 0)
		d.offer(i)
	}
	var c Chain
	usedEvent := d.at(availAt + 4 + 2*ringSize)
	binary.LittleEndian.PutUint16(usedEvent, 2) // interrupt once used passes 2
	var signals []uint16
	for i := range uint16(4) {
		if ok, err := r.Pop(&c); !ok || err != nil {
			t.Fatal(ok, err)
		}
		r.Push(c.Head, 0)
		if r.NeedSignal() {
			signals = append(signals, i)
		}
	}
	// The first check always signals; then only the push taking used
	// past used_event (index 3, the fourth).
	if len(signals) != 2 || signals[0] != 0 || signals[1] != 2 {
		t.Fatalf("signals after pushes %v", signals)
	}
	if r.EnableNotify() {
		t.Fatal("more available")
	}
	if got := binary.LittleEndian.Uint16(d.at(usedAt + 4 + 8*ringSize)); got != 4 {
		t.Fatalf("avail_event %d, want 4", got)
	}
}

// A backend that dies with heads taken: a new ring over the same memory
// and inflight record resubmits them, oldest first, and continues after.
func TestInflightResubmit(t *testing.T) {
	d := newDriver(t)
	region := make([]byte, InflightQueueSize(ringSize))
	in, err := NewInflight(region, ringSize)
	if err != nil {
		t.Fatal(err)
	}
	r := d.ring(Options{})
	if n, err := r.SetInflight(in); n != 0 || err != nil {
		t.Fatal(n, err)
	}
	for _, h := range []uint16{4, 1, 6, 2} {
		d.desc(descAt, int(h), dataAt+uint64(h)*16, 16, 0, 0)
		d.offer(h)
	}
	var c Chain
	for range 3 {
		if ok, err := r.Pop(&c); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	r.Push(1, 0) // 4 and 6 taken and not returned; 2 not taken
	// A push that reached the used ring but not the record: the next
	// backend must not resubmit it.
	r.Push(6, 0)
	binary.LittleEndian.PutUint16(region[inflightOffUsed:], 1)
	region[proto.InflightHeaderSize+proto.InflightDescSize*6] = 1
	in2, err := NewInflight(region, ringSize)
	if err != nil {
		t.Fatal(err)
	}
	r2 := d.ring(Options{})
	n, err := r2.SetInflight(in2)
	if n != 1 || err != nil {
		t.Fatalf("resubmit %d, %v; want 1", n, err)
	}
	var got []uint16
	for {
		ok, err := r2.Pop(&c)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			break
		}
		got = append(got, c.Head)
		r2.Push(c.Head, 0)
	}
	if len(got) != 2 || got[0] != 4 || got[1] != 2 {
		t.Fatalf("popped %v after restart, want [4 2]", got)
	}
	for h := range uint16(ringSize) {
		if in2.isInflight(h) {
			t.Errorf("head %d still in flight", h)
		}
	}
	if _, err := NewInflight(region[:10], ringSize); !errors.Is(err, ErrBadInflight) {
		t.Error(err)
	}
}
