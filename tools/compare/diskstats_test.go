package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseDiskstats(t *testing.T) {
	f, err := os.Open("testdata/diskstats")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	all, err := parseDiskstats(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 4 {
		t.Fatalf("%d devices", len(all))
	}
	vda := all[1]
	if vda.Name != "vda" || vda.Major != 254 || vda.Minor != 0 {
		t.Errorf("vda = %+v", vda)
	}
	want := ioCount{Reads: 85418, ReadBytes: 4111762 * 512, Writes: 63917, WriteBytes: 7047560 * 512}
	if vda.IO != want || vda.ReadMerges != 14192 || vda.WriteMerges != 56660 {
		t.Errorf("vda = %+v, want %+v", vda.IO, want)
	}
	// Old kernels' 14-field lines (no discard and flush fields) parse too.
	if p := all[2]; p.Name != "vda1" || p.IO.Writes != 200 || p.IO.WriteBytes != 4096*512 {
		t.Errorf("vda1 = %+v", p)
	}
	for _, bad := range []string{"254 0 vda 1 2 3\n", "254 0 vda x 0 0 0 0 0 0 0 0 0 0\n"} {
		if _, err := parseDiskstats(strings.NewReader(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func TestDeviceOf(t *testing.T) {
	d, err := deviceOf("", "/dev/vda", "testdata/diskstats")
	if err != nil || d.Name != "vda" || d.Major != 254 {
		t.Fatalf("by name: %+v, %v", d, err)
	}
	c, err := d.sample()
	if err != nil || c.Writes != 63917 {
		t.Errorf("sample %+v, %v", c, err)
	}
	if _, err := deviceOf("", "sdz", "testdata/diskstats"); err == nil {
		t.Error("a device that is not listed was found")
	}
	// By path: the device of a real directory, in a diskstats file that
	// lists it.
	dir := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(dir, "diskstats")
	line := fmt.Sprintf("%d %d thedisk 1 0 8 0 2 0 16 0 0 0 0 0 0 0 0 0 0\n", unix.Major(st.Dev), unix.Minor(st.Dev))
	if err := os.WriteFile(fake, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err = deviceOf(dir, "", fake)
	if err != nil || d.Name != "thedisk" {
		t.Fatalf("by path: %+v, %v", d, err)
	}
	if c, err := d.sample(); err != nil || c != (ioCount{Reads: 1, ReadBytes: 4096, Writes: 2, WriteBytes: 8192}) {
		t.Errorf("sample %+v, %v", c, err)
	}
	if err := os.WriteFile(fake, []byte("1 2 other 0 0 0 0 0 0 0 0 0 0 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := deviceOf(dir, "", fake); err == nil {
		t.Error("a device missing from diskstats was found")
	}
}

func TestIOCountSub(t *testing.T) {
	a := ioCount{Reads: 10, ReadBytes: 100, Writes: 20, WriteBytes: 2000}
	b := ioCount{Reads: 4, ReadBytes: 40, Writes: 5, WriteBytes: 500}
	d := a.sub(b)
	if d != (ioCount{6, 60, 15, 1500}) || d.ios() != 21 || d.bytes() != 1560 {
		t.Errorf("%+v", d)
	}
}
