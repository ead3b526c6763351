package main

import (
	"bytes"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func randomBytes(n int, seed uint64) []byte {
	var key [32]byte
	key[0], key[1] = byte(seed), byte(seed>>8)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
	return b
}

// piece is part of a source image: a file of size bytes with pieces written
// into it. A piece of nil data writes zeros explicitly, allocating them.
type piece struct {
	off  int64
	data []byte
}

func makeSparseFile(t *testing.T, path string, size int64, pieces []piece) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, p := range pieces {
		if _, err := f.WriteAt(p.data, p.off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// allocated returns st_blocks*512 of path: what du counts.
func allocated(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// dataStats walks path's data regions and returns their total length and
// the bytes in the non-zero bs-byte blocks inside them.
func dataStats(t *testing.T, path string, bs int64) (data, nonZero int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	buf := make([]byte, bs)
	seen := map[int64]bool{}
	err = fileDataRegions(f, st.Size(), true, func(start, end int64) error {
		data += end - start
		for b := start / bs * bs; b < end; b += bs {
			if seen[b] {
				continue
			}
			seen[b] = true
			n, err := f.ReadAt(buf, b)
			if err != nil && err != io.EOF {
				return err
			}
			if !isZero(buf[:n]) {
				nonZero += int64(n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return data, nonZero
}

// sameContents compares two files byte for byte, streaming them in 1 MiB
// chunks. A chunk that is a hole in both files (SEEK_DATA finds no data in it,
// asked here directly of the kernel) reads as zeros in both and is not read:
// reading a gigabyte of holes twice costs seconds on a loaded machine.
func sameContents(t *testing.T, a, b string) {
	t.Helper()
	open := func(p string) (*os.File, int64) {
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return f, st.Size()
	}
	fa, size := open(a)
	fb, sizeB := open(b)
	if size != sizeB {
		t.Fatalf("%s has %d bytes, %s has %d", a, size, b, sizeB)
	}
	hole := func(f *os.File, off, end int64) bool {
		d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
		if err == unix.ENXIO {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return d >= end
	}
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(ba)) {
		n := min(int64(len(ba)), size-off)
		if hole(fa, off, off+n) && hole(fb, off, off+n) {
			continue
		}
		if _, err := fa.ReadAt(ba[:n], off); err != nil {
			t.Fatal(err)
		}
		if _, err := fb.ReadAt(bb[:n], off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ba[:n], bb[:n]) {
			for i := range n {
				if ba[i] != bb[i] {
					t.Fatalf("%s and %s differ at byte %d", a, b, off+i)
				}
			}
		}
	}
}

// TestImportExportSparse is the acceptance test: import then export of a
// 1 GiB sparse raw file is byte-identical and as sparse as the source.
func TestImportExportSparse(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "store.img")
	mustRun(t, "format", store, "--size", "128M")
	t.Cleanup(func() { checkStore(t, store) })

	const size = 1 << 30
	r := rand.New(rand.NewPCG(42, 42))
	var pieces []piece
	for i := range 24 {
		n := 1 + r.IntN(384<<10)
		off := r.Int64N(size - int64(n))
		if i%3 == 0 {
			off = off / 4096 * 4096 // some aligned, most not
		}
		pieces = append(pieces, piece{off, randomBytes(n, uint64(i))})
	}
	// All-zero blocks written explicitly: the file system allocates them,
	// SEEK_DATA calls them data, and neither import nor export copies them.
	pieces = append(pieces,
		piece{200 << 20, make([]byte, 64<<10)},
		piece{300<<20 + 512, make([]byte, 20000)},
	)
	// Zero blocks inside a data region, and data in the last block.
	mixed := randomBytes(256<<10, 99)
	clear(mixed[64<<10 : 96<<10])
	pieces = append(pieces, piece{500 << 20, mixed}, piece{size - 100, randomBytes(100, 7)}, piece{0, []byte("MBR")})
	src := filepath.Join(dir, "src.raw")
	makeSparseFile(t, src, size, pieces)
	srcData, srcNonZero := dataStats(t, src, 4096)
	srcAlloc := allocated(t, src)
	t.Logf("source: %d bytes of data regions, %d in non-zero blocks, %d allocated", srcData, srcNonZero, srcAlloc)

	out := mustRun(t, "import", store, "disk.raw", src).stdout
	if !strings.HasPrefix(out, "imported "+src+" as disk.raw: 1 GiB disk") {
		t.Errorf("import output %q", out)
	}
	d := diskByName(t, store, "disk.raw")
	if d.Size != size {
		t.Errorf("disk size %d", d.Size)
	}
	if d.Allocated > srcData || d.Allocated != srcNonZero {
		t.Errorf("disk allocated %d bytes; source data regions %d, non-zero blocks %d", d.Allocated, srcData, srcNonZero)
	}

	dst := filepath.Join(dir, "dst.raw")
	mustRun(t, "export", store, "disk.raw", dst)
	sameContents(t, src, dst)
	dstAlloc := allocated(t, dst)
	t.Logf("export: %d allocated (source %d)", dstAlloc, srcAlloc)
	if diff := dstAlloc - srcAlloc; diff > 256<<10 || diff < -256<<10 {
		t.Errorf("exported file allocates %d bytes, source %d", dstAlloc, srcAlloc)
	}
	if dstAlloc < srcNonZero || dstAlloc > srcNonZero+128<<10 {
		t.Errorf("exported file allocates %d bytes for %d bytes of non-zero blocks", dstAlloc, srcNonZero)
	}

	// Exporting over an existing file replaces it.
	writeFile(t, dst, randomBytes(2<<20, 5))
	mustRun(t, "export", store, "disk.raw", dst)
	sameContents(t, src, dst)
}

// TestImportBigBlocks imports into a store with 64 KiB blocks a file whose
// data regions share blocks and whose size is not a multiple of a block.
func TestImportBigBlocks(t *testing.T) {
	store := newStore(t, "--block-size", "64K")
	dir := t.TempDir()
	const size = 10<<20 + 123
	src := filepath.Join(dir, "src.raw")
	makeSparseFile(t, src, size, []piece{
		{4096, randomBytes(100, 1)},          // two regions in one 64 KiB block
		{40960, randomBytes(5000, 2)},        //
		{1 << 20, make([]byte, 64<<10)},      // an all-zero block, allocated
		{2<<20 - 10, randomBytes(20, 3)},     // across a block boundary
		{3 << 20, randomBytes(200<<10, 4)},   // several blocks
		{size - 50, randomBytes(50, 5)},      // the short last block
		{5<<20 + 65536, randomBytes(10, 6)},  //
		{5<<20 + 131072, make([]byte, 4096)}, // zeros after data in a region
	})
	mustRun(t, "import", store, "a.raw", src)
	d := diskByName(t, store, "a.raw")
	_, nonZero64 := dataStats(t, src, 64<<10)
	if d.Size != size || d.Allocated != (nonZero64+64<<10-1)/(64<<10)*(64<<10) {
		t.Errorf("disk %+v; source has %d bytes in non-zero 64 KiB blocks", d, nonZero64)
	}
	dst := filepath.Join(dir, "dst.raw")
	mustRun(t, "export", store, "a.raw", dst)
	sameContents(t, src, dst)
	if st, err := os.Stat(dst); err != nil || st.Size() != size {
		t.Fatalf("exported size: %v %v", st, err)
	}
	_, nonZero4 := dataStats(t, src, 4096)
	if a := allocated(t, dst); a < nonZero4 || a > nonZero4+64<<10 {
		t.Errorf("exported file allocates %d bytes for %d bytes of non-zero 4 KiB blocks", a, nonZero4)
	}
}

// TestImportNoSeekHole reads the whole source, as on a file system without
// SEEK_HOLE: zero blocks are still skipped.
func TestImportNoSeekHole(t *testing.T) {
	store := newStore(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.raw")
	makeSparseFile(t, src, 3<<20+7, []piece{{1 << 20, randomBytes(8192, 1)}, {3 << 20, []byte("tail!!!")}})
	mustRun(t, "import", "--no-seek-hole", store, "a.raw", src)
	if d := diskByName(t, store, "a.raw"); d.Allocated != 3*4096 {
		t.Errorf("allocated %d", d.Allocated)
	}
	dst := filepath.Join(dir, "dst.raw")
	mustRun(t, "export", store, "a.raw", dst)
	sameContents(t, src, dst)
}

func TestImportOptions(t *testing.T) {
	store := newStore(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.raw")
	writeFile(t, src, randomBytes(10000, 1))
	mustRun(t, "import", "--size", "1M", "--mode", "600", store, "a.raw", src)
	if d := diskByName(t, store, "a.raw"); d.Size != 1<<20 || d.Mode != "0600" || d.Allocated != 12288 {
		t.Errorf("disk %+v", d)
	}
	empty := filepath.Join(dir, "empty.raw")
	writeFile(t, empty, nil)
	mustRun(t, "import", store, "empty.raw", empty)
	if d := diskByName(t, store, "empty.raw"); d.Size != 0 || d.Allocated != 0 {
		t.Errorf("disk %+v", d)
	}
}

func TestImportErrors(t *testing.T) {
	store := newStore(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.raw")
	writeFile(t, src, randomBytes(10000, 1))
	mustRun(t, "create", store, "a.raw", "1M")
	wantFail(t, exitFailure, []string{"already exists"}, "import", store, "a.raw", src)
	wantFail(t, exitFailure, []string{"no such file"}, "import", store, "b.raw", filepath.Join(dir, "none"))
	wantFail(t, exitFailure, []string{"smaller than"}, "import", "--size", "4K", store, "b.raw", src)
	wantFail(t, exitFailure, []string{"unknown suffix"}, "import", "--size", "4Q", store, "b.raw", src)
	wantFail(t, exitFailure, []string{"invalid disk name"}, "import", store, "a/b", src)
	wantFail(t, exitFailure, []string{"the store itself"}, "import", store, "b.raw", store)
	wantFail(t, exitFailure, []string{"no such file"}, "import", filepath.Join(dir, "none.img"), "b.raw", src)
	if ds := listDisks(t, store); len(ds) != 1 {
		t.Errorf("disks after failed imports: %+v", ds)
	}
}

// TestImportNoSpace: an import that runs out of space fails and removes the
// disk it created, leaving the store clean (newStore checks it).
func TestImportNoSpace(t *testing.T) {
	store := filepath.Join(t.TempDir(), "small.img")
	mustRun(t, "format", "--size", "4M", store)
	t.Cleanup(func() { checkStore(t, store) })
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, randomBytes(4<<20, 1))
	wantFail(t, exitFailure, []string{"no space left"}, "import", store, "a.raw", src)
	if ds := listDisks(t, store); len(ds) != 0 {
		t.Errorf("disks after a failed import: %+v", ds)
	}
	// The space is free again.
	writeFile(t, src, randomBytes(1<<20, 2))
	mustRun(t, "import", store, "b.raw", src)
}

func TestExportErrors(t *testing.T) {
	store := newStore(t)
	dir := t.TempDir()
	mustRun(t, "create", store, "a.raw", "1M")
	dst := filepath.Join(dir, "dst.raw")
	wantFail(t, exitFailure, []string{"no such disk"}, "export", store, "b.raw", dst)
	if _, err := os.Stat(dst); !os.IsNotExist(err) {
		t.Errorf("failed export left %s: %v", dst, err)
	}
	wantFail(t, exitFailure, []string{"the store itself"}, "export", store, "a.raw", store)
	wantFail(t, exitFailure, []string{"not a regular file"}, "export", store, "a.raw", dir)
	wantFail(t, exitFailure, []string{"no such file"}, "export", store, "a.raw", filepath.Join(dir, "nodir", "x"))
	wantFail(t, exitFailure, []string{"no such file"}, "export", filepath.Join(dir, "none.img"), "a.raw", dst)
	// A disk of holes exports as a file of holes.
	mustRun(t, "export", store, "a.raw", dst)
	if st, err := os.Stat(dst); err != nil || st.Size() != 1<<20 || allocated(t, dst) != 0 {
		t.Errorf("export of an empty disk: %v %v, %d allocated", st, err, allocated(t, dst))
	}
}

func TestProgress(t *testing.T) {
	var errb bytes.Buffer
	e := newEnv(io.Discard, &errb, true)
	p := e.newProgress(100<<20, "import")
	p.set(50 << 20)
	p.done()
	if !strings.Contains(errb.String(), "import") {
		t.Errorf("no progress bar on a terminal: %q", errb.String())
	}
	errb.Reset()
	e = newEnv(io.Discard, &errb, false)
	p = e.newProgress(100<<20, "import")
	p.set(50 << 20)
	p.done()
	if errb.Len() != 0 {
		t.Errorf("progress bar without a terminal: %q", errb.String())
	}
}

func TestWriteNonZero(t *testing.T) {
	buf := make([]byte, 10*4096+100)
	for _, b := range []int{1, 2, 5, 10} { // blocks with data; 10 is the short tail
		buf[b*4096+7] = 1
	}
	var got []string
	n, err := writeNonZero(buf, 8192, 4096, func(p []byte, off int64) error {
		got = append(got, strings.Repeat("x", len(p)/4096)+"@"+string(rune('0'+(off-8192)/4096)))
		return nil
	})
	if err != nil || n != 3*4096+100 || strings.Join(got, " ") != "xx@1 x@5 @:" {
		t.Errorf("writeNonZero: %d %v %q", n, err, got)
	}
}
