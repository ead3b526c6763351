package image

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Bad input that is not a Disk call: disk names, and files that are not
// (or no longer, or not yet) stores this build can open.

// validNameRef is the definition of a valid disk name, written out
// independently of ValidateName.
func validNameRef(name string) bool {
	return len(name) >= 1 && len(name) <= MaxNameLen && utf8.ValidString(name) &&
		!strings.ContainsFunc(name, func(r rune) bool { return r == '/' || r < 0x20 || r == 0x7f }) &&
		name != "." && name != ".."
}

func TestValidateName(t *testing.T) {
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"", false},
		{".", false},
		{"..", false},
		{"...", true},
		{".hidden", true},
		{"a/b", false},
		{"/", false},
		{"a\x00b", false},
		{"\x00", false},
		{"\xff\xfe.raw", false},            // not UTF-8
		{"a\xc3", false},                   // a truncated UTF-8 sequence
		{"\xed\xa0\x80.raw", false},        // a UTF-16 surrogate: not valid UTF-8
		{"disk.raw", true},                 // the usual
		{"vm disk (1).raw", true},          // spaces and brackets are bytes like any other
		{"new\nline", false},               // control characters garble listings
		{"-rf", true},                      // a name, not an option
		{"ディスク.raw", true},                 // UTF-8
		{strings.Repeat("a", 255), true},   // the longest
		{strings.Repeat("a", 256), false},  // one byte too long
		{strings.Repeat("é", 127), true},   // 254 bytes
		{strings.Repeat("é", 128), false},  // 256 bytes
		{strings.Repeat("a", 4096), false}, // much too long
	} {
		err := ValidateName(c.name)
		if (err == nil) != c.ok {
			t.Errorf("ValidateName(%q) = %v, want ok %v", c.name, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidName) {
			t.Errorf("ValidateName(%q) = %v: does not wrap ErrInvalidName", c.name, err)
		}
		if validNameRef(c.name) != c.ok {
			t.Errorf("test table: %q", c.name)
		}
	}
}

// FuzzValidateName: ValidateName agrees with the definition, and Create and
// Rename accept exactly the valid names (errors wrap ErrInvalidName).
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"", ".", "..", "a/b", "a\x00", "\xff", "disk.raw", strings.Repeat("x", 255), strings.Repeat("x", 256)} {
		f.Add(s)
	}
	ms := backend.NewMem(4 << 20)
	if err := Format(ms, FormatOptions{JournalSize: 16 << 10}); err != nil {
		f.Fatal(err)
	}
	s, err := Open(ms, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	if _, err := s.Create("base.raw", 0, Attr{}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, name string) {
		want := validNameRef(name)
		err := ValidateName(name)
		if (err == nil) != want {
			t.Fatalf("ValidateName(%q) = %v, want ok %v", name, err, want)
		}
		if err != nil && !errors.Is(err, ErrInvalidName) {
			t.Fatalf("ValidateName(%q) = %v: not ErrInvalidName", name, err)
		}
		if name == "base.raw" {
			return
		}
		_, err = s.Create(name, 0, Attr{})
		if want != (err == nil) || err != nil && !errors.Is(err, ErrInvalidName) {
			t.Fatalf("Create(%q) = %v, want ok %v", name, err, want)
		}
		if err == nil {
			if err := s.Remove(name); err != nil {
				t.Fatal(err)
			}
		}
		err = s.Rename("base.raw", name)
		if want != (err == nil) || err != nil && !errors.Is(err, ErrInvalidName) {
			t.Fatalf("Rename(base.raw, %q) = %v, want ok %v", name, err, want)
		}
		if err == nil {
			if err := s.Rename(name, "base.raw"); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// badStoreCase is a file that OpenPath must refuse, and what it must say.
type badStoreCase struct {
	name string
	make func(t *testing.T, path string) // writes the file at path
	want error                           // the sentinel the error wraps (nil: just an error)
	msg  string                          // the error names the problem
	// tolerant: an fsck-style (Tolerant) open succeeds; fatal findings
	// (if any) tell what is wrong.
	tolerant bool
}

// goodStore formats a 4 MiB store at path with one disk holding data.
func goodStore(t *testing.T, path string) {
	t.Helper()
	if err := FormatPath(path, 4<<20, FormatOptions{JournalSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	s, err := OpenPath(path, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	d := mustCreate(t, s, "a.raw", 0)
	if _, err := d.WriteAt(bytes.Repeat([]byte{'A'}, 100000), 0); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// editSuperblocks decodes both superblock copies of the store at path,
// lets edit change them, and writes them back with valid checksums.
func editSuperblocks(t *testing.T, path string, copies int, edit func(sb *superblock)) {
	t.Helper()
	img, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for c := 0; c < copies; c++ {
		page := img[c*pageSize : (c+1)*pageSize]
		sb, err := decodeSuperblock(page)
		if err != nil {
			t.Fatal(err)
		}
		edit(sb)
		sb.encode(page)
	}
	writeFileT(t, path, img)
}

// patchFile writes p at off of the file at path.
func patchFile(t *testing.T, path string, off int64, p []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(p, off); err != nil {
		t.Fatal(err)
	}
}

func writeFileT(t *testing.T, path string, p []byte) {
	t.Helper()
	if err := os.WriteFile(path, p, 0o644); err != nil {
		t.Fatal(err)
	}
}

func badStoreCases() []badStoreCase {
	le := binary.LittleEndian
	u32 := func(v uint32) []byte { return le.AppendUint32(nil, v) }
	return []badStoreCase{
		{"empty file", func(t *testing.T, p string) { writeFileT(t, p, nil) }, ErrNotStore, "too small to hold a store", false},
		{"one page", func(t *testing.T, p string) { writeFileT(t, p, make([]byte, 4096)) }, ErrNotStore, "too small to hold a store", false},
		{"zeros", func(t *testing.T, p string) { writeFileT(t, p, make([]byte, 4<<20)) }, ErrNotStore, "bad magic", false},
		{"random bytes", func(t *testing.T, p string) {
			b := make([]byte, 4<<20)
			rand.Read(b)
			writeFileT(t, p, b)
		}, ErrNotStore, "bad magic", false},
		{"truncated to half", func(t *testing.T, p string) {
			goodStore(t, p)
			if err := os.Truncate(p, 2<<20); err != nil {
				t.Fatal(err)
			}
		}, ErrCorrupt, "store is truncated", false},
		{"truncated inside the superblocks", func(t *testing.T, p string) {
			goodStore(t, p)
			if err := os.Truncate(p, 6000); err != nil {
				t.Fatal(err)
			}
		}, ErrNotStore, "too small to hold a store", false},
		{"truncated by one sector", func(t *testing.T, p string) {
			goodStore(t, p)
			if err := os.Truncate(p, 4<<20-512); err != nil {
				t.Fatal(err)
			}
		}, ErrCorrupt, "store is truncated", false},
		{"block size not a power of two", func(t *testing.T, p string) {
			goodStore(t, p)
			editSuperblocks(t, p, 2, func(sb *superblock) { sb.BlockSize = 5000 })
		}, ErrCorrupt, "block size 5000", false},
		{"block size below the minimum", func(t *testing.T, p string) {
			goodStore(t, p)
			editSuperblocks(t, p, 2, func(sb *superblock) { sb.BlockSize = 2048 })
		}, ErrCorrupt, "block size 2048", false},
		{"block size doubled", func(t *testing.T, p string) {
			goodStore(t, p)
			editSuperblocks(t, p, 2, func(sb *superblock) { sb.BlockSize = 8192 })
		}, ErrCorrupt, "past the store size", false},
		{"block size doubled, data blocks halved", func(t *testing.T, p string) {
			// Self-consistent but wrong: the checkpoint's block numbers
			// now point elsewhere, so its checksum fails.
			goodStore(t, p)
			editSuperblocks(t, p, 2, func(sb *superblock) { sb.BlockSize, sb.DataBlocks = 8192, sb.DataBlocks/2 })
		}, ErrCorrupt, "checkpoint", false},
		{"future format version", func(t *testing.T, p string) {
			goodStore(t, p)
			patchFile(t, p, 8, u32(4))
			patchFile(t, p, 4096+8, u32(4))
		}, ErrVersion, "format version 4, this build reads versions 1 to 3", false},
		{"unknown incompatible feature", func(t *testing.T, p string) {
			goodStore(t, p)
			editSuperblocks(t, p, 2, func(sb *superblock) { sb.Features = 1 << 7 })
		}, ErrVersion, "unknown incompatible features 0x80", false},
		{"both superblock checksums bad", func(t *testing.T, p string) {
			goodStore(t, p)
			patchFile(t, p, 200, []byte{0xff})
			patchFile(t, p, 4096+200, []byte{0xff})
		}, ErrCorrupt, "checksum", false},
		{"checkpoint checksum bad", func(t *testing.T, p string) {
			goodStore(t, p)
			editSuperblocks(t, p, 2, func(sb *superblock) { sb.CkptCRC ^= 1 })
		}, ErrCorrupt, "checkpoint", false},
		{"disk data overwritten with garbage", func(t *testing.T, p string) {
			// Data blocks carry no checksum: garbage there is the disk's
			// content, not damage. The store opens (and Check is clean).
			goodStore(t, p)
			patchFile(t, p, 1<<20, bytes.Repeat([]byte{0xee}, 8192))
		}, nil, "", true},
	}
}

// TestOpenBadStoreFiles opens damaged, foreign, truncated and future store
// files with OpenPath on a real file system (O_DIRECT): each is refused
// with an error that wraps the right sentinel and names the problem, and
// none panics or hangs, in a plain open or in a tolerant (fsck) open.
func TestOpenBadStoreFiles(t *testing.T) {
	for _, c := range badStoreCases() {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "store.img")
			c.make(t, path)
			s, err := OpenPath(path, Options{CommitInterval: -1, Logger: quietLogger()})
			if c.msg == "" {
				if err != nil {
					t.Fatalf("open: %v", err)
				}
				if rep := s.Check(); !rep.Clean() {
					t.Errorf("check: %v", rep.Findings)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatal("open succeeded")
			}
			t.Logf("open: %v", err)
			if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("open: %v, want an error wrapping %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.msg) || !strings.Contains(err.Error(), path) && !strings.Contains(err.Error(), "open store") {
				t.Errorf("open: %q does not say %q about the store", err, c.msg)
			}
			// What fsck does: a read-only tolerant open. Damage it can
			// read is reported as findings; anything else is refused alike.
			s, err = OpenPath(path, Options{ReadOnly: true, Tolerant: true, CommitInterval: -1, Logger: quietLogger()})
			if err == nil {
				rep := s.Check()
				s.Close()
				if !c.tolerant && !rep.Fatal() {
					t.Errorf("tolerant open succeeded without a fatal finding: %v", rep.Findings)
				}
			} else if c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("tolerant open: %v, want an error wrapping %v", err, c.want)
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		_, err := OpenPath(filepath.Join(t.TempDir(), "none.img"), Options{Logger: quietLogger()})
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("open of a missing file: %v", err)
		}
	})
	t.Run("directory", func(t *testing.T) {
		_, err := OpenPath(t.TempDir(), Options{Logger: quietLogger()})
		if err == nil || !strings.Contains(err.Error(), "directory") {
			t.Errorf("open of a directory: %v", err)
		}
	})
}

// TestFutureVersionInOneCopy: a superblock copy written by a newer format
// version while the other copy is still this version (a newer vdisk
// upgrading the store crashed between the copies). This build must not
// touch such a store: every open refuses it with ErrVersion.
func TestFutureVersionInOneCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.img")
	goodStore(t, path)
	patchFile(t, path, 8, binary.LittleEndian.AppendUint32(nil, 4))
	for _, opts := range []Options{{ReadOnly: true, Tolerant: true}, {}, {Repair: true}} {
		opts.CommitInterval, opts.Logger = -1, quietLogger()
		if s, err := OpenPath(path, opts); !errors.Is(err, ErrVersion) {
			if s != nil {
				s.Close()
			}
			t.Errorf("open %+v of a store with one newer copy: %v, want ErrVersion", opts, err)
		}
	}
}
