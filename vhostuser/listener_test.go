package vhostuser

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestListen: the socket is 0600 (0660 with a group), a stale socket is
// replaced, a live one is refused, a second frontend is refused while one
// is served and the next is served once it left, and Close removes the
// socket.
func TestListen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.sock")
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close() // leaves the file, nobody listening
	l, err := Listen(path, -1, &fakeDevice{running: map[int]bool{}}, quiet())
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, %v", fi.Mode(), err)
	}
	if _, err := Listen(path, -1, &fakeDevice{}, quiet()); !errors.Is(err, os.ErrExist) {
		t.Fatalf("a second listener on a live socket: %v", err)
	}
	// Its probe was a connect: wait until that session ended.
	waitFor(t, func() bool { return l.Stats().Connects == 1 && !l.Stats().Connected })
	c1, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return l.Stats().Connected })
	c2, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c2.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := c2.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("the second frontend was not refused: %d, %v", n, err)
	}
	c2.Close()
	c1.Close()
	waitFor(t, func() bool { return !l.Stats().Connected })
	c3, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return l.Stats().Connected })
	if st := l.Stats(); st.Connects != 3 || st.Refused != 1 {
		t.Errorf("stats %+v", st)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	c3.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}

	l, err = Listen(path, os.Getgid(), &fakeDevice{running: map[int]bool{}}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket mode with a group %v, %v", fi.Mode(), err)
	}
}

// waitFor polls cond, generously bounded against hangs.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
	}
}
