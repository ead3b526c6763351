package fs

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tests named TestBig* move a GiB or more; the race run skips them
// (go test -race -skip Big ./fs).

// TestBigDirectDD: 1 GiB of random data written with dd oflag=direct,
// read back with dd iflag=direct, and again after unmount, store close,
// reopen and remount.
func TestBigDirectDD(t *testing.T) {
	tc := newTestCase(t)
	src := filepath.Join(tc.dir, "src")
	writeRandomFile(t, src, 1<<30, 42)
	before := tc.store.Counters()
	start := time.Now()
	run(t, "dd", "if="+src, "of="+tc.path("d.raw"), "bs=1M", "oflag=direct", "status=none")
	wrote := time.Since(start)
	after := tc.store.Counters()
	t.Logf("dd write 1 GiB O_DIRECT: %v (%.0f MiB/s), %d backend data writes, %d write requests",
		wrote.Round(time.Millisecond), 1024/wrote.Seconds(), after.DataWrites-before.DataWrites, after.WriteRequests-before.WriteRequests)
	if st := stat(t, tc.path("d.raw")); st.Size != 1<<30 || st.Blocks != 1<<30/512 {
		t.Errorf("size %d, blocks %d", st.Size, st.Blocks)
	}
	start = time.Now()
	run(t, "bash", "-c", fmt.Sprintf("set -o pipefail; dd if=%s bs=1M iflag=direct status=none | cmp - %s", tc.path("d.raw"), src))
	t.Logf("dd read 1 GiB O_DIRECT + cmp: %v", time.Since(start).Round(time.Millisecond))
	tc.remount()
	start = time.Now()
	sameFiles(t, src, tc.path("d.raw"))
	t.Logf("cmp 1 GiB (buffered reads) after remount: %v", time.Since(start).Round(time.Millisecond))
}

// TestBigDDBackendWrites: dd of 1 GiB in 1 MiB O_DIRECT writes is about
// one backend data write per MiB (docs/DESIGN.md: keep large I/O large).
func TestBigDDBackendWrites(t *testing.T) {
	tc := newTestCase(t)
	before := tc.store.Counters()
	start := time.Now()
	run(t, "dd", "if=/dev/zero", "of="+tc.path("d.raw"), "bs=1M", "count=1024", "oflag=direct", "status=none")
	el := time.Since(start)
	after := tc.store.Counters()
	writes := after.DataWrites - before.DataWrites
	t.Logf("dd 1 GiB /dev/zero O_DIRECT: %v (%.0f MiB/s); DataWrites delta %d (%d bytes, avg %d KiB), WriteRequests %d",
		el.Round(time.Millisecond), 1024/el.Seconds(), writes, after.DataWriteBytes-before.DataWriteBytes,
		(after.DataWriteBytes-before.DataWriteBytes)/max(writes, 1)/1024, after.WriteRequests-before.WriteRequests)
	if writes < 1000 || writes > 1100 {
		t.Errorf("DataWrites delta %d, want within [1000, 1100]", writes)
	}
	if info, _ := tc.store.Stat("d.raw"); info.Extents > 4 {
		t.Errorf("1 GiB written sequentially is %d extents", info.Extents)
	}
}

// sparseSource writes a sparse image of size bytes at path: random data in
// the given [start, end) MiB ranges, plus one MiB of written zeros at
// zeroMiB (allocated in the source, a hole after cp --sparse=always).
// It returns the bytes of non-zero data.
func sparseSource(t *testing.T, path string, sizeMiB int64, dataMiB [][2]int64, zeroMiB int64) int64 {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(sizeMiB << 20); err != nil {
		t.Fatal(err)
	}
	var total int64
	for i, r := range dataMiB {
		n := (r[1] - r[0]) << 20
		buf := make([]byte, n)
		newPRNGReader(uint64(100 + i)).Read(buf)
		if _, err := f.WriteAt(buf, r[0]<<20); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if zeroMiB >= 0 {
		if _, err := f.WriteAt(make([]byte, 1<<20), zeroMiB<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return total
}

// duBytes is du --block-size=1 of path: allocated bytes.
func duBytes(t *testing.T, path string) int64 {
	t.Helper()
	out := run(t, "du", "--block-size=1", path)
	n, err := strconv.ParseInt(strings.Fields(out)[0], 10, 64)
	if err != nil {
		t.Fatalf("du output %q: %v", out, err)
	}
	return n
}

// TestCpSparse: cp --sparse=always of a sparse image into the mount is
// identical and about as sparse as the source; cp over an existing disk
// (which truncates it, docs/CLIENTS.md trap 9) works too.
func TestCpSparse(t *testing.T) {
	tc := newTestCase(t)
	src := filepath.Join(tc.dir, "src.raw")
	data := sparseSource(t, src, 256, [][2]int64{{0, 3}, {10, 11}, {100, 120}, {255, 256}}, 50)
	run(t, "cp", "--sparse=always", src, tc.path("s.raw"))
	sameFiles(t, src, tc.path("s.raw"))
	srcDu, dstDu := duBytes(t, src), duBytes(t, tc.path("s.raw"))
	t.Logf("du: source %d, copy %d, non-zero data %d", srcDu, dstDu, data)
	if dstDu < data || dstDu > data+(1<<20) {
		t.Errorf("du of the copy %d, want about the %d bytes of data (source du %d)", dstDu, data, srcDu)
	}

	// Over the existing disk: a smaller, differently laid out image.
	src2 := filepath.Join(tc.dir, "src2.raw")
	data2 := sparseSource(t, src2, 64, [][2]int64{{5, 7}, {60, 61}}, -1)
	run(t, "cp", "--sparse=always", src2, tc.path("s.raw"))
	sameFiles(t, src2, tc.path("s.raw"))
	if st := stat(t, tc.path("s.raw")); st.Size != 64<<20 || st.Blocks*512 > data2+(1<<20) {
		t.Errorf("after cp over: size %d, %d bytes allocated for %d of data", st.Size, st.Blocks*512, data2)
	}
	// Plain cp (sparse=auto: holes from SEEK_HOLE of the source) over it again.
	run(t, "cp", src, tc.path("s.raw"))
	sameFiles(t, src, tc.path("s.raw"))
	if du := duBytes(t, tc.path("s.raw")); du > srcDu+(1<<20) {
		t.Errorf("plain cp: du %d, source %d", du, srcDu)
	}
	// And the other way round, out of the mount.
	back := filepath.Join(tc.dir, "back.raw")
	run(t, "cp", "--sparse=always", tc.path("s.raw"), back)
	sameFiles(t, src, back)
	tc.remount()
	sameFiles(t, src, tc.path("s.raw"))
}

// qemuMap is one entry of qemu-img map --output=json.
type qemuMap struct {
	Start  int64 `json:"start"`
	Length int64 `json:"length"`
	Data   bool  `json:"data"`
	Zero   bool  `json:"zero"`
}

// TestQemuImg: qemu-img convert into the mount (buffered and cache=none),
// compare, and map shows the holes (found with SEEK_DATA/SEEK_HOLE).
func TestQemuImg(t *testing.T) {
	requireFUSE(t)
	requireTool(t, "qemu-img", "qemu-utils")
	tc := newTestCase(t)
	src := filepath.Join(tc.dir, "src.raw")
	ranges := [][2]int64{{0, 2}, {30, 34}, {200, 201}}
	sparseSource(t, src, 256, ranges, -1)

	run(t, "qemu-img", "convert", "-O", "raw", src, tc.path("q.raw"))
	run(t, "qemu-img", "compare", src, tc.path("q.raw"))
	out := run(t, "qemu-img", "map", "--output=json", tc.path("q.raw"))
	var m []qemuMap
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("qemu-img map: %v\n%s", err, out)
	}
	var dataBytes, holes int64
	for _, e := range m {
		if e.Data {
			dataBytes += e.Length
		} else {
			holes++
		}
	}
	if holes == 0 || dataBytes > 8<<20 || dataBytes < 7<<20 {
		t.Errorf("qemu-img map: %d holes, %d data bytes (want 7 MiB in 3 ranges): %s", holes, dataBytes, out)
	}
	for _, r := range ranges {
		found := false
		for _, e := range m {
			if e.Data && e.Start <= r[0]<<20 && e.Start+e.Length >= r[1]<<20 {
				found = true
			}
		}
		if !found {
			t.Errorf("qemu-img map: no data extent covers [%d, %d) MiB: %s", r[0], r[1], out)
		}
	}

	// cache=none: the target is opened O_DIRECT, as QEMU does for a VM.
	run(t, "qemu-img", "convert", "-t", "none", "-O", "raw", src, tc.path("q2.raw"))
	run(t, "qemu-img", "compare", "-T", "none", src, tc.path("q2.raw"))
	// A qcow2 image stored in the mount is just a file to qemu-img.
	run(t, "qemu-img", "convert", "-O", "qcow2", src, tc.path("q.qcow2"))
	run(t, "qemu-img", "compare", src, tc.path("q.qcow2"))
	run(t, "qemu-img", "create", "-f", "raw", tc.path("new.raw"), "1G")
	// QEMU writes the first block of a new raw image (file-posix
	// allocate_first_block), nothing else.
	if st := stat(t, tc.path("new.raw")); st.Size != 1<<30 || st.Blocks > 4096/512 {
		t.Errorf("qemu-img create: size %d, blocks %d", st.Size, st.Blocks)
	}
	info := run(t, "qemu-img", "info", "--output=json", tc.path("q.raw"))
	if !strings.Contains(info, `"virtual-size": 268435456`) {
		t.Errorf("qemu-img info: %s", info)
	}
}
