// Package stream is the byte format of `vdisk send` and `vdisk receive`:
// one disk's contents, complete or as the changes from a snapshot the
// receiver already holds, as a sequence of checksummed records that can go
// through a pipe (no seeking, no size known in advance). The header says
// the disk's size, identity, mode, owner and times, and for an incremental
// stream its base's identity, size and content digest.
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

// Version is the stream format this package writes. A Reader reads it and
// version 1, which has no ownership and no base check (Header.Version),
// and RawVersion.
const Version = 2

// RawVersion is the format of a raw stream (Header.Raw): an encrypted
// disk's ciphertext, each block with its tweak, and its key slot table,
// which needs no key to send or receive. Only a raw stream is version 3.
const RawVersion = 3

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
	recRaw  = 4 // raw streams: Len bytes of ciphertext at Off follow, block Off/BlockSize with tweak Tweak, the next blocks' following
)

// Header describes the disk a stream carries.
type Header struct {
	// Version is the stream's format version: what a Reader read; for a
	// Writer, Version when zero (1 writes a version-1 stream, without the
	// fields marked "version 2", for tests of receivers).
	Version int
	// Size is the disk's size in bytes.
	Size int64
	// Name is the sending disk's name (informational: the receiver names
	// the disk itself).
	Name string
	// UUID is the sent disk's identity (a snapshot's; zero for a disk that
	// has none); From is the identity of the snapshot an incremental
	// stream starts from, zero for a complete stream (which starts from an
	// empty disk).
	UUID, From [16]byte
	// FromName is the name of From on the sender (informational).
	FromName string
	// Mode (permission bits), UID and GID are the sent disk's, and Atime
	// and Mtime its times in Unix nanoseconds (version 2).
	Mode, UID, GID uint32
	Atime, Mtime   int64
	// FromSize is the base's size in bytes and FromDigest a digest of its
	// content that sender and receiver compute alike (package transfer),
	// for an incremental stream (version 2; zero otherwise).
	FromSize   int64
	FromDigest [32]byte
	// Raw (version 3): the records are ciphertext of whole blocks of
	// BlockSize bytes, each run with its first block's tweak, and Slots is
	// the disk's encoded key slot table (package crypt). FromDigest is
	// then of the base's ciphertext and tweaks (package transfer).
	Raw       bool
	BlockSize uint32
	Slots     string
}

// Incremental reports whether the stream holds only changes from From.
func (h *Header) Incremental() bool { return h.From != [16]byte{} }

// Header layout (FORMAT.md, "Send stream"): the fixed part after magic and
// version, by version; then two names of 2 + n bytes, then the CRC-32C.
const (
	fixedV1 = 8 + 16 + 16                          // size, uuid, from
	fixedV2 = fixedV1 + 4 + 4 + 4 + 8 + 8 + 8 + 32 // mode, uid, gid, atime, mtime, from size, from digest
	fixedV3 = fixedV2 + 4                          // block size; the slot table follows the names
)

// Record is one data or zero record.
type Record struct {
	Off, Len int64
	Zero     bool
	Data     []byte // Len bytes for a data record (valid until the next Next)
	// Tweak is a raw stream's data record's first block's tweak.
	Tweak uint64
}

// A Writer writes a stream. Records must come in increasing, not
// overlapping, offset order; Close writes the end record.
type Writer struct {
	w       *bufio.Writer
	bs      int64 // a raw stream's block size; 0 otherwise
	next    int64 // the lowest offset the next record may have
	records uint64
	bytes   uint64
	err     error
}

// NewWriter writes h to w and returns a Writer for the records.
func NewWriter(w io.Writer, h Header) (*Writer, error) {
	if h.Version == 0 {
		h.Version = Version
	}
	if h.Raw {
		h.Version = RawVersion
	}
	if len(h.Name) > 0xffff || len(h.FromName) > 0xffff || len(h.Slots) > 0xffff || h.Size < 0 || h.FromSize < 0 ||
		h.Version < 1 || h.Version > RawVersion || h.Version == RawVersion && !validBlockSize(h.BlockSize) {
		return nil, fmt.Errorf("stream header: version, name, size or block size out of range")
	}
	sw := &Writer{w: bufio.NewWriterSize(w, 256<<10)}
	if h.Raw {
		sw.bs = int64(h.BlockSize)
	}
	le := binary.LittleEndian
	b := append([]byte(nil), magic[:]...)
	b = le.AppendUint32(b, uint32(h.Version))
	b = le.AppendUint64(b, uint64(h.Size))
	b = append(b, h.UUID[:]...)
	b = append(b, h.From[:]...)
	if h.Version >= 2 {
		b = le.AppendUint32(b, h.Mode)
		b = le.AppendUint32(b, h.UID)
		b = le.AppendUint32(b, h.GID)
		b = le.AppendUint64(b, uint64(h.Atime))
		b = le.AppendUint64(b, uint64(h.Mtime))
		b = le.AppendUint64(b, uint64(h.FromSize))
		b = append(b, h.FromDigest[:]...)
	}
	if h.Version >= RawVersion {
		b = le.AppendUint32(b, h.BlockSize)
	}
	b = le.AppendUint16(b, uint16(len(h.Name)))
	b = append(b, h.Name...)
	b = le.AppendUint16(b, uint16(len(h.FromName)))
	b = append(b, h.FromName...)
	if h.Version >= RawVersion {
		b = le.AppendUint16(b, uint16(len(h.Slots)))
		b = append(b, h.Slots...)
	}
	b = le.AppendUint32(b, crc32.Checksum(b, table))
	sw.write(b)
	return sw, sw.err
}

func (sw *Writer) write(b []byte) {
	if sw.err == nil {
		_, sw.err = sw.w.Write(b)
	}
}

// record writes one record: type, offset, length, a raw record's tweak,
// the data, the CRC-32C of all of those.
func (sw *Writer) record(typ byte, off, n int64, tweak uint64, data []byte) error {
	if sw.err != nil {
		return sw.err
	}
	if off < sw.next || n <= 0 {
		return fmt.Errorf("stream: record [%d,+%d) out of order (next offset %d)", off, n, sw.next)
	}
	if (sw.bs != 0) != (typ == recRaw) && typ != recZero || sw.bs != 0 && (off%sw.bs != 0 || n%sw.bs != 0) {
		return fmt.Errorf("stream: record type %d [%d,+%d) in a stream of block size %d (0: not raw)", typ, off, n, sw.bs)
	}
	hdr := make([]byte, 17, 25)
	hdr[0] = typ
	binary.LittleEndian.PutUint64(hdr[1:], uint64(off))
	binary.LittleEndian.PutUint64(hdr[9:], uint64(n))
	if typ == recRaw {
		hdr = binary.LittleEndian.AppendUint64(hdr, tweak)
	}
	sum := crc32.Update(crc32.Checksum(hdr, table), table, data)
	sw.write(hdr)
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
		if err := sw.record(recData, off, int64(n), 0, p[:n]); err != nil {
			return err
		}
		off, p = off+int64(n), p[n:]
	}
	return nil
}

// RawData writes p, ciphertext of whole blocks of a raw stream, as the
// blocks at off, the first with tweak tweak and each next one's the next,
// in records of at most MaxData.
func (sw *Writer) RawData(off int64, tweak uint64, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), MaxData)
		if err := sw.record(recRaw, off, int64(n), tweak, p[:n]); err != nil {
			return err
		}
		if sw.bs != 0 {
			tweak += uint64(int64(n) / sw.bs)
		}
		off, p = off+int64(n), p[n:]
	}
	return nil
}

// Zero writes that [off, off+n) reads zeros (in a raw stream, whole
// blocks).
func (sw *Writer) Zero(off, n int64) error { return sw.record(recZero, off, n, 0, nil) }

// validBlockSize reports whether a raw stream's block size is a power of
// two from 4 KiB to 1 MiB (a store's).
func validBlockSize(bs uint32) bool { return bs >= 4096 && bs <= 1<<20 && bs&(bs-1) == 0 }

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

// NewReader reads and verifies the header, of version 1 or 2. It
// allocates at most the two names (64 KiB each) and its read buffer
// before the header verifies.
func NewReader(r io.Reader) (*Reader, error) {
	sr := &Reader{r: bufio.NewReaderSize(r, 256<<10)}
	var start [8 + 4]byte
	if err := sr.full(start[:], "header"); err != nil {
		return nil, err
	}
	if !bytes.Equal(start[:8], magic[:]) {
		return nil, fmt.Errorf("not a vdisk send stream (magic %q): %w", start[:8], ErrCorrupt)
	}
	le := binary.LittleEndian
	h := &sr.h
	var fixed []byte
	switch v := le.Uint32(start[8:]); v {
	case 1:
		fixed = make([]byte, fixedV1+2)
	case 2:
		fixed = make([]byte, fixedV2+2)
	case RawVersion:
		fixed = make([]byte, fixedV3+2)
	default:
		return nil, fmt.Errorf("stream format version %d, this build reads 1 to %d: %w", v, RawVersion, ErrVersion)
	}
	h.Version = int(le.Uint32(start[8:]))
	if err := sr.full(fixed, "header"); err != nil {
		return nil, err
	}
	sum := crc32.Update(crc32.Checksum(start[:], table), table, fixed)
	h.Size = int64(le.Uint64(fixed[0:]))
	copy(h.UUID[:], fixed[8:24])
	copy(h.From[:], fixed[24:40])
	if h.Version >= 2 {
		p := fixed[fixedV1:]
		h.Mode, h.UID, h.GID = le.Uint32(p[0:]), le.Uint32(p[4:]), le.Uint32(p[8:])
		h.Atime, h.Mtime = int64(le.Uint64(p[12:])), int64(le.Uint64(p[20:]))
		h.FromSize = int64(le.Uint64(p[28:]))
		copy(h.FromDigest[:], p[36:68])
	}
	if h.Version >= RawVersion {
		h.Raw, h.BlockSize = true, le.Uint32(fixed[fixedV2:])
	}
	name, err := sr.name(le.Uint16(fixed[len(fixed)-2:]), &sum)
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
	if h.Raw {
		if err := sr.full(l[:], "header"); err != nil {
			return nil, err
		}
		sum = crc32.Update(sum, table, l[:])
		slots, err := sr.name(le.Uint16(l[:]), &sum)
		if err != nil {
			return nil, err
		}
		h.Slots = slots
	}
	var c [4]byte
	if err := sr.full(c[:], "header"); err != nil {
		return nil, err
	}
	if le.Uint32(c[:]) != sum {
		return nil, fmt.Errorf("stream header checksum: %w", ErrCorrupt)
	}
	if h.Size < 0 || h.FromSize < 0 || h.Raw && !validBlockSize(h.BlockSize) {
		return nil, fmt.Errorf("stream header: disk size %d, base size %d, block size %d: %w", h.Size, h.FromSize, h.BlockSize, ErrCorrupt)
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
	case recData, recZero, recRaw:
		if (typ[0] == recData && sr.h.Raw) || (typ[0] == recRaw && !sr.h.Raw) {
			return Record{}, fmt.Errorf("stream record %d: type %d in a stream of version %d: %w", sr.records, typ[0], sr.h.Version, ErrCorrupt)
		}
		hdr := make([]byte, 17, 25)
		if typ[0] == recRaw {
			hdr = hdr[:25]
		}
		hdr[0] = typ[0]
		if err := sr.full(hdr[1:], "records"); err != nil {
			return Record{}, err
		}
		rec := Record{Off: int64(le.Uint64(hdr[1:])), Len: int64(le.Uint64(hdr[9:])), Zero: typ[0] == recZero}
		end := sr.h.Size // a raw stream's last block may reach past the size
		if bs := int64(sr.h.BlockSize); sr.h.Raw {
			end = (end + bs - 1) / bs * bs
			if typ[0] == recRaw {
				rec.Tweak = le.Uint64(hdr[17:])
			}
			if rec.Off%bs != 0 || rec.Len%bs != 0 || rec.Tweak+uint64(rec.Len/bs-1) < rec.Tweak {
				return Record{}, fmt.Errorf("stream record %d [%d,+%d) is not whole blocks of %d, or its tweaks wrap: %w", sr.records, rec.Off, rec.Len, bs, ErrCorrupt)
			}
		}
		if rec.Len <= 0 || rec.Off < sr.next || rec.Off+rec.Len < rec.Off || rec.Off+rec.Len > end ||
			!rec.Zero && rec.Len > MaxData {
			return Record{}, fmt.Errorf("stream record %d [%d,+%d) is out of order or out of range: %w", sr.records, rec.Off, rec.Len, ErrCorrupt)
		}
		sum := crc32.Checksum(hdr, table)
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
