package fuseuring

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string]int{"0\n": 1, "0-1\n": 2, "0-3,6-7": 8, "0,2": 3} {
		if got, err := parseCPUList(in); err != nil || got != want {
			t.Errorf("parseCPUList(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "0-"} {
		if _, err := parseCPUList(in); err == nil {
			t.Errorf("parseCPUList(%q) succeeded", in)
		}
	}
}

func TestOwnerCPU(t *testing.T) {
	// Every CPU hosts exactly one owner, never that of its own queue when
	// there is another CPU.
	for _, nq := range []int{1, 2, 3, 8} {
		hosted := make([]int, nq)
		for qid := range nq {
			cpu := ownerCPU(qid, nq)
			if cpu < 0 || cpu >= nq || nq > 1 && cpu == qid {
				t.Errorf("ownerCPU(%d, %d) = %d", qid, nq, cpu)
				continue
			}
			hosted[cpu]++
		}
		for cpu, n := range hosted {
			if n != 1 {
				t.Errorf("%d CPUs: CPU %d hosts %d owners", nq, cpu, n)
			}
		}
	}
}

// TestABI pins the layouts shared with the kernel (include/uapi/linux/fuse.h).
func TestABI(t *testing.T) {
	if n := unsafe.Sizeof(entInOut{}); n != 32 {
		t.Errorf("fuse_uring_ent_in_out is %d bytes, want 32", n)
	}
	if n := unsafe.Sizeof(cmdReq{}); n != 24 || n > 80 {
		t.Errorf("fuse_uring_cmd_req is %d bytes, want 24 (at most the SQE's 80)", n)
	}
	if reqHeaderSize != 288 || iovOff < reqHeaderSize || iovOff+32 > headerStride {
		t.Errorf("header layout: size %d, iovecs at %d, stride %d", reqHeaderSize, iovOff, headerStride)
	}
	if inHeaderSize != 40 || outHeaderSize != 16 {
		t.Errorf("fuse_in_header %d, fuse_out_header %d bytes; want 40, 16", inHeaderSize, outHeaderSize)
	}
}

// TestPayloadHugePages checks that payload buffers are mapped for
// transparent huge pages (MADV_HUGEPAGE): /proc/self/smaps says the
// mapping is THP-eligible. Without it a 1 MiB write reached virtio-blk as
// two requests and cost the daemon more CPU (see the package doc).
func TestPayloadHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Skipf("no transparent huge pages here (%q, %v)", mode, err)
	}
	b, err := mapPayload(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	start := uint64(uintptr(unsafe.Pointer(&b[0])))
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var in bool
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x", &lo, &hi); n == 2 && strings.Contains(line, " ") {
			in = lo <= start && start < hi
			continue
		}
		if in && strings.HasPrefix(line, "THPeligible:") {
			if got := strings.TrimSpace(strings.TrimPrefix(line, "THPeligible:")); got != "1" {
				t.Fatalf("payload mapping at %#x: THPeligible %s, want 1", start, got)
			}
			return
		}
	}
	t.Fatalf("payload mapping at %#x: no THPeligible line in /proc/self/smaps", start)
}
