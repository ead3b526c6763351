package hugepage

import (
	"testing"
	"unsafe"
)

func TestMapAlignedAndZeroed(t *testing.T) {
	for _, n := range []int{1, 4096, Size, Size + 1, 3 * Size} {
		b, err := Map(n)
		if err != nil {
			t.Fatalf("Map(%d): %v", n, err)
		}
		if want := (n + Size - 1) / Size * Size; len(b) != want || cap(b) != want {
			t.Errorf("Map(%d): len %d cap %d, want %d", n, len(b), cap(b), want)
		}
		if addr := uintptr(unsafe.Pointer(&b[0])); addr%Size != 0 {
			t.Errorf("Map(%d): address %#x not aligned to %d", n, addr, Size)
		}
		for i := 0; i < len(b); i += 4096 {
			if b[i] != 0 {
				t.Fatalf("Map(%d): byte %d is %d, want 0", n, i, b[i])
			}
			b[i] = 1
		}
		if err := Unmap(b); err != nil {
			t.Fatalf("Unmap: %v", err)
		}
	}
	if _, err := Map(0); err == nil {
		t.Error("Map(0) succeeded")
	}
}

// TestMapHugePages checks, through /proc/self/smaps, that touched memory
// from Map is backed by transparent huge pages where the kernel has them.
func TestMapHugePages(t *testing.T) {
	if !Available() {
		t.Skip("no transparent huge pages on this kernel")
	}
	b, err := Map(4 * Size)
	if err != nil {
		t.Fatal(err)
	}
	defer Unmap(b)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	m, err := Lookup(b)
	if err != nil {
		t.Fatal(err)
	}
	if !m.THPEligible {
		t.Errorf("mapping at %p: not THP-eligible", &b[0])
	}
	if m.AnonHugePages == 0 {
		t.Errorf("mapping at %p: no huge pages behind %d touched bytes (%+v)", &b[0], len(b), m)
	}
	if m.Size < int64(len(b)) {
		t.Errorf("mapping at %p: smaps size %d, want at least %d", &b[0], m.Size, len(b))
	}
}

func TestLookupEmpty(t *testing.T) {
	if _, err := Lookup(nil); err == nil {
		t.Error("Lookup(nil) succeeded")
	}
}
