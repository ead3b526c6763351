package fs

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// fakeVhost records the servers a mount starts: each listens on its
// socket (so that the test sees the socket come and go) and counts its
// config changes; the device itself is package vhostuser/blk's to test.
type fakeVhost struct {
	mu      sync.Mutex
	servers map[string]*fakeServer // by socket, the live ones
	started int
}

type fakeServer struct {
	l       *net.UnixListener
	h       *image.Disk
	changes atomic.Int64
	closed  atomic.Bool
}

func (f *fakeVhost) serve(h *image.Disk, cfg blk.Config) (VhostServer, error) {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Socket, Net: "unix"})
	if err != nil {
		return nil, err
	}
	s := &fakeServer{l: l, h: h}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.servers[cfg.Socket] = s
	f.started++
	return &fakeHandle{f: f, s: s, socket: cfg.Socket}, nil
}

type fakeHandle struct {
	f      *fakeVhost
	s      *fakeServer
	socket string
}

func (h *fakeHandle) ConfigChanged() { h.s.changes.Add(1) }
func (h *fakeHandle) Stats() blk.Stats {
	return blk.Stats{Read: blk.OpStats{Requests: 1}}
}
func (h *fakeHandle) Close() error {
	if h.s.closed.Swap(true) {
		return errors.New("closed twice")
	}
	h.f.mu.Lock()
	delete(h.f.servers, h.socket)
	h.f.mu.Unlock()
	return h.s.l.Close() // removes the socket
}

func (f *fakeVhost) get(socket string) *fakeServer {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.servers[socket]
}

func (f *fakeVhost) live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.servers)
}

// TestVhostUserDirFollowsDisks: with a vhost-user directory, every disk
// is served as DIR/NAME.sock from the mount on, from its creation, moved
// by a rename, told of a resize, stopped before its removal, and every
// server is closed at unmount.
func TestVhostUserDirFollowsDisks(t *testing.T) {
	dir := t.TempDir()
	fake := &fakeVhost{servers: map[string]*fakeServer{}}
	tc := newTestCase(t, withMountOptions(Options{VhostServe: fake.serve, VhostUserDir: dir}))
	sock := func(name string) string { return filepath.Join(dir, name+".sock") }

	f := tc.openFile("a.raw", os.O_CREATE|os.O_RDWR, 0o644)
	f.Close()
	if fake.get(sock("a.raw")) == nil {
		t.Fatalf("no server on %s after the create", sock("a.raw"))
	}
	if err := os.Truncate(tc.path("a.raw"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if n := fake.get(sock("a.raw")).changes.Load(); n != 1 {
		t.Errorf("after a truncate: %d config changes, want 1", n)
	}
	if _, err := tc.srv.Snapshot("a.raw", "a-snap"); err != nil {
		t.Fatal(err)
	}
	if fake.get(sock("a-snap")) == nil {
		t.Errorf("no server for the snapshot")
	}
	if err := os.Rename(tc.path("a.raw"), tc.path("b.raw")); err != nil {
		t.Fatal(err)
	}
	if fake.get(sock("a.raw")) != nil || fake.get(sock("b.raw")) == nil {
		t.Errorf("after a rename: servers %v, want b.raw.sock and not a.raw.sock", tc.srv.VhostUsers())
	}
	if _, err := os.Stat(sock("a.raw")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the old socket is still there: %v", err)
	}

	// One socket per disk: b.raw is served on its own socket in dir, so
	// another socket for it is refused until that one stops.
	other := filepath.Join(t.TempDir(), "other.sock")
	if _, err := tc.srv.ServeVhostUser("b.raw", other); !errors.Is(err, image.ErrExist) {
		t.Errorf("a disk on a second socket: %v, want ErrExist", err)
	}
	if err := tc.srv.StopVhostUser(sock("b.raw"), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.srv.ServeVhostUser("b.raw", other); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.srv.ServeVhostUser("a-snap", other); !errors.Is(err, image.ErrExist) {
		t.Errorf("a second disk on the same socket: %v, want ErrExist", err)
	}
	if _, err := tc.srv.ServeVhostUser("missing", filepath.Join(dir, "x.sock")); !errors.Is(err, image.ErrNotExist) {
		t.Errorf("serving a missing disk: %v, want ErrNotExist", err)
	}
	got := tc.srv.VhostUsers()
	if len(got) != 2 {
		t.Fatalf("VhostUsers: %+v, want 2 servers", got)
	}
	for _, u := range got {
		if u.Stats.Read.Requests != 1 {
			t.Errorf("%s: stats not the server's: %+v", u.Socket, u.Stats)
		}
		if want := u.Socket != other; u.Auto != want {
			t.Errorf("%s: auto %v, want %v", u.Socket, u.Auto, want)
		}
	}

	if err := os.Remove(tc.path("b.raw")); err != nil {
		t.Fatal(err)
	}
	if fake.get(sock("b.raw")) != nil || fake.get(other) != nil {
		t.Errorf("after the removal a server of the disk is left: %+v", tc.srv.VhostUsers())
	}
	if err := tc.srv.StopVhostUser(other, nil); !errors.Is(err, ErrNotServed) {
		t.Errorf("stop a server already gone: %v, want ErrNotServed", err)
	}
	tc.unmount()
	if n := fake.live(); n != 0 {
		t.Errorf("%d servers left after the unmount", n)
	}
	// The disks there at mount time are served at once.
	tc.mount()
	if fake.get(sock("a-snap")) == nil {
		t.Errorf("the snapshot is not served after a remount")
	}
	if err := tc.srv.StopVhostUser(sock("a-snap"), nil); err != nil {
		t.Errorf("stop: %v", err)
	}
	if fake.live() != 0 {
		t.Errorf("a server is left after StopVhostUser")
	}
}

// TestVhostUserRealDevice serves a disk of a mount with the real device
// and talks to it with the Go frontend: a write through the socket reads
// back through the file and the other way round, a truncate of the file
// reaches the frontend as a config change with the new capacity, a flush
// succeeds, the stats count it all, and removing the disk disconnects the
// frontend and removes the socket.
func TestVhostUserRealDevice(t *testing.T) {
	tc := newTestCase(t)
	sock := filepath.Join(t.TempDir(), "d.sock")
	f := tc.openFile("d.raw", os.O_CREATE|os.O_RDWR, 0o644)
	if err := f.Truncate(4 << 20); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.srv.ServeVhostUser("d.raw", sock); err != nil {
		t.Fatal(err)
	}
	const wait = time.Minute // against hangs
	d, err := frontend.Dial(frontend.Options{Socket: sock, MemSize: 16 << 20, ReplyTimeout: wait, ReconnectTimeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if c := d.Config(); c.Capacity != (4<<20)/512 {
		t.Fatalf("capacity %d sectors, want %d", c.Capacity, (4<<20)/512)
	}
	q := d.Queues()[0]
	do := func(r frontend.Request) {
		t.Helper()
		c, err := q.Do(r, wait)
		if err != nil || c.Status != proto.BlkSOK {
			t.Fatalf("request type %d at sector %d: %+v, %v", r.Type, r.Sector, c, err)
		}
	}

	// Through the socket, then through the file.
	buf, err := d.Alloc(64<<10, 4096)
	if err != nil {
		t.Fatal(err)
	}
	rand.NewChaCha8([32]byte{1}).Read(buf.Bytes)
	do(frontend.Request{Type: proto.BlkTOut, Sector: 8, Data: []frontend.Buffer{buf}})
	do(frontend.Request{Type: proto.BlkTFlush})
	got := make([]byte, buf.Len())
	if _, err := f.ReadAt(got, 8*512); err != nil || !bytes.Equal(got, buf.Bytes) {
		t.Fatalf("the file does not read what the socket wrote (%v)", err)
	}
	// Through the file, then through the socket.
	rand.NewChaCha8([32]byte{2}).Read(got)
	if _, err := f.WriteAt(got, 1<<20); err != nil {
		t.Fatal(err)
	}
	do(frontend.Request{Type: proto.BlkTIn, Sector: (1 << 20) / 512, Data: []frontend.Buffer{buf}})
	if !bytes.Equal(got, buf.Bytes) {
		t.Fatal("the socket does not read what the file wrote")
	}

	// A resize of the file reaches the frontend.
	if err := os.Truncate(tc.path("d.raw"), 8<<20); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.ConfigChanges():
	case <-time.After(wait):
		t.Fatal("no config change reached the frontend after a truncate")
	}
	if c, err := d.RefreshConfig(); err != nil || c.Capacity != (8<<20)/512 {
		t.Fatalf("config after the truncate: %+v, %v", c, err)
	}
	us := tc.srv.VhostUsers()
	if len(us) != 1 || us[0].Stats.Write.Requests != 1 || us[0].Stats.Read.Requests != 1 || us[0].Stats.Flush.Requests != 1 || !us[0].Stats.Connected {
		t.Errorf("VhostUsers: %+v", us)
	}

	// Removing the disk stops its server first.
	f.Close()
	if err := os.Remove(tc.path("d.raw")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-d.Dead():
	case <-time.After(wait):
		t.Fatal("the frontend is still connected after the disk's removal")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there after the disk's removal: %v", err)
	}
}

// TestVhostUserServesUnlocked: with a vhost-user directory, an encrypted
// disk that is locked is not served, and an unlock through the mount
// (Server.Unlock) serves it on its socket.
func TestVhostUserServesUnlocked(t *testing.T) {
	dir := t.TempDir()
	fake := &fakeVhost{servers: map[string]*fakeServer{}}
	tc := newTestCase(t, withMountOptions(Options{VhostServe: fake.serve, VhostUserDir: dir}))
	sock := filepath.Join(dir, "e.raw.sock")
	raw := bytes.Repeat([]byte{7}, 32)
	key := func() *crypt.Secret {
		k, err := crypt.KeyFileSecret(raw)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { k.Close() })
		return k
	}
	if _, err := tc.srv.CreateEncrypted("e.raw", 1<<20, image.Attr{Mode: 0o600}, key()); err != nil {
		t.Fatal(err)
	}
	if fake.get(sock) == nil {
		t.Fatalf("the new encrypted disk is not served")
	}
	if err := tc.srv.StopVhostUser(sock, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.srv.vfs.store.Lock("e.raw"); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.srv.ServeVhostUser("e.raw", sock); err == nil {
		t.Fatalf("a locked disk was served")
	}
	if _, err := tc.srv.Unlock("e.raw", key()); err != nil {
		t.Fatal(err)
	}
	if fake.get(sock) == nil {
		t.Errorf("the unlocked disk is not served on %s", sock)
	}
}
