package frontend

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Request is one virtio-blk request.
type Request struct {
	Type   uint32   // proto.BlkT*
	Sector uint64   // 512-byte units
	Data   []Buffer // the data segments (discard, write-zeroes: BlkSeg entries)
	Tag    uint64   // handed back in the Completion
}

// Completion is a request the device has put in the used ring.
type Completion struct {
	Tag    uint64
	Status uint8  // proto.BlkS*; 0xff: the device did not write it
	Len    uint32 // bytes the device says it wrote into the chain
}

// statusUnset is what a status byte holds until the device writes it.
const statusUnset = 0xff

// Queue is the driver side of one split virtqueue in guest memory. Its
// methods (Submit, Kick, Poll, Wait, InFlight) belong to one goroutine at
// a time, the queue's owner; Device.Reconnect may run meanwhile (it reads
// only the used index).
type Queue struct {
	index    int
	num      int
	eventIdx bool
	indirect bool
	maxSegs  int // data segments per request

	rings Buffer // descriptor table, then avail ring, then used ring
	desc  []byte
	avail []byte
	used  []byte
	// meta holds per head: the 16-byte request header, the status byte and,
	// with indirect descriptors, a table of maxSegs+2 descriptors.
	meta                   Buffer
	statusOff, indirectOff int
	descAddr, availAddr    uint64
	usedAddr               uint64
	kick, call             int // eventfds (nonblocking)
	free                   []uint16
	next                   []uint16 // our copy of each descriptor's next
	slots                  []slot
	availIdx, kickedIdx    uint16
	lastUsed               uint16
	inFlight               int
	seq                    uint64 // submissions so far
}

type slot struct {
	active bool
	n      int    // ring descriptors in the chain
	seq    uint64 // submission order
	tag    uint64
}

// ErrQueueFull is Submit's answer when the ring lacks free descriptors.
var ErrQueueFull = errors.New("vhostuser/frontend: virtqueue full")

// ErrDevice marks a device that broke the ring's rules (a used id that is
// not in flight).
var ErrDevice = errors.New("vhostuser/frontend: device broke the virtqueue")

func newQueue(m *memory, index, num, maxSegs int, eventIdx, indirect bool) (*Queue, error) {
	q := &Queue{index: index, num: num, eventIdx: eventIdx, indirect: indirect, maxSegs: maxSegs, kick: -1, call: -1}
	availOff := proto.DescTableSize(num)
	// The avail and used rings get 2 bytes of room past their event
	// fields, so that those can be read and written as aligned 32-bit
	// words.
	usedOff := alignUp(availOff+proto.AvailRingSize(num)+2, 64)
	size := usedOff + proto.UsedRingSize(num) + 2
	var err error
	if q.rings, err = m.alloc(size, 4096); err != nil {
		return nil, err
	}
	q.desc = q.rings.Bytes[:availOff]
	q.avail = q.rings.Bytes[availOff:usedOff]
	q.used = q.rings.Bytes[usedOff:]
	q.descAddr, q.availAddr, q.usedAddr = q.rings.Addr, q.rings.Addr+uint64(availOff), q.rings.Addr+uint64(usedOff)
	q.statusOff = proto.BlkOutHdrSize * num
	q.indirectOff = alignUp(q.statusOff+num, proto.DescAlign)
	metaSize := q.indirectOff
	if indirect {
		metaSize += num * (maxSegs + 2) * proto.DescSize
	}
	if q.meta, err = m.alloc(metaSize, 64); err != nil {
		m.release(q.rings)
		return nil, err
	}
	for _, fd := range []*int{&q.kick, &q.call} {
		if *fd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK); err != nil {
			q.release(m)
			return nil, fmt.Errorf("eventfd: %w", err)
		}
	}
	q.next = make([]uint16, num)
	q.slots = make([]slot, num)
	q.free = make([]uint16, num)
	for i := range q.free {
		q.free[i] = uint16(num - 1 - i)
	}
	return q, nil
}

func (q *Queue) release(m *memory) {
	for _, fd := range []int{q.kick, q.call} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
	m.release(q.rings)
	m.release(q.meta)
}

func alignUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

// word is the aligned 32-bit word at b[off:].
func word(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

// Index is the queue's index on the device.
func (q *Queue) Index() int { return q.index }

// Size is the ring's number of descriptors.
func (q *Queue) Size() int { return q.num }

// InFlight is how many requests were submitted and not yet polled.
func (q *Queue) InFlight() int { return q.inFlight }

// MaxSegments is the most data segments one request may have.
func (q *Queue) MaxSegments() int {
	if q.indirect {
		return q.maxSegs
	}
	return q.num - 2
}

// Submit puts r on the available ring; Kick tells the device. It
// returns ErrQueueFull when the ring has no room for r.
func (q *Queue) Submit(r Request) error {
	n := len(r.Data) + 2
	if len(r.Data) > q.MaxSegments() {
		return fmt.Errorf("request of %d segments (most %d)", len(r.Data), q.MaxSegments())
	}
	writable := uint16(0)
	if r.Type == proto.BlkTIn || r.Type == proto.BlkTGetID {
		writable = proto.DescFWrite
	}
	ringN := n
	if q.indirect {
		ringN = 1
	}
	if len(q.free) < ringN {
		return ErrQueueFull
	}
	head := q.free[len(q.free)-1]
	hdr := q.meta.Slice(proto.BlkOutHdrSize*int(head), proto.BlkOutHdrSize)
	status := q.meta.Slice(q.statusOff+int(head), 1)
	proto.BlkOutHdr{Type: r.Type, Sector: r.Sector}.Put(hdr.Bytes)
	status.Bytes[0] = statusUnset
	// put writes the i-th descriptor of the chain into table t (the ring's
	// own table or an indirect one) at index at, linked to link.
	put := func(t []byte, at, link uint16, i int) {
		var d proto.Desc
		switch {
		case i == 0:
			d = proto.Desc{Addr: hdr.Addr, Len: proto.BlkOutHdrSize}
		case i == n-1:
			d = proto.Desc{Addr: status.Addr, Len: 1, Flags: proto.DescFWrite}
		default:
			b := r.Data[i-1]
			d = proto.Desc{Addr: b.Addr, Len: uint32(len(b.Bytes)), Flags: writable}
		}
		if i < n-1 {
			d.Flags |= proto.DescFNext
			d.Next = link
		}
		d.Put(t[proto.DescSize*int(at):])
	}
	if q.indirect {
		q.free = q.free[:len(q.free)-1]
		stride := (q.maxSegs + 2) * proto.DescSize
		table := q.meta.Slice(q.indirectOff+stride*int(head), n*proto.DescSize)
		for i := 0; i < n; i++ {
			put(table.Bytes, uint16(i), uint16(i+1), i)
		}
		proto.Desc{Addr: table.Addr, Len: uint32(len(table.Bytes)), Flags: proto.DescFIndirect}.Put(q.desc[proto.DescSize*int(head):])
	} else {
		chain := q.free[len(q.free)-n:]
		// chain is popped from the top: chain[n-1] is head.
		for i := 0; i < n; i++ {
			at := chain[n-1-i]
			var link uint16
			if i < n-1 {
				link = chain[n-2-i]
				q.next[at] = link
			}
			put(q.desc, at, link, i)
		}
		q.free = q.free[:len(q.free)-n]
	}
	q.seq++
	q.slots[head] = slot{active: true, n: ringN, seq: q.seq, tag: r.Tag}
	q.publish(head)
	return nil
}

// Kick notifies the device of what Submit added since the last kick,
// unless the device asked not to be (EVENT_IDX's avail_event, or
// VRING_USED_F_NO_NOTIFY).
func (q *Queue) Kick() error {
	if q.availIdx == q.kickedIdx {
		return nil
	}
	old := q.kickedIdx
	q.kickedIdx = q.availIdx
	// The atomic load after Submit's atomic store is the full barrier the
	// spec asks for between publishing and reading the suppression.
	var need bool
	if q.eventIdx {
		ev := uint16(atomic.LoadUint32(word(q.used, proto.AvailEventOff(q.num))))
		need = proto.NeedEvent(ev, q.availIdx, old)
	} else {
		need = atomic.LoadUint32(word(q.used, 0))&proto.UsedFNoNotify == 0
	}
	if !need {
		return nil
	}
	var one [8]byte
	one[0] = 1
	if _, err := unix.Write(q.kick, one[:]); err != nil {
		return fmt.Errorf("kick queue %d: %w", q.index, err)
	}
	return nil
}

// Completed says whether the device has completed requests that Poll
// has not reported yet.
func (q *Queue) Completed() bool { return q.usedIdx() != q.lastUsed }

// usedIdx is the device's used index.
func (q *Queue) usedIdx() uint16 { return uint16(atomic.LoadUint32(word(q.used, 0)) >> 16) }

// Poll calls fn for every request the device has completed, oldest
// first, frees their descriptors and returns how many. With EVENT_IDX it
// asks for a call at the next completion.
func (q *Queue) Poll(fn func(Completion)) (int, error) {
	done := 0
	for {
		used := q.usedIdx()
		for q.lastUsed != used {
			e := q.used[proto.RingArrayOff+proto.UsedElemSize*(int(q.lastUsed)&(q.num-1)):]
			id := binary.LittleEndian.Uint32(e)
			ln := binary.LittleEndian.Uint32(e[4:])
			if id >= uint32(q.num) || !q.slots[id].active {
				return done, fmt.Errorf("%w: queue %d used id %d is not in flight", ErrDevice, q.index, id)
			}
			c := Completion{Tag: q.slots[id].tag, Status: q.meta.Bytes[q.statusOff+int(id)], Len: ln}
			q.freeChain(uint16(id))
			q.lastUsed++
			q.inFlight--
			done++
			fn(c)
		}
		if q.eventIdx {
			// used_event sits 4-aligned in the avail ring with 2 bytes of
			// our padding after it.
			atomic.StoreUint32(word(q.avail, proto.UsedEventOff(q.num)), uint32(q.lastUsed))
		}
		if q.usedIdx() == q.lastUsed {
			return done, nil
		}
	}
}

func (q *Queue) freeChain(head uint16) {
	s := &q.slots[head]
	at := head
	for i := 0; i < s.n; i++ {
		q.free = append(q.free, at)
		at = q.next[at]
	}
	*s = slot{}
}

// Wait blocks until the device calls (or timeout passes: false). Poll
// before and after: a call may be suppressed while completions wait.
func (q *Queue) Wait(timeout time.Duration) (bool, error) {
	fds := []unix.PollFd{{Fd: int32(q.call), Events: unix.POLLIN}}
	ms := int(timeout / time.Millisecond)
	if timeout < 0 {
		ms = -1
	}
	for {
		n, err := unix.Poll(fds, ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("wait for queue %d: %w", q.index, err)
		}
		if n == 0 {
			return false, nil
		}
		var b [8]byte
		if _, err := unix.Read(q.call, b[:]); err != nil && err != unix.EAGAIN {
			return false, fmt.Errorf("read call of queue %d: %w", q.index, err)
		}
		return true, nil
	}
}

// Do submits r, kicks, and waits for r's completion (and any other's,
// which it drops): for tests and one-off requests on an otherwise idle
// queue.
func (q *Queue) Do(r Request, timeout time.Duration) (Completion, error) {
	if err := q.Submit(r); err != nil {
		return Completion{}, err
	}
	if err := q.Kick(); err != nil {
		return Completion{}, err
	}
	deadline := time.Now().Add(timeout)
	for {
		var got *Completion
		if _, err := q.Poll(func(c Completion) {
			if c.Tag == r.Tag {
				got = &c
			}
		}); err != nil {
			return Completion{}, err
		}
		if got != nil {
			return *got, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return Completion{}, fmt.Errorf("queue %d: no completion of request %d within %v", q.index, r.Tag, timeout)
		}
		if _, err := q.Wait(min(left, 100*time.Millisecond)); err != nil {
			return Completion{}, err
		}
	}
}

// rewind puts every request in flight that the device has not used back
// on the available ring, in submission order, from the used index on,
// and returns that index: the base for a new backend that knows nothing
// of the old one's work (no inflight region). Completions already in the
// used ring stay there for Poll. The queue's owner must not run
// meanwhile.
func (q *Queue) rewind() uint16 {
	used := q.usedIdx()
	done := make(map[uint32]bool)
	for i := q.lastUsed; i != used; i++ {
		done[binary.LittleEndian.Uint32(q.used[proto.RingArrayOff+proto.UsedElemSize*(int(i)&(q.num-1)):])] = true
	}
	var heads []uint16
	for h := range q.slots {
		if q.slots[h].active && !done[uint32(h)] {
			heads = append(heads, uint16(h))
		}
	}
	slices.SortFunc(heads, func(a, b uint16) int { return cmp.Compare(q.slots[a].seq, q.slots[b].seq) })
	idx := used
	for _, h := range heads {
		binary.LittleEndian.PutUint16(q.avail[proto.RingArrayOff+2*(int(idx)&(q.num-1)):], h)
		idx++
	}
	q.availIdx = idx
	q.kickedIdx = used
	atomic.StoreUint32(word(q.avail, 0), uint32(q.availIdx)<<16)
	return used
}

// SubmitChain puts a hand-made descriptor chain on the available ring,
// for tests of a backend's checks (descriptors outside guest memory,
// wrong directions, loops, bad indirect tables). descs[0] is the head;
// each Next is an index into descs, mapped to the ring slot the
// descriptor lands in, or written as is when it is not one (len(descs) or
// more). Addresses, lengths and flags are written as given. The chain
// holds its descriptors until its completion is polled; the completion's
// Status is not meaningful (the caller's own status buffer is). Kick
// tells the device.
func (q *Queue) SubmitChain(descs []proto.Desc, tag uint64) error {
	n := len(descs)
	if n == 0 {
		return fmt.Errorf("empty chain")
	}
	if len(q.free) < n {
		return ErrQueueFull
	}
	chain := q.free[len(q.free)-n:]
	at := func(i int) uint16 { return chain[n-1-i] }
	for i, d := range descs {
		if int(d.Next) < n {
			d.Next = at(int(d.Next))
		}
		d.Put(q.desc[proto.DescSize*int(at(i)):])
		if i < n-1 {
			q.next[at(i)] = at(i + 1)
		}
	}
	q.free = q.free[:len(q.free)-n]
	head := at(0)
	q.meta.Bytes[q.statusOff+int(head)] = statusUnset
	q.seq++
	q.slots[head] = slot{active: true, n: n, seq: q.seq, tag: tag}
	q.publish(head)
	return nil
}

// publish puts head on the available ring and publishes the new index;
// the atomic store orders the descriptor writes before it (flags stay 0:
// calls wanted).
func (q *Queue) publish(head uint16) {
	binary.LittleEndian.PutUint16(q.avail[proto.RingArrayOff+2*(int(q.availIdx)&(q.num-1)):], head)
	q.availIdx++
	atomic.StoreUint32(word(q.avail, 0), uint32(q.availIdx)<<16)
	q.inFlight++
}
