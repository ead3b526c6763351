package vhostuser

import (
	"encoding/binary"
	"io"
	"testing"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// fakeDevice is a Device that takes one chain off every queue it is
// given (touching the rings through the mapped memory) and counts.
type fakeDevice struct {
	started, stopped int
	running          map[int]bool
}

func (f *fakeDevice) Features() uint64 {
	return proto.Bit(proto.VirtioFVersion1) | proto.Bit(proto.VirtioFRingEventIdx) | proto.Bit(proto.VirtioFRingIndirectDesc)
}
func (f *fakeDevice) ProtocolFeatures() uint64 {
	return proto.Bit(proto.ProtocolMQ) | proto.Bit(proto.ProtocolConfig)
}
func (f *fakeDevice) NumQueues() int             { return 2 }
func (f *fakeDevice) QueueLimits() virtq.Options { return virtq.Options{MaxBufs: 16} }
func (f *fakeDevice) Config() []byte             { return []byte("0123456789") }
func (f *fakeDevice) SetConfig(uint32, []byte) error {
	return nil
}
func (f *fakeDevice) StartQueue(q *Queue) error {
	if f.running[q.Index] {
		panic("queue started twice")
	}
	f.running[q.Index] = true
	f.started++
	var c virtq.Chain
	if ok, err := q.Ring.Pop(&c); ok && err == nil {
		q.Ring.Push(c.Head, 0)
	}
	q.Ring.NeedSignal()
	q.Ring.EnableNotify()
	return nil
}
func (f *fakeDevice) StopQueue(i int) {
	if !f.running[i] {
		panic("queue stopped while not running")
	}
	delete(f.running, i)
	f.stopped++
}
func (f *fakeDevice) Reset() {
	if len(f.running) != 0 {
		panic("reset with queues running")
	}
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// fdFor returns the descriptor a fuzzed message of request r carries:
// shared memory for the memory table and the inflight region, an
// eventfd for the vring ones, a socket for the backend channel.
func fdFor(t testing.TB, r proto.Request) []int {
	var fd int
	var err error
	switch r {
	case proto.SetMemTable, proto.SetInflightFD, proto.AddMemReg:
		fd, err = unix.MemfdCreate("fuzz", unix.MFD_CLOEXEC)
		if err == nil {
			err = unix.Ftruncate(fd, 1<<20)
		}
	case proto.SetVringKick, proto.SetVringCall, proto.SetVringErr:
		fd, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	case proto.SetBackendReqFD:
		var fds [2]int
		fds, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		unix.Close(fds[1])
		fd = fds[0]
	default:
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return []int{fd}
}

// FuzzSession feeds a session a stream of messages made from random
// bytes (request codes of the protocol, random flags, payloads and the
// descriptors each request takes): no panic, no hang, every queue the
// device was given taken back, and the session ends at the end of the
// stream.
func FuzzSession(f *testing.F) {
	f.Add(sessionSeed(false))
	f.Add(sessionSeed(true))
	f.Fuzz(func(t *testing.T, data []byte) { runSession(t, data) })
}

// TestSessionSeed: the fuzz seeds' setup (memory by SET_MEM_TABLE, or
// by ADD_MEM_REG with a region removed and added again while the queue
// runs) starts queue 0, and GET_VRING_BASE stops it.
func TestSessionSeed(t *testing.T) {
	for _, slots := range []bool{false, true} {
		want := 1
		if slots {
			want = 2 // REM_MEM_REG stops the queue, ADD_MEM_REG starts it again
		}
		if dev := runSession(t, sessionSeed(slots)); dev.started != want || dev.stopped != want {
			t.Fatalf("slots %v: started %d, stopped %d", slots, dev.started, dev.stopped)
		}
	}
}

// runSession runs a session over the messages data encodes (FuzzSession)
// and checks what the device saw.
func runSession(t *testing.T, data []byte) *fakeDevice {
	dev := &fakeDevice{running: map[int]bool{}}
	l := &Listener{dev: dev, log: quiet()}
	a, b := testutil.SocketPair(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		newSession(l, a).run()
		a.Close()
	}()
	// Drain replies so the session never blocks writing them.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			m, err := proto.ReadMessage(b)
			if err != nil {
				return
			}
			for _, fd := range m.FDs {
				unix.Close(fd)
			}
		}
	}()
	for n := 0; len(data) >= 5 && n < 64; n++ {
		req := proto.Request(data[0] % 40)
		flags := uint32(proto.Version)
		if data[0]&0x80 != 0 {
			flags |= proto.FlagNeedReply
		}
		size := min(int(binary.LittleEndian.Uint16(data[1:])), len(data)-5, proto.MaxPayload)
		payload := data[5 : 5+size]
		data = data[5+size:]
		fds := fdFor(t, req)
		err := proto.WriteMessage(b, proto.Message{Request: uint32(req), Flags: flags, Payload: payload, FDs: fds})
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			break // the session ended (a malformed message)
		}
	}
	b.CloseWrite()
	<-done
	b.Close()
	<-drained
	if len(dev.running) != 0 || dev.started != dev.stopped {
		t.Fatalf("started %d, stopped %d, running at the end %v", dev.started, dev.stopped, dev.running)
	}
	return dev
}

// sessionSeed encodes a plausible setup: features, protocol features, a
// memory table (or, with slots, a region added), a ring, the inflight
// region, a kick, enable (with slots, the region removed and added
// again), then GET_VRING_BASE and GET_CONFIG.
func sessionSeed(slots bool) []byte {
	var seed []byte
	add := func(req proto.Request, payload []byte) {
		var h [5]byte
		h[0] = byte(req)
		binary.LittleEndian.PutUint16(h[1:], uint16(len(payload)))
		seed = append(append(seed, h[:]...), payload...)
	}
	add(proto.SetFeatures, proto.EncodeU64(1<<proto.FProtocolFeatures|1<<proto.VirtioFVersion1))
	add(proto.SetProtocolFeatures, proto.EncodeU64(1<<proto.ProtocolReplyAck|1<<proto.ProtocolInflightShmFD))
	region := proto.MemRegion{GuestAddr: 0, Size: 1 << 20, UserAddr: 1 << 30}
	if slots {
		add(proto.AddMemReg, proto.EncodeMemRegMsg(region))
	} else {
		mt, _ := proto.EncodeMemTable([]proto.MemRegion{region})
		add(proto.SetMemTable, mt)
	}
	add(proto.SetVringNum, proto.VringState{Index: 0, Num: 16}.Encode())
	add(proto.SetVringAddr, proto.VringAddr{Index: 0, Desc: 1 << 30, Avail: 1<<30 + 4096, Used: 1<<30 + 8192}.Encode())
	add(proto.GetInflightFD, proto.Inflight{NumQueues: 2, QueueSize: 16}.Encode())
	add(proto.SetVringKick, proto.EncodeU64(0))
	add(proto.SetVringEnable, proto.VringState{Index: 0, Num: 1}.Encode())
	if slots {
		add(proto.RemMemReg, proto.EncodeMemRegMsg(region))
		add(proto.AddMemReg, proto.EncodeMemRegMsg(region))
	}
	add(proto.GetVringBase, proto.VringState{Index: 0}.Encode())
	add(proto.GetConfig, []byte{2, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	return seed
}
