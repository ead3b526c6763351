package vhostuser

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// sessionProtocol are the protocol features the session implements
// itself, offered whatever the device.
const sessionProtocol = 1<<proto.ProtocolReplyAck | 1<<proto.ProtocolBackendReq |
	1<<proto.ProtocolInflightShmFD | 1<<proto.ProtocolResetDevice | 1<<proto.ProtocolConfigureMemSlots

// maxMemSlots is what GET_MAX_MEM_SLOTS answers (libvhost-user's
// VHOST_USER_MAX_RAM_SLOTS).
const maxMemSlots = 32

// vring is the session's state of one queue.
type vring struct {
	num        uint16
	addr       proto.VringAddr
	hasAddr    bool
	base       uint16
	kick, call int // -1: none
	enabled    bool
	started    bool // a kick descriptor came and no GET_VRING_BASE since
	running    bool // handed to the device
	ring       *virtq.Ring
}

// session is one frontend's connection; only its goroutine uses it.
type session struct {
	l   *Listener
	c   *net.UnixConn
	log logrus.FieldLogger

	features, protocol uint64
	mem                *memTable
	inflight           []byte // the inflight region's mapping, or nil
	inflightQueue      int    // bytes of each queue's part
	vrings             []vring
}

func newSession(l *Listener, c *net.UnixConn) *session {
	s := &session{l: l, c: c, log: l.log, vrings: make([]vring, l.dev.NumQueues())}
	for i := range s.vrings {
		s.vrings[i] = vring{kick: -1, call: -1}
	}
	return s
}

// run serves messages until the connection ends, then stops the queues
// and releases what the frontend gave.
func (s *session) run() {
	s.log.Info("vhost-user: frontend connected")
	defer s.teardown()
	for {
		m, err := proto.ReadMessage(s.c)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.log.WithError(err).Warn("vhost-user: frontend connection")
			}
			s.log.Info("vhost-user: frontend disconnected")
			return
		}
		if err := s.handle(m); err != nil {
			s.log.WithError(err).WithField("request", proto.Request(m.Request).String()).Warn("vhost-user: request failed")
			if errors.Is(err, errFatal) {
				return
			}
		}
	}
}

// errFatal marks a failure after which the session cannot go on (a reply
// that could not be sent).
var errFatal = errors.New("vhost-user: connection broken")

func (s *session) teardown() {
	s.stopAll()
	s.l.dev.Reset()
	for i := range s.vrings {
		v := &s.vrings[i]
		closeFDs([]int{v.kick, v.call})
		*v = vring{kick: -1, call: -1}
	}
	s.mem.unmap()
	s.mem = nil
	s.unmapInflight()
	s.l.setBackend(nil)
}

func (s *session) unmapInflight() {
	if s.inflight != nil {
		unix.Munmap(s.inflight)
		s.inflight = nil
	}
}

// reply sends payload (and fds) as the reply to m.
func (s *session) reply(m proto.Message, payload []byte, fds ...int) error {
	err := proto.WriteMessage(s.c, proto.Message{Request: m.Request, Flags: proto.Version | proto.FlagReply, Payload: payload, FDs: fds})
	if err != nil {
		return fmt.Errorf("%w: reply: %w", errFatal, err)
	}
	return nil
}

// handle serves one message; m's descriptors are closed or kept.
func (s *session) handle(m proto.Message) error {
	req := proto.Request(m.Request)
	err := s.serve(req, m)
	if errors.Is(err, errFatal) {
		return err
	}
	// REPLY_ACK for the requests that have no reply of their own.
	if m.NeedReply() && s.protocol&(1<<proto.ProtocolReplyAck) != 0 && !hasReply(req) {
		status := uint64(0)
		if err != nil {
			status = 1
		}
		if rerr := s.reply(m, proto.EncodeU64(status)); rerr != nil {
			return rerr
		}
	}
	return err
}

func hasReply(r proto.Request) bool {
	switch r {
	case proto.GetFeatures, proto.GetProtocolFeatures, proto.GetVringBase, proto.GetQueueNum,
		proto.GetConfig, proto.GetInflightFD, proto.GetMaxMemSlots:
		return true
	}
	return false
}

func (s *session) serve(req proto.Request, m proto.Message) error {
	// Only these take descriptors; any others sent are closed.
	switch req {
	case proto.SetMemTable, proto.SetVringKick, proto.SetVringCall, proto.SetVringErr,
		proto.SetBackendReqFD, proto.SetInflightFD, proto.AddMemReg:
	default:
		closeFDs(m.FDs)
		m.FDs = nil
	}
	dev := s.l.dev
	switch req {
	case proto.GetFeatures:
		return s.reply(m, proto.EncodeU64(dev.Features()|1<<proto.FProtocolFeatures))
	case proto.SetFeatures:
		f, err := proto.DecodeU64(m.Payload)
		if err != nil {
			return err
		}
		if f&^(dev.Features()|1<<proto.FProtocolFeatures) != 0 {
			return fmt.Errorf("features %#x not offered: %w", f, ErrProtocol)
		}
		// Running rings follow the ring features (EVENT_IDX, INDIRECT):
		// they start again under the new ones.
		s.stopAll()
		s.features = f
		return s.restartAll()
	case proto.GetProtocolFeatures:
		return s.reply(m, proto.EncodeU64(dev.ProtocolFeatures()|sessionProtocol))
	case proto.SetProtocolFeatures:
		f, err := proto.DecodeU64(m.Payload)
		if err != nil {
			return err
		}
		s.stopAll() // INFLIGHT_SHMFD decides whether rings record
		s.protocol = f & (dev.ProtocolFeatures() | sessionProtocol)
		return s.restartAll()
	case proto.SetOwner:
		return nil
	case proto.ResetOwner, proto.ResetDevice:
		s.stopAll()
		dev.Reset()
		for i := range s.vrings {
			v := &s.vrings[i]
			closeFDs([]int{v.kick, v.call})
			*v = vring{kick: -1, call: -1}
		}
		s.features = 0
		return nil
	case proto.GetQueueNum:
		return s.reply(m, proto.EncodeU64(uint64(len(s.vrings))))
	case proto.GetMaxMemSlots:
		return s.reply(m, proto.EncodeU64(maxMemSlots))
	case proto.SetMemTable:
		regions, err := proto.DecodeMemTable(m.Payload)
		if err != nil {
			closeFDs(m.FDs)
			return err
		}
		s.stopAll()
		t, err := mapMemTable(regions, m.FDs)
		s.mem.unmap()
		s.mem = t
		if err != nil {
			return err
		}
		return s.restartAll()
	case proto.AddMemReg, proto.RemMemReg:
		return s.changeMemReg(req, m)
	case proto.SetVringNum, proto.SetVringBase, proto.SetVringEnable, proto.GetVringBase:
		st, err := proto.DecodeVringState(m.Payload)
		if err != nil {
			return err
		}
		err = s.change(st.Index, func(v *vring) (bool, error) {
			switch req {
			case proto.SetVringNum:
				if !proto.ValidQueueSize(int(st.Num)) {
					return false, fmt.Errorf("queue %d size %d: %w", st.Index, st.Num, ErrProtocol)
				}
				v.num = uint16(st.Num)
			case proto.SetVringBase:
				v.base = uint16(st.Num)
			case proto.SetVringEnable:
				v.enabled = st.Num != 0
				return true, nil // start if now ready
			case proto.GetVringBase:
				v.started = false // stopped until the next kick
				st.Num = uint32(v.base)
			}
			return false, nil
		})
		if err != nil || req != proto.GetVringBase {
			return err
		}
		return s.reply(m, st.Encode())
	case proto.SetVringAddr:
		a, err := proto.DecodeVringAddr(m.Payload)
		if err != nil {
			return err
		}
		if a.Flags&proto.VringAddrFLog != 0 {
			return fmt.Errorf("queue %d: dirty logging not offered: %w", a.Index, ErrProtocol)
		}
		return s.change(a.Index, func(v *vring) (bool, error) {
			v.addr, v.hasAddr = a, true
			return false, nil
		})
	case proto.SetVringKick, proto.SetVringCall, proto.SetVringErr:
		return s.setVringFD(req, m)
	case proto.GetConfig:
		c, err := proto.DecodeConfig(m.Payload)
		if err != nil {
			return err
		}
		space := dev.Config()
		for i := range c.Data {
			c.Data[i] = 0
			if o := uint64(c.Offset) + uint64(i); o < uint64(len(space)) {
				c.Data[i] = space[o]
			}
		}
		p, err := c.Encode()
		if err != nil {
			return err
		}
		return s.reply(m, p)
	case proto.SetConfig:
		c, err := proto.DecodeConfig(m.Payload)
		if err != nil {
			return err
		}
		return dev.SetConfig(c.Offset, c.Data)
	case proto.SetBackendReqFD:
		if len(m.FDs) != 1 {
			closeFDs(m.FDs)
			return fmt.Errorf("backend channel with %d descriptors: %w", len(m.FDs), ErrProtocol)
		}
		f := os.NewFile(uintptr(m.FDs[0]), "vhost-user backend channel")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("backend channel: %w", err)
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			return fmt.Errorf("backend channel is not a Unix socket: %w", ErrProtocol)
		}
		s.l.setBackend(uc)
		return nil
	case proto.GetInflightFD:
		return s.getInflight(m)
	case proto.SetInflightFD:
		return s.setInflight(m)
	}
	closeFDs(m.FDs)
	return fmt.Errorf("%v not supported: %w", req, ErrProtocol)
}

func (s *session) vring(i uint32) (*vring, error) {
	if int(i) >= len(s.vrings) {
		return nil, fmt.Errorf("queue %d of %d: %w", i, len(s.vrings), ErrProtocol)
	}
	return &s.vrings[i], nil
}

// changeMemReg serves ADD_MEM_REG and REM_MEM_REG
// (CONFIGURE_MEM_SLOTS): the queues stop while the table changes.
func (s *session) changeMemReg(req proto.Request, m proto.Message) error {
	r, err := proto.DecodeMemRegMsg(m.Payload)
	if err != nil || req == proto.AddMemReg && len(m.FDs) != 1 {
		closeFDs(m.FDs)
		if err == nil {
			err = fmt.Errorf("%v with %d descriptors: %w", req, len(m.FDs), ErrProtocol)
		}
		return err
	}
	s.stopAll()
	if s.mem == nil {
		s.mem = &memTable{}
	}
	if req == proto.AddMemReg {
		err = s.mem.add(r, m.FDs[0])
	} else {
		err = s.mem.remove(r)
	}
	if rerr := s.restartAll(); err == nil {
		err = rerr
	}
	return err
}

// setVringFD serves SET_VRING_KICK, SET_VRING_CALL and SET_VRING_ERR.
func (s *session) setVringFD(req proto.Request, m proto.Message) error {
	u, err := proto.DecodeU64(m.Payload)
	if err != nil {
		closeFDs(m.FDs)
		return err
	}
	idx := uint32(u & proto.VringIndexMask)
	nofd := u&proto.VringNoFDMask != 0
	_, err = s.vring(idx)
	if err != nil || nofd != (len(m.FDs) == 0) || len(m.FDs) > 1 {
		closeFDs(m.FDs)
		if err == nil {
			err = fmt.Errorf("%v queue %d: %d descriptors, nofd %v: %w", req, idx, len(m.FDs), nofd, ErrProtocol)
		}
		return err
	}
	fd := -1
	if !nofd {
		fd = m.FDs[0]
	}
	if req == proto.SetVringErr {
		closeFDs([]int{fd}) // errors are logged here, not signalled
		return nil
	}
	if req == proto.SetVringKick && nofd {
		return fmt.Errorf("queue %d: polling without a kick descriptor not offered: %w", idx, ErrProtocol)
	}
	return s.change(idx, func(v *vring) (bool, error) {
		if req == proto.SetVringCall {
			closeFDs([]int{v.call})
			v.call = fd
			return false, nil
		}
		closeFDs([]int{v.kick})
		v.kick, v.started = fd, true
		return true, nil
	})
}

// getInflight creates the inflight region (GET_INFLIGHT_FD).
func (s *session) getInflight(m proto.Message) error {
	in, err := proto.DecodeInflight(m.Payload)
	if err != nil {
		return err
	}
	if in.NumQueues == 0 || int(in.NumQueues) > len(s.vrings) || !proto.ValidQueueSize(int(in.QueueSize)) {
		return fmt.Errorf("inflight region for %d queues of %d: %w", in.NumQueues, in.QueueSize, ErrProtocol)
	}
	per := virtq.InflightQueueSize(in.QueueSize)
	size := per * int(in.NumQueues)
	fd, err := unix.MemfdCreate("vhost-user-inflight", unix.MFD_CLOEXEC)
	if err != nil {
		return fmt.Errorf("inflight region: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fmt.Errorf("inflight region: %w", err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("inflight region: %w", err)
	}
	s.stopAll()
	s.unmapInflight()
	s.inflight, s.inflightQueue = b, per
	return s.reply(m, proto.Inflight{MmapSize: uint64(size), NumQueues: in.NumQueues, QueueSize: in.QueueSize}.Encode(), fd)
}

// setInflight maps the inflight region the frontend kept (SET_INFLIGHT_FD).
func (s *session) setInflight(m proto.Message) error {
	defer closeFDs(m.FDs)
	in, err := proto.DecodeInflight(m.Payload)
	if err != nil {
		return err
	}
	if len(m.FDs) != 1 {
		return fmt.Errorf("inflight region with %d descriptors: %w", len(m.FDs), ErrProtocol)
	}
	per := virtq.InflightQueueSize(in.QueueSize)
	if in.NumQueues == 0 || !proto.ValidQueueSize(int(in.QueueSize)) ||
		in.MmapSize < uint64(per)*uint64(in.NumQueues) || in.MmapSize > 1<<30 || in.MmapOffset > 1<<48 || in.MmapOffset%uint64(unix.Getpagesize()) != 0 {
		return fmt.Errorf("inflight region of %d bytes for %d queues of %d: %w", in.MmapSize, in.NumQueues, in.QueueSize, ErrProtocol)
	}
	if err := fileHolds(m.FDs[0], in.MmapOffset+in.MmapSize); err != nil {
		return fmt.Errorf("inflight region: %w", err)
	}
	b, err := unix.Mmap(m.FDs[0], int64(in.MmapOffset), int(in.MmapSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("inflight region: %w", err)
	}
	s.stopAll()
	s.unmapInflight()
	s.inflight, s.inflightQueue = b, per
	return s.restartAll()
}

// change stops queue i, applies fn to its state, and hands the queue
// back to the device if it was running or fn says to try (update starts
// it only once it is ready).
func (s *session) change(i uint32, fn func(v *vring) (start bool, err error)) error {
	v, err := s.vring(i)
	if err != nil {
		return err
	}
	running := v.running
	s.stop(int(i))
	start, err := fn(v)
	if err != nil {
		return err
	}
	if running || start {
		return s.update(int(i))
	}
	return nil
}

// update hands queue i to the device if it is ready and not running.
func (s *session) update(i int) error {
	v := &s.vrings[i]
	enabled := v.enabled || s.features&(1<<proto.FProtocolFeatures) == 0
	if v.running || !v.started || !enabled || !v.hasAddr || v.num == 0 || s.mem == nil || s.mem.mem == nil {
		return nil
	}
	o := s.l.dev.QueueLimits()
	o.EventIdx = s.features&(1<<proto.VirtioFRingEventIdx) != 0
	o.Indirect = s.features&(1<<proto.VirtioFRingIndirectDesc) != 0
	r, err := virtq.NewRing(s.mem.mem, virtq.Addrs{Size: v.num, Desc: v.addr.Desc, Avail: v.addr.Avail,
		Used: v.addr.Used, User: true, LastAvail: v.base}, o)
	if err != nil {
		return fmt.Errorf("queue %d: %w", i, err)
	}
	q := &Queue{Index: i, Ring: r, Kick: v.kick, Call: v.call}
	if s.inflight != nil && s.protocol&(1<<proto.ProtocolInflightShmFD) != 0 {
		off := i * s.inflightQueue
		if off+s.inflightQueue > len(s.inflight) {
			return fmt.Errorf("queue %d past the inflight region: %w", i, ErrProtocol)
		}
		in, err := virtq.NewInflight(s.inflight[off:off+s.inflightQueue], v.num)
		if err != nil {
			return fmt.Errorf("queue %d: %w", i, err)
		}
		if q.Resubmitted, err = r.SetInflight(in); err != nil {
			return fmt.Errorf("queue %d: %w", i, err)
		}
		if q.Resubmitted > 0 {
			s.log.WithFields(logrus.Fields{"queue": i, "requests": q.Resubmitted}).Info("vhost-user: resubmitting requests in flight at the last disconnect")
		}
	}
	if err := s.l.dev.StartQueue(q); err != nil {
		return fmt.Errorf("queue %d: %w", i, err)
	}
	v.ring, v.running = r, true
	return nil
}

// stop takes queue i back from the device, keeping where it stopped.
func (s *session) stop(i int) {
	v := &s.vrings[i]
	if !v.running {
		return
	}
	s.l.dev.StopQueue(i)
	v.base = v.ring.LastAvail()
	v.ring, v.running = nil, false
}

// stopAll stops every running queue.
func (s *session) stopAll() {
	for i := range s.vrings {
		s.stop(i)
	}
}

// restartAll hands every queue that is ready back to the device (after
// stopAll and a change of the memory, features or inflight region): a
// queue started and enabled runs whenever it can.
func (s *session) restartAll() error {
	var first error
	for i := range s.vrings {
		if err := s.update(i); err != nil && first == nil {
			first = err
		}
	}
	return first
}
