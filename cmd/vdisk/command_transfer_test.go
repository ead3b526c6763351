package main

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/stream"
)

// TestSendReceive: a complete and an incremental stream between two stores
// through files, diff of the snapshots, and damaged streams refused with
// nothing left behind.
func TestSendReceive(t *testing.T) {
	src, dst := newStore(t), newStore(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	writeFile(t, img, randomBytes(8<<20, 1))
	mustRun(t, "import", src, "a.raw", img)
	mustRun(t, "snapshot", src, "a.raw", "s1")

	full := mustRun(t, "send", src, "s1").stdout
	fullPath := filepath.Join(dir, "s1.stream")
	writeFile(t, fullPath, []byte(full))
	r := mustRun(t, "receive", dst, "s1", fullPath)
	if !strings.Contains(r.stdout, "received s1 (complete stream)") {
		t.Errorf("receive says %q", r.stdout)
	}

	// Change 1 MiB and punch 1 MiB through the image API, snapshot s2.
	s, err := image.OpenPath(src, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := s.OpenDisk("a.raw")
	h.WriteAt(randomBytes(1<<20, 2), 3<<20)
	h.Punch(6<<20, 1<<20)
	h.Close()
	s.Close()
	mustRun(t, "snapshot", src, "a.raw", "s2")

	var diff []diffEntry
	if err := json.Unmarshal([]byte(mustRun(t, "diff", "--json", src, "s1", "s2").stdout), &diff); err != nil {
		t.Fatal(err)
	}
	want := []diffEntry{{Offset: 3 << 20, Length: 1 << 20, Kind: "data"}, {Offset: 6 << 20, Length: 1 << 20, Kind: "zero"}}
	if len(diff) != 2 || diff[0] != want[0] || diff[1] != want[1] {
		t.Errorf("diff s1 s2: %+v, want %+v", diff, want)
	}
	if out := mustRun(t, "diff", src, "s1", "s2").stdout; !strings.Contains(out, "no data read") {
		t.Errorf("diff: %s", out)
	}

	inc := mustRun(t, "send", src, "s2", "--from", "s1").stdout
	if len(inc) > (1<<20)+(64<<10) {
		t.Errorf("incremental stream of %d bytes for 1 MiB changed", len(inc))
	}
	incPath := filepath.Join(dir, "s2.stream")
	writeFile(t, incPath, []byte(inc))
	mustRun(t, "receive", dst, "s2", incPath)
	for _, name := range []string{"s1", "s2"} {
		a, b := filepath.Join(dir, name+".src"), filepath.Join(dir, name+".dst")
		mustRun(t, "export", src, name, a)
		mustRun(t, "export", dst, name, b)
		x, _ := os.ReadFile(a)
		y, _ := os.ReadFile(b)
		if !bytes.Equal(x, y) {
			t.Errorf("%s differs between the stores", name)
		}
	}

	// Damaged: cut, flipped, and an incremental stream without its base.
	other := newStore(t)
	cut := filepath.Join(dir, "cut.stream")
	writeFile(t, cut, []byte(full[:len(full)/2]))
	flipped := []byte(full)
	flipped[len(flipped)/3] ^= 1
	flip := filepath.Join(dir, "flip.stream")
	writeFile(t, flip, flipped)
	for path, msg := range map[string]string{cut: "cut short", flip: "corrupt", incPath: "does not hold"} {
		wantFail(t, exitFailure, []string{msg}, "receive", other, "x", path)
	}
	if ds := listDisks(t, other); len(ds) != 0 {
		t.Errorf("damaged streams left disks: %+v", ds)
	}
	mustRun(t, "fsck", other)
}

// TestSendReceiveMounted is the round trip between two mounted
// stores, through their daemons: a disk of random data, snapshot s1, a
// complete stream received on the other mount and read back equal; then
// scattered overwrites and a punch, snapshot s2, an incremental stream no
// larger than what changed (plus 5% and 1 MiB), received and equal; diff
// of s1 and s2 lists exactly the changed bytes; fsck clean on both.
func TestSendReceiveMounted(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	size, piece := int64(64<<20), int64(64<<10)
	if testing.Short() {
		size = 32 << 20
	}
	if v, err := strconv.ParseInt(os.Getenv("VDISK_SEND_MIB"), 10, 64); err == nil && v > 0 {
		size = v << 20 // the figure: VDISK_SEND_MIB=1024
	}
	storeSize := strconv.FormatInt(max(1<<30, 3*size), 10)
	storeA, storeB := newStore(t, "--size", storeSize), newStore(t, "--size", storeSize)
	ma, mb := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	startDaemon(t, bin, storeA, ma)
	startDaemon(t, bin, storeB, mb)
	a := filepath.Join(ma, "a.raw")
	writeFile(t, a, randomBytes(int(size), 11))
	mustRun(t, "snapshot", a, "s1.raw")
	dir := t.TempDir()
	receive := func(name string, stream string) {
		t.Helper()
		path := filepath.Join(dir, name+".stream")
		writeFile(t, path, []byte(stream))
		mustRun(t, "receive", mb, name, path)
		x, y := readFileT(t, filepath.Join(ma, name)), readFileT(t, filepath.Join(mb, name))
		if !bytes.Equal(x, y) {
			t.Fatalf("%s differs between the mounts", name)
		}
	}
	receive("s1.raw", mustRun(t, "send", filepath.Join(ma, "s1.raw")).stdout)

	// Overwrite 1/16 of the disk in scattered 64 KiB pieces, punch 1/32.
	f, err := os.OpenFile(a, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	slots := size / piece
	perm := rand.New(rand.NewPCG(3, 3)).Perm(int(slots))
	written := size / 16
	for _, k := range perm[:written/piece] {
		if _, err := f.WriteAt(randomBytes(int(piece), uint64(k)), int64(k)*piece); err != nil {
			t.Fatal(err)
		}
	}
	punchAt := int64(perm[written/piece]) * piece
	punched := min(size/32, size-punchAt)
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, punchAt, punched); err != nil {
		t.Fatal(err)
	}
	f.Close()
	mustRun(t, "snapshot", a, "s2.raw")

	var diff []diffEntry
	if err := json.Unmarshal([]byte(mustRun(t, "diff", "--json", filepath.Join(ma, "s1.raw"), filepath.Join(ma, "s2.raw")).stdout), &diff); err != nil {
		t.Fatal(err)
	}
	var data, zero int64
	for _, d := range diff {
		if d.Kind == "zero" {
			zero += d.Length
		} else {
			data += d.Length
		}
	}
	// The punch may cover pieces just written: they are zeros now.
	if data+zero < written || data > written || zero > punched || data+zero > written+punched {
		t.Errorf("diff: %d bytes of data and %d of zeros for %d written and %d punched", data, zero, written, punched)
	}
	inc := mustRun(t, "send", filepath.Join(ma, "s2.raw"), "--from", "s1.raw").stdout
	if limit := written*105/100 + 1<<20; int64(len(inc)) > limit {
		t.Errorf("incremental stream of %d bytes for %d written, want at most %d", len(inc), written, limit)
	}
	t.Logf("complete stream of a %d MiB disk; incremental stream %d bytes for %d written and %d punched", size>>20, len(inc), written, punched)
	receive("s2.raw", inc)
	for _, m := range []string{ma, mb} {
		mustRun(t, "umount", m)
	}
	mustRun(t, "fsck", storeA)
	mustRun(t, "fsck", storeB)
}

// setDisk changes a disk of an offline store through the image API: f
// gets an open handle.
func setDisk(t *testing.T, store, name string, f func(h *image.Disk) error) {
	t.Helper()
	s, err := image.OpenPath(store, image.Options{CommitInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	h, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := f(h); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// sameExport fails the test unless disk name reads the same in both
// stores.
func sameExport(t *testing.T, a, b, name string) {
	t.Helper()
	dir := t.TempDir()
	x, y := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	mustRun(t, "export", a, name, x)
	mustRun(t, "export", b, name, y)
	if p, q := readFileT(t, x), readFileT(t, y); !bytes.Equal(p, q) {
		for i := range min(len(p), len(q)) {
			if p[i] != q[i] {
				t.Fatalf("%s differs between the stores at byte %d", name, i+1)
			}
		}
		t.Fatalf("%s differs between the stores: %d and %d bytes", name, len(p), len(q))
	}
}

// TestSendCloneAsBase is issue 39's reproduction through the CLI: a clone
// is sent and received, then written on the sender and snapshotted; the
// incremental stream of the snapshot from the clone is refused, naming
// the clone, where it used to be received ("0 B of data") into a copy
// that differed from the sender's at byte 131073.
func TestSendCloneAsBase(t *testing.T) {
	a, b := newStore(t), newStore(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "d.img")
	writeFile(t, img, randomBytes(1<<20, 39))
	mustRun(t, "import", a, "d", img)
	mustRun(t, "clone", a, "d", "base")
	full := filepath.Join(dir, "base.stream")
	writeFile(t, full, []byte(mustRun(t, "send", a, "base").stdout))
	mustRun(t, "receive", b, "base", full)
	sameExport(t, a, b, "base")
	setDisk(t, a, "base", func(h *image.Disk) error {
		_, err := h.WriteAt(randomBytes(64<<10, 40), 128<<10)
		return err
	})
	mustRun(t, "snapshot", a, "base", "s4")
	r := vdisk(t, "send", a, "s4", "--from", "base")
	if r.code == 0 {
		inc := filepath.Join(dir, "s4.stream")
		writeFile(t, inc, []byte(r.stdout))
		mustRun(t, "receive", b, "s4", inc)
		sameExport(t, a, b, "s4")
		t.Fatal("send --from a clone succeeded")
	}
	if !strings.Contains(r.stderr, `--from "base" is a clone`) || !strings.Contains(r.stderr, "vdisk snapshot") {
		t.Errorf("send --from a clone: %s", r.stderr)
	}
	// The way that works: snapshots on both sides.
	mustRun(t, "snapshot", a, "d", "s1")
	writeFile(t, full, []byte(mustRun(t, "send", a, "s1").stdout))
	mustRun(t, "receive", b, "s1", full)
	setDisk(t, a, "d", func(h *image.Disk) error {
		_, err := h.WriteAt(randomBytes(64<<10, 41), 128<<10)
		return err
	})
	mustRun(t, "snapshot", a, "d", "s2")
	inc := filepath.Join(dir, "s2.stream")
	writeFile(t, inc, []byte(mustRun(t, "send", a, "s2", "--from", "s1").stdout))
	mustRun(t, "receive", b, "s2", inc)
	sameExport(t, a, b, "s2")
}

// TestReceiveOwnership: a 0600 disk of 1234:5678 is received 0600
// 1234:5678; --mode and --owner (numbers or names) override; a setuid
// --mode is refused; a version-1 stream makes a 0600 root disk.
func TestReceiveOwnership(t *testing.T) {
	a, b := newStore(t), newStore(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "a.img")
	writeFile(t, img, randomBytes(256<<10, 5))
	mustRun(t, "import", a, "a", img)
	setDisk(t, a, "a", func(h *image.Disk) error {
		m, u, g := uint32(0o600), uint32(1234), uint32(5678)
		return h.SetAttr(image.AttrChange{Mode: &m, UID: &u, GID: &g})
	})
	mustRun(t, "snapshot", a, "a", "s1")
	path := filepath.Join(dir, "s1.stream")
	writeFile(t, path, []byte(mustRun(t, "send", a, "s1").stdout))
	want := func(name, mode string, uid, gid uint32) {
		t.Helper()
		if d := diskByName(t, b, name); d.Mode != mode || d.UID != uid || d.GID != gid {
			t.Errorf("%s: mode %s %d:%d, want %s %d:%d", name, d.Mode, d.UID, d.GID, mode, uid, gid)
		}
	}
	mustRun(t, "receive", b, "s1", path)
	want("s1", "0600", 1234, 5678)
	mustRun(t, "receive", b, "x", path, "--mode", "640", "--owner", "42:43")
	want("x", "0640", 42, 43)
	mustRun(t, "receive", b, "y", path, "--owner", "root")
	want("y", "0600", 0, 5678)
	mustRun(t, "receive", b, "z", path, "--owner", ":root")
	want("z", "0600", 1234, 0)
	wantFail(t, exitFailure, []string{"--mode", "0777"}, "receive", b, "w", path, "--mode", "4755")
	wantFail(t, exitFailure, []string{"--owner", "no user"}, "receive", b, "w", path, "--owner", "no-such-user-here")
	wantFail(t, exitFailure, []string{"--owner"}, "receive", b, "w", path, "--owner", "1:")

	old := writeV1Stream(t, dir)
	mustRun(t, "receive", b, "old", old)
	want("old", "0600", 0, 0)
}

// TestSendReceiveOwnershipMounted: through two daemons, a 0600 disk of
// 1234:5678, written and not a snapshot (its daemon sends it from a
// hidden snapshot, gone afterwards), arrives 0600 1234:5678 with its
// modification time; --mode and --owner go through the socket; a
// version-1 stream makes a 0600 root disk; a clone is refused as a base,
// and a stream whose base the receiver lacks is refused with the daemon's
// reason.
func TestSendReceiveOwnershipMounted(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	storeA, storeB := newStore(t), newStore(t)
	ma, mb := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	startDaemon(t, bin, storeA, ma)
	startDaemon(t, bin, storeB, mb)
	a := filepath.Join(ma, "a.raw")
	if err := os.WriteFile(a, randomBytes(1<<20, 6), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(a, 1234, 5678); err != nil {
		t.Fatal(err)
	}
	mtime := time.Unix(1700000000, 0)
	if err := os.Chtimes(a, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "a.stream")
	writeFile(t, path, []byte(mustRun(t, "send", a).stdout))
	if ents, _ := os.ReadDir(ma); len(ents) != 1 {
		t.Errorf("the sender's mount after the send: %v", ents)
	}
	check := func(name string, mode os.FileMode, uid, gid uint32) {
		t.Helper()
		fi, err := os.Stat(filepath.Join(mb, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().Perm() != mode || st.Uid != uid || st.Gid != gid {
			t.Errorf("%s: mode %v %d:%d, want %v %d:%d", name, fi.Mode().Perm(), st.Uid, st.Gid, mode, uid, gid)
		}
	}
	mustRun(t, "receive", mb, "a.raw", path)
	check("a.raw", 0o600, 1234, 5678)
	if fi, err := os.Stat(filepath.Join(mb, "a.raw")); err != nil || !fi.ModTime().Equal(mtime) {
		t.Errorf("received mtime: %v", fi.ModTime())
	}
	if !bytes.Equal(readFileT(t, a), readFileT(t, filepath.Join(mb, "a.raw"))) {
		t.Error("a.raw differs")
	}
	mustRun(t, "receive", mb, "b.raw", path, "--mode", "0644", "--owner", "7:8")
	check("b.raw", 0o644, 7, 8)
	old := writeV1Stream(t, dir)
	mustRun(t, "receive", mb, "old.raw", old)
	check("old.raw", 0o600, 0, 0)

	mustRun(t, "clone", a, "base.raw")
	wantFail(t, exitFailure, []string{`"base.raw" is a clone`}, "send", filepath.Join(ma, "a.raw"), "--from", "base.raw")

	// An incremental stream whose base the receiver lacks is refused
	// with the daemon's reason, though the stream is still coming.
	mustRun(t, "snapshot", a, "s1.raw")
	f, err := os.OpenFile(a, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(randomBytes(16<<20, 8), 1<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	mustRun(t, "snapshot", a, "s2.raw")
	inc := filepath.Join(dir, "s2.stream")
	writeFile(t, inc, []byte(mustRun(t, "send", filepath.Join(ma, "s2.raw"), "--from", "s1.raw").stdout))
	wantFail(t, exitFailure, []string{"does not hold"}, "receive", mb, "s2.raw", inc)
	for _, m := range []string{ma, mb} {
		mustRun(t, "umount", m)
	}
}

// killingWriter is a send's standard output that kills the daemon on
// the first bytes of the stream.
type killingWriter struct {
	t    *testing.T
	pid  int
	n    int64
	kill sync.Once
}

func (k *killingWriter) Write(p []byte) (int, error) {
	k.kill.Do(func() { killDaemon(k.t, k.pid) })
	k.n += int64(len(p))
	return len(p), nil
}

// TestTransferDaemonDies: when the daemon of a mount dies (kill -9) during
// vdisk send or vdisk receive through it, the error says that the daemon
// stopped, not what the broken socket said; the receive left no disk, and
// fsck is clean once the store is mounted again.
func TestTransferDaemonDies(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	storeA, storeB := newStore(t), newStore(t)
	ma, mb := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	pidA := startDaemon(t, bin, storeA, ma)
	pidB := startDaemon(t, bin, storeB, mb)
	data := randomBytes(24<<20, 7)
	writeFile(t, filepath.Join(ma, "a.raw"), data)
	mustRun(t, "snapshot", filepath.Join(ma, "a.raw"), "s1.raw")
	full := mustRun(t, "send", filepath.Join(ma, "s1.raw")).stdout

	// Receive from a FIFO: a part of the stream, the daemon killed, the rest.
	fifo := filepath.Join(t.TempDir(), "stream")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	res := make(chan result, 1)
	go func() {
		var out, errb bytes.Buffer
		code := run([]string{"receive", mb, "s1.raw", fifo}, &out, &errb)
		res <- result{stdout: out.String(), stderr: errb.String(), code: code}
	}()
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write([]byte(full[:4<<20])); err != nil {
		t.Fatal(err)
	}
	killDaemon(t, pidB)
	f.Write([]byte(full[4<<20:])) // fails once the receiver gives up
	f.Close()
	r := <-res
	if r.code == 0 || !strings.Contains(r.stderr, "the vdiskfs daemon serving "+mb+" stopped during the receive") {
		t.Errorf("receive when the daemon died: exit %d: %s", r.code, r.stderr)
	}
	t.Logf("receive: %s", r.stderr)

	// Send to a writer that kills the daemon when the stream starts.
	var errb bytes.Buffer
	kw := &killingWriter{t: t, pid: pidA}
	if code := run([]string{"send", filepath.Join(ma, "s1.raw")}, kw, &errb); code == 0 ||
		!strings.Contains(errb.String(), "the vdiskfs daemon serving "+ma+" stopped during the send") {
		t.Errorf("send when the daemon died: exit %d after %d bytes: %s", code, kw.n, errb.String())
	}
	t.Logf("send: %s", errb.String())

	for _, m := range []struct{ store, mnt string }{{storeA, ma}, {storeB, mb}} {
		if err := unix.Unmount(m.mnt, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
		stop := mountForeground(t, bin, m.store, m.mnt)
		stop()
	}
	if ds := listDisks(t, storeB); len(ds) != 0 {
		t.Errorf("the interrupted receive left %+v", ds)
	}
}

// writeV1Stream writes, in dir, a stream of the format before streams
// carried ownership (version 1): 8 KiB, "version 1" at its start.
func writeV1Stream(t *testing.T, dir string) string {
	t.Helper()
	var v1 bytes.Buffer
	w, err := stream.NewWriter(&v1, stream.Header{Version: 1, Size: 8192, Name: "old"})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Data(0, []byte("version 1")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "old.stream")
	writeFile(t, old, v1.Bytes())
	return old
}
