package telemetry

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// fakeControl is a Controller over a fixed set of disks that validates
// every name it is given and answers only with the errors the socket
// maps to a client's fault. It also checks that the guard never let a
// request read a disk its peer may not read.
type fakeControl struct {
	peer     Peer
	disks    map[string]image.DiskInfo
	violated string // the first read of a disk the peer may not read
}

func newFakeControl(p Peer) *fakeControl {
	return &fakeControl{peer: p, disks: map[string]image.DiskInfo{
		"pub.raw":  {Name: "pub.raw", Mode: 0o644, UID: 1000, GID: 1000, Size: 1 << 20},
		"priv.raw": {Name: "priv.raw", Mode: 0o600, UID: 1000, GID: 1000, Size: 1 << 20},
		"grp.raw":  {Name: "grp.raw", Mode: 0o640, UID: 1000, GID: 100, Size: 1 << 20},
		"snap.raw": {Name: "snap.raw", Mode: 0o444, UID: 0, GID: 0, Size: 1 << 20, Snapshot: true},
	}}
}

func (c *fakeControl) Stat(name string) (image.DiskInfo, error) {
	if err := image.ValidateName(name); err != nil {
		return image.DiskInfo{}, fmt.Errorf("disk %q: %w", name, err)
	}
	info, ok := c.disks[name]
	if !ok {
		return image.DiskInfo{}, fmt.Errorf("disk %q: %w", name, image.ErrNotExist)
	}
	return info, nil
}

// read is a read of the disk name: it must exist and be readable by the
// peer, or the guard failed.
func (c *fakeControl) read(name string) (image.DiskInfo, error) {
	info, err := c.Stat(name)
	if err == nil && !mayRead(c.peer, info) && c.violated == "" {
		c.violated = name
	}
	return info, err
}

func (c *fakeControl) Sync() error { return nil }

func (c *fakeControl) Snapshot(disk, name string) (image.DiskInfo, error) {
	info, err := c.read(disk)
	if err != nil {
		return image.DiskInfo{}, err
	}
	if err := image.ValidateName(name); err != nil {
		return image.DiskInfo{}, fmt.Errorf("snapshot %q: %w", name, err)
	}
	if _, ok := c.disks[name]; ok {
		return image.DiskInfo{}, fmt.Errorf("snapshot %q: %w", name, image.ErrExist)
	}
	info.Name = name
	return info, nil
}

func (c *fakeControl) Clone(disk, name string) (image.DiskInfo, error) { return c.Snapshot(disk, name) }

func (c *fakeControl) Diff(old, new string) ([]image.Change, image.DiffStats, error) {
	for _, name := range []string{old, new} {
		if _, err := c.read(name); err != nil {
			return nil, image.DiffStats{}, err
		}
	}
	return []image.Change{}, image.DiffStats{}, nil
}

func (c *fakeControl) Send(w io.Writer, disk, from string) (transfer.Stats, error) {
	if _, err := c.read(disk); err != nil {
		return transfer.Stats{}, err
	}
	if from != "" {
		if _, err := c.read(from); err != nil {
			return transfer.Stats{}, err
		}
	}
	_, err := io.WriteString(w, "stream of "+disk)
	return transfer.Stats{}, err
}

func (c *fakeControl) Receive(r io.Reader, name string, _ transfer.ReceiveOptions) (transfer.Stats, error) {
	if err := image.ValidateName(name); err != nil {
		return transfer.Stats{}, fmt.Errorf("receive %q: %w", name, err)
	}
	if _, ok := c.disks[name]; ok {
		return transfer.Stats{}, fmt.Errorf("receive %q: %w", name, image.ErrExist)
	}
	io.Copy(io.Discard, io.LimitReader(r, 1<<20))
	return transfer.Stats{}, nil
}

// List, Info, Version and Check read no disk's data: the guard lets every
// admitted peer ask them.
func (c *fakeControl) List() []image.DiskInfo {
	out := make([]image.DiskInfo, 0, len(c.disks))
	for _, d := range c.disks {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
func (c *fakeControl) Info() image.Info     { return image.Info{Disks: len(c.disks)} }
func (c *fakeControl) Version() int         { return 2 }
func (c *fakeControl) Check() *image.Report { return &image.Report{Disks: len(c.disks)} }

func (c *fakeControl) Defrag(name string) (image.DefragResult, error) {
	if _, err := c.read(name); err != nil {
		return image.DefragResult{}, err
	}
	return image.DefragResult{Name: name, Skipped: image.DefragContiguous}, nil
}

// emptySource is a Source with no figures.
type emptySource struct{}

func (emptySource) Metrics() image.Metrics                        { return image.Metrics{} }
func (emptySource) OpMetrics() map[string]image.HistogramSnapshot { return nil }

// FuzzControlRequest sends the socket's handler any request (method,
// path and query, body) from any peer: it must never panic nor answer
// 5xx (the fake controller fails only for the client's faults), a peer
// the socket does not admit must get 403 and reach nothing, and no
// request may read a disk its peer may not read.
func FuzzControlRequest(f *testing.F) {
	for _, s := range []struct {
		method, target, body string
		uid, gid             uint32
	}{
		{"GET", "/stats", "", 1000, 1000},
		{"GET", "/metrics", "", 0, 0},
		{"POST", "/sync", "", 1000, 1000},
		{"POST", "/sync", "", 2000, 2000},
		{"GET", "/send?disk=pub.raw", "", 1001, 100},
		{"GET", "/send?disk=priv.raw", "", 1001, 100},
		{"GET", "/send?disk=pub.raw&from=grp.raw", "", 1001, 100},
		{"GET", "/send?disk=snap.raw&from=priv.raw", "", 1001, 100},
		{"HEAD", "/send?disk=priv.raw", "", 1001, 100},
		{"GET", "/send?disk=../etc/passwd", "", 1000, 1000},
		{"GET", "/send?disk=a%2Fb&from=%00", "", 1000, 1000},
		{"GET", "/send?disk=" + strings.Repeat("x", 300), "", 1000, 1000},
		{"GET", "/send", "", 1000, 1000},
		{"GET", "/diff?old=pub.raw&new=priv.raw", "", 1001, 1001},
		{"GET", "/diff?old=grp.raw&new=grp.raw", "", 1001, 100},
		{"GET", "/diff?old=&new=", "", 1000, 1000},
		{"POST", "/snapshot", `{"disk":"pub.raw","name":"s.raw"}`, 1000, 1000},
		{"POST", "/snapshot", `{"disk":"priv.raw","name":"s.raw","clone":true}`, 1001, 100},
		{"POST", "/snapshot", `{"disk":"pub.raw","name":"pub.raw"}`, 1000, 1000},
		{"POST", "/snapshot", `{"disk":"pub.raw","name":".."}`, 1000, 1000},
		{"POST", "/snapshot", `{"disk":1,"name":[]}`, 1000, 1000},
		{"POST", "/snapshot", `{`, 1000, 1000},
		{"POST", "/snapshot", "", 1000, 1000},
		{"POST", "/receive?name=in.raw", "VDISKSTREAM\x00\x01", 1001, 100},
		{"POST", "/receive?name=a/b", "", 1001, 100},
		{"POST", "/receive?name=in.raw&name=x.raw", "", 1001, 100},
		{"PUT", "/send?disk=pub.raw", "", 1000, 1000},
		{"GET", "//send/../send?disk=priv.raw", "", 1001, 100},
		{"GET", "/%73end?disk=priv.raw", "", 1001, 100},
		{"GET", "/disks", "", 1001, 100},
		{"GET", "/info", "", 2000, 2000},
		{"POST", "/check", "", 1000, 100},
		{"GET", "/check", "", 1000, 1000},
		{"POST", "/defrag?disk=pub.raw", "", 1001, 100},
		{"POST", "/defrag?disk=priv.raw", "", 1001, 100},
		{"POST", "/defrag?disk=none.raw", "", 1000, 1000},
		{"POST", "/defrag", "", 1000, 1000},
		{"DELETE", "/", "", 1000, 1000},
		{"GET", "/nothing?%zz", "", 1000, 1000},
	} {
		f.Add(s.method, s.target, []byte(s.body), s.uid, s.gid)
	}
	stats := Handler(emptySource{}, "/m", "store")
	pol := policy{uid: 1000, group: &Group{GID: 100, Name: "disk"}}
	f.Fuzz(func(t *testing.T, method, target string, body []byte, uid, gid uint32) {
		r, err := http.NewRequest(method, "http://vdiskfs"+target, bytes.NewReader(body))
		if err != nil || !strings.HasPrefix(target, "/") {
			return // not a request a client could send
		}
		peer := Peer{UID: uid, GID: gid, PID: 1}
		ctl := newFakeControl(peer)
		h := socketHandler{stats: stats, ctl: ctl, policy: pol, mountpoint: "/m", log: discardLogger()}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r.WithContext(withPeer(r.Context(), peer)))
		switch {
		case rec.Code >= 500 || rec.Code < 200:
			t.Fatalf("%s %q from uid %d gid %d: %d %s", method, target, uid, gid, rec.Code, rec.Body)
		case ctl.violated != "":
			t.Fatalf("%s %q from uid %d gid %d read %s, which it may not read: %d", method, target, uid, gid, ctl.violated, rec.Code)
		case !pol.admits(peer) && rec.Code != http.StatusForbidden:
			t.Fatalf("%s %q from uid %d gid %d, not admitted: %d", method, target, uid, gid, rec.Code)
		}
	})
}
