package stream

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

// sample writes a stream with a zero record and data records, the first
// of dataLen bytes (more than MaxData makes the Writer split it).
func sample(t *testing.T, dataLen int) ([]byte, Header, []Record) {
	t.Helper()
	h := Header{Size: 10 << 20, Name: "vm.raw", FromName: "s1", UUID: [16]byte{1, 2, 3}, From: [16]byte{9}}
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

// TestCutAnywhere: a stream cut at any byte is refused, never read as a
// shorter disk.
func TestCutAnywhere(t *testing.T) {
	b, _, _ := sample(t, 3000)
	for n := 0; n < len(b); n++ {
		if _, _, err := readAll(b[:n]); !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("stream cut at byte %d of %d: %v, want ErrTruncated", n, len(b), err)
		}
	}
}

// TestFlipAnyByte: a stream with any one byte changed is refused.
func TestFlipAnyByte(t *testing.T) {
	b, _, _ := sample(t, 3000)
	for i := range len(b) {
		c := bytes.Clone(b)
		c[i] ^= 0x10
		if _, _, err := readAll(c); err == nil {
			t.Fatalf("stream with byte %d of %d flipped was accepted", i, len(b))
		}
	}
	// Bytes after the end are damage too.
	if _, _, err := readAll(append(bytes.Clone(b), 0)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("trailing byte: %v", err)
	}
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
