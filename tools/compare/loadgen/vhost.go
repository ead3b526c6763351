package loadgen

import (
	"fmt"
	"time"

	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Vhost is an Engine on one queue of a vhost-user-blk device: requests
// in guest memory, a kick per batch, and the device's call to wake up.
type Vhost struct {
	Dev   *frontend.Device
	Queue int
}

type vhostQueue struct {
	dev  *frontend.Device
	q    *frontend.Queue
	bufs [][]frontend.Buffer // per slot: the one data segment
	bs   int
	// Reap's callback and what it hands completions to, made once so
	// that a reap allocates nothing.
	onPoll func(frontend.Completion)
	fn     func(slot int)
	fail   error
}

// Open allocates depth buffers in guest memory.
func (v Vhost) Open(depth, bs int) (Queue, error) {
	qs := v.Dev.Queues()
	if v.Queue >= len(qs) {
		return nil, fmt.Errorf("vhost-user device has %d queues, no queue %d", len(qs), v.Queue)
	}
	q := &vhostQueue{dev: v.Dev, q: qs[v.Queue], bs: bs}
	q.onPoll = func(c frontend.Completion) {
		if c.Status != proto.BlkSOK && q.fail == nil {
			q.fail = fmt.Errorf("vhost-user request of %d bytes: status %d", q.bs, c.Status)
		}
		q.fn(int(c.Tag))
	}
	if q.q.InFlight() != 0 {
		return nil, fmt.Errorf("vhost-user queue %d has %d requests in flight", v.Queue, q.q.InFlight())
	}
	for i := 0; i < depth; i++ {
		b, err := v.Dev.Alloc(bs, 4096)
		if err != nil {
			q.Close()
			return nil, fmt.Errorf("%d buffers of %d bytes: %w", depth, bs, err)
		}
		q.bufs = append(q.bufs, []frontend.Buffer{b})
	}
	return q, nil
}

func (q *vhostQueue) Buffer(slot int) []byte { return q.bufs[slot][0].Bytes }

func (q *vhostQueue) Submit(slot int, write bool, off int64) error {
	t := uint32(proto.BlkTIn)
	if write {
		t = proto.BlkTOut
	}
	return q.q.Submit(frontend.Request{Type: t, Sector: uint64(off) / proto.SectorSize, Data: q.bufs[slot], Tag: uint64(slot)})
}

func (q *vhostQueue) Flush(wait bool) error {
	if err := q.q.Kick(); err != nil {
		return err
	}
	if !wait || q.q.Completed() {
		return nil
	}
	_, err := q.q.Wait(time.Second)
	return err
}

func (q *vhostQueue) Reap(fn func(slot int)) (int, error) {
	q.fn = fn
	n, err := q.q.Poll(q.onPoll)
	if err == nil {
		err, q.fail = q.fail, nil
	}
	return n, err
}

func (q *vhostQueue) Close() error {
	for _, b := range q.bufs {
		q.dev.Free(b[0])
	}
	q.bufs = nil
	return nil
}
