package image

import (
	"bytes"
	"errors"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Fuzz targets for every on-disk decoder and for opening a mutated store:
// never a panic, never a hang, and every error wraps a package sentinel
// that says what kind of problem it is.

func sentinel(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNotStore) || errors.Is(err, ErrVersion)
}

func FuzzSuperblock(f *testing.F) {
	sb := superblock{Generation: 3, BlockSize: 4096, StoreSize: 8 << 20, JournalOff: journalOffset, JournalLen: 1 << 20,
		DataOff: 2 << 20, DataBlocks: 1536, CkptSeq: 7, CkptLen: 100, CkptExts: []pext{{Start: 1535, Len: 1}}, Host: "h", Program: "p"}
	page := make([]byte, pageSize)
	sb.encode(page)
	f.Add(page)
	f.Add(make([]byte, pageSize))
	f.Add(page[:100])
	f.Fuzz(func(t *testing.T, p []byte) {
		got, err := decodeSuperblock(p)
		if err != nil {
			if !sentinel(err) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			return
		}
		// What decodes must encode to the same page.
		again := make([]byte, pageSize)
		got.encode(again)
		if !bytes.Equal(again, p[:pageSize]) {
			t.Fatal("decoded superblock does not re-encode to the same bytes")
		}
	})
}

func FuzzJournalCommit(f *testing.F) {
	var uuid [16]byte
	uuid[0] = 9
	recs := []record{
		{Type: recCreate, ID: 1, Attr: diskAttr{Size: 100, Mode: 0o644}, Name: "a.raw"},
		{Type: recMap, ID: 1, Virt: 0, Phys: 5, Len: 3},
		{Type: recPunch, ID: 1, Virt: 1, Len: 1},
		{Type: recSize, ID: 1, Attr: diskAttr{Size: 4096}},
		{Type: recRename, ID: 1, Name: "b.raw"},
		{Type: recAttr, ID: 1, Attr: diskAttr{Mode: 0o600}},
		{Type: recUnlink, ID: 1},
		{Type: recDelete, ID: 1},
	}
	var payload []byte
	for i := range recs {
		payload = appendRecord(payload, &recs[i])
	}
	f.Add(encodeCommit(nil, 1, uuid, uint32(len(recs)), payload))
	f.Add(encodeCommit(nil, 2, uuid, 0, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, ok := decodeCommitHeader(b, uuid)
		if !ok {
			return
		}
		payload, ok := verifyCommit(b, h)
		if !ok {
			return
		}
		got, err := decodeRecords(payload, h.Count)
		if err != nil {
			if !sentinel(err) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			return
		}
		// Records that decode re-encode to the same payload.
		var again []byte
		for i := range got {
			again = appendRecord(again, &got[i])
		}
		if !bytes.Equal(again, payload) {
			t.Fatal("records do not re-encode to the same payload")
		}
	})
}

func FuzzCheckpoint(f *testing.F) {
	var uuid [16]byte
	c := &checkpoint{Seq: 4, UUID: uuid, NextID: 3, Disks: []ckptDisk{
		{ID: 1, Attr: diskAttr{Size: 1 << 20}, Name: "a.raw", Extents: []extentRec{{0, 10, 5}, {8, 100, 2}}},
		{ID: 2, Flags: diskFlagOrphan, Name: "b.raw"},
	}, Free: []pext{{Start: 0, Len: 10}, {Start: 200, Len: 50}}}
	f.Add(c.encode(nil))
	f.Add((&checkpoint{UUID: uuid}).encode(nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodeCheckpoint(b, uuid)
		if err != nil {
			if !sentinel(err) {
				t.Fatalf("error without a sentinel: %v", err)
			}
			return
		}
		if again := got.encode(nil); !bytes.Equal(again, b) {
			t.Fatal("checkpoint does not re-encode to the same bytes")
		}
	})
}

// fuzzBaseImage is a small store with a checkpoint and journal commits
// after it: two disks with data, a rename, a punch, no clean close.
func fuzzBaseImage(tb testing.TB) []byte {
	mem := backend.NewMem(3 << 20)
	if err := Format(mem, FormatOptions{JournalSize: 32 << 10}); err != nil {
		tb.Fatal(err)
	}
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		tb.Fatal(err)
	}
	a := mustCreate(tb, s, "a.raw", 0)
	a.WriteAt(bytes.Repeat([]byte{1}, 40000), 3000)
	a.Sync()
	if err := s.Checkpoint(); err != nil {
		tb.Fatal(err)
	}
	b := mustCreate(tb, s, "b.raw", 0)
	b.WriteAt(bytes.Repeat([]byte{2}, 20000), 0)
	a.Punch(8192, 8192)
	s.Rename("a.raw", "c.raw")
	b.Sync()
	return mem.Bytes()
}

// FuzzOpenMutatedStore patches bytes of a valid store's metadata (the
// superblocks, journal and checkpoint) and opens it: Open must return a
// store or an error naming the damage, and an opened store must survive
// Check and reading every disk.
func FuzzOpenMutatedStore(f *testing.F) {
	base := fuzzBaseImage(f)
	sb, _, err := readSuperblocks(backend.NewMemFrom(base))
	if err != nil {
		f.Fatal(err)
	}
	ckptOff := int64(sb.DataOff + sb.CkptExts[0].Start*uint64(sb.BlockSize))
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 20, 0xff})                                        // superblock A
	f.Add([]byte{0, 0, 0x20, 30, 0x01})                                     // journal
	f.Add([]byte{1, 0, 0, 44, 0x07})                                        // checkpoint
	f.Add([]byte{0, 0, 0x10, 108, 0x02, 0, 0, 0, 200, 0x09, 1, 0, 1, 0, 3}) // both superblocks, checkpoint
	f.Fuzz(func(t *testing.T, patch []byte) {
		img := append([]byte(nil), base...)
		// Each 5-byte group: region (superblocks, journal, checkpoint),
		// a 24-bit offset in it, a byte to xor in.
		for len(patch) >= 5 {
			region, off, x := patch[0]%3, int64(patch[1])<<16|int64(patch[2])<<8|int64(patch[3]), patch[4]
			patch = patch[5:]
			var at int64
			switch region {
			case 0:
				at = off % (2 * pageSize)
			case 1:
				at = journalOffset + off%int64(sb.JournalLen)
			default:
				at = ckptOff + off%int64(sb.CkptLen)
			}
			img[at] ^= x
		}
		mem := backend.NewMemFrom(img)
		s, err := Open(mem, Options{CommitInterval: -1, Tolerant: true, Logger: quietLogger()})
		if err != nil {
			if !sentinel(err) {
				t.Fatalf("open error without a sentinel: %v", err)
			}
			return
		}
		defer s.Close()
		s.Check()
		for _, info := range s.List() {
			d, err := s.OpenDisk(info.Name)
			if err != nil {
				continue
			}
			p := make([]byte, min(info.Size, 1<<20))
			d.ReadAt(p, 0) // errors are fine (a damaged map can point anywhere); panics are not
			d.Close()
		}
	})
}
