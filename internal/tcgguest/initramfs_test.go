package tcgguest

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
)

// cpioNames reads the entry names and modes of a newc archive.
func cpioNames(t *testing.T, b []byte) (names []string, modes []uint32) {
	t.Helper()
	align := func(n int) int { return (n + 3) &^ 3 }
	for off := 0; off < len(b); {
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc magic at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, nameLen := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+nameLen-1])
		if name == "TRAILER!!!" {
			return names, modes
		}
		names, modes = append(names, name), append(modes, uint32(mode))
		off = align(off+110+nameLen) + align(size)
	}
	t.Fatal("no trailer")
	return nil, nil
}

func TestInitramfsMakesParentDirectoriesOnce(t *testing.T) {
	dir := t.TempDir()
	bb := filepath.Join(dir, "busybox")
	if err := os.WriteFile(bb, []byte("not really busybox"), 0o755); err != nil {
		t.Fatal(err)
	}
	in := Initramfs{Busybox: bb, Files: []File{
		{Name: "init", Mode: 0o755, Data: []byte("#!/bin/sh\n")},
		{Name: "usr/lib/x86_64-linux-gnu/ceph/libx.so", Mode: 0o755, Data: []byte("x")},
		{Name: "usr/lib/x86_64-linux-gnu/liby.so", Mode: 0o755, Data: []byte("yy")},
		{Name: "lib64/ld.so", Mode: 0o755, Data: []byte("zzz")},
	}}
	out := filepath.Join(dir, "initramfs.cpio")
	if err := in.Write(out); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	names, modes := cpioNames(t, b)
	seen := map[string]bool{}
	for i, n := range names {
		if seen[n] {
			t.Errorf("%s twice", n)
		}
		seen[n] = true
		if parent := filepath.Dir(n); parent != "." && !seen[parent] {
			t.Errorf("%s before its directory %s", n, parent)
		}
		if isDir := modes[i]&0o170000 == cpioDir; isDir != slices.Contains([]string{"bin", "dev", "proc", "sys", "tmp", "lib", "lib/modules", "usr", "usr/lib", "usr/lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu/ceph", "lib64"}, n) {
			t.Errorf("%s: mode %o", n, modes[i])
		}
	}
	for _, want := range []string{"init", "bin/busybox", "bin/sh", "dev/console", "usr/lib/x86_64-linux-gnu/ceph/libx.so", "usr/lib/x86_64-linux-gnu/liby.so", "lib64/ld.so"} {
		if !seen[want] {
			t.Errorf("no %s in %v", want, names)
		}
	}
}

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd6b5f2000)\n" +
		"\tlibrbd.so.1 => /lib/x86_64-linux-gnu/librbd.so.1 (0x00007f0c1a000000)\n" +
		"\tlibceph-common.so.2 => /usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2 (0x00007f0c19000000)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f0c1c4a1000)\n"
	got, err := parseLdd(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/lib/x86_64-linux-gnu/librbd.so.1", "/usr/lib/x86_64-linux-gnu/ceph/libceph-common.so.2", "/lib64/ld-linux-x86-64.so.2"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := parseLdd("\tlibfoo.so.1 => not found\n"); err == nil {
		t.Error("a missing library is not an error")
	}
	if _, err := parseLdd("\tnot a dynamic executable\n"); err == nil {
		t.Error("no libraries is not an error")
	}
}

func TestConfigValue(t *testing.T) {
	config := []byte("# CONFIG_FOO is not set\nCONFIG_VIRTIO_PCI=m\nCONFIG_VIRTIO_BLK=y\nCONFIG_CMDLINE=\"x\"\n")
	for option, want := range map[string]string{"CONFIG_VIRTIO_PCI": "m", "CONFIG_VIRTIO_BLK": "y", "CONFIG_FOO": "", "CONFIG_CMDLINE": "x", "CONFIG_VIRTIO": ""} {
		if got := configValue(config, option); got != want {
			t.Errorf("%s: %q, want %q", option, got, want)
		}
	}
}
