package telemetry

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// The peer child: the test binary run again as another user (runAsPeer)
// dials a socket and reports what it got.
const (
	envPeerSock = "VDISKFS_TEST_PEER_SOCK" // the socket to dial; set only in the child
	envPeerMnt  = "VDISKFS_TEST_PEER_MNT"  // the mount point, for mayConnect's message
	envPeerReqs = "VDISKFS_TEST_PEER_REQS" // "METHOD PATH" requests, separated by ';'
)

func TestMain(m *testing.M) {
	if sock := os.Getenv(envPeerSock); sock != "" {
		peerChild(sock, os.Getenv(envPeerMnt), strings.Split(os.Getenv(envPeerReqs), ";"))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// peerChild prints "check\t<mayConnect's error or ok>", "fetch\t<the
// error of Fetch of the mount point, the client's own way, or ok>", then for each
// request "<status>\t<the body's first line>" (or "<status>\t<n> bytes"
// for a 200) or "error\t<the error>".
func peerChild(sock, mnt string, reqs []string) {
	if err := mayConnect(mnt, sock); err != nil {
		fmt.Printf("check\t%v\n", err)
	} else {
		fmt.Printf("check\tok\n")
	}
	if _, err := Fetch(mnt); err != nil {
		fmt.Printf("fetch\t%v\n", err)
	} else {
		fmt.Printf("fetch\tok\n")
	}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	for _, req := range reqs {
		method, path, _ := strings.Cut(req, " ")
		r, _ := http.NewRequest(method, "http://vdiskfs"+path, nil)
		resp, err := c.Do(r)
		if err != nil {
			fmt.Printf("error\t%v\n", err)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			fmt.Printf("%d\t%d bytes\n", resp.StatusCode, len(body))
			continue
		}
		line, _, _ := strings.Cut(string(body), "\n")
		fmt.Printf("%d\t%s\n", resp.StatusCode, line)
	}
}

// peerResult is one line of the child's report.
type peerResult struct{ status, text string }

// peerBinary is a copy of the test binary that any user may run.
func peerBinary(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running a peer as another user needs root")
	}
	dir := testutil.SharedTempDir(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "peer.test")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// runAsPeer runs bin as uid/gid with the supplementary groups given, to
// dial sock and make reqs; it returns mayConnect's verdict for sock, what
// Fetch(mnt) says, and each request's result.
func runAsPeer(t *testing.T, bin string, uid, gid uint32, groups []uint32, sock, mnt string, reqs ...string) (check, fetch string, res []peerResult) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Dir = filepath.Dir(bin)
	cmd.Env = []string{envPeerSock + "=" + sock, envPeerMnt + "=" + mnt, envPeerReqs + "=" + strings.Join(reqs, ";")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups}}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("peer as uid %d: %v\n%s", uid, err, out)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "\t")
		switch k {
		case "check":
			check = v
			continue
		case "fetch":
			fetch = v
			continue
		}
		res = append(res, peerResult{k, v})
	}
	if len(res) != len(reqs) {
		t.Fatalf("peer as uid %d reported %d results for %d requests:\n%s", uid, len(res), len(reqs), out)
	}
	return check, fetch, res
}

// syncBuffer is a log destination the test reads while servers write.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// withUmask runs the rest of the test under umask mask.
func withUmask(t *testing.T, mask int) {
	old := syscall.Umask(mask)
	t.Cleanup(func() { syscall.Umask(old) })
}

// openDir is a new directory anyone may search, for a runtime directory
// whose sockets other users can reach: only the sockets' own modes and
// the peer check keep them out.
func openDir(t *testing.T) string {
	t.Helper()
	dir := testutil.SharedTempDir(t)
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	return dir
}

// addSecret adds secret.raw, mode 0600, root's, to src's store.
func addSecret(t *testing.T, src storeSource) {
	t.Helper()
	if _, err := src.s.Create("secret.raw", 1<<20, image.Attr{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
}

func modeOf(t *testing.T, path string) (os.FileMode, *syscall.Stat_t) {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode(), fi.Sys().(*syscall.Stat_t)
}

// A daemon started under umask 000 still makes its socket 0600 in a
// directory no one else may write in or list, and user nobody can
// neither use it nor stream a disk out of it.
func TestSocketRefusesOtherUsersUnderUmask0(t *testing.T) {
	bin := peerBinary(t)
	withUmask(t, 0)
	src := newSource(t)
	addSecret(t, src)
	mnt := filepath.Join(t.TempDir(), "mnt")
	serveSource(t, src, mnt, "")
	sock := SocketPath(mnt)
	if m, _ := modeOf(t, sock); m.Perm() != 0o600 || m.Type() != fs.ModeSocket {
		t.Errorf("socket %s: mode %v, want a socket 0600", sock, m)
	}
	if m, st := modeOf(t, filepath.Dir(sock)); !m.IsDir() || m.Perm()&0o066 != 0 || st.Uid != 0 {
		t.Errorf("socket directory %s: mode %v uid %d; want root's, no read or write for group and others", filepath.Dir(sock), m, st.Uid)
	}
	check, fetch, res := runAsPeer(t, bin, 65534, 65534, nil, sock, mnt,
		"GET /stats", "GET /send?disk=secret.raw", "POST /snapshot")
	for i, r := range res {
		if r.status != "error" && r.status != "403" {
			t.Errorf("nobody's request %d: %s %s; want refused", i, r.status, r.text)
		}
	}
	if !strings.Contains(check, "permission denied: the socket of "+mnt) || !strings.Contains(check, "admits only root") ||
		!strings.Contains(check, "you are uid 65534") {
		t.Errorf("nobody's client says %q; want why it may not connect", check)
	}
	if fetch == "ok" {
		t.Error("nobody's vdisk stats got the stats")
	}
	if _, err := Fetch(mnt); err != nil {
		t.Errorf("root's stats: %v", err)
	}
}

// The peer check holds even where the socket's mode lets anyone connect:
// another user gets 403 saying whom the socket admits, and the daemon logs
// a warning naming the peer.
func TestPeerCheck(t *testing.T) {
	bin := peerBinary(t)
	withUmask(t, 0)
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	var logs syncBuffer
	log := logrus.New()
	log.SetOutput(&logs)
	dir := openDir(t)
	stop, err := Start(Handler(src, mnt, "store.img"), src, mnt, Options{Logger: log, dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	sock := filepath.Join(dir, socketName(mnt))
	if err := os.Chmod(sock, 0o666); err != nil { // a socket widened by hand
		t.Fatal(err)
	}
	_, _, res := runAsPeer(t, bin, 65534, 65534, nil, sock, mnt, "GET /stats", "POST /sync")
	for i, r := range res {
		if r.status != "403" || !strings.Contains(r.text, "permission denied: the socket of "+mnt+" admits only root;") ||
			!strings.Contains(r.text, "uid 65534") {
			t.Errorf("nobody's request %d: %s %q; want 403 saying whom the socket admits", i, r.status, r.text)
		}
	}
	if l := logs.String(); !strings.Contains(l, "refused a connection to the control socket") || !strings.Contains(l, "uid=65534") ||
		!strings.Contains(l, "pid=") {
		t.Errorf("the daemon's log lacks the refusal with the peer's uid and pid:\n%s", l)
	}
	if src.s.Counters().Commits != 0 {
		t.Error("a refused peer's sync committed")
	}
}

// With a socket group the socket is 0660 and the group's, whatever the
// umask, and the directory lets the group search it; a member (by
// effective or by supplementary group) is admitted, but reads only the
// disks whose mode lets it: 403 on /send or /defrag of a 0600 disk; it
// may list the disks, see the store's info and check it (metadata,
// catalog.go).
func TestSocketGroup(t *testing.T) {
	bin := peerBinary(t)
	withUmask(t, 0)
	src := newSource(t)
	addSecret(t, src)
	if _, err := src.s.Snapshot("vm.raw", "vm-snap.raw"); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(t.TempDir(), "mnt")
	const gid = 4242 // a gid with no name: LookupGroup allows one
	g, err := LookupGroup(strconv.Itoa(gid))
	if err != nil {
		t.Fatal(err)
	}
	stop, err := Start(Handler(src, mnt, "store.img"), src, mnt, Options{SocketGroup: &g, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	sock, dir := SocketPath(mnt), runtimeDir()
	if m, st := modeOf(t, sock); m.Perm() != 0o660 || st.Gid != gid {
		t.Errorf("socket: mode %v gid %d, want 0660 and gid %d", m, st.Gid, gid)
	}
	if m, _ := modeOf(t, dir); m.Perm() != 0o711 {
		t.Errorf("socket directory: mode %v, want 0711", m)
	}
	reqs := []string{"GET /stats", "GET /send?disk=secret.raw", "GET /send?disk=vm.raw",
		"GET /send?disk=vm-snap.raw&from=secret.raw", "GET /diff?old=vm.raw&new=secret.raw", "HEAD /send?disk=secret.raw",
		"GET /disks", "GET /info", "POST /check", "POST /defrag?disk=secret.raw", "POST /defrag?disk=vm.raw"}
	// The catalog is metadata: a member lists every disk, secret.raw too;
	// defrag needs read permission.
	want := []string{"200", "403", "200", "403", "403", "403", "200", "200", "200", "403", "200"}
	for _, who := range []struct {
		name   string
		gid    uint32
		groups []uint32
	}{
		{"effective gid", gid, nil},
		{"supplementary group", 65534, []uint32{100, gid}},
	} {
		check, fetch, res := runAsPeer(t, bin, 65534, who.gid, who.groups, sock, mnt, reqs...)
		if check != "ok" || fetch != "ok" {
			t.Errorf("member by %s: the client refuses to connect: %s; vdisk stats: %s", who.name, check, fetch)
		}
		for i, r := range res {
			if r.status != want[i] {
				t.Errorf("member by %s: %s: %s %q, want %s", who.name, reqs[i], r.status, r.text, want[i])
			}
			if r.status == "403" && reqs[i] != "HEAD /send?disk=secret.raw" && !strings.Contains(r.text, `may not read disk "secret.raw" (mode 0600`) {
				t.Errorf("member by %s: %s: %q does not say which disk it may not read", who.name, reqs[i], r.text)
			}
		}
	}
	// Not a member: the socket's mode keeps it out, and the client says
	// whom the socket admits.
	check, _, res := runAsPeer(t, bin, 65534, 65534, nil, sock, mnt, "GET /stats")
	if res[0].status != "error" || !strings.Contains(check, "admits only root and members of gid 4242") {
		t.Errorf("a non-member: %s %q, client check %q", res[0].status, res[0].text, check)
	}
	// Nor does widening the socket let it in.
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	if _, _, res := runAsPeer(t, bin, 65534, 65534, []uint32{100}, sock, mnt, "GET /stats"); res[0].status != "403" ||
		!strings.Contains(res[0].text, "admits only root and members of gid 4242") {
		t.Errorf("a non-member through a widened socket: %s %q", res[0].status, res[0].text)
	}
}

func discardLogger() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// A runtime directory the daemon did not make for itself is refused,
// naming it and what is wrong: another user's (as a /tmp/vdiskfs-UID
// another user made first), one others may write in, a symbolic link, a
// file. The daemon's own, left 0755 by an older vdiskfs, is taken back to
// search only.
func TestRuntimeDirChecked(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give a directory to another user")
	}
	parent := t.TempDir() // made before the umask is cleared: 0700
	withUmask(t, 0)
	src := newSource(t)
	mnt := filepath.Join(parent, "mnt")
	for _, c := range []struct {
		name string
		make func(dir string) error
		want string
	}{
		{"foreign", func(dir string) error {
			if err := os.Mkdir(dir, 0o700); err != nil {
				return err
			}
			return os.Chown(dir, 65534, 65534)
		}, "belongs to uid 65534 (nobody), not to the daemon's uid 0"},
		{"writable", func(dir string) error {
			if err := os.Mkdir(dir, 0o777); err != nil {
				return err
			}
			return os.Chmod(dir, 0o777)
		}, "has mode 0777: group or others may write in it"},
		{"group-writable", func(dir string) error { return os.Mkdir(dir, 0o770) }, "has mode 0770"},
		{"symlink", func(dir string) error {
			target := filepath.Join(parent, "elsewhere")
			if err := os.Mkdir(target, 0o700); err != nil {
				return err
			}
			return os.Symlink(target, dir)
		}, "is a symbolic link"},
		{"file", func(dir string) error { return os.WriteFile(dir, nil, 0o600) }, "is not a directory"},
	} {
		dir := filepath.Join(parent, "vdiskfs-"+c.name)
		if err := c.make(dir); err != nil {
			t.Fatal(err)
		}
		stop, err := Start(Handler(src, mnt, ""), src, mnt, Options{dir: dir})
		if err == nil {
			stop()
			t.Errorf("%s: a runtime directory %s was used", c.name, dir)
			continue
		}
		if !strings.Contains(err.Error(), "socket directory "+dir+" ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want it to name %s and say %q", c.name, err, dir, c.want)
		}
		if _, err := os.Lstat(filepath.Join(dir, socketName(mnt))); err == nil {
			t.Errorf("%s: a socket was made in %s", c.name, dir)
		}
	}

	own := filepath.Join(parent, "vdiskfs-old")
	if err := os.Mkdir(own, 0o755); err != nil {
		t.Fatal(err)
	}
	stop, err := Start(Handler(src, mnt, ""), src, mnt, Options{dir: own})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if m, _ := modeOf(t, own); m.Perm() != 0o711 {
		t.Errorf("the daemon's own 0755 directory: mode %v after use, want 0711", m)
	}
	fresh := filepath.Join(parent, "vdiskfs-new")
	if stop, err = Start(Handler(src, mnt, ""), src, mnt, Options{dir: fresh}); err != nil {
		t.Fatal(err)
	}
	stop()
	if m, _ := modeOf(t, fresh); m.Perm() != 0o700 {
		t.Errorf("a new runtime directory: mode %v, want 0700", m)
	}
	entries, _ := os.ReadDir(fresh)
	if len(entries) != 0 {
		t.Errorf("left in the runtime directory after stop: %v", entries)
	}

	// A parent others could rename the directory out of.
	loose := filepath.Join(parent, "loose")
	if err := os.Mkdir(loose, 0o777); err != nil {
		t.Fatal(err)
	}
	if _, err := Start(Handler(src, mnt, ""), src, mnt, Options{dir: filepath.Join(loose, "vdiskfs")}); err == nil ||
		!strings.Contains(err.Error(), "without the sticky bit") {
		t.Errorf("runtime directory in a world-writable parent: %v", err)
	}
}

// Whether a peer may read a disk is the kernel's default_permissions
// answer: root always; the owner by the owner's bits only, a group member
// by the group's, anyone else by the others'.
func TestMayRead(t *testing.T) {
	disk := func(mode, uid, gid uint32) image.DiskInfo { return image.DiskInfo{Mode: mode, UID: uid, GID: gid} }
	for _, c := range []struct {
		peer Peer
		disk image.DiskInfo
		want bool
	}{
		{Peer{UID: 0, GID: 0}, disk(0, 1000, 1000), true},
		{Peer{UID: 1000, GID: 1000}, disk(0o600, 1000, 1000), true},
		{Peer{UID: 1000, GID: 1000}, disk(0o044, 1000, 1000), false}, // owner bits only
		{Peer{UID: 1001, GID: 1000}, disk(0o640, 1000, 1000), true},
		{Peer{UID: 1001, GID: 5, Groups: []uint32{1000}}, disk(0o640, 1000, 1000), true},
		{Peer{UID: 1001, GID: 1000}, disk(0o604, 1000, 1000), false}, // group bits only
		{Peer{UID: 1001, GID: 1001}, disk(0o644, 1000, 1000), true},
		{Peer{UID: 1001, GID: 1001}, disk(0o640, 1000, 1000), false},
	} {
		if got := mayRead(c.peer, c.disk); got != c.want {
			t.Errorf("mayRead(%+v, mode %04o uid %d gid %d) = %v", c.peer, c.disk.Mode, c.disk.UID, c.disk.GID, got)
		}
	}
}

// Through the handler, a peer that may not read the source of a snapshot
// or clone is refused with 403, and its client's error matches
// fs.ErrPermission; one that may read it makes it, with the source's mode
// and owner.
func TestSnapshotNeedsRead(t *testing.T) {
	src := newSource(t)
	addSecret(t, src)
	h := socketHandler{stats: Handler(src, "/m", ""), ctl: src, policy: policy{uid: 0, group: &Group{GID: 100}}, mountpoint: "/m", log: discardLogger()}
	peer := Peer{UID: 1000, GID: 100}
	for _, c := range []struct {
		body string
		code int
	}{
		{`{"disk":"secret.raw","name":"leak.raw"}`, http.StatusForbidden},
		{`{"disk":"secret.raw","name":"leak.raw","clone":true}`, http.StatusForbidden},
		{`{"disk":"vm.raw","name":"mine.raw","clone":true}`, http.StatusCreated},
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/snapshot", strings.NewReader(c.body))
		h.ServeHTTP(rec, r.WithContext(withPeer(r.Context(), peer)))
		if rec.Code != c.code {
			t.Errorf("%s: %d %s, want %d", c.body, rec.Code, rec.Body, c.code)
		}
		if rec.Code == http.StatusForbidden {
			if err := errorOf(rec.Result()); !errors.Is(err, fs.ErrPermission) {
				t.Errorf("%s: the client's error %v does not match fs.ErrPermission", c.body, err)
			}
		}
	}
	if _, err := src.s.Stat("leak.raw"); err == nil {
		t.Error("a peer that may not read secret.raw copied it")
	}
	if info, err := src.s.Stat("mine.raw"); err != nil || info.Mode&0o777 != 0o644 || info.UID != 0 {
		t.Errorf("the clone: %+v, %v; want the source's mode and owner", info, err)
	}
	// A request with no peer in its context is refused.
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/stats", nil))
	if rec.Code != http.StatusForbidden {
		t.Errorf("a request of no known peer: %d", rec.Code)
	}
}

// A refused POST /receive comes back as the daemon's 403 through the
// client, not as a broken pipe while the stream is still being sent.
func TestRefusedReceiveSaysWhy(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("serves a socket in root's runtime directory")
	}
	src := newSource(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := prepareDir(runtimeDir(), 0, false); err != nil {
		t.Fatal(err)
	}
	l, err := listenSocket(runtimeDir(), socketName(mnt), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(SocketPath(mnt))
	// Every connection is a peer of uid 1000, whom the policy does not admit.
	hs := &http.Server{
		Handler: socketHandler{stats: Handler(src, mnt, ""), ctl: src, policy: policy{uid: 0}, mountpoint: mnt, log: discardLogger()},
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return withPeer(ctx, Peer{UID: 1000, GID: 1000, PID: 1})
		},
	}
	go hs.Serve(l)
	defer hs.Close()
	stream := bytes.NewReader(make([]byte, 32<<20))
	_, err = Receive(mnt, "in.raw", stream, transfer.ReceiveOptions{})
	if !errors.Is(err, fs.ErrPermission) || !strings.Contains(err.Error(), "admits only root") {
		t.Fatalf("refused receive: %v; want the daemon's permission denied", err)
	}
	if _, err := src.s.Stat("in.raw"); err == nil {
		t.Fatal("a refused peer received a disk")
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/mnt/vdisks`:      "/mnt/vdisks",
		`/mnt/my\040disks`: "/mnt/my disks",
		`/a\011b\134c\012`: "/a\tb\\c\n",
		`/trailing\04`:     `/trailing\04`,
		`/not\99octal`:     `/not\99octal`,
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

// receiveRecorder is a Controller that records the options of a Receive.
type receiveRecorder struct {
	Controller
	got *transfer.ReceiveOptions
}

func (r receiveRecorder) Receive(_ io.Reader, _ string, o transfer.ReceiveOptions) (transfer.Stats, error) {
	*r.got = o
	return transfer.Stats{}, nil
}

// A disk received through the socket belongs to the peer that sent it,
// unless the peer is root: no one else may give a disk away (chown(2)
// allows only root), and naming another owner is refused.
func TestReceiveOwnedByPeer(t *testing.T) {
	u := func(v uint32) *uint32 { return &v }
	member := Peer{UID: 1000, GID: 1000, Groups: []uint32{100}}
	for _, c := range []struct {
		name     string
		peer     Peer
		in       transfer.ReceiveOptions
		uid, gid *uint32 // what reaches the store; nil: the stream's
		refused  bool
	}{
		{"root keeps the stream's owner", Peer{}, transfer.ReceiveOptions{}, nil, nil, false},
		{"root names any owner", Peer{}, transfer.ReceiveOptions{UID: u(5), GID: u(6)}, u(5), u(6), false},
		{"a user's disk is the user's", member, transfer.ReceiveOptions{}, u(1000), u(1000), false},
		{"a user may name itself", member, transfer.ReceiveOptions{UID: u(1000)}, u(1000), u(1000), false},
		{"a user may name a group of its own", member, transfer.ReceiveOptions{GID: u(100)}, u(1000), u(100), false},
		{"a user may not give a disk away", member, transfer.ReceiveOptions{UID: u(0)}, nil, nil, true},
		{"nor to a group it is not in", member, transfer.ReceiveOptions{GID: u(0)}, nil, nil, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got transfer.ReceiveOptions
			g := guard{Controller: receiveRecorder{got: &got}, peer: c.peer}
			_, err := g.Receive(strings.NewReader(""), "d.raw", c.in)
			if c.refused {
				if !errors.Is(err, fs.ErrPermission) {
					t.Fatalf("err %v, want permission denied", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			same := func(a, b *uint32) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }
			if !same(got.UID, c.uid) || !same(got.GID, c.gid) {
				t.Errorf("owner reaching the store %v:%v, want %v:%v", got.UID, got.GID, c.uid, c.gid)
			}
		})
	}
}
