package image

import (
	"bytes"
	"compress/gzip"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// The fsck fixtures: small stores, each damaged in one way by the function
// beside its name below. `go test ./image -run TestFsckFixtures -update`
// rebuilds testdata/fsck/*.img.gz; the test (and cmd/vdisk's fsck test)
// asserts the finding each one must produce and what repair keeps.

var update = flag.Bool("update", false, "rewrite the fsck fixtures in testdata/fsck")

// fixtureBase builds the undamaged store every fixture starts from: disks
// a.raw (1 MiB of 'A' at offset 0, 4 KiB of 'a' at 2 MiB) and b.raw (256 KiB
// of 'B'), closed cleanly so everything is in the checkpoint.
func fixtureBase(t testing.TB) []byte {
	mem := backend.NewMem(4 << 20)
	if err := Format(mem, FormatOptions{JournalSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	a := mustCreate(t, s, "a.raw", 3<<20)
	a.WriteAt(bytes.Repeat([]byte{'A'}, 1<<20), 0)
	a.WriteAt(bytes.Repeat([]byte{'a'}, 4096), 2<<20)
	a.Close()
	b := mustCreate(t, s, "b.raw", 0)
	b.WriteAt(bytes.Repeat([]byte{'B'}, 256<<10), 0)
	b.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return mem.Bytes()
}

// fixtureShared builds the version-2 store the shared-block fixtures start
// from: fixtureBase's a.raw and b.raw, then a-snap, a snapshot of a.raw,
// and a-clone.raw, a clone of it (a whole-disk CopyFrom), then 4 KiB of
// 'X' written at 0 of a.raw, which goes to a new block (copy-on-write). So
// a.raw's old first block is shared by a-snap and a-clone.raw (count 2),
// its other 255 blocks of 'A' and its block of 'a' by all three (count 3).
// Closed cleanly: the counts are in the checkpoint's shared extents.
func fixtureShared(t testing.TB) []byte {
	mem := backend.NewMemFrom(fixtureBase(t))
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Snapshot("a.raw", "a-snap"); err != nil {
		t.Fatal(err)
	}
	a, err := s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	c := mustCreate(t, s, "a-clone.raw", 0)
	if n, err := c.CopyFrom(a, 0, 0, a.Size()); err != nil || n != a.Size() {
		t.Fatalf("clone: %d bytes, %v", n, err)
	}
	c.Close()
	if _, err := a.WriteAt(bytes.Repeat([]byte{'X'}, 4096), 0); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return mem.Bytes()
}

// editSharedCount changes the stored count of the shared stretch that
// holds the block a-clone.raw maps at virtual block virt (in a store made
// by fixtureShared), which must have count want; the stretch keeps its
// blocks and only its count changes to refs.
func editSharedCount(t testing.TB, img []byte, virt uint64, want, refs uint32) []byte {
	return editCheckpoint(t, img, func(c *checkpoint) {
		var phys uint64
		found := false
		for _, d := range c.Disks {
			if d.Name != "a-clone.raw" {
				continue
			}
			for _, e := range d.Extents {
				if e.Virt <= virt && virt < e.Virt+e.Len {
					phys, found = e.Phys+(virt-e.Virt), true
				}
			}
		}
		if !found {
			t.Fatalf("a-clone.raw maps nothing at block %d", virt)
		}
		for i, e := range c.Shared {
			if e.Start <= phys && phys < e.End() {
				if e.Refs != want {
					t.Fatalf("shared stretch %+v: count %d, want %d", e, e.Refs, want)
				}
				c.Shared[i].Refs = refs
				checkTableShape(t, c.Shared)
				return
			}
		}
		t.Fatalf("block %d (a-clone.raw's block %d) is not in the shared extents %+v", phys, virt, c.Shared)
	})
}

// checkTableShape fails if the edited counts are not a table a store could
// have written (sorted, disjoint, touching entries with different counts),
// so that a fixture has one damage, not two.
func checkTableShape(t testing.TB, es []refcount.Extent) {
	for i := 1; i < len(es); i++ {
		if a, b := es[i-1], es[i]; a.End() > b.Start || a.End() == b.Start && a.Refs == b.Refs {
			t.Fatalf("edited shared extents %+v and %+v are not a valid table", a, b)
		}
	}
}

// withJournal adds three commits after the checkpoint (three writes to
// c.raw, each synced) and stops without closing, as a crash would.
func withJournal(t testing.TB, img []byte) []byte {
	mem := backend.NewMemFrom(img)
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	c := mustCreate(t, s, "c.raw", 0)
	for i := 0; i < 3; i++ {
		c.WriteAt(bytes.Repeat([]byte{'C'}, 8192), int64(i)*65536)
		c.Sync()
	}
	return mem.Bytes()
}

// editCheckpoint decodes the checkpoint, lets edit change it, and writes it
// back in place with a matching checksum in both superblocks.
func editCheckpoint(t testing.TB, img []byte, edit func(c *checkpoint)) []byte {
	sb, _, err := readSuperblocks(backend.NewMemFrom(img))
	if err != nil {
		t.Fatal(err)
	}
	at := sb.DataOff + sb.CkptExts[0].Start*uint64(sb.BlockSize)
	c, err := decodeCheckpoint(img[at:at+sb.CkptLen], sb.UUID)
	if err != nil {
		t.Fatal(err)
	}
	edit(c)
	stream := c.encode(nil)
	if uint64(len(stream)) > sb.CkptExts[0].Len*uint64(sb.BlockSize) {
		t.Fatal("edited checkpoint outgrew its blocks")
	}
	copy(img[at:], stream)
	sb.CkptLen, sb.CkptCRC = uint64(len(stream)), crc(stream)
	sb.encode(img[superAOffset : superAOffset+pageSize])
	sb.encode(img[superBOffset : superBOffset+pageSize])
	return img
}

// journalCommits returns the journal byte offsets of the commits after the
// checkpoint.
func journalCommits(t testing.TB, img []byte) []int {
	sb, _, err := readSuperblocks(backend.NewMemFrom(img))
	if err != nil {
		t.Fatal(err)
	}
	var offs []int
	expect := sb.CkptSeq + 1
	for off := 0; off+pageSize <= int(sb.JournalLen); {
		h, ok := decodeCommitHeader(img[journalOffset+off:], sb.UUID)
		if !ok || h.Seq != expect {
			break
		}
		offs = append(offs, off)
		off += int(h.pages()) * pageSize
		expect++
	}
	return offs
}

// fsckFixture is one damage class: how it is made, what Check must say, and
// what must still read back after repair.
type fsckFixture struct {
	name   string
	damage func(t testing.TB) []byte
	codes  []string // finding codes Check must report (nothing else)
	// after repair: disk → byte that must still be there at offset 0
	keeps map[string]byte
	// intact, if set, builds the undamaged store: after repair every disk
	// must read byte for byte as there (repair cost no data).
	intact func(t testing.TB) []byte
}

var fsckFixtures = []fsckFixture{
	{"clean", fixtureBase, nil, map[string]byte{"a.raw": 'A', "b.raw": 'B'}, nil},
	{"torn-journal-tail", func(t testing.TB) []byte {
		img := withJournal(t, fixtureBase(t))
		offs := journalCommits(t, img)
		img[journalOffset+offs[len(offs)-1]+40] ^= 0xff // last commit: a torn tail, not damage
		return img
	}, nil, map[string]byte{"a.raw": 'A', "c.raw": 'C'}, nil},
	{"superblock-copy-bad", func(t testing.TB) []byte {
		img := fixtureBase(t)
		img[superBOffset+100] ^= 0x5a
		return img
	}, []string{CodeSuperblockCopy}, map[string]byte{"a.raw": 'A', "b.raw": 'B'}, nil},
	{"journal-broken", func(t testing.TB) []byte {
		img := withJournal(t, fixtureBase(t))
		offs := journalCommits(t, img)
		img[journalOffset+offs[1]+40] ^= 0xff // middle commit damaged, a later one valid
		return img
	}, []string{CodeJournalBroken}, map[string]byte{"a.raw": 'A', "c.raw": 'C'}, nil},
	{"extent-outside-data", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) {
			e := &c.Disks[1].Extents[0] // b.raw
			e.Phys = 1 << 40
		})
	}, []string{CodeExtentOutside, CodeLeak}, map[string]byte{"a.raw": 'A', "b.raw": 0}, nil},
	{"shared-block", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) {
			// b.raw's first extent now points into a.raw's blocks.
			c.Disks[1].Extents[0].Phys = c.Disks[0].Extents[0].Phys
		})
	}, []string{CodeSharedBlock, CodeLeak}, map[string]byte{"a.raw": 'A', "b.raw": 0}, nil},
	{"extent-beyond-size", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) {
			c.Disks[0].Attr.Size = 1 << 20 // a.raw still maps a block at 2 MiB
		})
	}, []string{CodeExtentBeyondSize}, map[string]byte{"a.raw": 'A', "b.raw": 'B'}, nil},
	{"leak", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) {
			c.Free = c.Free[1:] // the first free extent is used by nothing now
		})
	}, []string{CodeLeak}, map[string]byte{"a.raw": 'A', "b.raw": 'B'}, nil},
	{"used-block-free", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) {
			// a.raw's blocks listed as free as well.
			e := c.Disks[0].Extents[0]
			c.Free = append(c.Free, pext{Start: e.Phys, Len: e.Len})
			slices.SortFunc(c.Free, func(x, y pext) int { return int(x.Start) - int(y.Start) })
		})
	}, []string{CodeUsedFree}, map[string]byte{"a.raw": 'A', "b.raw": 'B'}, nil},
	{"invalid-name", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) { c.Disks[0].Name = "a/raw" })
	}, []string{CodeInvalidName}, map[string]byte{"recovered-1.raw": 'A', "b.raw": 'B'}, nil},
	{"duplicate-name", func(t testing.TB) []byte {
		return editCheckpoint(t, fixtureBase(t), func(c *checkpoint) { c.Disks[1].Name = "a.raw" })
	}, []string{CodeDuplicateName}, map[string]byte{"a.raw": 'A', "recovered-2.raw": 'B'}, nil},
	{"shared-clean", fixtureShared, nil, sharedKeeps, fixtureShared},
	{"refcount-high", func(t testing.TB) []byte {
		// The 255 blocks of 'A' that a.raw, a-snap and a-clone.raw share
		// count 4: one more than their users, so they would never be freed.
		return editSharedCount(t, fixtureShared(t), 1, 3, 4)
	}, []string{CodeRefHigh}, sharedKeeps, fixtureShared},
	{"refcount-low", func(t testing.TB) []byte {
		// The block of 'a' (at 2 MiB) that all three share counts 2: a
		// punch by two of them would free it while the third maps it.
		return editSharedCount(t, fixtureShared(t), 512, 3, 2)
	}, []string{CodeRefLow}, sharedKeeps, fixtureShared},
}

// repairSays holds, per fixture, a sentence one of repair's actions must
// contain.
var repairSays = map[string]string{
	"refcount-high": "255 block(s) counted above their users, 0 below",
	"refcount-low":  "0 block(s) counted above their users, 1 below",
}

// sharedKeeps is what the disks of fixtureShared hold at offset 0.
var sharedKeeps = map[string]byte{"a.raw": 'X', "a-snap": 'A', "a-clone.raw": 'A', "b.raw": 'B'}

func fixturePath(name string) string {
	return filepath.Join("..", "testdata", "fsck", name+".img.gz")
}

func writeFixture(t testing.TB, name string, img []byte) {
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	zw.Write(img)
	zw.Close()
	if err := os.MkdirAll(filepath.Dir(fixturePath(name)), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(fixturePath(name), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// LoadFixture reads a gzipped fixture image.
func loadFixture(t testing.TB, name string) []byte {
	f, err := os.Open(fixturePath(name))
	if err != nil {
		t.Fatalf("fixture %s: %v (rebuild with go test ./image -run TestFsckFixtures -update)", name, err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	img, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestFsckFixtures(t *testing.T) {
	for _, fx := range fsckFixtures {
		t.Run(fx.name, func(t *testing.T) {
			if *update {
				writeFixture(t, fx.name, fx.damage(t))
			}
			img := loadFixture(t, fx.name)

			// Check (read-only, as vdisk fsck does).
			s, err := Open(backend.NewMemFrom(img), Options{Tolerant: true, CommitInterval: -1, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("tolerant open: %v", err)
			}
			rep := s.Check()
			s.Close()
			var codes []string
			for _, f := range rep.Findings {
				if !slices.Contains(codes, f.Code) {
					codes = append(codes, f.Code)
				}
				t.Logf("finding: %s", f)
			}
			if !slices.Equal(codes, fx.codes) {
				t.Fatalf("findings %v, want %v", codes, fx.codes)
			}

			// A plain open refuses fatal damage and accepts the rest.
			fatal := rep.Fatal()
			if s, err := Open(backend.NewMemFrom(img), Options{CommitInterval: -1, Logger: quietLogger()}); err == nil {
				s.Close()
				if fatal && fx.name != "superblock-copy-bad" { // a bad copy is healed by any read-write open
					t.Fatal("plain open accepted a store with fatal findings")
				}
			} else if !fatal {
				t.Fatalf("plain open refused a store without fatal findings: %v", err)
			}

			// Repair, then everything is clean, stays clean after reopen,
			// and the undamaged data is still there.
			mem := backend.NewMemFrom(img)
			s, err = Open(mem, Options{Repair: true, CommitInterval: -1, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("open for repair: %v", err)
			}
			actions, err := s.Repair()
			if err != nil {
				t.Fatalf("repair: %v", err)
			}
			said := repairSays[fx.name] == ""
			for _, a := range actions {
				t.Logf("repair: %s", a)
				said = said || strings.Contains(a, repairSays[fx.name])
			}
			if !said {
				t.Errorf("no repair action says %q", repairSays[fx.name])
			}
			if rep := s.Check(); !rep.Clean() {
				t.Fatalf("after repair: %v", rep.Findings)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			mem.Reopen()
			s, err = Open(mem, testOptions())
			if err != nil {
				t.Fatalf("open after repair: %v", err)
			}
			defer s.Close()
			if rep := s.Check(); !rep.Clean() {
				t.Fatalf("after repair and reopen: %v", rep.Findings)
			}
			for name, want := range fx.keeps {
				got := readAll(t, s, name)
				if len(got) == 0 || got[0] != want {
					t.Fatalf("after repair %s starts with %q, want %q", name, got[:min(1, len(got))], want)
				}
			}
			if fx.intact != nil {
				checkIntact(t, s, fx.intact(t))
			}
		})
	}
}

// checkIntact asserts that every disk of s reads byte for byte as in the
// store image want, and no disk is missing or added. Then it removes
// every disk but the first and commits: with counts that match the maps,
// the blocks the others shared with it stay its own and still read the
// same, and Check stays clean (a count too low would have freed them).
func checkIntact(t *testing.T, s *Store, img []byte) {
	t.Helper()
	ref, err := Open(backend.NewMemFrom(img), Options{CommitInterval: -1, ReadOnly: true, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	if v, w := s.Version(), ref.Version(); v != w {
		t.Fatalf("after repair the store is version %d, want %d", v, w)
	}
	var got, want []string
	for _, d := range s.List() {
		got = append(got, d.Name)
	}
	for _, d := range ref.List() {
		want = append(want, d.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("after repair disks %q, want %q", got, want)
	}
	for _, name := range want {
		if !bytes.Equal(readAll(t, s, name), readAll(t, ref, name)) {
			t.Fatalf("after repair %s reads differently from the undamaged store", name)
		}
	}
	keep := want[0]
	for _, name := range want[1:] {
		if err := s.Remove(name); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("after removing all disks but %s: %v", keep, rep.Findings)
	}
	if !bytes.Equal(readAll(t, s, keep), readAll(t, ref, keep)) {
		t.Fatalf("%s changed when the disks sharing its blocks were removed", keep)
	}
}
