package blk

import (
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
	"github.com/vdiskfs/vdiskfs/vhostuser/virtq"
)

// Request statuses: the virtio-blk ones, and statusPending for a request
// not answered yet.
const (
	statusOK      = proto.BlkSOK
	statusIOErr   = proto.BlkSIOErr
	statusUnsupp  = proto.BlkSUnsupp
	statusPending = 0xff
)

// request is one slot of a queue: the request taken from the ring into
// it, until it is returned. Its slices are reused from request to
// request. Only the owner touches it, or the one worker it was handed to.
type request struct {
	o     *owner
	slot  int
	chain virtq.Chain
	start time.Time

	op      int // opRead…opGetID; -1: not counted (unsupported or bad)
	off     int64
	status  byte
	written uint32 // bytes written into the data buffers (IN, GET_ID)
	bytes   uint64 // bytes the request covers, for the counters

	// pieces is the request's data: slices of guest memory, each
	// contiguous in the guest's and in this process's address space.
	pieces [][]byte
	// stage, for a read or write whose pieces are several, is one
	// buffer of the request's size (from device.stages) that the store
	// reads into or writes from in their place, so that it plans one
	// range instead of one per piece (a guest's buffer is scattered over
	// its pages): a write's pieces are copied in before it is planned, a
	// read's copied out once it has succeeded (unless direct). nil
	// otherwise.
	stage []byte
	one   [1][]byte // data's slice when staged: one[0] == stage
	// direct, for a staged request of large aligned pieces: the stage is
	// only the range the store plans, and the backing I/O goes straight
	// from and into the pieces as vectored I/O (iov), unless the owner
	// finds the plan cannot (undirect): a write's pieces are not copied
	// in, a read's not copied out. iov holds the vectors of its I/Os in
	// flight.
	direct bool
	iov    []unix.Iovec
	// The owner's plans: one IO per piece while the request is planned.
	ios     []IO
	pending int  // backing I/Os in flight
	failed  bool // one of them failed or came back short
	// committed: a completed write the committer made recoverable, to
	// be returned now.
	committed bool
}

// data is what the store reads into or writes from: the stage, or the
// pieces.
func (r *request) data() [][]byte {
	if r.stage != nil {
		return r.one[:]
	}
	return r.pieces
}

// stageIn gives a read or write of several pieces a stage, if it is not
// too large for one. The request is direct when its range and every piece
// are aligned for vectored I/O; otherwise a write's pieces are copied in.
func (r *request) stageIn(d *device) {
	if len(r.pieces) < 2 || r.bytes > maxStaged || (r.op != opRead && r.op != opWrite) {
		return
	}
	r.stage = d.stages.Get(int(r.bytes))
	r.one[0] = r.stage
	r.direct = r.vectorable(d.vectorAlign)
	if !r.direct {
		r.fill(d)
	}
}

// vectorable says whether r's range and pieces are multiples of align
// (0: never), the pieces large enough on average (vectorMinPiece), and
// few enough for the vectors of its I/Os (r.iov).
func (r *request) vectorable(align uint64) bool {
	if align == 0 || uint64(r.off)%align != 0 || r.bytes%align != 0 || len(r.pieces) > maxPieces ||
		r.bytes < vectorMinPiece*uint64(len(r.pieces)) {
		return false
	}
	for _, p := range r.pieces {
		if uint64(uintptr(unsafe.Pointer(unsafe.SliceData(p))))%align != 0 || uint64(len(p))%align != 0 {
			return false
		}
	}
	return true
}

// fill copies a staged write's pieces into its stage.
func (r *request) fill(d *device) {
	if r.op != opWrite {
		return
	}
	n := 0
	for _, p := range r.pieces {
		n += copy(r.stage[n:], p)
	}
	d.st.staged.Add(1)
}

// undirect makes a direct request staged like any other, before it is
// planned or served again through its stage: a write's pieces are copied
// in (guest memory still holds them; a read's are copied out at unstage).
func (r *request) undirect(d *device) {
	if r.direct {
		r.direct = false
		r.fill(d)
	}
}

// vectors appends to r.iov the vectors of the request's bytes [at,
// at+n), across its pieces, and returns them. r.iov has room for every
// I/O of a plan (issueDirect): it is never reallocated while I/O is in
// flight.
func (r *request) vectors(at, n int) []unix.Iovec {
	start, pos := len(r.iov), 0
	for _, p := range r.pieces {
		if n == 0 {
			break
		}
		if pos+len(p) <= at {
			pos += len(p)
			continue
		}
		lo := at - pos
		k := min(len(p)-lo, n)
		r.iov = append(r.iov, unix.Iovec{Base: &p[lo], Len: uint64(k)})
		at, n, pos = at+k, n-k, pos+len(p)
	}
	return r.iov[start:]
}

// unstage gives r's stage back, if it has one, after copying it out to
// the pieces of a read when ok (the read succeeded) and not direct. The
// owner calls it as it completes r, whoever served it.
func (r *request) unstage(d *device, ok bool) {
	if r.stage == nil {
		return
	}
	if ok && r.op == opRead && !r.direct {
		scatterCopy(r.pieces, r.stage)
		d.st.staged.Add(1)
	}
	d.stages.Put(r.stage)
	r.stage, r.one[0], r.direct = nil, nil, false
}

// statusByte is the request's status: the last byte of its last writable
// buffer, or nil if it has none.
func (r *request) statusByte() []byte {
	b := r.chain.LastWrite
	if len(b) == 0 {
		return nil
	}
	return b[len(b)-1:]
}

// parse reads r's header and sets out its data. A malformed request is an
// error (answered IOERR); one the device answers without I/O (GET_ID,
// unsupported, out of range) comes back with its status set; others with
// statusPending.
func (r *request) parse(d *device) error {
	c := &r.chain
	r.op, r.status, r.written, r.bytes, r.pieces = -1, statusPending, 0, 0, r.pieces[:0]
	r.committed = false
	if c.ReadLen < proto.BlkOutHdrSize || c.WriteLen < proto.BlkStatusSize {
		return fmt.Errorf("request of %d readable and %d writable bytes: %w", c.ReadLen, c.WriteLen, errBadRequest)
	}
	var hdr [proto.BlkOutHdrSize]byte
	gatherCopy(hdr[:], c.Bufs[:c.NumRead])
	h, err := proto.DecodeBlkOutHdr(hdr[:])
	if err != nil {
		return fmt.Errorf("%v: %w", err, errBadRequest)
	}
	typ := h.Type
	readData := c.ReadLen - proto.BlkOutHdrSize
	writeData := c.WriteLen - proto.BlkStatusSize
	switch typ {
	case proto.BlkTIn, proto.BlkTOut:
		r.op = opRead
		n := writeData
		r.pieces = gather(r.pieces, c.Bufs[c.NumRead:], 0, n)
		if typ == proto.BlkTOut {
			r.op, n = opWrite, readData
			r.pieces = gather(r.pieces[:0], c.Bufs[:c.NumRead], proto.BlkOutHdrSize, n)
		}
		r.bytes = n
		size := uint64(d.disk.Size())
		// Data in the wrong direction: readable buffers after a read's
		// header, writable ones before a write's status.
		wrongWay := typ == proto.BlkTIn && readData != 0 || typ == proto.BlkTOut && writeData != 0
		if wrongWay || n%proto.SectorSize != 0 || !inDisk(h.Sector, n, size) {
			r.status = statusIOErr // the driver's mistake, answered like a device's error
			return nil
		}
		r.off = int64(h.Sector * proto.SectorSize)
		if r.op == opRead {
			r.written = uint32(n)
		}
	case proto.BlkTFlush:
		r.op = opFlush
	case proto.BlkTGetID:
		r.op = opGetID
		r.pieces = gather(r.pieces, c.Bufs[c.NumRead:], 0, min(writeData, proto.BlkIDBytes))
		r.written = uint32(scatterCopy(r.pieces, d.id[:]))
		r.status = statusOK
	case proto.BlkTDiscard, proto.BlkTWriteZeroes:
		r.op = opDiscard
		if typ == proto.BlkTWriteZeroes {
			r.op = opWriteZeroes
		}
		if readData == 0 || readData%proto.BlkSegSize != 0 || readData/proto.BlkSegSize > maxDiscardSeg {
			r.status = statusIOErr
			return nil
		}
		r.pieces = gather(r.pieces, c.Bufs[:c.NumRead], proto.BlkOutHdrSize, readData)
	default:
		r.status = statusUnsupp
	}
	return nil
}

// inDisk reports whether n bytes from sector lie inside a disk of size
// bytes, without overflow for any sector.
func inDisk(sector, n, size uint64) bool {
	return sector <= size/proto.SectorSize && n <= size-sector*proto.SectorSize
}

// gather appends to dst the n bytes of bufs after the first skip, as
// pieces: buffers next to each other in both address spaces are one.
func gather(dst [][]byte, bufs []virtq.Buf, skip, n uint64) [][]byte {
	var lastAddr uint64
	for _, b := range bufs {
		if n == 0 {
			break
		}
		data, addr := b.Data, b.Addr
		if skip >= uint64(len(data)) {
			skip -= uint64(len(data))
			continue
		}
		data, addr = data[skip:], addr+skip
		skip = 0
		if uint64(len(data)) > n {
			data = data[:n]
		}
		n -= uint64(len(data))
		if k := len(dst); k > 0 && lastAddr == addr && adjacent(dst[k-1], data) {
			dst[k-1] = unsafe.Slice(unsafe.SliceData(dst[k-1]), len(dst[k-1])+len(data))
		} else {
			dst = append(dst, data)
		}
		lastAddr = addr + uint64(len(data))
	}
	return dst
}

// adjacent says whether b starts where a ends in this process's memory.
func adjacent(a, b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(a)))+uintptr(len(a)) == uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// gatherCopy fills dst from the start of bufs.
func gatherCopy(dst []byte, bufs []virtq.Buf) {
	for _, b := range bufs {
		if len(dst) == 0 {
			return
		}
		dst = dst[copy(dst, b.Data):]
	}
}

// scatterCopy copies src into pieces and returns how many bytes it copied.
func scatterCopy(pieces [][]byte, src []byte) int {
	n := 0
	for _, p := range pieces {
		k := copy(p, src[n:])
		n += k
		if n == len(src) {
			break
		}
	}
	return n
}
