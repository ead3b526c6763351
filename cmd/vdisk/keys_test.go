package main

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// writeKey writes a key file of 32 random bytes with mode.
func writeKey(t *testing.T, dir, name string, mode os.FileMode) string {
	t.Helper()
	b := make([]byte, 32)
	rand.Read(b)
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

// cryptPattern is n recognisable bytes of disk tag.
func cryptPattern(tag string, n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%-12s %08d: recognisable plaintext of this disk....\n", tag, i)
	}
	return b.Bytes()[:n]
}

// writeDisk writes p at the start of the mounted disk path and fsyncs it.
func writeDisk(t *testing.T, path string, p []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

// readDisk reads len(want) bytes of the mounted disk path and compares.
func checkDisk(t *testing.T, path string, want []byte) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	got := make([]byte, len(want))
	if _, err := f.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s does not read back as written", path)
	}
}

func unmountAndWait(t *testing.T, mnt string, exit <-chan result) {
	t.Helper()
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
}

// Encrypted disks end to end: created offline and through a mount, a
// pattern written through the mount is nowhere in the store file in clear
// (a plain disk's is, so the search can fail); two keys each open only
// their disk; a locked disk is listed, refused with ENOKEY, snapshotted,
// defragmented and checked without its key, and after unlocking it and
// its snapshot read as written; key slots change online.
func TestEncryptedDisksThroughMount(t *testing.T) {
	requireFUSE(t)
	store := newStore(t)
	keys := t.TempDir()
	aKey := writeKey(t, keys, "a.raw.key", 0o600)
	other := t.TempDir()
	bKey := writeKey(t, other, "b.key", 0o400)
	cKey := writeKey(t, other, "c.key", 0o600)
	writeKey(t, keys, "open.raw.key", 0o644) // refused: readable by others

	mustRun(t, "create", store, "a.raw", "4M", "--encrypt", "--key-file", aKey)
	mustRun(t, "create", store, "open.raw", "1M", "--encrypt", "--key-file", aKey)
	wantFail(t, exitFailure, []string{"--encrypt needs --key-file"}, "create", store, "x.raw", "4M", "--encrypt")
	if out := mustRun(t, "ls", store).stdout; !strings.Contains(out, "locked") {
		t.Errorf("ls of the store lists no locked disk:\n%s", out)
	}

	mnt, exit := mountInProcess(t, "--key-dir", keys, store, filepath.Join(t.TempDir(), "mnt"))
	mustRun(t, "create", mnt, "b.raw", "4M", "--encrypt", "--key-file", bKey)
	mustRun(t, "create", mnt, "plain.raw", "4M")
	pa, pb, pp := cryptPattern("DISK-A", 3<<20), cryptPattern("DISK-B", 3<<20), cryptPattern("PLAIN", 3<<20)
	writeDisk(t, filepath.Join(mnt, "a.raw"), pa)
	writeDisk(t, filepath.Join(mnt, "b.raw"), pb)
	writeDisk(t, filepath.Join(mnt, "plain.raw"), pp)
	if _, err := os.Open(filepath.Join(mnt, "open.raw")); !errors.Is(err, syscall.ENOKEY) {
		t.Errorf("open of the disk whose key file was refused: %v, want ENOKEY", err)
	}
	ls := mustRun(t, "ls", mnt).stdout
	for _, want := range []string{"a.raw", "encrypted", "locked"} {
		if !strings.Contains(ls, want) {
			t.Errorf("ls through the mount lacks %q:\n%s", want, ls)
		}
	}
	mustRun(t, "sync", mnt)

	img, err := os.ReadFile(store)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(img, pp[1<<20:1<<20+64]) {
		t.Fatal("the plain disk's pattern is not in the store file: the search cannot fail")
	}
	for name, p := range map[string][]byte{"a.raw": pa, "b.raw": pb} {
		for off := 0; off+64 <= len(p); off += 4096 {
			if bytes.Contains(img, p[off:off+64]) {
				t.Fatalf("%s: its bytes at %d are in the store file in clear", name, off)
			}
		}
	}
	unmountAndWait(t, mnt, exit)

	// Mounted again with a.raw's key alone: b.raw is locked until its own
	// key is given; a's key is refused for it.
	mnt, exit = mountInProcess(t, "--key-dir", keys, store, mnt)
	checkDisk(t, filepath.Join(mnt, "a.raw"), pa)
	if _, err := os.Open(filepath.Join(mnt, "b.raw")); !errors.Is(err, syscall.ENOKEY) {
		t.Errorf("open of a locked disk: %v, want ENOKEY", err)
	}
	mustRun(t, "snapshot", filepath.Join(mnt, "b.raw"), "b.snap")
	mustRun(t, "clone", filepath.Join(mnt, "b.raw"), "b.clone")
	mustRun(t, "defrag", mnt, "b.raw")
	mustRun(t, "fsck", mnt)
	wantFail(t, exitWrongKey, []string{"wrong key"}, "unlock", filepath.Join(mnt, "b.raw"), "--key-file", aKey)
	mustRun(t, "unlock", filepath.Join(mnt, "b.raw"), "--key-file", bKey)
	checkDisk(t, filepath.Join(mnt, "b.raw"), pb)
	checkDisk(t, filepath.Join(mnt, "b.snap"), pb)
	checkDisk(t, filepath.Join(mnt, "b.clone"), pb)

	// Lock is refused while a disk with the key is open, then forgets it.
	f, err := os.Open(filepath.Join(mnt, "b.clone"))
	if err != nil {
		t.Fatal(err)
	}
	wantFail(t, exitFailure, []string{"in use"}, "lock", filepath.Join(mnt, "b.raw"))
	f.Close()
	// The kernel releases the file after close returns: try until it has.
	for start := time.Now(); vdisk(t, "lock", filepath.Join(mnt, "b.raw")).code != 0; time.Sleep(50 * time.Millisecond) {
		if time.Since(start) > time.Minute {
			t.Fatal("lock still refused a minute after the last close")
		}
	}
	if _, err := os.Open(filepath.Join(mnt, "b.snap")); !errors.Is(err, syscall.ENOKEY) {
		t.Errorf("open after lock: %v, want ENOKEY", err)
	}
	mustRun(t, "unlock", filepath.Join(mnt, "b.raw"), "--key-file", bKey)

	// Rotate b's key online: add c, remove b's slot; c opens it after a
	// remount, b does not.
	mustRun(t, "key", "add", filepath.Join(mnt, "b.raw"), "--key-file", bKey, "--new-key-file", cKey)
	list := mustRun(t, "key", "list", filepath.Join(mnt, "b.raw")).stdout
	if strings.Count(list, "keyfile") != 2 {
		t.Errorf("key list after adding one:\n%s", list)
	}
	mustRun(t, "key", "remove", filepath.Join(mnt, "b.raw"), "--key-file", cKey, "--slot", firstSlot(t, list))
	unmountAndWait(t, mnt, exit)

	mnt, exit = mountInProcess(t, store, mnt)
	wantFail(t, exitWrongKey, []string{"wrong key"}, "unlock", filepath.Join(mnt, "b.raw"), "--key-file", bKey)
	mustRun(t, "unlock", filepath.Join(mnt, "b.raw"), "--key-file", cKey)
	checkDisk(t, filepath.Join(mnt, "b.raw"), pb)
	unmountAndWait(t, mnt, exit)
}

// firstSlot is the first slot id of vdisk key list's output.
func firstSlot(t *testing.T, list string) string {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(list), "\n")
	if len(lines) < 2 {
		t.Fatalf("key list:\n%s", list)
	}
	return strings.Fields(lines[1])[0]
}

// send of an unlocked encrypted disk sends plaintext; a locked one is
// refused (exit 32); receive --encrypt encrypts on arrival under a key of
// its own, and an incremental stream lands on its encrypted base under
// the base's key.
func TestEncryptedSendReceive(t *testing.T) {
	requireFUSE(t)
	src := newStore(t)
	keys := t.TempDir()
	writeKey(t, keys, "a.raw.key", 0o600)
	mustRun(t, "create", src, "a.raw", "2M", "--encrypt", "--key-file", filepath.Join(keys, "a.raw.key"))
	mnt, exit := mountInProcess(t, "--key-dir", keys, src, filepath.Join(t.TempDir(), "mnt"))
	p1, p2 := cryptPattern("FIRST", 1<<20), cryptPattern("SECOND", 1<<20)
	writeDisk(t, filepath.Join(mnt, "a.raw"), p1)
	mustRun(t, "snapshot", filepath.Join(mnt, "a.raw"), "a.1")
	writeDisk(t, filepath.Join(mnt, "a.raw"), p2)
	mustRun(t, "snapshot", filepath.Join(mnt, "a.raw"), "a.2")
	full := mustRun(t, "send", filepath.Join(mnt, "a.1")).stdout
	incr := mustRun(t, "send", filepath.Join(mnt, "a.2"), "--from", "a.1").stdout
	unmountAndWait(t, mnt, exit)
	if !strings.Contains(full, string(p1[4096:4160])) {
		t.Error("the stream of an unlocked encrypted disk is not plaintext")
	}
	wantFail(t, exitLocked, []string{"locked"}, "send", src, "a.1")

	dir := t.TempDir()
	fullPath, incrPath := filepath.Join(dir, "full"), filepath.Join(dir, "incr")
	os.WriteFile(fullPath, []byte(full), 0o600)
	os.WriteFile(incrPath, []byte(incr), 0o600)
	dst := newStore(t)
	k2 := writeKey(t, dir, "k2", 0o600)
	mustRun(t, "receive", dst, "r.1", fullPath, "--encrypt", "--key-file", k2)
	wantFail(t, exitLocked, []string{"locked"}, "receive", dst, "r.2", incrPath)
	mustRun(t, "receive", dst, "r.2", incrPath, "--key-file", k2)
	img, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][]byte{p1, p2} {
		if bytes.Contains(img, p[4096:4160]) {
			t.Fatal("a received encrypted disk's data is in the store in clear")
		}
	}
	mnt, exit = mountInProcess(t, dst, filepath.Join(t.TempDir(), "mnt"))
	mustRun(t, "unlock", filepath.Join(mnt, "r.2"), "--key-file", k2)
	checkDisk(t, filepath.Join(mnt, "r.1"), p1)
	checkDisk(t, filepath.Join(mnt, "r.2"), p2)
	// Through the mount, the key file goes to the daemon open, with the
	// stream; the disk is unlocked there at once.
	k3 := writeKey(t, dir, "k3", 0o600)
	mustRun(t, "receive", mnt, "r.3", fullPath, "--encrypt", "--key-file", k3)
	checkDisk(t, filepath.Join(mnt, "r.3"), p1)
	if out := mustRun(t, "ls", mnt).stdout; !strings.Contains(out, "encrypted") {
		t.Errorf("ls:\n%s", out)
	}
	unmountAndWait(t, mnt, exit)
	mnt, exit = mountInProcess(t, dst, mnt)
	wantFail(t, exitWrongKey, []string{"wrong key"}, "unlock", filepath.Join(mnt, "r.3"), "--key-file", k2)
	unmountAndWait(t, mnt, exit)

	// Raw streams need no key: the full one from the store, the
	// incremental one through a mount that has no key; the received disks
	// open with the sender's key.
	rawFull := mustRun(t, "send", "--raw", src, "a.1").stdout
	smnt, sexit := mountInProcess(t, src, filepath.Join(t.TempDir(), "smnt"))
	rawIncr := mustRun(t, "send", "--raw", filepath.Join(smnt, "a.2"), "--from", "a.1").stdout
	unmountAndWait(t, smnt, sexit)
	if strings.Contains(rawFull, string(p1[4096:4160])) || strings.Contains(rawIncr, string(p2[4096:4160])) {
		t.Fatal("a raw stream holds plaintext")
	}
	os.WriteFile(fullPath, []byte(rawFull), 0o600)
	os.WriteFile(incrPath, []byte(rawIncr), 0o600)
	third := newStore(t)
	mustRun(t, "receive", third, "x.1", fullPath)
	mustRun(t, "receive", third, "x.2", incrPath)
	mnt, exit = mountInProcess(t, third, mnt)
	wantFail(t, exitWrongKey, []string{"wrong key"}, "unlock", filepath.Join(mnt, "x.2"), "--key-file", k2)
	mustRun(t, "unlock", filepath.Join(mnt, "x.2"), "--key-file", filepath.Join(keys, "a.raw.key"))
	checkDisk(t, filepath.Join(mnt, "x.1"), p1)
	checkDisk(t, filepath.Join(mnt, "x.2"), p2)
	unmountAndWait(t, mnt, exit)
}
