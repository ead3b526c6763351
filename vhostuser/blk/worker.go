package blk

import (
	"errors"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// errBadRequest: a request whose layout breaks the virtio-blk rules.
var errBadRequest = errors.New("vhostuser/blk: bad request")

// serveBlocking serves r on a worker: what may block (FLUSH, DISCARD,
// WRITE_ZEROES) and reads and writes the owner could not plan, or whose
// planned I/O failed, which the blocking path then reports.
func (d *device) serveBlocking(r *request) {
	var err error
	switch r.op {
	case opRead, opWrite:
		off := r.off
		for _, p := range r.data() {
			if r.op == opRead {
				_, err = d.disk.ReadAt(p, off)
			} else {
				_, err = d.disk.WriteAt(p, off)
			}
			if err != nil {
				break
			}
			off += int64(len(p))
		}
	case opFlush:
		err = d.disk.Flush()
	case opDiscard, opWriteZeroes:
		err = d.zeroSegments(r)
	}
	switch {
	case errors.Is(err, errUnsupported):
		r.status = statusUnsupp
	case err != nil:
		r.status = statusIOErr
		d.log.WithError(err).WithFields(logrus.Fields{"op": opNames[r.op], "offset": r.off}).Warn("vhost-user: request failed")
	default:
		r.status = statusOK
	}
}

// errUnsupported: a DISCARD or WRITE_ZEROES with flags the device does
// not take (VIRTIO_BLK_S_UNSUPP).
var errUnsupported = errors.New("vhostuser/blk: unsupported flags")

var opNames = [numOps]string{"read", "write", "flush", "discard", "write-zeroes", "get-id"}

// zeroSegments serves a DISCARD or WRITE_ZEROES: every segment of its data.
func (d *device) zeroSegments(r *request) error {
	size := uint64(d.disk.Size())
	var seg [proto.BlkSegSize]byte
	pieces := r.pieces
	pos := 0
	r.bytes = 0
	for {
		// The next segment, across pieces if it must.
		n := 0
		for n < len(seg) && len(pieces) > 0 {
			k := copy(seg[n:], pieces[0][pos:])
			n, pos = n+k, pos+k
			if pos == len(pieces[0]) {
				pieces, pos = pieces[1:], 0
			}
		}
		if n == 0 {
			return nil
		}
		sg, err := proto.DecodeBlkSeg(seg[:n])
		if err != nil {
			return fmt.Errorf("%v: %w", err, errBadRequest)
		}
		sector, num := sg.Sector, uint64(sg.NumSectors)
		unmap := sg.Flags&proto.BlkSegFlagUnmap != 0
		if sg.Flags&^proto.BlkSegFlagUnmap != 0 || r.op == opDiscard && unmap {
			return fmt.Errorf("segment flags %#x: %w", sg.Flags, errUnsupported)
		}
		if num > maxDiscardSectors || !inDisk(sector, num*proto.SectorSize, size) {
			return fmt.Errorf("segment of %d sectors at %d past the disk's %d bytes: %w", num, sector, size, errBadRequest)
		}
		off, length := int64(sector*proto.SectorSize), int64(num*proto.SectorSize)
		if r.op == opDiscard {
			err = d.disk.Discard(off, length)
		} else {
			err = d.disk.WriteZeroes(off, length, unmap)
		}
		if err != nil {
			return err
		}
		r.bytes += uint64(length)
	}
}
