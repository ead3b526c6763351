package fs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// testCase is a store in t.TempDir() mounted in this process.
type testCase struct {
	t         testing.TB
	dir       string // scratch space on the same (real) filesystem
	storePath string
	mnt       string
	storeSize int64
	storeOpts image.Options
	mountOpts Options
	wrapBE    func(backend.Backend) backend.Backend
	memBE     memBackend          // the store's backing instead of a file (withMemBackend)
	formatOpt image.FormatOptions // how the store is formatted
	formatOps int                 // for a Crash memBE: its op count when Format returned
	store     *image.Store
	srv       *Server
}

type tcOption func(*testCase)

// withStoreOptions opens the store with o (CommitInterval -1 keeps the
// background commit from running behind a test's back). Strict is on
// whatever o says.
func withStoreOptions(o image.Options) tcOption { return func(tc *testCase) { tc.storeOpts = o } }

// withBackend opens the store on wrap(the file backend), for tests that
// watch or slow down backend I/O.
func withBackend(wrap func(backend.Backend) backend.Backend) tcOption {
	return func(tc *testCase) { tc.wrapBE = wrap }
}

// memBackend is an in-memory backend that keeps its contents across Close
// and Reopen: backend.Mem, or backend.Crash for power cuts and injected
// faults.
type memBackend interface {
	backend.Backend
	Reopen()
	Bytes() []byte
}

// withMemBackend formats the store on be instead of a file in t.TempDir()
// and opens it there (again after a remount); be's size is the store's.
// Tests then cut power (Crash.MemAt) or inject faults (Crash.SetFault).
func withMemBackend(be memBackend) tcOption { return func(tc *testCase) { tc.memBE = be } }

// withFormatOptions formats the store with fo (a small journal makes
// checkpoints frequent).
func withFormatOptions(fo image.FormatOptions) tcOption {
	return func(tc *testCase) { tc.formatOpt = fo }
}

// withMountOptions mounts with o.
func withMountOptions(o Options) tcOption { return func(tc *testCase) { tc.mountOpts = o } }

// withStoreSize makes a store of size bytes (default 4 GiB, sparse).
func withStoreSize(size int64) tcOption {
	return func(tc *testCase) { tc.storeSize = size }
}

// requireFUSE skips the test when this process cannot serve FUSE, and
// fails it instead in CI, where FUSE must be there.
func requireFUSE(t testing.TB) { testutil.RequireFUSE(t) }

var testLogger = func() *logrus.Logger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	if os.Getenv("VDISKFS_TEST_DEBUG") != "" {
		l.SetLevel(logrus.DebugLevel)
	}
	return l
}()

// newTestCase formats a 4 GiB sparse store in t.TempDir() (or, in a build
// with the rbd tag and VDISKFS_TEST_RBD set, on a new RBD image), opens it
// and mounts it. Cleanup unmounts (also when the test failed), checks the
// store, closes it, reopens it and checks it again; any finding fails the
// test and the store file is kept for inspection.
func newTestCase(t testing.TB, opts ...tcOption) *testCase {
	t.Helper()
	requireFUSE(t)
	dir := t.TempDir()
	tc := &testCase{
		t:         t,
		dir:       dir,
		storePath: filepath.Join(dir, "store.img"),
		mnt:       filepath.Join(dir, "mnt"),
		storeSize: 4 << 30,
	}
	for _, o := range opts {
		o(tc)
	}
	if tc.memBE == nil {
		if name := rbdTestStore(t); name != "" {
			tc.storePath = name // VDISKFS_TEST_RBD: the suite on an RBD image
		}
	}
	tc.storeOpts.Program = "fs test"
	// Every mounted test checks the whole store after every commit
	// (Options.Strict), so a test finds a broken invariant where it
	// happens, not only in the final fsck.
	tc.storeOpts.Strict = true
	if tc.storeOpts.Logger == nil {
		tc.storeOpts.Logger = testLogger
	}
	if tc.mountOpts.Logger == nil {
		tc.mountOpts.Logger = testLogger
	}
	if os.Getenv("VDISKFS_TEST_DEBUG") != "" {
		tc.mountOpts.Debug = true
	}
	// VDISKFS_TEST_TRANSPORT runs every test that does not choose its
	// transport over the one it names (dev, io_uring), as tools/test.sh
	// does once more with dev: the default (auto) is io_uring where the
	// kernel has it, so without this the /dev/fuse path of a root mount
	// would go untested.
	if tr := os.Getenv("VDISKFS_TEST_TRANSPORT"); tr != "" && tc.mountOpts.Transport == TransportAuto {
		parsed, err := ParseTransport(tr)
		if err != nil {
			t.Fatalf("VDISKFS_TEST_TRANSPORT: %v", err)
		}
		tc.mountOpts.Transport = parsed
	}
	if err := os.Mkdir(tc.mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if tc.memBE != nil {
		if err := image.Format(tc.memBE, tc.formatOpt); err != nil {
			t.Fatal(err)
		}
		if c, ok := tc.memBE.(*backend.Crash); ok {
			tc.formatOps = c.OpCount()
		}
	} else if err := image.FormatPath(tc.storePath, tc.storeSize, tc.formatOpt); err != nil {
		t.Fatal(err)
	}
	// Production wiring, as cmd/vdisk's mount does it: the transport
	// settled once, the store's engine chosen from it.
	if err := PrepareTransport(tc.mountOpts.Transport); err != nil {
		t.Fatal(err)
	}
	tc.storeOpts.IOEngine = StoreEngine(tc.mountOpts.Transport, tc.storeOpts.IOEngine)
	tc.openStore()
	t.Cleanup(tc.cleanup)
	tc.mount()
	return tc
}

func (tc *testCase) openStore() {
	tc.t.Helper()
	if tc.memBE != nil {
		tc.memBE.Reopen() // a no-op before the first open
		s, err := image.Open(tc.memBE, tc.storeOpts)
		if err != nil {
			tc.t.Fatal(err)
		}
		tc.store = s
		return
	}
	if tc.wrapBE != nil {
		be, err := backend.Open(tc.storePath, backend.OpenOptions{})
		if err != nil {
			tc.t.Fatal(err)
		}
		s, err := image.Open(tc.wrapBE(be), tc.storeOpts)
		if err != nil {
			be.Close()
			tc.t.Fatal(err)
		}
		tc.store = s
		return
	}
	s, err := image.OpenPath(tc.storePath, tc.storeOpts)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.store = s
}

func (tc *testCase) mount() {
	tc.t.Helper()
	srv, err := Mount(tc.store, tc.mnt, tc.mountOpts)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.srv = srv
}

// unmount unmounts; false if that did not finish (a file left open keeps
// a lazily detached mount alive), which fails the test rather than hang it.
func (tc *testCase) unmount() bool {
	tc.t.Helper()
	if tc.srv == nil {
		return true
	}
	done := make(chan error, 1)
	go func() { done <- tc.srv.Unmount() }()
	select {
	case err := <-done:
		if err != nil {
			tc.t.Errorf("unmount: %v", err)
		}
	case <-time.After(2 * time.Minute):
		tc.t.Errorf("unmount of %s did not finish: is a file still open?", tc.mnt)
		return false
	}
	tc.srv = nil
	return true
}

// check runs store.Check and fails the test on any finding.
func (tc *testCase) check(when string) {
	tc.t.Helper()
	if rep := tc.store.Check(); !rep.Clean() {
		for _, f := range rep.Findings {
			tc.t.Errorf("store check %s: %s", when, f)
		}
	}
}

// remount unmounts, checks and closes the store, reopens and remounts it.
func (tc *testCase) remount() {
	tc.t.Helper()
	tc.closeStore()
	tc.openStore()
	tc.check("after reopen")
	tc.mount()
}

func (tc *testCase) cleanup() {
	t := tc.t
	if !tc.unmount() {
		return // still serving: leave the store alone
	}
	if tc.store != nil {
		tc.check("at cleanup")
		if err := tc.store.Close(); err != nil {
			t.Errorf("close store: %v", err)
		}
		tc.store = nil
		if s, err := tc.reopenReadOnly(); err != nil {
			t.Errorf("reopen store: %v", err)
		} else {
			if rep := s.Check(); !rep.Clean() {
				for _, f := range rep.Findings {
					t.Errorf("store check after reopen: %s", f)
				}
			}
			s.Close()
		}
	}
	if t.Failed() && tc.memBE != nil {
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("vdiskfs-%s-%d.img", strings.ReplaceAll(t.Name(), "/", "_"), os.Getpid()))
		if err := os.WriteFile(keep, tc.memBE.Bytes(), 0o644); err == nil {
			t.Logf("store kept at %s", keep)
		}
	} else if t.Failed() {
		keep := filepath.Join(os.TempDir(), fmt.Sprintf("vdiskfs-%s-%d.img", strings.ReplaceAll(t.Name(), "/", "_"), os.Getpid()))
		if err := os.Rename(tc.storePath, keep); err == nil {
			t.Logf("store kept at %s", keep)
		}
	}
}

// reopenReadOnly opens the (closed) store again, read-only and tolerant,
// for a last check.
func (tc *testCase) reopenReadOnly() (*image.Store, error) {
	opts := image.Options{ReadOnly: true, Tolerant: true, Logger: testLogger}
	if tc.memBE != nil {
		tc.memBE.Reopen()
		return image.Open(tc.memBE, opts)
	}
	return image.OpenPath(tc.storePath, opts)
}

// closeStore unmounts, checks and closes the store, leaving nothing for
// cleanup to do: for tests that look at the backing afterwards.
func (tc *testCase) closeStore() {
	tc.t.Helper()
	if !tc.unmount() {
		tc.t.FailNow()
	}
	tc.check("before close")
	err := tc.store.Close()
	tc.store = nil
	if err != nil {
		tc.t.Fatalf("close store: %v", err)
	}
}

// crashCopy copies the store's backing as it is now, with the store still
// open: what a kill -9 of the daemon would leave. It returns the copy's
// store name.
func (tc *testCase) crashCopy() string {
	tc.t.Helper()
	if backend.IsRBD(tc.storePath) {
		return rbdCrashCopy(tc.t, tc.storePath)
	}
	crash := filepath.Join(tc.dir, "crash.img")
	run(tc.t, "cp", "--sparse=always", tc.storePath, crash)
	return crash
}

// path is the mount path of disk name.
func (tc *testCase) path(name string) string { return filepath.Join(tc.mnt, name) }

// openFile opens a file and closes it at the end of the test (before the
// unmount, which would otherwise wait for it).
func (tc *testCase) openFile(name string, flags int, perm os.FileMode) *os.File {
	tc.t.Helper()
	f, err := os.OpenFile(tc.path(name), flags, perm)
	if err != nil {
		tc.t.Fatal(err)
	}
	tc.t.Cleanup(func() { f.Close() })
	return f
}

// run runs a command, failing the test with its output if it fails.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	t.Logf("%s %s (%v)", name, strings.Join(args, " "), time.Since(start).Round(time.Millisecond))
	return string(out)
}

// requireTool makes sure a command is installed, installing its Debian
// package when it is missing and we are root; it fails the test clearly
// when that does not work.
func requireTool(t testing.TB, bin, pkg string) {
	t.Helper()
	if _, err := exec.LookPath(bin); err == nil {
		return
	}
	if os.Geteuid() != 0 {
		testutil.Missing(t, "%s is missing (package %s) and cannot be installed without root", bin, pkg)
	}
	installMu.Lock()
	defer installMu.Unlock()
	if _, err := exec.LookPath(bin); err == nil {
		return
	}
	env := append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	install := func() ([]byte, error) {
		cmd := exec.Command("apt-get", "install", "-y", "--no-install-recommends", pkg)
		cmd.Env = env
		return cmd.CombinedOutput()
	}
	out, err := install()
	if err != nil {
		upd := exec.Command("apt-get", "update")
		upd.Env = env
		if uout, uerr := upd.CombinedOutput(); uerr != nil {
			t.Fatalf("apt-get update (to install %s): %v\n%s", pkg, uerr, uout)
		}
		out, err = install()
	}
	if err != nil {
		t.Fatalf("apt-get install %s: %v\n%s", pkg, err, out)
	}
	if _, err := exec.LookPath(bin); err != nil {
		t.Fatalf("%s still missing after installing %s", bin, pkg)
	}
}

var installMu sync.Mutex

// writeRandomFile writes size bytes from a PRNG seeded with seed to path.
func writeRandomFile(t testing.TB, path string, size int64, seed uint64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := io.CopyN(f, newPRNGReader(seed), size); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// prngReader streams pseudo-random bytes.
type prngReader struct{ r *rand.ChaCha8 }

func newPRNGReader(seed uint64) io.Reader {
	var s [32]byte
	for i := range 8 {
		s[i] = byte(seed >> (8 * i))
	}
	return &prngReader{rand.NewChaCha8(s)}
}

func (p *prngReader) Read(b []byte) (int, error) { return p.r.Read(b) }

// sameFiles compares two files byte by byte (cmp).
func sameFiles(t testing.TB, a, b string) {
	t.Helper()
	out, err := exec.Command("cmp", a, b).CombinedOutput()
	if err != nil {
		t.Fatalf("cmp %s %s: %v: %s", a, b, err, out)
	}
}

// stat returns the stat of path.
func stat(t testing.TB, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return st
}

// readAll reads a whole file.
func readAll(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// wantErrno fails unless err is the errno want.
func wantErrno(t testing.TB, what string, err error, want unix.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: got error %v, want %v (%d)", what, err, want, int(want))
	}
}

// eventually polls cond until it holds, failing after a generous bound
// (for effects of asynchronous FUSE requests such as RELEASE).
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: did not happen", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// isZero reports whether b is all zeros.
func isZero(b []byte) bool {
	return len(b) == 0 || (b[0] == 0 && bytes.Equal(b[1:], b[:len(b)-1]))
}

// forTransports runs f as a subtest on each FUSE transport: dev, and
// io_uring where the kernel has it (requireIOURing), so that a test runs
// the queue-thread (owner) path of a root mount as well as go-fuse's.
func forTransports(t *testing.T, f func(t *testing.T, tr Transport)) {
	t.Helper()
	for _, tr := range []Transport{TransportDev, TransportIOURing} {
		t.Run(string(tr), func(t *testing.T) {
			requireFUSE(t)
			if tr == TransportIOURing {
				requireIOURing(t)
			}
			f(t, tr)
		})
	}
}

// ownerIO reports how many READ and WRITE requests the mount's io_uring
// queue owners served themselves (owner I/O through the backend's seam),
// and how many of those they started but handed to a worker because a
// backing I/O failed. It logs both, and on the io_uring transport fails
// the test if no request took the owner path. Call it before unmounting:
// the counts belong to the mount.
func (tc *testCase) ownerIO(what string) (served, retried uint64) {
	tc.t.Helper()
	if tc.srv == nil {
		tc.t.Fatalf("%s: owner I/O counts asked of an unmounted store", what)
	}
	ring := tc.srv.ring
	if ring == nil {
		if tc.mountOpts.Transport == TransportIOURing {
			tc.t.Fatalf("%s: mount serves over %q, want io_uring", what, tc.srv.Transport())
		}
		tc.t.Logf("%s: %s transport: no queue-thread path", what, tc.srv.Transport())
		return 0, 0
	}
	r, w := ring.OwnerIO()
	served, retried = r+w, ring.OwnerRetries()
	tc.t.Logf("%s: %d requests took the queue-thread path: %d served there (%d reads, %d writes), %d fell back to a worker after a failed backing I/O",
		what, served+retried, served, r, w, retried)
	if served+retried == 0 {
		tc.t.Errorf("%s: no request took the queue-thread path on io_uring", what)
	}
	return served, retried
}

// ownerRetries is how many requests the mount's io_uring queue owners
// handed to a worker after a failed backing I/O; 0 on /dev/fuse.
func (tc *testCase) ownerRetries() uint64 {
	if tc.srv == nil || tc.srv.ring == nil {
		return 0
	}
	return tc.srv.ring.OwnerRetries()
}
