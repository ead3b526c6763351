package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Files that are not stores this build can use, through the commands a
// user runs on them: fsck tells damage it can see (exit 4, a
// store-unreadable finding) from a file it cannot treat as a store at all
// (exit 8: not a store, a newer format, too short to hold superblocks);
// mount and ls refuse all of them with exit 8 and a message naming the
// problem. The byte offsets come from FORMAT.md.

// superblockPatch changes both superblock copies of the store at path with
// edit, then sets each copy's CRC-32C (bytes 12..16, over 16..4096) again.
func superblockPatch(t *testing.T, path string, edit func(page []byte)) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	page := make([]byte, 4096)
	for _, at := range []int64{0, 4096} {
		if _, err := f.ReadAt(page, at); err != nil {
			t.Fatal(err)
		}
		edit(page)
		binary.LittleEndian.PutUint32(page[12:], crc32.Checksum(page[16:], crc32.MakeTable(crc32.Castagnoli)))
		if _, err := f.WriteAt(page, at); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBadStoreFiles(t *testing.T) {
	le := binary.LittleEndian
	store := func(t *testing.T) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "store.img")
		mustRun(t, "format", path, "--size", "8M")
		mustRun(t, "create", path, "a.raw", "1M")
		return path
	}
	cases := []struct {
		name string
		make func(t *testing.T) string
		fsck int      // exit code of vdisk fsck (and fsck --repair)
		msgs []string // in the output of every command
	}{
		{"random bytes", func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "random.img")
			b := make([]byte, 8<<20)
			rand.Read(b)
			writeFile(t, path, b)
			return path
		}, exitFailure, []string{"not a vdiskfs store", "bad magic"}},
		{"empty file", func(t *testing.T) string {
			path := filepath.Join(t.TempDir(), "empty.img")
			writeFile(t, path, nil)
			return path
		}, exitFailure, []string{"0 bytes, too small to hold a store"}},
		{"truncated store", func(t *testing.T) string {
			path := store(t)
			if err := os.Truncate(path, 4<<20); err != nil {
				t.Fatal(err)
			}
			return path
		}, exitUncorrected, []string{"store is truncated: the backing has 4194304 bytes, the superblock says 8388608"}},
		{"wrong block size", func(t *testing.T) string {
			path := store(t)
			superblockPatch(t, path, func(p []byte) { le.PutUint32(p[40:], 5000) })
			return path
		}, exitUncorrected, []string{"block size 5000 is not a power of two"}},
		{"future format version", func(t *testing.T) string {
			path := store(t)
			superblockPatch(t, path, func(p []byte) { le.PutUint32(p[8:], 4) })
			return path
		}, exitFailure, []string{"unsupported store format version", "format version 4, this build reads versions 1 to 3"}},
		{"unknown incompatible feature", func(t *testing.T) string {
			path := store(t)
			superblockPatch(t, path, func(p []byte) { le.PutUint32(p[44:], 1<<7) })
			return path
		}, exitFailure, []string{"unsupported store format version", "unknown incompatible features 0x80"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.make(t)
			for _, args := range [][]string{{"fsck", path}, {"fsck", "--repair", path}} {
				r := vdisk(t, args...)
				out := r.stdout + r.stderr
				if r.code != c.fsck {
					t.Errorf("vdisk %s: exit %d, want %d\n%s", strings.Join(args, " "), r.code, c.fsck, out)
				}
				for _, m := range c.msgs {
					if !strings.Contains(out, m) {
						t.Errorf("vdisk %s does not say %q:\n%s", strings.Join(args, " "), m, out)
					}
				}
				if c.fsck == exitUncorrected && !strings.Contains(r.stdout, codeUnreadable) {
					t.Errorf("vdisk %s: no %s finding:\n%s", strings.Join(args, " "), codeUnreadable, out)
				}
			}
			wantFail(t, exitFailure, c.msgs, "ls", path)
			wantFail(t, exitFailure, c.msgs, "info", path)
			r := mountExpectFail(t, path, filepath.Join(t.TempDir(), "mnt"))
			for _, m := range c.msgs {
				if !strings.Contains(r.stderr, m) {
					t.Errorf("vdisk mount does not say %q:\n%s", m, r.stderr)
				}
			}
			if strings.Contains(r.stderr, "Usage:") {
				t.Errorf("vdisk mount printed its usage for a bad store:\n%s", r.stderr)
			}
		})
	}
}

// mountExpectFail runs `vdisk mount STORE MNT --foreground` in process,
// which must fail (exit 8) before mounting. Should it mount after all, the
// mount is taken down again and the test fails, instead of serving forever.
func mountExpectFail(t *testing.T, store, mnt string) result {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	fd, err := unix.Dup(int(w.Fd()))
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan result, 1)
	go func() {
		done <- vdisk(t, "mount", store, mnt, "--foreground", "--ready-fd", strconv.Itoa(fd))
	}()
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(r).ReadString('\n')
		ready <- line
	}()
	select {
	case res := <-done:
		unix.Close(fd) // the mount closes it only when it became ready
		if res.code != exitFailure {
			t.Errorf("vdisk mount: exit %d, want %d: %s", res.code, exitFailure, res.stderr)
		}
		return res
	case <-ready:
		unix.Unmount(mnt, unix.MNT_DETACH)
		res := <-done
		t.Fatalf("vdisk mount of a bad store succeeded (exit %d)", res.code)
		return res
	}
}
