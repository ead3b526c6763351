package crypt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

func writeKeyFile(t *testing.T, dir, name string, content []byte, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadKeyFile(t *testing.T) {
	dir := t.TempDir()
	key := bytes.Repeat([]byte{7}, KeyFileSize)
	tab := func() *SlotTable {
		k := newDataKey(t)
		tab := NewSlotTable(k)
		if _, err := tab.AddSlot(k, newKeyFileSecret(t, 7), Argon2Params{}); err != nil {
			t.Fatal(err)
		}
		return tab
	}()
	for _, mode := range []os.FileMode{0o600, 0o400} {
		p := writeKeyFile(t, dir, "ok"+mode.String(), key, mode)
		s, err := LoadKeyFile(p)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if s.Kind() != KindKeyFile || !bytes.Equal(s.bytes(), key) {
			t.Errorf("mode %v: wrong secret", mode)
		}
		if k, _, err := tab.Unlock(s); err != nil {
			t.Errorf("mode %v: unlock: %v", mode, err)
		} else {
			k.Close()
		}
		s.Close()
	}
	// A symbolic link to a good key file is followed (Kubernetes secret
	// volumes are made of them): the file it names is what is checked.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(writeKeyFile(t, dir, "target", key, 0o400), link); err != nil {
		t.Fatal(err)
	}
	if s, err := LoadKeyFile(link); err != nil {
		t.Errorf("symlink to a good key file: %v", err)
	} else {
		s.Close()
	}

	refused := map[string]string{
		"mode 0644":   writeKeyFile(t, dir, "0644", key, 0o644),
		"mode 0640":   writeKeyFile(t, dir, "0640", key, 0o640),
		"mode 0700":   writeKeyFile(t, dir, "0700", key, 0o700),
		"mode 0200":   writeKeyFile(t, dir, "0200", key, 0o200),
		"setuid":      writeKeyFile(t, dir, "setuid", key, 0o600|os.ModeSetuid),
		"short":       writeKeyFile(t, dir, "short", key[:31], 0o600),
		"long":        writeKeyFile(t, dir, "long", append(bytes.Clone(key), '\n'), 0o600),
		"empty":       writeKeyFile(t, dir, "empty", nil, 0o600),
		"directory":   dir,
		"device":      "/dev/null",
		"symlink dir": func() string { p := filepath.Join(dir, "dirlink"); _ = os.Symlink(dir, p); return p }(),
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	refused["fifo"] = fifo
	if os.Geteuid() == 0 {
		p := writeKeyFile(t, dir, "other-owner", key, 0o600)
		if err := os.Chown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		refused["other owner"] = p
	} else {
		t.Log("not root: the other-owner case needs chown and is left out")
	}
	for name, p := range refused {
		s, err := LoadKeyFile(p)
		if !errors.Is(err, ErrKeyFile) {
			t.Errorf("%s: %v, want ErrKeyFile", name, err)
		}
		if s != nil {
			s.Close()
		}
	}
	if _, err := LoadKeyFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

// TestKeyFileOwnerCheck covers the owner rule without root: the file is
// ours, the euid given is not.
func TestKeyFileOwnerCheck(t *testing.T) {
	p := writeKeyFile(t, t.TempDir(), "k", make([]byte, KeyFileSize), 0o600)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkKeyFileInfo(fi, os.Geteuid()); err != nil {
		t.Fatalf("own file: %v", err)
	}
	if err := checkKeyFileInfo(fi, os.Geteuid()+1); !errors.Is(err, ErrKeyFile) {
		t.Errorf("file of another uid: %v, want ErrKeyFile", err)
	}
}

func TestSecretConstructorsCheckLength(t *testing.T) {
	for _, n := range []int{0, 31, 33, 64} {
		if _, err := KeyFileSecret(make([]byte, n)); !errors.Is(err, ErrKeyFile) {
			t.Errorf("key of %d bytes: %v, want ErrKeyFile", n, err)
		}
	}
	for _, n := range []int{0, MaxPassphrase + 1} {
		if _, err := PassphraseSecret(make([]byte, n)); !errors.Is(err, ErrInvalid) {
			t.Errorf("passphrase of %d bytes: %v, want ErrInvalid", n, err)
		}
	}
}

// TestKeyMemoryIsLockedAndNotDumped finds a data key's mapping in
// /proc/self/smaps and checks its flags: dd (MADV_DONTDUMP) and wf
// (MADV_WIPEONFORK, Linux 4.14 on) always, lo (mlock) when RLIMIT_MEMLOCK
// allows a page. After Close the key is gone:
// its mapping is unmapped and using the key panics.
func TestKeyMemoryIsLockedAndNotDumped(t *testing.T) {
	k, err := NewDataKey()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(k.bytes(), make([]byte, DataKeySize)) {
		t.Fatal("a new data key is all zeros")
	}
	start := fmt.Sprintf("%x-", uintptrOf(k.buf.mem))
	flags := mappingFlags(t, start)
	if flags == nil {
		t.Fatalf("no mapping starting at %s in /proc/self/smaps", start)
	}
	if !flags["dd"] {
		t.Error("key memory is not excluded from core dumps (no dd flag)")
	}
	if !flags["wf"] {
		t.Error("key memory is not wiped in a forked child (no wf flag)")
	}
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 || lim.Cur >= uint64(os.Getpagesize()) {
		if !flags["lo"] {
			t.Error("key memory is not locked (no lo flag)")
		}
	} else {
		t.Logf("RLIMIT_MEMLOCK %d: mlock is not expected to succeed", lim.Cur)
	}
	k.Close()
	if mappingFlags(t, start) != nil {
		t.Error("Close left the key's mapping in place")
	}
	k.Close() // closing twice is fine
	mustPanic(t, "a closed key", func() { k.bytes() })
}

// mustPanic fails the test unless f panics.
func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s was usable", what)
		}
	}()
	f()
}

// mappingFlags returns the VmFlags of the mapping whose smaps header
// starts with start ("7f12...-"), or nil when there is none.
func mappingFlags(t *testing.T, start string) map[string]bool {
	t.Helper()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		if strings.HasPrefix(line, start) {
			in = true
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			flags := map[string]bool{}
			for _, f := range strings.Fields(strings.TrimPrefix(line, "VmFlags:")) {
				flags[f] = true
			}
			return flags
		}
	}
	return nil
}
