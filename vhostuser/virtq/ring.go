package virtq

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync/atomic"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// MaxSize is the largest split ring (virtio 1.2: Queue Size ≤ 32768).
const MaxSize = proto.MaxQueueSize

// Options are what the device and the negotiated features allow.
type Options struct {
	EventIdx bool // VIRTIO_F_EVENT_IDX (RING_F_EVENT_IDX) was negotiated
	Indirect bool // VIRTIO_F_INDIRECT_DESC was negotiated
	// MaxBufs is the most buffers a chain may have after its indirect
	// table is expanded (0: the ring's size). MaxBytes the most bytes
	// (0: 1 GiB).
	MaxBufs  int
	MaxBytes uint64
}

// Addrs are a ring's size and addresses, as VHOST_USER_SET_VRING_NUM and
// SET_VRING_ADDR give them.
type Addrs struct {
	Size               uint16
	Desc, Avail, Used  uint64
	User               bool // the addresses are the frontend's, not guest-physical
	LogUsed            bool // VHOST_VRING_F_LOG (dirty logging: refused)
	LastAvail, UsedIdx uint16
}

// Buf is one buffer of a chain: a slice of the shared memory.
type Buf struct {
	Addr  uint64 // guest-physical address of Data
	Data  []byte
	Write bool // device-writable
}

// Chain is one descriptor chain as the device sees it. Its zero value is
// ready; it is reused from request to request, and its slices belong to
// it (Pop allocates only while they grow).
type Chain struct {
	Head uint16
	// Bufs holds the readable buffers, then the writable ones; empty
	// descriptors are left out.
	Bufs     []Buf
	NumRead  int    // how many of Bufs are readable
	ReadLen  uint64 // bytes of the readable buffers
	WriteLen uint64 // bytes of the writable buffers
	// LastWrite is the chain's last device-writable buffer inside the
	// memory table, even when a bad chain left it out of Bufs (where a
	// device answers a request it refuses), or nil.
	LastWrite []byte

	order []int // scratch for the overlap check
}

// Ring is the device side of one split virtqueue.
type Ring struct {
	mem               *Memory
	size              uint16
	desc, avail, used []byte
	o                 Options

	lastAvail uint16 // next avail entry to take
	usedIdx   uint16 // next used entry to fill
	// signalledUsed is the used index when NeedSignal last looked;
	// signalledValid says it has looked since the ring started.
	signalledUsed  uint16
	signalledValid bool
	usedFlags      uint16

	inflight *Inflight
	resubmit []uint16 // heads to take again before the avail ring, last first

	fence atomic.Uint32
}

// NewRing returns the ring at a in mem.
func NewRing(mem *Memory, a Addrs, o Options) (*Ring, error) {
	n := uint64(a.Size)
	if !proto.ValidQueueSize(int(n)) {
		return nil, fmt.Errorf("ring size %d: %w", n, ErrBadRing)
	}
	if a.LogUsed {
		return nil, fmt.Errorf("dirty logging of the used ring: %w", ErrBadRing)
	}
	tr := mem.Guest
	if a.User {
		tr = mem.User
	}
	r := &Ring{mem: mem, size: a.Size, o: o, lastAvail: a.LastAvail}
	var ok1, ok2, ok3 bool
	r.desc, ok1 = tr(a.Desc, proto.DescSize*n)
	r.avail, ok2 = tr(a.Avail, uint64(proto.AvailRingSize(int(a.Size))))
	r.used, ok3 = tr(a.Used, uint64(proto.UsedRingSize(int(a.Size))))
	if !ok1 || !ok2 || !ok3 {
		return nil, fmt.Errorf("ring of %d at desc %#x avail %#x used %#x outside the memory table: %w",
			n, a.Desc, a.Avail, a.Used, ErrBadRing)
	}
	if a.Avail%2 != 0 || a.Used%4 != 0 || a.Desc%16 != 0 {
		return nil, fmt.Errorf("ring at desc %#x avail %#x used %#x misaligned: %w", a.Desc, a.Avail, a.Used, ErrBadRing)
	}
	if r.o.MaxBufs <= 0 {
		r.o.MaxBufs = int(n)
	}
	if r.o.MaxBytes == 0 {
		r.o.MaxBytes = 1 << 30
	}
	// The used index the driver last saw (libvhost-user reads it at
	// SET_VRING_ADDR too): where a restarted backend continues.
	r.usedIdx = load16(r.used[2:])
	r.signalledUsed = r.usedIdx
	return r, nil
}

// Size is the ring's number of entries.
func (r *Ring) Size() uint16 { return r.size }

// LastAvail is the next available entry the device will take: what
// VHOST_USER_GET_VRING_BASE returns.
func (r *Ring) LastAvail() uint16 { return r.lastAvail }

// Pop takes the next chain: first one to resubmit (Inflight), else the
// next available. False when there is none. An error wrapping ErrBadRing
// breaks the ring (nothing was taken); one wrapping ErrBadChain means the
// head c.Head was taken but its chain is bad: c holds the good buffers
// walked (package doc), and the head must still be Pushed.
func (r *Ring) Pop(c *Chain) (bool, error) {
	if k := len(r.resubmit); k > 0 {
		c.Head = r.resubmit[k-1]
		r.resubmit = r.resubmit[:k-1]
		return true, r.walk(c)
	}
	avail := load16(r.avail[2:])
	if avail == r.lastAvail {
		return false, nil
	}
	if avail-r.lastAvail > r.size {
		return false, fmt.Errorf("avail index %d, %d taken, ring of %d: %w", avail, r.lastAvail, r.size, ErrBadRing)
	}
	i := uint64(r.lastAvail%r.size) * 2
	c.Head = binary.LittleEndian.Uint16(r.avail[4+i:])
	r.lastAvail++
	if c.Head >= r.size {
		c.Bufs, c.NumRead, c.ReadLen, c.WriteLen, c.LastWrite = c.Bufs[:0], 0, 0, 0, nil
		return true, fmt.Errorf("head %d of a ring of %d: %w", c.Head, r.size, ErrBadChain)
	}
	if r.inflight != nil {
		r.inflight.get(c.Head)
	}
	return true, r.walk(c)
}

// walk reads the chain at c.Head into c.
func (r *Ring) walk(c *Chain) error {
	c.Bufs, c.NumRead, c.ReadLen, c.WriteLen, c.LastWrite = c.Bufs[:0], 0, 0, 0, nil
	table := r.desc
	i := c.Head
	indirect := false
	var bad error // the first bad buffer
	for seen := 0; ; seen++ {
		if seen >= len(table)/proto.DescSize {
			return fmt.Errorf("head %d: a loop, or more descriptors than the table's %d: %w", c.Head, len(table)/proto.DescSize, ErrBadChain)
		}
		d := table[int(i)*proto.DescSize : int(i+1)*proto.DescSize]
		addr := binary.LittleEndian.Uint64(d)
		n := binary.LittleEndian.Uint32(d[8:])
		flags := binary.LittleEndian.Uint16(d[12:])
		next := binary.LittleEndian.Uint16(d[14:])
		if flags&proto.DescFIndirect != 0 {
			switch {
			case !r.o.Indirect:
				return fmt.Errorf("head %d: indirect descriptor not negotiated: %w", c.Head, ErrBadChain)
			case indirect || seen > 0 || flags&proto.DescFNext != 0:
				return fmt.Errorf("head %d: indirect descriptor not alone at the head: %w", c.Head, ErrBadChain)
			case n == 0 || n%proto.DescSize != 0 || n/proto.DescSize > MaxSize:
				return fmt.Errorf("head %d: indirect table of %d bytes: %w", c.Head, n, ErrBadChain)
			}
			t, ok := r.mem.Guest(addr, uint64(n))
			if !ok {
				return fmt.Errorf("head %d: indirect table of %d bytes at %#x outside the memory table: %w", c.Head, n, addr, ErrBadChain)
			}
			table, i, indirect, seen = t, 0, true, -1
			continue
		}
		if n > 0 {
			// A bad buffer does not end the walk: the rest of the
			// chain still gives the device the status byte to answer in.
			if err := r.add(c, addr, n, flags&proto.DescFWrite != 0); err != nil && bad == nil {
				bad = err
			}
		}
		if flags&proto.DescFNext == 0 {
			break
		}
		if int(next) >= len(table)/proto.DescSize {
			return fmt.Errorf("head %d: next %d past the table's %d: %w", c.Head, next, len(table)/proto.DescSize, ErrBadChain)
		}
		i = next
	}
	if bad != nil {
		return bad
	}
	return checkOverlap(c)
}

// add appends one descriptor's buffer to c.
func (r *Ring) add(c *Chain, addr uint64, n uint32, write bool) error {
	data, ok := r.mem.Guest(addr, uint64(n))
	if ok && write {
		c.LastWrite = data
	}
	if len(c.Bufs) >= r.o.MaxBufs {
		return fmt.Errorf("head %d: more than %d buffers: %w", c.Head, r.o.MaxBufs, ErrBadChain)
	}
	if c.ReadLen+c.WriteLen+uint64(n) > r.o.MaxBytes {
		return fmt.Errorf("head %d: more than %d bytes: %w", c.Head, r.o.MaxBytes, ErrBadChain)
	}
	if !write && c.NumRead < len(c.Bufs) {
		return fmt.Errorf("head %d: a readable buffer after a writable one: %w", c.Head, ErrBadChain)
	}
	if !ok {
		return fmt.Errorf("head %d: buffer of %d bytes at %#x outside the memory table: %w", c.Head, n, addr, ErrBadChain)
	}
	c.Bufs = append(c.Bufs, Buf{Addr: addr, Data: data, Write: write})
	if write {
		c.WriteLen += uint64(n)
	} else {
		c.NumRead++
		c.ReadLen += uint64(n)
	}
	return nil
}

// checkOverlap refuses a chain two of whose buffers share a byte. Chains
// are usually in address order already, which the insertion sort takes
// in one pass.
func checkOverlap(c *Chain) error {
	if len(c.Bufs) < 2 {
		return nil
	}
	c.order = c.order[:0]
	for i := range c.Bufs {
		c.order = append(c.order, i)
	}
	o, b := c.order, c.Bufs
	for i := 1; i < len(o); i++ {
		for j := i; j > 0 && b[o[j]].Addr < b[o[j-1]].Addr; j-- {
			o[j], o[j-1] = o[j-1], o[j]
		}
	}
	for i := 1; i < len(o); i++ {
		p, q := b[o[i-1]], b[o[i]]
		if p.Addr+uint64(len(p.Data)) > q.Addr {
			return fmt.Errorf("head %d: buffers at %#x (%d bytes) and %#x overlap: %w", c.Head, p.Addr, len(p.Data), q.Addr, ErrBadChain)
		}
	}
	return nil
}

// Push returns head to the driver on the used ring, with written the
// bytes the device wrote into its writable buffers.
func (r *Ring) Push(head uint16, written uint32) {
	e := r.used[4+uint64(r.usedIdx%r.size)*8:]
	binary.LittleEndian.PutUint32(e, uint32(head))
	binary.LittleEndian.PutUint32(e[4:], written)
	if r.inflight != nil {
		r.inflight.prePut(head)
	}
	r.usedIdx++
	store16(r.used[2:], r.usedIdx) // after the element: stores are ordered
	if r.inflight != nil {
		r.inflight.postPut(head, r.usedIdx)
	}
}

// NeedSignal says whether the driver wants an interrupt for what was
// pushed since the last call (VIRTIO_F_EVENT_IDX: whether the used index
// passed used_event; else unless the driver set NO_INTERRUPT).
func (r *Ring) NeedSignal() bool {
	r.fence.Add(1) // the used index stored before the driver's event is loaded
	if !r.o.EventIdx {
		return load16(r.avail)&proto.AvailFNoInterrupt == 0
	}
	old, valid := r.signalledUsed, r.signalledValid
	r.signalledUsed, r.signalledValid = r.usedIdx, true
	if !valid {
		return true
	}
	return proto.NeedEvent(load16(r.avail[proto.UsedEventOff(int(r.size)):]), r.usedIdx, old)
}

// EnableNotify asks the driver to kick for the next entry it makes
// available (avail_event, or clearing NO_NOTIFY) and says whether entries
// became available meanwhile, in which case the device must not sleep.
func (r *Ring) EnableNotify() bool {
	if r.o.EventIdx {
		store16(r.used[proto.AvailEventOff(int(r.size)):], r.lastAvail)
	} else if r.usedFlags&proto.UsedFNoNotify != 0 {
		r.usedFlags &^= proto.UsedFNoNotify
		store16(r.used, r.usedFlags)
	}
	r.fence.Add(1) // the store above before the avail index's load
	return len(r.resubmit) > 0 || load16(r.avail[2:]) != r.lastAvail
}

// DisableNotify tells the driver that kicks are not needed while the
// device is busy (without EVENT_IDX; with it, avail_event stays behind).
func (r *Ring) DisableNotify() {
	if !r.o.EventIdx && r.usedFlags&proto.UsedFNoNotify == 0 {
		r.usedFlags |= proto.UsedFNoNotify
		store16(r.used, r.usedFlags)
	}
}

// load16 and store16 access an index shared with the driver. Not inlined,
// so that the compiler neither keeps it in a register nor moves it.
//
//go:noinline
func load16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

//go:noinline
func store16(b []byte, v uint16) { binary.LittleEndian.PutUint16(b, v) }

// SetInflight attaches the queue's inflight record and takes from it the
// heads a previous backend took and never returned: Pop gives them first,
// oldest first, and the ring continues after them (libvhost-user's
// vu_check_queue_inflights). A fresh record (version 0) is initialised.
// It returns how many heads will be resubmitted.
func (r *Ring) SetInflight(in *Inflight) (int, error) {
	if in.Size() != r.size {
		return 0, fmt.Errorf("inflight region of %d descriptors for a ring of %d: %w", in.Size(), r.size, ErrBadInflight)
	}
	r.inflight = in
	if in.version() == 0 {
		in.init()
		return 0, nil
	}
	r.usedIdx = load16(r.used[2:])
	if in.usedIdx() != r.usedIdx {
		// The last push reached the used ring but not the record.
		in.setInflight(in.lastBatchHead(), false)
		r.fence.Add(1)
		in.setUsedIdx(r.usedIdx)
	}
	type taken struct {
		head    uint16
		counter uint64
	}
	var list []taken
	for h := range r.size {
		if in.isInflight(h) {
			list = append(list, taken{h, in.counterOf(h)})
		}
	}
	sort.Slice(list, func(i, j int) bool { return list[i].counter > list[j].counter })
	r.resubmit = r.resubmit[:0]
	for _, t := range list {
		r.resubmit = append(r.resubmit, t.head)
	}
	r.lastAvail = r.usedIdx + uint16(len(list))
	if len(list) > 0 {
		in.counter = list[0].counter + 1
	}
	return len(list), nil
}
