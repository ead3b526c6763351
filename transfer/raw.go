package transfer

// Raw streams (stream.RawVersion): an encrypted disk sent as it is
// stored, its blocks' ciphertext with their tweaks and its key slot table,
// so neither side needs its key. The received disk has the sent disk's
// data key (the slots seal it), so it opens with the same keys, and a
// later incremental raw stream lands on it sharing its blocks.
//
// A raw stream moves whole blocks, so it goes only between stores of one
// block size (the receiver refuses others: send plaintext and receive
// --encrypt there). The changes image.Diff finds are widened to whole
// blocks; a zeroed range that does not cover its blocks is sent as those
// blocks' ciphertext. The base digest of an incremental raw stream is the
// plain one's (baseDigest) over the base's ciphertext and tweaks
// (rawDigest), of pieces of whole blocks, after the two bases were found
// to have the same key (their slot tables' check values).

import (
	"encoding/binary"
	"fmt"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/stream"
)

// ErrRaw: a raw stream cannot be sent or received as asked.
var ErrRaw = fmt.Errorf("transfer: raw stream refused")

// rawHeader makes h a raw stream's header for the encrypted disk d.
func rawHeader(h *stream.Header, d *image.Disk, bs int64) error {
	slots, ok := d.SlotTable()
	if !ok {
		return fmt.Errorf("a raw stream is of an encrypted disk, and this one is plain: %w", ErrRaw)
	}
	h.Raw, h.BlockSize, h.Slots = true, uint32(bs), slots
	return nil
}

// keyCheck is the key check value of an encoded slot table.
func keyCheck(slots string) ([16]byte, error) {
	t, err := crypt.DecodeSlotTable([]byte(slots))
	if err != nil {
		return [16]byte{}, err
	}
	return t.Check, nil
}

// rawBase checks that the base d has the key of the slot table slots and
// returns its raw digest.
func rawBase(d *image.Disk, slots string, bs int64) ([32]byte, error) {
	own, ok := d.SlotTable()
	if !ok {
		return [32]byte{}, fmt.Errorf("the base is a plain disk: %w", ErrRaw)
	}
	a, err := keyCheck(own)
	if err != nil {
		return [32]byte{}, err
	}
	b, err := keyCheck(slots)
	if err != nil {
		return [32]byte{}, err
	}
	if a != b {
		return [32]byte{}, fmt.Errorf("the base has another key than the disk: %w", ErrRaw)
	}
	return rawDigest(d, bs)
}

// rawDigest is baseDigest of d's ciphertext: pieces of whole blocks, each
// hashed as its offset, then for every piece ReadRaw found its offset,
// length, whether it is a hole and its tweak, then its bytes.
func rawDigest(d *image.Disk, bs int64) ([32]byte, error) {
	size := d.Size()
	end := (size + bs - 1) / bs * bs
	piece := (int64(digestPiece) + bs - 1) / bs * bs
	le := binary.LittleEndian
	var pieces []image.RawPiece
	var meta []byte
	return digest(size, end, piece, bs, func(b []byte, off int64) ([]byte, error) {
		var err error
		if pieces, err = d.ReadRaw(b, off, pieces[:0]); err != nil {
			return nil, fmt.Errorf("raw digest: %w", err)
		}
		meta = meta[:0]
		for _, p := range pieces {
			meta = le.AppendUint64(meta, uint64(p.Off))
			meta = le.AppendUint64(meta, uint64(p.Len))
			meta = append(meta, boolByte(p.Hole))
			meta = le.AppendUint64(meta, p.Tweak)
		}
		return meta, nil
	})
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// rawRange is a change widened to whole blocks: zeros only when the
// change zeroed all of them (or up to the size).
type rawRange struct {
	off, end int64
	zero     bool
}

// rawRanges widens changes (in order) to whole blocks of bs, merging those
// that then meet.
func rawRanges(changes []image.Change, bs, size int64) []rawRange {
	var out []rawRange
	for _, c := range changes {
		r := rawRange{off: c.Off / bs * bs, end: (c.Off + c.Len + bs - 1) / bs * bs}
		r.zero = c.Zero && r.off == c.Off && (r.end == c.Off+c.Len || c.Off+c.Len == size)
		// Ranges that share a block merge (data wins); ranges that meet
		// merge when they are of one kind.
		if n := len(out); n > 0 && (r.off < out[n-1].end || r.off == out[n-1].end && r.zero == out[n-1].zero) {
			last := &out[n-1]
			last.end = max(last.end, r.end)
			last.zero = last.zero && r.zero
			continue
		}
		out = append(out, r)
	}
	return out
}

// sendRaw writes the changes of the encrypted disk d as raw records.
func sendRaw(sw *stream.Writer, d *image.Disk, changes []image.Change, bs int64, st *Stats, progress func(done, total int64)) error {
	ranges := rawRanges(changes, bs, d.Size())
	var total int64
	for _, r := range ranges {
		if !r.zero {
			total += r.end - r.off
		}
	}
	buf := directio.AlignedBlock(int(max(chunk, bs)))
	var pieces []image.RawPiece
	for _, r := range ranges {
		if r.zero {
			if err := sw.Zero(r.off, r.end-r.off); err != nil {
				return err
			}
			st.ZeroBytes += r.end - r.off
			st.Records++
			continue
		}
		for off := r.off; off < r.end; {
			n := min(int64(len(buf)), r.end-off)
			var err error
			if pieces, err = d.ReadRaw(buf[:n], off, pieces[:0]); err != nil {
				return err
			}
			st.ReadBytes += n
			for _, p := range pieces {
				if p.Hole {
					err = sw.Zero(p.Off, p.Len)
					st.ZeroBytes += p.Len
					st.Records++
				} else {
					err = sw.RawData(p.Off, p.Tweak, buf[p.Off-off:p.Off-off+p.Len])
					st.DataBytes += p.Len
					st.Records += int((p.Len + stream.MaxData - 1) / stream.MaxData)
				}
				if err != nil {
					return err
				}
			}
			off += n
			if progress != nil {
				progress(st.DataBytes, total)
			}
		}
	}
	return sw.Close()
}

// rawAccepted checks that s takes the raw stream h: its block size, and
// no key asked for (the stream keeps its own).
func rawAccepted(s *image.Store, h stream.Header, o ReceiveOptions) error {
	if bs := s.Info().BlockSize; uint32(bs) != h.BlockSize {
		return fmt.Errorf("a raw stream of %d-byte blocks into a store of %d-byte blocks: send it plain and receive it with --encrypt: %w", h.BlockSize, bs, ErrRaw)
	}
	if o.Key != nil {
		return fmt.Errorf("a raw stream keeps the sent disk's key (its key slots): receive it without --encrypt, and unlock it with one of the sender's keys: %w", ErrRaw)
	}
	return nil
}

// startFrom makes d, a disk being received, read as base does, sharing
// its blocks, and gives it the stream's size. A raw stream's base is
// copied in whole blocks, the last one by its ciphertext: no key needed.
func startFrom(d, base *image.Disk, h stream.Header) error {
	n := base.Size()
	if h.Raw {
		bs := int64(h.BlockSize)
		n = n / bs * bs
		if tail := base.Size() - n; tail > 0 && n < h.Size {
			buf := directio.AlignedBlock(int(bs))
			pieces, err := base.ReadRaw(buf, n, nil)
			if err != nil {
				return err
			}
			if len(pieces) == 1 && !pieces[0].Hole {
				if err := d.WriteRaw(buf, n, pieces[0].Tweak); err != nil {
					return err
				}
			}
		}
	}
	if _, err := d.CopyFrom(base, 0, 0, n); err != nil {
		return err
	}
	return d.Truncate(h.Size)
}
