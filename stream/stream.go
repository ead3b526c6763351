// Package stream is the byte format of `vdisk send` and `vdisk receive`:
// one disk's contents, complete or as the changes from a snapshot the
// receiver already holds, as a sequence of checksummed records that can go
// through a pipe (no seeking, no size known in advance).
//
// A stream is a header, then data and zero records in increasing offset
// order (not overlapping), then an end record. Every part carries a
// CRC-32C, and the end record counts the records and data bytes before it,
// so a cut stream (no end record) and a damaged one (a checksum, an order
// or a count that does not hold) are both detected: a Reader returns an
// error wrapping ErrCorrupt or ErrTruncated, never a record it has not
// verified. FORMAT.md ("Send stream") gives the bytes.
package stream

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/ncw/directio"
)

// Version is the stream format this package writes and reads.
const Version = 1

// MaxData is the largest data record: a Writer splits larger ranges.
const MaxData = 1 << 20

var (
	// ErrCorrupt: a checksum, the record order or the counts do not hold.
	ErrCorrupt = errors.New("stream is corrupt")
	// ErrTruncated: the stream ended before its end record.
	ErrTruncated = errors.New("stream is cut short")
	// ErrVersion: a stream of a format version this build does not read.
	ErrVersion = errors.New("unsupported stream version")
)

var (
	magic = [8]byte{'V', 'D', 'S', 'E', 'N', 'D', 0, 0}
	table = crc32.MakeTable(crc32.Castagnoli)
)

// Record types.
const (
	recData = 1 // Len bytes of data at Off follow
	recZero = 2 // [Off, Off+Len) reads zeros
	recEnd  = 3 // the end: counts of what came before
)

// Header describes the disk a stream carries.
type Header struct {
	// Size is the disk's size in bytes.
	Size int64
	// Name is the sending disk's name (informational: the receiver names
	// the disk itself).
	Name string
	// UUID is the sent disk's identity; From is the identity of the
	// snapshot an incremental stream starts from, zero for a complete
	// stream (which starts from an empty disk).
	UUID, From [16]byte
	// FromName is the name of From on the sender (informational).
	FromName string
}

// Incremental reports whether the stream holds only changes from From.
func (h *Header) Incremental() bool { return h.From != [16]byte{} }

// Record is one data or zero record.
type Record struct {
	Off, Len int64
	Zero     bool
	Data     []byte // Len bytes for a data record (valid until the next Next)
}

// A Writer writes a stream. Records must come in increasing, not
// overlapping, offset order; Close writes the end record.
type Writer struct {
	w       *bufio.Writer
	next    int64 // the lowest offset the next record may have
	records uint64
	bytes   uint64
	err     error
}

// NewWriter writes h to w and returns a Writer for the records.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if len(h.Name) > 0xffff || len(h.FromName) > 0xffff || h.Size < 0 {
		return nil, fmt.Errorf("stream header: name or size out of range")
	}
	sw := &Writer{w: bufio.NewWriterSize(w, 256<<10)}
	le := binary.LittleEndian
	b := append([]byte(nil), magic[:]...)
	b = le.AppendUint32(b, Version)
	b = le.AppendUint64(b, uint64(h.Size))
	b = append(b, h.UUID[:]...)
	b = append(b, h.From[:]...)
	b = le.AppendUint16(b, uint16(len(h.Name)))
	b = append(b, h.Name...)
	b = le.AppendUint16(b, uint16(len(h.FromName)))
	b = append(b, h.FromName...)
	b = le.AppendUint32(b, crc32.Checksum(b, table))
	sw.write(b)
	return sw, sw.err
}

func (sw *Writer) write(b []byte) {
	if sw.err == nil {
		_, sw.err = sw.w.Write(b)
	}
}

// record writes one record: type, offset, length, the data, the CRC-32C of
// all of those.
func (sw *Writer) record(typ byte, off, n int64, data []byte) error {
	if sw.err != nil {
		return sw.err
	}
	if off < sw.next || n <= 0 {
		return fmt.Errorf("stream: record [%d,+%d) out of order (next offset %d)", off, n, sw.next)
	}
	var hdr [17]byte
	hdr[0] = typ
	binary.LittleEndian.PutUint64(hdr[1:], uint64(off))
	binary.LittleEndian.PutUint64(hdr[9:], uint64(n))
	sum := crc32.Update(crc32.Checksum(hdr[:], table), table, data)
	sw.write(hdr[:])
	sw.write(data)
	sw.write(binary.LittleEndian.AppendUint32(nil, sum))
	sw.next = off + n
	sw.records++
	sw.bytes += uint64(len(data))
	return sw.err
}

// Data writes p as the bytes at off, in records of at most MaxData.
func (sw *Writer) Data(off int64, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxData)
		if err := sw.record(recData, off, int64(n), p[:n]); err != nil {
			return err
		}
		off, p = off+int64(n), p[n:]
	}
	return nil
}

// Zero writes that [off, off+n) reads zeros.
func (sw *Writer) Zero(off, n int64) error { return sw.record(recZero, off, n, nil) }

// Close writes the end record and flushes. It does not close the
// underlying writer.
func (sw *Writer) Close() error {
	if sw.err != nil {
		return sw.err
	}
	le := binary.LittleEndian
	b := []byte{recEnd}
	b = le.AppendUint64(b, sw.records)
	b = le.AppendUint64(b, sw.bytes)
	b = le.AppendUint32(b, crc32.Checksum(b, table))
	sw.write(b)
	if sw.err == nil {
		sw.err = sw.w.Flush()
	}
	return sw.err
}

// A Reader reads a stream, verifying each part before returning it.
type Reader struct {
	r       *bufio.Reader
	h       Header
	next    int64
	records uint64
	bytes   uint64
	buf     []byte
	done    bool
}

// NewReader reads and verifies the header.
func NewReader(r io.Reader) (*Reader, error) {
	sr := &Reader{r: bufio.NewReaderSize(r, 256<<10)}
	var fixed [8 + 4 + 8 + 16 + 16 + 2]byte
	if err := sr.full(fixed[:], "header"); err != nil {
		return nil, err
	}
	if !bytes.Equal(fixed[:8], magic[:]) {
		return nil, fmt.Errorf("not a vdisk send stream (magic %q): %w", fixed[:8], ErrCorrupt)
	}
	le := binary.LittleEndian
	if v := le.Uint32(fixed[8:]); v != Version {
		return nil, fmt.Errorf("stream format version %d, this build reads %d: %w", v, Version, ErrVersion)
	}
	sum := crc32.Checksum(fixed[:], table)
	h := &sr.h
	h.Size = int64(le.Uint64(fixed[12:]))
	copy(h.UUID[:], fixed[20:36])
	copy(h.From[:], fixed[36:52])
	name, err := sr.name(le.Uint16(fixed[52:]), &sum)
	if err != nil {
		return nil, err
	}
	h.Name = name
	var l [2]byte
	if err := sr.full(l[:], "header"); err != nil {
		return nil, err
	}
	sum = crc32.Update(sum, table, l[:])
	if h.FromName, err = sr.name(le.Uint16(l[:]), &sum); err != nil {
		return nil, err
	}
	var c [4]byte
	if err := sr.full(c[:], "header"); err != nil {
		return nil, err
	}
	if le.Uint32(c[:]) != sum {
		return nil, fmt.Errorf("stream header checksum: %w", ErrCorrupt)
	}
	if h.Size < 0 {
		return nil, fmt.Errorf("stream header: disk size %d: %w", h.Size, ErrCorrupt)
	}
	return sr, nil
}

func (sr *Reader) name(n uint16, sum *uint32) (string, error) {
	b := make([]byte, n)
	if err := sr.full(b, "header"); err != nil {
		return "", err
	}
	*sum = crc32.Update(*sum, table, b)
	return string(b), nil
}

// full reads exactly len(p) bytes; a stream that ends first is truncated.
func (sr *Reader) full(p []byte, what string) error {
	if _, err := io.ReadFull(sr.r, p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("stream ends inside the %s: %w", what, ErrTruncated)
		}
		return fmt.Errorf("read stream: %w", err)
	}
	return nil
}

// Header is the stream's header.
func (sr *Reader) Header() Header { return sr.h }

// Next returns the next record, verified, or io.EOF after a verified end
// record. A record's Data is valid until the next call.
func (sr *Reader) Next() (Record, error) {
	if sr.done {
		return Record{}, io.EOF
	}
	var typ [1]byte
	if err := sr.full(typ[:], "records"); err != nil {
		return Record{}, err
	}
	le := binary.LittleEndian
	switch typ[0] {
	case recData, recZero:
		var hdr [17]byte
		hdr[0] = typ[0]
		if err := sr.full(hdr[1:], "records"); err != nil {
			return Record{}, err
		}
		rec := Record{Off: int64(le.Uint64(hdr[1:])), Len: int64(le.Uint64(hdr[9:])), Zero: typ[0] == recZero}
		if rec.Len <= 0 || rec.Off < sr.next || rec.Off+rec.Len < rec.Off || rec.Off+rec.Len > sr.h.Size ||
			!rec.Zero && rec.Len > MaxData {
			return Record{}, fmt.Errorf("stream record %d [%d,+%d) is out of order or out of range: %w", sr.records, rec.Off, rec.Len, ErrCorrupt)
		}
		sum := crc32.Checksum(hdr[:], table)
		if !rec.Zero {
			if cap(sr.buf) < int(rec.Len) {
				// Aligned for O_DIRECT, so that a receiver's write goes
				// to the backing without a bounce buffer.
				sr.buf = directio.AlignedBlock(int(rec.Len+4095) &^ 4095)
			}
			rec.Data = sr.buf[:rec.Len]
			if err := sr.full(rec.Data, "records"); err != nil {
				return Record{}, err
			}
			sum = crc32.Update(sum, table, rec.Data)
		}
		var c [4]byte
		if err := sr.full(c[:], "records"); err != nil {
			return Record{}, err
		}
		if le.Uint32(c[:]) != sum {
			return Record{}, fmt.Errorf("stream record %d at %d: checksum: %w", sr.records, rec.Off, ErrCorrupt)
		}
		sr.next = rec.Off + rec.Len
		sr.records++
		sr.bytes += uint64(len(rec.Data))
		return rec, nil
	case recEnd:
		var b [1 + 8 + 8 + 4]byte
		b[0] = recEnd
		if err := sr.full(b[1:], "end record"); err != nil {
			return Record{}, err
		}
		if crc32.Checksum(b[:17], table) != le.Uint32(b[17:]) {
			return Record{}, fmt.Errorf("stream end record checksum: %w", ErrCorrupt)
		}
		if n, k := le.Uint64(b[1:]), le.Uint64(b[9:]); n != sr.records || k != sr.bytes {
			return Record{}, fmt.Errorf("stream end record counts %d records and %d bytes, the stream held %d and %d: %w", n, k, sr.records, sr.bytes, ErrCorrupt)
		}
		if _, err := sr.r.ReadByte(); err == nil {
			return Record{}, fmt.Errorf("bytes after the stream's end record: %w", ErrCorrupt)
		}
		sr.done = true
		return Record{}, io.EOF
	default:
		return Record{}, fmt.Errorf("stream record %d: unknown type %d: %w", sr.records, typ[0], ErrCorrupt)
	}
}
