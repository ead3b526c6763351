package telemetry

import (
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

// vhostSource is a storeSource that serves vhost-user in a map.
type vhostSource struct {
	storeSource
	served map[string]VhostUser // by socket
}

func (v vhostSource) ServeVhostUser(disk, socket string) (VhostUser, error) {
	if _, err := v.s.Stat(disk); err != nil {
		return VhostUser{}, err
	}
	if _, ok := v.served[socket]; ok {
		return VhostUser{}, image.ErrExist
	}
	u := VhostUser{Disk: disk, Socket: socket}
	v.served[socket] = u
	return u, nil
}

func (v vhostSource) StopVhostUser(socket string, may func(VhostUser) error) error {
	u, ok := v.served[socket]
	if !ok {
		return image.ErrNotExist
	}
	if err := may(u); err != nil {
		return err
	}
	delete(v.served, socket)
	return nil
}

func (v vhostSource) VhostUsers() []VhostUser {
	var out []VhostUser
	for _, u := range v.served {
		out = append(out, u)
	}
	return out
}

// Serving a disk needs write permission on the disk and on the socket's
// directory; stopping, write permission on the disk served; a mount
// without the door answers 404.
func TestVhostUserNeedsWrite(t *testing.T) {
	if os.Geteuid() != 0 {
		testutil.Missing(t, "root: the test's directories must not belong to the made-up peer (uid 1000)")
	}
	src := vhostSource{storeSource: newSource(t), served: map[string]VhostUser{}}
	addSecret(t, src.storeSource) // 0600 root
	if _, err := src.s.Create("shared.raw", 1<<20, image.Attr{Mode: 0o664, UID: 0, GID: 100}); err != nil {
		t.Fatal(err)
	}
	open := t.TempDir() // 0700 root (the test's user) unless chmod'ed
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	closed := t.TempDir()
	if err := os.Chmod(closed, 0o755); err != nil {
		t.Fatal(err)
	}
	h := socketHandler{stats: Handler(src, "/m", ""), ctl: src, policy: policy{uid: 0, group: &Group{GID: 100}}, mountpoint: "/m", log: discardLogger()}
	do := func(peer Peer, method, path, body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(method, path, strings.NewReader(body))
		h.ServeHTTP(rec, r.WithContext(withPeer(r.Context(), peer)))
		return rec
	}
	user := Peer{UID: 1000, GID: 100}
	for _, c := range []struct {
		peer   Peer
		disk   string
		socket string
		code   int
	}{
		{user, "secret.raw", filepath.Join(open, "a.sock"), http.StatusForbidden},   // may not write the disk
		{user, "shared.raw", filepath.Join(closed, "a.sock"), http.StatusForbidden}, // may not create there
		{user, "shared.raw", "relative.sock", http.StatusBadRequest},
		{user, "missing.raw", filepath.Join(open, "a.sock"), http.StatusNotFound},
		{user, "shared.raw", filepath.Join(open, "a.sock"), http.StatusCreated},
		{user, "shared.raw", filepath.Join(open, "a.sock"), http.StatusConflict},
		{Peer{UID: 0}, "secret.raw", filepath.Join(closed, "b.sock"), http.StatusCreated},
	} {
		body, _ := json.Marshal(VhostUserRequest{Disk: c.disk, Socket: c.socket})
		rec := do(c.peer, "POST", "/vhost-user", string(body))
		if rec.Code != c.code {
			t.Errorf("uid %d serves %s on %s: %d %s, want %d", c.peer.UID, c.disk, c.socket, rec.Code, strings.TrimSpace(rec.Body.String()), c.code)
		}
		if rec.Code == http.StatusForbidden {
			if err := errorOf(rec.Result()); !errors.Is(err, fs.ErrPermission) {
				t.Errorf("the client's error %v does not match fs.ErrPermission", err)
			}
		}
	}
	// The user may not stop root's server of the secret disk, but may stop
	// its own.
	if rec := do(user, "DELETE", "/vhost-user?socket="+filepath.Join(closed, "b.sock"), ""); rec.Code != http.StatusForbidden {
		t.Errorf("stop a server of a disk the peer may not write: %d", rec.Code)
	}
	if rec := do(user, "DELETE", "/vhost-user?socket="+filepath.Join(open, "a.sock"), ""); rec.Code != http.StatusNoContent {
		t.Errorf("stop: %d %s", rec.Code, rec.Body)
	}
	if rec := do(user, "DELETE", "/vhost-user?socket="+filepath.Join(open, "a.sock"), ""); rec.Code != http.StatusNotFound {
		t.Errorf("stop again: %d, want 404", rec.Code)
	}
	rec := do(user, "GET", "/vhost-user", "")
	var list []VhostUser
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || len(list) != 1 || list[0].Disk != "secret.raw" {
		t.Errorf("list: %s (%v), want root's server of secret.raw", rec.Body, err)
	}
	// Without the door.
	plain := socketHandler{stats: Handler(src.storeSource, "/m", ""), ctl: src.storeSource, policy: policy{uid: 0}, mountpoint: "/m", log: discardLogger()}
	rec = httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/vhost-user", strings.NewReader(`{"disk":"shared.raw","socket":"/tmp/x.sock"}`))
	plain.ServeHTTP(rec, r.WithContext(withPeer(r.Context(), Peer{UID: 0})))
	if rec.Code != http.StatusNotFound {
		t.Errorf("a mount without the door: %d, want 404", rec.Code)
	}
}

// The counters of a served disk reach /stats and /metrics.
func TestVhostUserMetrics(t *testing.T) {
	src := vhostSource{storeSource: newSource(t), served: map[string]VhostUser{}}
	var lat blk.Latency
	lat.Buckets[3] = 2
	lat.Buckets[len(blk.LatencyBounds)] = 1
	src.served["/run/vm.sock"] = VhostUser{Disk: "vm.raw", Socket: "/run/vm.sock", Stats: blk.Stats{
		Write: blk.OpStats{Requests: 3, Bytes: 12288, Latency: lat}, Inflight: 2, Reconnects: 1, Connected: true}}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src))
	want := `
# HELP vdiskfs_vhost_user_inflight_requests Requests a vhost-user device has taken from its queues and not completed.
# TYPE vdiskfs_vhost_user_inflight_requests gauge
vdiskfs_vhost_user_inflight_requests{disk="vm.raw",socket="/run/vm.sock"} 2
`
	if err := promtest.GatherAndCompare(reg, strings.NewReader(want), "vdiskfs_vhost_user_inflight_requests"); err != nil {
		t.Error(err)
	}
	n, err := promtest.GatherAndCount(reg, "vdiskfs_vhost_user_request_latency_seconds")
	if err != nil || n != 6 {
		t.Errorf("latency histograms: %d (%v), want one per request type (6)", n, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "vdiskfs_vhost_user_request_latency_seconds" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "op" && l.GetValue() == "write" && m.Histogram.GetSampleCount() != 3 {
					t.Errorf("write latency count %d, want 3 (the last bucket counts)", m.Histogram.GetSampleCount())
				}
			}
		}
	}
	rec := httptest.NewRecorder()
	Handler(src, "/m", "").ServeHTTP(rec, httptest.NewRequest("GET", "/stats", nil))
	var st Stats
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || len(st.VhostUser) != 1 || st.VhostUser[0].Stats.Write.Bytes != 12288 {
		t.Errorf("/stats: %v %+v", err, st.VhostUser)
	}
}
