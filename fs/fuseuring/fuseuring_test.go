package fuseuring

import (
	"testing"
	"unsafe"
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
