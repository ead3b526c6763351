// Package transfer sends a disk of a store as a stream (package stream)
// and receives one into another store: complete, or incremental from a
// snapshot both stores hold (the same identity, image.DiskInfo.UUID).
//
// Invariants:
//   - Only a read-only snapshot is a base, on either side: Send refuses a
//     writable disk after --from, and Receive finds its base with
//     image.Store.FindUUID, which matches only snapshots. A snapshot's
//     content never changes, and a receiver's copy is made only from a
//     verified stream, so the identity names the same bytes in both
//     stores; the base's size and digest (baseDigest) in the header are
//     checked too, and a receiver whose copy differs refuses the stream,
//     naming the base.
//   - A stream is of one moment: a snapshot is sent as it is; any other
//     disk, when the store is in use (SendOptions.Live, a mount), from a
//     hidden snapshot taken first (image.Store.SnapshotHidden), deleted
//     when the send ends. Only a snapshot's identity travels.
//   - Send reads only the changed ranges image.Diff finds: for two
//     snapshots of one disk, what was written or punched between them.
//   - Receive makes the disk hidden (image.Store.CreateHidden) and names it
//     only once the whole stream has arrived and verified: a cut, damaged
//     or refused stream leaves no disk behind, and the store as clean as
//     before. A received disk is a read-only snapshot carrying the sent
//     disk's identity (a new one when it had none), so a later
//     incremental stream from it can be received on top (clone it with cp
//     to write to it), with the sent disk's permission bits (no setuid,
//     setgid or sticky bit), owner and times, or those ReceiveOptions say.
//     A version-1 stream carries no ownership: its disk is 0600 root:root.
package transfer

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/stream"
)

// chunk is the size of Send's reads, one backend I/O each: 1 MiB, as a
// data record; larger ones measured slower (more memory to copy through).
const chunk = 1 << 20

var (
	// ErrNotSnapshot: the base named for an incremental stream is not a
	// read-only snapshot.
	ErrNotSnapshot = errors.New("transfer: not a snapshot")
	// ErrNoBase: the receiver does not hold the base of an incremental
	// stream.
	ErrNoBase = errors.New("transfer: the stream's base is not in this store")
	// ErrBaseDiffers: the receiver's snapshot with the base's identity
	// does not have the sender's base's size or digest.
	ErrBaseDiffers = errors.New("transfer: this store's copy of the stream's base differs from the sender's")
)

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
	// Snapshot: the sent disk was a snapshot, so its identity went with
	// it and an incremental stream can later start from the received disk
	// (Send).
	Snapshot bool
}

// SendOptions say how to send.
type SendOptions struct {
	// From is the snapshot an incremental stream starts from; "" for a
	// complete stream.
	From string
	// Live: the store is in use (a mount), so a disk that is not a
	// snapshot may be written during the send: it is sent from a hidden
	// snapshot, taken first and deleted at the end. Without Live the
	// caller holds the store, and nothing writes to it.
	Live bool
	// Progress, when not nil, is told the data bytes sent so far and
	// those to send.
	Progress func(done, total int64)
	// Raw: send an encrypted disk as it is stored (raw.go): ciphertext,
	// tweaks and key slots, needing no key.
	Raw bool
}

// Send writes the disk name of s to w as a stream: complete, or with
// o.From the changes since that snapshot.
func Send(w io.Writer, s *image.Store, name string, o SendOptions) (Stats, error) {
	st, err := send(w, s, name, o)
	if err != nil {
		return st, fmt.Errorf("send %q: %w", name, err)
	}
	return st, nil
}

func send(w io.Writer, s *image.Store, name string, o SendOptions) (Stats, error) {
	var st Stats
	info, err := s.Stat(name)
	if err != nil {
		return st, err
	}
	var nd *image.Disk
	if !info.Snapshot && o.Live {
		nd, err = s.SnapshotHidden(name)
	} else {
		nd, err = s.OpenDisk(name)
	}
	if err != nil {
		return st, err
	}
	defer nd.Close()
	info = nd.Stat() // a hidden snapshot's: the disk as sent
	h := stream.Header{Size: info.Size, Name: name, Mode: info.Mode & 0o7777, UID: info.UID, GID: info.GID,
		Atime: info.Atime.UnixNano(), Mtime: info.Mtime.UnixNano()}
	if info.Snapshot {
		h.UUID, st.Snapshot = info.UUID, info.UUID != [16]byte{}
	}
	bs := int64(s.Info().BlockSize)
	if o.Raw {
		if err := rawHeader(&h, nd, bs); err != nil {
			return st, err
		}
	}
	var od *image.Disk
	if o.From != "" {
		oi, err := s.Stat(o.From)
		if err != nil {
			return st, fmt.Errorf("--from: %w", err)
		}
		if !oi.Snapshot || oi.UUID == ([16]byte{}) {
			what := "a writable disk"
			switch {
			case oi.Snapshot:
				what = "a snapshot without an identity"
			case oi.Clone:
				what = "a clone (writable)"
			}
			return st, fmt.Errorf("--from %q is %s, not a snapshot: an incremental stream starts only from a snapshot both stores hold, which cannot change (take one with vdisk snapshot, and send it): %w", o.From, what, ErrNotSnapshot)
		}
		if od, err = s.OpenDisk(o.From); err != nil {
			return st, fmt.Errorf("--from: %w", err)
		}
		defer od.Close()
		if o.Raw {
			h.FromDigest, err = rawBase(od, h.Slots, bs)
		} else {
			h.FromDigest, err = baseDigest(od)
		}
		if err != nil {
			return st, fmt.Errorf("--from %q: %w", o.From, err)
		}
		h.From, h.FromName, h.FromSize = oi.UUID, o.From, od.Size()
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
	if o.Raw {
		return st, sendRaw(sw, nd, changes, bs, &st, o.Progress)
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
			if o.Progress != nil {
				o.Progress(st.DataBytes, total)
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

// The base digest (stream.Header.FromDigest): SHA-256 of the base's size
// (u64, little-endian) followed, for each of digestPieces pieces of
// digestPiece bytes spread evenly over the disk (piece i of n at
// (size-digestPiece)*i/(n-1) rounded down to a multiple of 4096, but the
// last, which ends at the end), by its offset (u64) and its bytes; a disk no larger than
// digestPieces*digestPiece is one piece, all of it. It reads at most
// 1 MiB, whatever the size, from either side's own copy: content, not
// block addresses or layout, so stores with other block sizes agree.
const (
	digestPieces = 64
	digestPiece  = 16 << 10
)

// digestSpan is one piece a base digest reads.
type digestSpan struct{ off, n int64 }

// digestSpans are the pieces a base digest reads of total bytes: all of
// them when they are at most digestPieces pieces of piece bytes, else
// digestPieces pieces of piece bytes spread evenly, the offsets rounded
// down to a multiple of align, the last ending at the end.
func digestSpans(total, piece, align int64) []digestSpan {
	if total <= digestPieces*piece {
		return []digestSpan{{0, total}}
	}
	var out []digestSpan
	last := total - piece
	for i := range int64(digestPieces - 1) {
		out = append(out, digestSpan{off: (last * i / (digestPieces - 1)) / align * align, n: piece})
	}
	return append(out, digestSpan{off: last, n: piece})
}

// baseDigest computes the base digest of d.
func baseDigest(d *image.Disk) ([32]byte, error) {
	size := d.Size()
	return digest(size, size, digestPiece, 4096, func(b []byte, off int64) ([]byte, error) {
		if k, err := d.ReadAt(b, off); k != len(b) {
			return nil, fmt.Errorf("base digest: read %d bytes at %d: %w", len(b), off, err)
		}
		return nil, nil
	})
}

// digest is SHA-256 of size (u64, little-endian) followed, for each of
// digestSpans(total, piece, align), by its offset (u64), then the bytes
// read returns about it, then the bytes read put in b (the span).
func digest(size, total, piece, align int64, read func(b []byte, off int64) ([]byte, error)) ([32]byte, error) {
	le := binary.LittleEndian
	hash := sha256.New()
	hash.Write(le.AppendUint64(nil, uint64(size)))
	buf := directio.AlignedBlock(int(max(digestPieces*piece, align)))
	for _, sp := range digestSpans(total, piece, align) {
		if sp.n == 0 {
			break
		}
		b := buf[:sp.n]
		meta, err := read(b, sp.off)
		if err != nil {
			return [32]byte{}, err
		}
		hash.Write(le.AppendUint64(nil, uint64(sp.off)))
		hash.Write(meta)
		hash.Write(b)
	}
	var sum [32]byte
	hash.Sum(sum[:0])
	return sum, nil
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

// ReceiveOptions say how to receive.
type ReceiveOptions struct {
	// Mode, when not nil, is the received disk's permission bits (at most
	// 0777) instead of the stream's; UID and GID its owner instead of the
	// stream's.
	Mode, UID, GID *uint32
	// Progress, when not nil, is told the data bytes received so far.
	Progress func(done int64)
	// Key, when not nil, makes the received disk encrypted: under a new
	// data key sealed in a slot Key opens, or, for an incremental stream
	// whose base is encrypted, under the base's key, which Key must open
	// (it unlocks the base). A disk received on an encrypted base is
	// encrypted with it anyway, its key given or not.
	Key *crypt.Secret
}

// Receive reads a stream from r into s as the disk name, a read-only
// snapshot with the sent disk's identity, permission bits, owner and
// times (or o's). An incremental stream starts from the receiver's copy
// of its base (the snapshot with the base's identity, whose size and
// digest must be the sender's), shared, not copied. Nothing is created
// unless the whole stream verifies.
func Receive(r io.Reader, s *image.Store, name string, o ReceiveOptions) (Stats, error) {
	st, err := receive(r, s, name, o)
	if err != nil {
		return st, fmt.Errorf("receive %q: %w", name, err)
	}
	return st, nil
}

func receive(r io.Reader, s *image.Store, name string, o ReceiveOptions) (Stats, error) {
	var st Stats
	if err := image.ValidateName(name); err != nil {
		return st, err
	}
	if o.Mode != nil && *o.Mode&^0o777 != 0 {
		return st, fmt.Errorf("mode %#o: only permission bits (at most 0777): %w", *o.Mode, image.ErrInvalid)
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
	if h.Raw {
		if err := rawAccepted(s, h, o); err != nil {
			return st, err
		}
	}
	var base *image.Disk
	if h.Incremental() {
		if base, err = openBase(s, h, o.Key); err != nil {
			return st, err
		}
		defer base.Close()
	}
	attr := image.Attr{Mode: 0o600} // a version-1 stream's: root's, private
	if h.Version >= 2 {
		attr = image.Attr{Mode: h.Mode & 0o777, UID: h.UID, GID: h.GID}
	}
	if o.Mode != nil {
		attr.Mode = *o.Mode
	}
	if o.UID != nil {
		attr.UID = *o.UID
	}
	if o.GID != nil {
		attr.GID = *o.GID
	}
	var d *image.Disk
	if h.Raw {
		d, err = s.CreateHiddenRaw(h.Size, attr, h.Slots, base)
	} else {
		d, err = createFor(s, h.Size, attr, base, h.FromName, o.Key)
	}
	if err != nil {
		return st, err
	}
	defer d.Close() // deletes it unless published
	if base != nil {
		if err := startFrom(d, base, h); err != nil {
			return st, fmt.Errorf("start from %q: %w", h.FromName, err)
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
		if h.Raw {
			err = d.WriteRaw(rec.Data, rec.Off, rec.Tweak)
		} else {
			_, err = d.WriteAt(rec.Data, rec.Off)
		}
		if err != nil {
			return st, err
		}
		st.DataBytes += rec.Len
		if o.Progress != nil {
			o.Progress(st.DataBytes)
		}
	}
	if h.Version >= 2 {
		// The writes made the times now; the sender's go back.
		at, mt := time.Unix(0, h.Atime), time.Unix(0, h.Mtime)
		if err := d.SetAttr(image.AttrChange{Atime: &at, Mtime: &mt}); err != nil {
			return st, err
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

// createFor makes the hidden disk a stream is received into: plain, or
// encrypted under a new key opened by key, or, on an encrypted base (which
// openBase unlocked), under the base's key.
func createFor(s *image.Store, size int64, attr image.Attr, base *image.Disk, baseName string, key *crypt.Secret) (*image.Disk, error) {
	baseEncrypted := false
	if base != nil {
		baseEncrypted, _ = base.Encrypted()
	}
	switch {
	case baseEncrypted:
		return s.CreateHiddenEncrypted(size, attr, nil, base)
	case key != nil && base != nil:
		return nil, fmt.Errorf("an encrypted disk on the plain base %q: %w", baseName, image.ErrCrossKey)
	case key != nil:
		return s.CreateHiddenEncrypted(size, attr, key, nil)
	}
	return s.CreateHidden(size, attr)
}

// openBase opens the receiver's copy of the base of the incremental
// stream h: the snapshot with its identity, which must have the base's
// size and digest (a version-1 stream carries neither).
//
// An encrypted base is unlocked with key, when given: its digest is of its
// data.
func openBase(s *image.Store, h stream.Header, key *crypt.Secret) (*image.Disk, error) {
	name, ok := s.FindUUID(h.From)
	if !ok {
		return nil, fmt.Errorf("the stream is incremental from snapshot %q (identity %x), which this store does not hold as a snapshot: receive a complete stream of it first: %w", h.FromName, h.From, ErrNoBase)
	}
	if info, err := s.Stat(name); err == nil && info.Encrypted && key != nil && !h.Raw {
		if _, err := s.Unlock(name, key); err != nil {
			return nil, fmt.Errorf("base %q: %w", name, err)
		}
	}
	base, err := s.OpenDisk(name)
	if err != nil {
		return nil, err
	}
	if h.Version < 2 {
		return base, nil
	}
	differs := func(what string) (*image.Disk, error) {
		base.Close()
		return nil, fmt.Errorf("the stream is incremental from snapshot %q (identity %x), and this store's snapshot %q has that identity but %s: it is not a copy of the sender's base, and the stream is refused: %w", h.FromName, h.From, name, what, ErrBaseDiffers)
	}
	if size := base.Size(); size != h.FromSize {
		return differs(fmt.Sprintf("%d bytes, not %d", size, h.FromSize))
	}
	var sum [32]byte
	if h.Raw {
		sum, err = rawBase(base, h.Slots, int64(h.BlockSize))
	} else {
		sum, err = baseDigest(base)
	}
	if err != nil {
		base.Close()
		return nil, fmt.Errorf("base %q: %w", name, err)
	}
	if sum != h.FromDigest {
		return differs("other content (its digest differs)")
	}
	return base, nil
}
