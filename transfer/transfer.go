// Package transfer sends a disk of a store as a stream (package stream)
// and receives one into another store: complete, or incremental from a
// snapshot both stores hold (the same identity, image.DiskInfo.UUID).
//
// Invariants:
//   - Send reads only the changed ranges image.Diff finds: for two
//     snapshots of one disk, what was written or punched between them.
//   - Receive makes the disk hidden (image.Store.CreateHidden) and names it
//     only once the whole stream has arrived and verified: a cut, damaged
//     or refused stream leaves no disk behind, and the store as clean as
//     before. A received disk is a read-only snapshot carrying the sent
//     disk's identity, so a later incremental stream from it can be
//     received on top (clone it with cp to write to it).
package transfer

import (
	"errors"
	"fmt"
	"io"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/stream"
)

// chunk is the size of Send's reads, one backend I/O each: 1 MiB, as a
// data record; larger ones measured slower (more memory to copy through).
const chunk = 1 << 20

// Stats say what a transfer moved.
type Stats struct {
	DataBytes   int64 // bytes of data records
	ZeroBytes   int64 // bytes the zero records cover
	Records     int
	Size        int64 // the disk's size
	Changes     int   // ranges image.Diff found (Send)
	ReadBytes   int64 // data Send read from the disk
	Compared    int64 // data image.Diff read to compare unrelated disks
	Incremental bool
}

// Send writes the disk name of s to w as a stream: complete, or with from
// the changes since the snapshot from, which must have an identity (a
// snapshot, or a disk received from a stream). progress, when not nil, is
// told the bytes sent so far and the bytes to send.
func Send(w io.Writer, s *image.Store, name, from string, progress func(done, total int64)) (Stats, error) {
	st, err := send(w, s, name, from, progress)
	if err != nil {
		return st, fmt.Errorf("send %q: %w", name, err)
	}
	return st, nil
}

func send(w io.Writer, s *image.Store, name, from string, progress func(done, total int64)) (Stats, error) {
	var st Stats
	nd, err := s.OpenDisk(name)
	if err != nil {
		return st, err
	}
	defer nd.Close()
	info, err := s.Stat(name)
	if err != nil {
		return st, err
	}
	h := stream.Header{Size: info.Size, Name: name, UUID: info.UUID}
	var od *image.Disk
	if from != "" {
		oi, err := s.Stat(from)
		if err != nil {
			return st, fmt.Errorf("--from: %w", err)
		}
		if oi.UUID == ([16]byte{}) {
			return st, fmt.Errorf("--from %q is not a snapshot: an incremental stream starts from a snapshot both stores hold", from)
		}
		if od, err = s.OpenDisk(from); err != nil {
			return st, fmt.Errorf("--from: %w", err)
		}
		defer od.Close()
		h.From, h.FromName = oi.UUID, from
		st.Incremental = true
	}
	changes, ds, err := image.Diff(od, nd)
	if err != nil {
		return st, err
	}
	st.Changes, st.Compared, st.Size = len(changes), ds.ComparedBytes, info.Size
	var total int64
	for _, c := range changes {
		if !c.Zero {
			total += c.Len
		}
	}
	sw, err := stream.NewWriter(w, h)
	if err != nil {
		return st, err
	}
	// A reader goroutine reads the next chunks while this one writes:
	// the disk's reads and the stream's writes overlap.
	chunks, done := make(chan readChunk, 2), make(chan struct{})
	defer close(done)
	go readChanges(nd, changes, chunks, done)
	for c := range chunks {
		if c.err != nil {
			return st, c.err
		}
		var err error
		if c.zero {
			err = sw.Zero(c.off, c.n)
			st.ZeroBytes += c.n
			st.Records++
		} else {
			err = sw.Data(c.off, c.buf[:c.n])
			st.ReadBytes += c.n
			st.DataBytes += c.n
			st.Records += int((c.n + stream.MaxData - 1) / stream.MaxData)
			if progress != nil {
				progress(st.DataBytes, total)
			}
		}
		if c.free != nil {
			c.free <- c.buf
		}
		if err != nil {
			return st, err
		}
	}
	return st, sw.Close()
}

// readChunk is a piece of a change, read (or a zero range), for Send's
// writer; free takes the buffer back.
type readChunk struct {
	off, n int64
	zero   bool
	buf    []byte
	free   chan []byte
	err    error
}

// readChanges reads the data of changes from d in chunks into three
// buffers that go round, and sends them in order on out, which it closes;
// it stops early when done closes.
func readChanges(d *image.Disk, changes []image.Change, out chan<- readChunk, done <-chan struct{}) {
	defer close(out)
	free := make(chan []byte, 3)
	for range 3 {
		free <- directio.AlignedBlock(chunk) // aligned: the planner reads into it directly
	}
	send := func(c readChunk) bool {
		select {
		case out <- c:
			return true
		case <-done:
			return false
		}
	}
	for _, c := range changes {
		if c.Zero {
			if !send(readChunk{off: c.Off, n: c.Len, zero: true}) {
				return
			}
			continue
		}
		for off := c.Off; off < c.Off+c.Len; {
			var buf []byte
			select {
			case buf = <-free:
			case <-done:
				return
			}
			n := min(int64(len(buf)), c.Off+c.Len-off)
			if k, err := d.ReadAt(buf[:n], off); int64(k) != n {
				send(readChunk{err: fmt.Errorf("read %d bytes at %d: %w", n, off, err)})
				return
			}
			if !send(readChunk{off: off, n: n, buf: buf, free: free}) {
				return
			}
			off += n
		}
	}
}

// Receive reads a stream from r into s as the disk name, a read-only
// snapshot with the sent disk's identity. An incremental stream starts
// from the receiver's copy of its base (the disk with the base's
// identity), shared, not copied. Nothing is created unless the whole
// stream verifies. progress, when not nil, is told the data bytes received
// so far.
func Receive(r io.Reader, s *image.Store, name string, progress func(done int64)) (Stats, error) {
	st, err := receive(r, s, name, progress)
	if err != nil {
		return st, fmt.Errorf("receive %q: %w", name, err)
	}
	return st, nil
}

func receive(r io.Reader, s *image.Store, name string, progress func(done int64)) (Stats, error) {
	var st Stats
	if err := image.ValidateName(name); err != nil {
		return st, err
	}
	if _, err := s.Stat(name); err == nil {
		return st, fmt.Errorf("a disk called %q exists: %w", name, image.ErrExist)
	}
	sr, err := stream.NewReader(r)
	if err != nil {
		return st, err
	}
	h := sr.Header()
	st.Size, st.Incremental = h.Size, h.Incremental()
	var base *image.Disk
	if h.Incremental() {
		baseName, ok := s.FindUUID(h.From)
		if !ok {
			return st, fmt.Errorf("the stream is incremental from snapshot %q (identity %x), which this store does not hold: receive a complete stream of it first", h.FromName, h.From)
		}
		if base, err = s.OpenDisk(baseName); err != nil {
			return st, err
		}
		defer base.Close()
	}
	d, err := s.CreateHidden(h.Size, image.Attr{Mode: 0o644})
	if err != nil {
		return st, err
	}
	defer d.Close() // deletes it unless published
	if base != nil {
		if _, err := d.CopyFrom(base, 0, 0, base.Size()); err != nil {
			return st, fmt.Errorf("start from %q: %w", h.FromName, err)
		}
		if err := d.Truncate(h.Size); err != nil {
			return st, err
		}
	}
	for {
		rec, err := sr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return st, err
		}
		st.Records++
		if rec.Zero {
			if err := d.Punch(rec.Off, rec.Len); err != nil {
				return st, err
			}
			st.ZeroBytes += rec.Len
			continue
		}
		if _, err := d.WriteAt(rec.Data, rec.Off); err != nil {
			return st, err
		}
		st.DataBytes += rec.Len
		if progress != nil {
			progress(st.DataBytes)
		}
	}
	if err := d.Publish(name, true, h.UUID); err != nil {
		return st, err
	}
	if err := s.Commit(); err != nil {
		return st, err
	}
	return st, nil
}
