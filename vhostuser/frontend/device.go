package frontend

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Options configure a Device.
type Options struct {
	Socket  string // the backend's Unix socket
	MemSize int64  // guest memory bytes (default 64 MiB)
	// Memory is guest memory shared with other devices (NewMemory), used
	// instead of memory of the device's own (MemSize is then ignored).
	Memory      *Memory
	Queues      int // queues to set up (0: as many as the device offers)
	QueueSize   int // descriptors per queue, a power of two from 4 (default 256)
	MaxSegments int // data segments per request with indirect descriptors (default 32)
	// Turn off features the frontend otherwise negotiates when offered.
	NoIndirect, NoEventIdx, NoInflight, NoBackendReq bool
	// ReconnectTimeout bounds how long Reconnect re-dials (default 30s);
	// ReplyTimeout how long a request waits for its reply (default 30s).
	ReconnectTimeout, ReplyTimeout time.Duration
}

// Features the frontend acks when the device offers them.
var (
	wantFeatures = proto.Bit(proto.VirtioFVersion1) | proto.Bit(proto.VirtioFRingIndirectDesc) |
		proto.Bit(proto.VirtioFRingEventIdx) | proto.Bit(proto.FProtocolFeatures) |
		proto.Bit(proto.BlkFSizeMax) | proto.Bit(proto.BlkFSegMax) | proto.Bit(proto.BlkFBlkSize) |
		proto.Bit(proto.BlkFFlush) | proto.Bit(proto.BlkFTopology) | proto.Bit(proto.BlkFMQ) |
		proto.Bit(proto.BlkFDiscard) | proto.Bit(proto.BlkFWriteZeroes) | proto.Bit(proto.BlkFRO)
	wantProtocol = proto.Bit(proto.ProtocolMQ) | proto.Bit(proto.ProtocolConfig) |
		proto.Bit(proto.ProtocolReplyAck) | proto.Bit(proto.ProtocolInflightShmFD) |
		proto.Bit(proto.ProtocolBackendReq)
)

// wants is the virtio and protocol features to ack when offered: the
// frontend's set less what the options turn off.
func (o Options) wants() (features, protocol uint64) {
	features, protocol = wantFeatures, wantProtocol
	for _, off := range []struct {
		set  bool
		mask *uint64
		bit  uint
	}{
		{o.NoIndirect, &features, proto.VirtioFRingIndirectDesc},
		{o.NoEventIdx, &features, proto.VirtioFRingEventIdx},
		{o.NoInflight, &protocol, proto.ProtocolInflightShmFD},
		{o.NoBackendReq, &protocol, proto.ProtocolBackendReq},
	} {
		if off.set {
			*off.mask &^= proto.Bit(off.bit)
		}
	}
	return features, protocol
}

// Device is a vhost-user-blk device seen from the frontend: the socket,
// guest memory, the negotiated features, the config space and the
// queues.
//
// Locking: mu serialises the exchanges on the socket (a request and its
// reply) and guards conn and cfg; queues are their owners' (see Queue).
type Device struct {
	opts     Options
	mem      *memory
	ownMem   bool   // mem is the device's own, closed with it
	features uint64 // acked virtio features
	protocol uint64 // acked protocol features
	replyAck bool   // REPLY_ACK is on in the current session
	queues   []*Queue
	inflight struct {
		fd  int // -1: none
		msg proto.Inflight
	}
	configChanges chan struct{}

	mu struct {
		sync.Mutex
		conn *session
		cfg  proto.BlkConfig
	}
}

// session is one connection to the backend: its socket, the reader
// goroutine that hands replies over, and the backend request channel.
type session struct {
	c       *net.UnixConn
	replies chan proto.Message
	dead    chan struct{} // closed when the reader stops
	err     error         // why, set before dead is closed
	quit    chan struct{} // closed by close: the reader drops what it reads
	backend *net.UnixConn // our end of the backend request channel, or nil
	wg      sync.WaitGroup
}

// Dial connects to the backend at opts.Socket and sets the device up:
// features, guest memory, config, inflight region and queues, all
// enabled.
func Dial(opts Options) (*Device, error) {
	if opts.MemSize == 0 {
		opts.MemSize = 64 << 20
	}
	if opts.QueueSize == 0 {
		opts.QueueSize = 256
	}
	if opts.MaxSegments == 0 {
		opts.MaxSegments = 32
	}
	if opts.ReconnectTimeout == 0 {
		opts.ReconnectTimeout = 30 * time.Second
	}
	if opts.ReplyTimeout == 0 {
		opts.ReplyTimeout = 30 * time.Second
	}
	// From 4 up, the event fields of both rings sit 4-aligned, where the
	// queue reads and writes them as 32-bit words.
	if !proto.ValidQueueSize(opts.QueueSize) || opts.QueueSize < 4 {
		return nil, fmt.Errorf("queue size %d: want a power of two from 4 to %d", opts.QueueSize, proto.MaxQueueSize)
	}
	d := &Device{opts: opts, configChanges: make(chan struct{}, 1)}
	if opts.Memory != nil {
		d.mem = opts.Memory.m
	} else {
		mem, err := newMemory(opts.MemSize, SmallPages)
		if err != nil {
			return nil, err
		}
		d.mem, d.ownMem = mem, true
	}
	d.inflight.fd = -1
	s, err := d.connect()
	if err != nil {
		d.Close()
		return nil, err
	}
	d.mu.Lock()
	d.mu.conn = s
	err = d.setupLocked(true)
	d.mu.Unlock()
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// connect dials the socket and starts the reader.
func (d *Device) connect() (*session, error) {
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: d.opts.Socket, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("vhost-user %s: %w", d.opts.Socket, err)
	}
	s := &session{c: c, replies: make(chan proto.Message, 1), dead: make(chan struct{}), quit: make(chan struct{})}
	s.wg.Add(1)
	go s.read()
	return s, nil
}

// read hands every message of the socket to request, until the socket
// fails or ends.
func (s *session) read() {
	defer s.wg.Done()
	for {
		m, err := proto.ReadMessage(s.c)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("backend closed the connection: %w", err)
			}
			s.err = err
			close(s.dead)
			return
		}
		select {
		case s.replies <- m:
		case <-s.quit:
			for _, fd := range m.FDs {
				unix.Close(fd)
			}
		}
	}
}

func (s *session) close() {
	select {
	case <-s.quit: // closed already (a failed Reconnect, then Close)
	default:
		close(s.quit)
	}
	s.c.Close()
	if s.backend != nil {
		s.backend.Close()
	}
	s.wg.Wait()
	// A reply that arrived after its request gave up may hold fds.
	for {
		select {
		case m := <-s.replies:
			for _, fd := range m.FDs {
				unix.Close(fd)
			}
		default:
			return
		}
	}
}

// requestLocked sends a request and, when reply is true or the request
// has no reply of its own but REPLY_ACK is on, waits for its reply. A
// REPLY_ACK reply that is not 0 is an error. Caller holds d.mu.
func (d *Device) requestLocked(req proto.Request, payload []byte, fds []int, reply bool) (proto.Message, error) {
	s := d.mu.conn
	flags := uint32(proto.Version)
	ack := !reply && d.replyAck
	if ack {
		flags |= proto.FlagNeedReply
	}
	if err := proto.WriteMessage(s.c, proto.Message{Request: uint32(req), Flags: flags, Payload: payload, FDs: fds}); err != nil {
		return proto.Message{}, err
	}
	if !reply && !ack {
		return proto.Message{}, nil
	}
	timer := time.NewTimer(d.opts.ReplyTimeout)
	defer timer.Stop()
	select {
	case m := <-s.replies:
		if !m.IsReply() || m.Request != uint32(req) {
			for _, fd := range m.FDs {
				unix.Close(fd)
			}
			return proto.Message{}, fmt.Errorf("%v: got %v in reply", req, m)
		}
		if ack {
			v, err := proto.DecodeU64(m.Payload)
			if err != nil {
				return proto.Message{}, fmt.Errorf("%v reply: %w", req, err)
			}
			if v != 0 {
				return proto.Message{}, fmt.Errorf("%v: backend failed it (%d)", req, v)
			}
		}
		return m, nil
	case <-s.dead:
		return proto.Message{}, fmt.Errorf("%v: %w", req, s.err)
	case <-timer.C:
		return proto.Message{}, fmt.Errorf("%v: no reply within %v", req, d.opts.ReplyTimeout)
	}
}

// getU64 sends a request whose reply is a u64.
func (d *Device) getU64Locked(req proto.Request) (uint64, error) {
	m, err := d.requestLocked(req, nil, nil, true)
	if err != nil {
		return 0, err
	}
	v, err := proto.DecodeU64(m.Payload)
	if err != nil {
		return 0, fmt.Errorf("%v reply: %w", req, err)
	}
	return v, nil
}

// setupLocked negotiates and sets everything up on d.mu.conn. The first
// time (first) it also sizes the queues and allocates them and the
// inflight region; after a reconnect it sets up the same ones again.
func (d *Device) setupLocked(first bool) error {
	d.replyAck = false // until negotiated in this session
	offered, err := d.getU64Locked(proto.GetFeatures)
	if err != nil {
		return err
	}
	want, pWant := d.opts.wants()
	features := offered & want
	for _, b := range []uint{proto.VirtioFVersion1, proto.FProtocolFeatures} {
		if !proto.Has(features, b) {
			return fmt.Errorf("backend does not offer feature bit %d (offers %#x)", b, offered)
		}
	}
	if !first && features != d.features {
		return fmt.Errorf("backend offers features %#x after reconnect, had %#x acked", offered, d.features)
	}
	pOffered, err := d.getU64Locked(proto.GetProtocolFeatures)
	if err != nil {
		return err
	}
	protocol := pOffered & pWant
	if !proto.Has(protocol, proto.ProtocolConfig) {
		return fmt.Errorf("backend does not offer the CONFIG protocol feature (offers %#x)", pOffered)
	}
	if !first && protocol != d.protocol {
		return fmt.Errorf("backend offers protocol features %#x after reconnect", pOffered)
	}
	if _, err := d.requestLocked(proto.SetProtocolFeatures, proto.EncodeU64(protocol), nil, false); err != nil {
		return err
	}
	d.protocol = protocol
	d.features = features
	d.replyAck = proto.Has(protocol, proto.ProtocolReplyAck)
	if _, err := d.requestLocked(proto.SetOwner, nil, nil, false); err != nil {
		return err
	}
	maxQueues := 1
	if proto.Has(protocol, proto.ProtocolMQ) {
		n, err := d.getU64Locked(proto.GetQueueNum)
		if err != nil {
			return err
		}
		maxQueues = int(n)
	}
	if err := d.getConfigLocked(); err != nil {
		return err
	}
	if proto.Has(features, proto.BlkFMQ) && d.mu.cfg.NumQueues > 0 {
		maxQueues = min(maxQueues, int(d.mu.cfg.NumQueues))
	}
	if proto.Has(protocol, proto.ProtocolBackendReq) {
		if err := d.backendChannelLocked(); err != nil {
			return err
		}
	}
	if _, err := d.requestLocked(proto.SetFeatures, proto.EncodeU64(features), nil, false); err != nil {
		return err
	}
	region := proto.MemRegion{GuestAddr: 0, Size: uint64(len(d.mem.mem)), UserAddr: d.mem.base}
	table, err := proto.EncodeMemTable([]proto.MemRegion{region})
	if err != nil {
		return err
	}
	if _, err := d.requestLocked(proto.SetMemTable, table, []int{d.mem.fd}, false); err != nil {
		return err
	}
	if first {
		n := d.opts.Queues
		if n == 0 {
			n = maxQueues
		}
		if n < 1 || n > maxQueues {
			return fmt.Errorf("%d queues asked, the device has %d", n, maxQueues)
		}
		for i := 0; i < n; i++ {
			q, err := newQueue(d.mem, i, d.opts.QueueSize, d.opts.MaxSegments,
				proto.Has(features, proto.VirtioFRingEventIdx), proto.Has(features, proto.VirtioFRingIndirectDesc))
			if err != nil {
				return err
			}
			d.queues = append(d.queues, q)
		}
	}
	if proto.Has(protocol, proto.ProtocolInflightShmFD) {
		if err := d.inflightLocked(first); err != nil {
			return err
		}
	}
	for _, q := range d.queues {
		if err := d.startQueueLocked(q, first); err != nil {
			return err
		}
	}
	return nil
}

// getConfigLocked reads the config space.
func (d *Device) getConfigLocked() error {
	p, err := proto.Config{Data: make([]byte, proto.BlkConfigSize)}.Encode()
	if err != nil {
		return err
	}
	m, err := d.requestLocked(proto.GetConfig, p, nil, true)
	if err != nil {
		return err
	}
	c, err := proto.DecodeConfig(m.Payload)
	if err != nil {
		return fmt.Errorf("GET_CONFIG reply: %w", err)
	}
	if len(c.Data) < 36 {
		return fmt.Errorf("GET_CONFIG reply of %d bytes: the backend refused", len(c.Data))
	}
	d.mu.cfg = proto.DecodeBlkConfig(c.Data)
	return nil
}

// inflightLocked gets the inflight region the first time and hands it
// (the same one after a reconnect) to the backend.
func (d *Device) inflightLocked(first bool) error {
	if first {
		req := proto.Inflight{NumQueues: uint16(len(d.queues)), QueueSize: uint16(d.opts.QueueSize)}
		m, err := d.requestLocked(proto.GetInflightFD, req.Encode(), nil, true)
		if err != nil {
			return err
		}
		got, err := proto.DecodeInflight(m.Payload)
		if err != nil || len(m.FDs) != 1 {
			for _, fd := range m.FDs {
				unix.Close(fd)
			}
			return fmt.Errorf("GET_INFLIGHT_FD reply with %d fds: %v", len(m.FDs), err)
		}
		d.inflight.fd = m.FDs[0]
		d.inflight.msg = got
	}
	_, err := d.requestLocked(proto.SetInflightFD, d.inflight.msg.Encode(), []int{d.inflight.fd}, false)
	return err
}

// startQueueLocked sets one queue up on the backend and enables it. The
// base is the used index the device last published: after a reconnect
// with an inflight region the backend finds there what else is in
// flight; without one, the queue puts what is in flight back on the
// available ring from that index on (rewind) and kicks once enabled.
func (d *Device) startQueueLocked(q *Queue, first bool) error {
	idx := uint32(q.index)
	base := q.usedIdx()
	rewound := !first && !proto.Has(d.protocol, proto.ProtocolInflightShmFD)
	if rewound {
		base = q.rewind()
	}
	steps := []struct {
		req     proto.Request
		payload []byte
		fd      int
	}{
		{proto.SetVringNum, proto.VringState{Index: idx, Num: uint32(q.num)}.Encode(), -1},
		{proto.SetVringBase, proto.VringState{Index: idx, Num: uint32(base)}.Encode(), -1},
		{proto.SetVringAddr, proto.VringAddr{Index: idx, Desc: d.mem.base + q.descAddr, Used: d.mem.base + q.usedAddr, Avail: d.mem.base + q.availAddr}.Encode(), -1},
		{proto.SetVringKick, proto.EncodeU64(uint64(idx)), q.kick},
		{proto.SetVringCall, proto.EncodeU64(uint64(idx)), q.call},
		{proto.SetVringEnable, proto.VringState{Index: idx, Num: 1}.Encode(), -1},
	}
	for _, s := range steps {
		var fds []int
		if s.fd >= 0 {
			fds = []int{s.fd}
		}
		if _, err := d.requestLocked(s.req, s.payload, fds, false); err != nil {
			return fmt.Errorf("queue %d: %w", q.index, err)
		}
	}
	if rewound && q.availIdx != base {
		var one [8]byte
		one[0] = 1
		if _, err := unix.Write(q.kick, one[:]); err != nil {
			return fmt.Errorf("kick queue %d: %w", q.index, err)
		}
		q.kickedIdx = q.availIdx
	}
	return nil
}

// backendChannelLocked makes the backend request channel: a socket pair,
// one end sent with SET_BACKEND_REQ_FD, the other read by a goroutine
// that answers CONFIG_CHANGE_MSG by signalling ConfigChanges.
func (d *Device) backendChannelLocked() error {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("backend channel: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "vhost-user backend channel")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		unix.Close(fds[1])
		return fmt.Errorf("backend channel: %w", err)
	}
	_, err = d.requestLocked(proto.SetBackendReqFD, nil, []int{fds[1]}, false)
	unix.Close(fds[1])
	if err != nil {
		c.Close()
		return err
	}
	s := d.mu.conn
	s.backend = c.(*net.UnixConn)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			m, err := proto.ReadMessage(s.backend)
			if err != nil {
				return
			}
			for _, fd := range m.FDs {
				unix.Close(fd)
			}
			status := uint64(0)
			if proto.BackendRequest(m.Request) == proto.BackendConfigChangeMsg {
				select {
				case d.configChanges <- struct{}{}:
				default:
				}
			} else {
				status = 1
			}
			if m.NeedReply() {
				reply := proto.Message{Request: m.Request, Flags: proto.Version | proto.FlagReply, Payload: proto.EncodeU64(status)}
				if proto.WriteMessage(s.backend, reply) != nil {
					return
				}
			}
		}
	}()
	return nil
}
