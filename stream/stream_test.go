package stream

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"testing"
)

// sampleHeader is a version-2 header with every field set.
var sampleHeader = Header{Version: Version, Size: 10 << 20, Name: "vm.raw", FromName: "s1", UUID: [16]byte{1, 2, 3}, From: [16]byte{9},
	Mode: 0o600, UID: 1234, GID: 5678, Atime: 1700000000123456789, Mtime: -5, FromSize: 3 << 20, FromDigest: [32]byte{7, 31: 8}}

// sample writes a stream with a zero record and data records, the first
// of dataLen bytes (more than MaxData makes the Writer split it).
func sample(t *testing.T, dataLen int) ([]byte, Header, []Record) {
	t.Helper()
	return sampleOf(t, sampleHeader, dataLen)
}

func sampleOf(t *testing.T, h Header, dataLen int) ([]byte, Header, []Record) {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), dataLen/16)
	recs := []Record{{Off: 4096, Len: 8192, Zero: true}, {Off: 1 << 20, Len: int64(len(data)), Data: data}, {Off: 3 << 20, Len: 3, Data: []byte("xyz")}}
	for _, r := range recs {
		if r.Zero {
			err = w.Zero(r.Off, r.Len)
		} else {
			err = w.Data(r.Off, r.Data)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), h, recs
}

// readAll reads a whole stream and returns its records joined back (data
// records as Writer split them).
func readAll(b []byte) (Header, []Record, error) {
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return Header{}, nil, err
	}
	var out []Record
	for {
		rec, err := r.Next()
		if errors.Is(err, io.EOF) {
			return r.Header(), out, nil
		}
		if err != nil {
			return r.Header(), out, err
		}
		if n := len(out); n > 0 && !rec.Zero && !out[n-1].Zero && out[n-1].Off+out[n-1].Len == rec.Off {
			out[n-1].Data = append(out[n-1].Data, rec.Data...)
			out[n-1].Len += rec.Len
			continue
		}
		rec.Data = bytes.Clone(rec.Data)
		out = append(out, rec)
	}
}

func TestRoundTrip(t *testing.T) {
	b, h, recs := sample(t, MaxData+5000)
	got, out, err := readAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if got != h {
		t.Errorf("header %+v, want %+v", got, h)
	}
	if len(out) != len(recs) {
		t.Fatalf("%d records, want %d", len(out), len(recs))
	}
	for i := range recs {
		if out[i].Off != recs[i].Off || out[i].Len != recs[i].Len || out[i].Zero != recs[i].Zero || !bytes.Equal(out[i].Data, recs[i].Data) {
			t.Errorf("record %d differs", i)
		}
	}
}

// v1Stream is a version-1 stream as the build that wrote version 1 wrote
// it: size 8192, name "a", uuid 01.., from 02.., base name "b", "hello"
// at 0, zeros at [4096, 8192).
const v1Stream = "564453454e4400000100000000200000000000000100000000000000000000000000000002000000000000000000000000000000010061010062f4c6dad0010000000000000000050000000000000068656c6c6f198cfc420200100000000000000010000000000000c707f99d03020000000000000005000000000000004f5515b3"

// TestStreamVersion1: a version-1 stream still reads, as version 1 with
// no ownership and no base check; one written by NewWriter with Version 1
// is the same bytes.
func TestStreamVersion1(t *testing.T) {
	b, _ := hex.DecodeString(v1Stream)
	h, recs, err := readAll(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Header{Version: 1, Size: 8192, Name: "a", UUID: [16]byte{1}, From: [16]byte{2}, FromName: "b"}
	if h != want {
		t.Errorf("header %+v, want %+v", h, want)
	}
	if len(recs) != 2 || string(recs[0].Data) != "hello" || !recs[1].Zero || recs[1].Off != 4096 || recs[1].Len != 4096 {
		t.Errorf("records %+v", recs)
	}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, want)
	if err != nil {
		t.Fatal(err)
	}
	w.Data(0, []byte("hello"))
	w.Zero(4096, 4096)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), b) {
		t.Errorf("NewWriter version 1: %x", buf.Bytes())
	}
	for _, v := range []uint32{0, 4, 1 << 31} {
		c := bytes.Clone(b)
		c[8], c[9], c[10], c[11] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		if _, err := NewReader(bytes.NewReader(c)); !errors.Is(err, ErrVersion) {
			t.Errorf("version %d: %v, want ErrVersion", v, err)
		}
	}
}

// TestCutAnywhere: a stream cut at any byte is refused, never read as a
// shorter disk, in both versions.
func TestCutAnywhere(t *testing.T) {
	for _, v := range []int{1, 2} {
		h := sampleHeader
		h.Version = v
		b, _, _ := sampleOf(t, h, 3000)
		for n := 0; n < len(b); n++ {
			if _, _, err := readAll(b[:n]); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
				t.Fatalf("version %d stream cut at byte %d of %d: %v, want ErrTruncated", v, n, len(b), err)
			}
		}
	}
}

// TestFlipAnyByte: a stream with any one byte changed is refused, in both
// versions.
func TestFlipAnyByte(t *testing.T) {
	for _, v := range []int{1, 2} {
		h := sampleHeader
		h.Version = v
		b, _, _ := sampleOf(t, h, 3000)
		for i := range len(b) {
			c := bytes.Clone(b)
			c[i] ^= 0x10
			if _, _, err := readAll(c); err == nil {
				t.Fatalf("version %d stream with byte %d of %d flipped was accepted", v, i, len(b))
			}
		}
		// Bytes after the end are damage too.
		if _, _, err := readAll(append(bytes.Clone(b), 0)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("version %d, trailing byte: %v", v, err)
		}
	}
}

// FuzzStreamReader: whatever the bytes, the Reader returns records or an
// error, never panics, and what it returns lies inside the disk, in order,
// no data record larger than MaxData (so its buffer stays bounded).
func FuzzStreamReader(f *testing.F) {
	b, _ := hex.DecodeString(v1Stream)
	f.Add(b)
	for _, v := range []int{1, 2} {
		h := sampleHeader
		h.Version = v
		h.Size = 64 << 10
		var buf bytes.Buffer
		w, err := NewWriter(&buf, h)
		if err != nil {
			f.Fatal(err)
		}
		w.Zero(0, 4096)
		w.Data(8192, []byte("data"))
		w.Close()
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		h := r.Header()
		var next int64
		for {
			rec, err := r.Next()
			if err != nil {
				return
			}
			if rec.Off < next || rec.Len <= 0 || rec.Off+rec.Len > h.Size || !rec.Zero && (rec.Len > MaxData || int64(len(rec.Data)) != rec.Len) {
				t.Fatalf("record %+v of a disk of %d bytes (next offset %d)", rec, h.Size, next)
			}
			next = rec.Off + rec.Len
		}
	})
}

func TestWriterRefusesDisorder(t *testing.T) {
	w, err := NewWriter(io.Discard, Header{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Zero(8192, 4096); err != nil {
		t.Fatal(err)
	}
	if err := w.Data(4096, []byte{1}); err == nil {
		t.Error("a record before the previous one was written")
	}
}

// A raw stream (version 3) carries its block size and slot table, raw
// records with their tweaks past the size's last block, and zero records;
// a data record in it, or a raw one in a plain stream, or one that is not
// whole blocks, is damage.
func TestRawStream(t *testing.T) {
	h := Header{Size: 3*4096 + 100, Name: "enc.raw", Raw: true, BlockSize: 4096, Slots: "SLOTS", Mode: 0o600}
	var buf bytes.Buffer
	w, err := NewWriter(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{0xc7}, 2*4096)
	if err := w.Zero(0, 4096); err != nil {
		t.Fatal(err)
	}
	if err := w.RawData(2*4096, 1<<40, data); err != nil {
		t.Fatal(err)
	}
	if err := w.Data(5*4096, data); err == nil {
		t.Error("a plain data record in a raw stream was written")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, recs, err := readAll(buf.Bytes())
	h.Version = RawVersion
	if err != nil || got != h {
		t.Fatalf("header %+v, %v; want %+v", got, err, h)
	}
	if len(recs) != 2 || !recs[0].Zero || recs[1].Off != 2*4096 || recs[1].Tweak != 1<<40 || !bytes.Equal(recs[1].Data, data) {
		t.Fatalf("records %+v", recs)
	}

	var plain bytes.Buffer
	pw, err := NewWriter(&plain, Header{Size: 8192})
	if err != nil {
		t.Fatal(err)
	}
	if err := pw.RawData(0, 1, data[:4096]); err == nil {
		t.Error("a raw record in a plain stream was written")
	}
}
