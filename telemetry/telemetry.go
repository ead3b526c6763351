// Package telemetry exposes a mounted store's counters: as Prometheus
// metrics (on an opt-in loopback TCP listener, `vdisk mount --metrics`) and,
// always, on a per-mount Unix socket that `vdisk stats MNT` reads, so that
// stats need no flags at mount time. The socket also takes the few requests
// an operator makes of a running mount (`vdisk sync MNT`: POST /sync;
// `vdisk snapshot MNT/DISK NAME` and `vdisk clone MNT/DISK NAME`: POST
// /snapshot; diff, send and receive; ls, info and fsck: catalog.go; the
// vhost-user door: vhost.go); the
// TCP listener never does: it has no authentication, and most of these
// change the store.
//
// The socket admits only root, the daemon's user and, when configured,
// the members of one group: its mode is 0600 (0660 with a group), it lives
// in a directory only the daemon's user may write in, and every
// connection's peer is checked (SO_PEERCRED). Disk data read through it
// obeys the disk's mode for the peer. socket.go and peer.go say how.
//
// Every figure comes from image.Store.Metrics (requests, map, coalescer,
// backend, journal, allocator, per disk) and from the FUSE layer's per-op
// counts and latencies (fs.Server.OpMetrics). Nothing here counts on its own:
// it only translates snapshots, so scraping costs the I/O path nothing.
//
// Concurrency: Collector and the HTTP handlers are safe for concurrent use;
// each scrape takes fresh snapshots.
package telemetry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// Source is what a mount offers to telemetry.
type Source interface {
	// Metrics is the store's snapshot.
	Metrics() image.Metrics
	// OpMetrics is the FUSE layer's latency histogram per operation name
	// (count included); it may be empty.
	OpMetrics() map[string]image.HistogramSnapshot
}

// Controller is what a local operator may ask of a running mount through
// its Unix socket.
type Controller interface {
	// Stat describes the disk called name (image.Store.Stat): the socket
	// checks its mode and owners before a peer reads it.
	Stat(name string) (image.DiskInfo, error)
	// Sync commits the whole store: every write, map and catalog change
	// acknowledged before the call is durable when it returns.
	Sync() error
	// Snapshot makes a read-only snapshot called name of the disk called
	// disk, holding every write acknowledged before the call, durable
	// and visible in the mount when it returns (fs.Server.Snapshot).
	Snapshot(disk, name string) (image.DiskInfo, error)
	// Clone makes a writable disk called name sharing every block of the
	// disk called disk, taken as a snapshot is (fs.Server.Clone).
	Clone(disk, name string) (image.DiskInfo, error)
	// Diff lists where the disk new differs from the disk old
	// (image.Diff).
	Diff(old, new string) ([]image.Change, image.DiffStats, error)
	// Send writes the stream of disk to w, incremental from the snapshot
	// from when it is not "" (transfer.Send).
	Send(w io.Writer, disk, from string) (transfer.Stats, error)
	// Receive makes the disk name from the stream r (transfer.Receive),
	// with o's mode and owner when given; it is durable and shows in the
	// mount when Receive returns.
	Receive(r io.Reader, name string, o transfer.ReceiveOptions) (transfer.Stats, error)
	// List lists every disk, sorted by name (image.Store.List).
	List() []image.DiskInfo
	// Info describes the store (image.Store.Info).
	Info() image.Info
	// Version is the store's format version (image.Store.Version).
	Version() int
	// Check checks the whole store as it is now (image.Store.Check).
	Check() *image.Report
	// Defrag moves the disk called name into contiguous blocks
	// (image.Store.Defrag) while it may be in use.
	Defrag(name string) (image.DefragResult, error)
}

// SnapshotRequest is the body of POST /snapshot.
type SnapshotRequest struct {
	Disk  string `json:"disk"`  // the disk to snapshot
	Name  string `json:"name"`  // the snapshot's name, a new disk
	Clone bool   `json:"clone"` // a writable clone instead (vdisk clone)
}

// SnapshotReply is the answer of POST /snapshot: the new disk.
type SnapshotReply struct {
	Name   string `json:"name"`
	ID     uint64 `json:"id"`
	Size   int64  `json:"size"`
	Origin string `json:"origin"`
}

// Stats is the JSON document of `vdisk stats --json` and of GET /stats.
type Stats struct {
	Time       time.Time                          `json:"time"`
	Mountpoint string                             `json:"mountpoint"`
	Store      string                             `json:"store"`
	PID        int                                `json:"pid"`
	Metrics    image.Metrics                      `json:"store_metrics"`
	FUSE       map[string]image.HistogramSnapshot `json:"fuse_ops"`
	// VhostUser is the disks served on vhost-user, when the mount
	// serves any (its Source is a VhostSource).
	VhostUser []VhostUser `json:"vhost_user,omitempty"`
}

// Handler serves GET /stats (JSON) and GET /metrics (Prometheus text).
func Handler(src Source, mountpoint, store string) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(src))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) {
		st := Stats{Time: time.Now(), Mountpoint: mountpoint, Store: store, PID: os.Getpid(),
			Metrics: src.Metrics(), FUSE: src.OpMetrics()}
		if vs, ok := src.(VhostSource); ok {
			st.VhostUser = vs.VhostUsers()
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(st)
	})
	return mux
}

// SocketPath is where the mount at mountpoint (absolute) listens:
// /run/vdiskfs for root, else $XDG_RUNTIME_DIR/vdiskfs (or the temp dir's
// vdiskfs-UID), named by a hash of the mount point.
func SocketPath(mountpoint string) string {
	return filepath.Join(runtimeDir(), socketName(mountpoint))
}

func socketName(mountpoint string) string {
	sum := sha256.Sum256([]byte(mountpoint))
	return hex.EncodeToString(sum[:8]) + ".sock"
}

// Options are how Start serves a mount.
type Options struct {
	// MetricsAddr, when not empty, is a TCP address to serve the metrics
	// handler on too; it must be a loopback address unless AllowRemote.
	MetricsAddr string
	AllowRemote bool
	// SocketGroup, when not nil, is a group whose members may use the
	// socket besides root and the daemon's user (vdisk mount
	// --socket-group): the socket is then 0660 and the group's.
	SocketGroup *Group
	// Logger gets a warning for every connection refused; nil is
	// logrus's standard logger.
	Logger logrus.FieldLogger

	dir string // the runtime directory, when not runtimeDir() (tests)
}

// Serve is Start with no socket group: it serves the mount's socket, and
// metricsAddr when not empty.
func Serve(h http.Handler, ctl Controller, mountpoint, metricsAddr string, allowRemote bool) (stop func(), err error) {
	return Start(h, ctl, mountpoint, Options{MetricsAddr: metricsAddr, AllowRemote: allowRemote})
}

// Start listens on the mount's Unix socket, with h and ctl's requests for
// the peers it admits, and, when o.MetricsAddr is not empty, on that TCP
// address too, with h only. It returns a function that stops both; calling
// it again does nothing.
func Start(h http.Handler, ctl Controller, mountpoint string, o Options) (stop func(), err error) {
	var servers []*http.Server
	closeAll := func() {
		for _, s := range servers {
			s.Close()
		}
	}
	stop = closeAll
	if o.MetricsAddr != "" && !o.AllowRemote {
		if err := requireLoopback(o.MetricsAddr); err != nil {
			return stop, err
		}
	}
	log := o.Logger
	if log == nil {
		log = logrus.StandardLogger()
	}
	dir := o.dir
	if dir == "" {
		dir = runtimeDir()
	}
	euid := uint32(os.Geteuid())
	if err := prepareDir(dir, euid, o.SocketGroup != nil); err != nil {
		return stop, err
	}
	ul, err := listenSocket(dir, socketName(mountpoint), o.SocketGroup)
	if err != nil {
		return stop, err
	}
	// The socket is removed by stop, and only if it is still ours: a
	// daemon that mounts the same point after this one has closed its
	// store may already have put its own there.
	sock := filepath.Join(dir, socketName(mountpoint))
	mine, _ := os.Lstat(sock)
	sh := socketHandler{stats: h, ctl: ctl, policy: policy{uid: euid, group: o.SocketGroup}, mountpoint: mountpoint, log: log}
	us := &http.Server{Handler: sh, ReadHeaderTimeout: 10 * time.Second, ConnContext: peerContext}
	go us.Serve(peerListener{ul})
	servers = append(servers, us)
	if o.MetricsAddr != "" {
		tl, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			closeAll()
			return stop, fmt.Errorf("metrics listener: %w", err)
		}
		servers = append(servers, serve(h, tl))
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			closeAll()
			if now, err := os.Lstat(sock); err == nil && mine != nil && os.SameFile(mine, now) {
				os.Remove(sock)
			}
		})
	}, nil
}

// withControl adds ctl's requests to h: POST /sync answers 204 once the
// store is committed, or 500 with the error; POST /snapshot (a
// SnapshotRequest: a snapshot, or a clone) answers 201 with a SnapshotReply once the snapshot is
// durable, or the error with a status that says whose fault it is
// (statusOf).
func withControl(h http.Handler, ctl Controller) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("POST /sync", func(w http.ResponseWriter, r *http.Request) {
		if err := ctl.Sync(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /snapshot", func(w http.ResponseWriter, r *http.Request) {
		var req SnapshotRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
			http.Error(w, "snapshot request: "+err.Error(), http.StatusBadRequest)
			return
		}
		take := ctl.Snapshot
		if req.Clone {
			take = ctl.Clone
		}
		info, err := take(req.Disk, req.Name)
		if err != nil {
			http.Error(w, err.Error(), statusOf(err))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(SnapshotReply{Name: info.Name, ID: info.ID, Size: info.Size, Origin: req.Disk})
	})
	handleTransfers(mux, ctl)
	handleCatalog(mux, ctl)
	handleKeys(mux, ctl)
	if g, ok := ctl.(guard); ok {
		handleVhostUser(mux, g)
	}
	return mux
}

// statusSentinels pairs each sentinel a request may fail with and the HTTP
// status that carries it: statusOf maps the first way, errorOf back. The
// first sentinel that matches wins.
var statusSentinels = []struct {
	err    error
	status int
}{
	{image.ErrNotExist, http.StatusNotFound},
	{image.ErrExist, http.StatusConflict},
	{image.ErrInvalidName, http.StatusBadRequest},
	{fs.ErrPermission, http.StatusForbidden},
	{image.ErrWrongKey, http.StatusUnauthorized},
	{image.ErrLocked, http.StatusLocked},
	{image.ErrBusy, http.StatusPreconditionFailed},
}

// statusOf is the HTTP status of a failed request; errorOf undoes it.
func statusOf(err error) int {
	for _, s := range statusSentinels {
		if errors.Is(err, s.err) {
			return s.status
		}
	}
	return http.StatusInternalServerError
}

// remoteError is an error the daemon reported: its message, and the image
// sentinel its status stands for (nil for none), for errors.Is.
type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// errorOf turns a failed reply into an error with the daemon's message.
func errorOf(resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	e := &remoteError{msg: strings.TrimSpace(string(msg))}
	for _, s := range statusSentinels {
		if resp.StatusCode == s.status {
			e.is = s.err
			break
		}
	}
	if e.msg == "" {
		e.msg = resp.Status
	}
	return e
}

func serve(h http.Handler, l net.Listener) *http.Server {
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go s.Serve(l)
	return s
}

// requireLoopback refuses a listen address that is not on loopback: the
// metrics endpoint names disks and has no authentication.
func requireLoopback(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("metrics address %q is not a loopback address (127.0.0.1, ::1, localhost)", addr)
	}
	return nil
}

// ErrNotServing: no vdiskfs daemon answers for that mount point.
var ErrNotServing = errors.New("telemetry: no vdiskfs mount is serving there")

// client is an HTTP client of the socket of the mount at mountpoint, with
// the mount point made absolute and the socket's path, for messages.
func client(mountpoint string, timeout time.Duration) (c *http.Client, abs, sock string, err error) {
	if abs, err = filepath.Abs(mountpoint); err != nil {
		return nil, "", "", err
	}
	sock = findSocket(abs)
	if err := mayConnect(abs, sock); err != nil {
		return nil, "", "", err
	}
	c = &http.Client{Timeout: timeout, Transport: expectContinue{&http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		ExpectContinueTimeout: time.Second,
	}}}
	return c, abs, sock, nil
}

// doJSON makes the request method /what of the mount's socket with body (JSON),
// expects status, and decodes the answer into v unless v is nil, waiting
// at most timeout (0: as long as the daemon takes). The descriptors of
// files, if any, pass with the request (SCM_RIGHTS).
func doJSON(mountpoint, method, what string, body []byte, status int, timeout time.Duration, v any, files ...*os.File) error {
	c, abs, sock, err := client(mountpoint, timeout)
	if err != nil {
		return err
	}
	if len(files) > 0 {
		c = withRights(c, sock, files...)
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://vdiskfs/"+what, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != status {
		return errorOf(resp)
	}
	if v == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("%s of %s: %w", what, abs, err)
	}
	return nil
}

// Fetch reads the stats of the mount at mountpoint through its socket.
func Fetch(mountpoint string) (*Stats, error) {
	c, abs, sock, err := client(mountpoint, 10*time.Second)
	if err != nil {
		return nil, err
	}
	resp, err := c.Get("http://vdiskfs/stats")
	if err != nil {
		return nil, fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("stats of %s: %w", abs, errorOf(resp))
	}
	var st Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return nil, fmt.Errorf("stats of %s: %w", abs, err)
	}
	return &st, nil
}

// Sync commits the store of the mount at mountpoint through its socket and
// returns once everything acknowledged before the call is durable. It waits
// as long as the commit takes.
func Sync(mountpoint string) error {
	c, abs, sock, err := client(mountpoint, 0)
	if err != nil {
		return err
	}
	resp, err := c.Post("http://vdiskfs/sync", "", nil)
	if err != nil {
		return fmt.Errorf("%s (socket %s): %w: %v", abs, sock, ErrNotServing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("sync %s: %w", abs, errorOf(resp))
	}
	return nil
}

// Snapshot asks the mount at mountpoint to snapshot its disk called disk as
// name, through its socket, and returns once the snapshot is durable and
// shows in the mount. Errors carry the daemon's message; a missing disk
// matches image.ErrNotExist, a name in use image.ErrExist, a bad name
// image.ErrInvalidName (errors.Is).
func Snapshot(mountpoint, disk, name string) (SnapshotReply, error) {
	return shareWhole(SnapshotRequest{Disk: disk, Name: name}, mountpoint)
}

// Clone asks the mount at mountpoint to clone its disk called disk as
// name (a writable disk sharing every block), as Snapshot does.
func Clone(mountpoint, disk, name string) (SnapshotReply, error) {
	return shareWhole(SnapshotRequest{Disk: disk, Name: name, Clone: true}, mountpoint)
}

func shareWhole(req SnapshotRequest, mountpoint string) (SnapshotReply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return SnapshotReply{}, err
	}
	var rep SnapshotReply
	err = doJSON(mountpoint, http.MethodPost, "snapshot", body, http.StatusCreated, 0, &rep)
	return rep, err
}
