package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"
)

// TestSnapshotOffline: vdisk snapshot STORE DISK NAME makes a read-only
// disk that shares every block and reads as the disk did; ls shows the
// origin and the exclusive/shared split, in columns and in JSON, and so does
// info; the errors say what is wrong; removing the origin leaves the
// snapshot whole, its blocks its own.
func TestSnapshotOffline(t *testing.T) {
	store := newStore(t)
	src := filepath.Join(t.TempDir(), "src")
	data := randomBytes(3<<20, 5)
	writeFile(t, src, data)
	mustRun(t, "import", store, "a.raw", src)
	if r := mustRun(t, "snapshot", store, "a.raw", "a-snap"); r.stdout != "snapshot a-snap of a.raw taken: 3 MiB, read-only, shares every block\n" {
		t.Errorf("output %q", r.stdout)
	}
	a, snap := diskByName(t, store, "a.raw"), diskByName(t, store, "a-snap")
	if !snap.Snapshot || snap.Clone || snap.Origin != "a.raw" || snap.OriginID != a.ID || snap.Shared != 3<<20 || snap.Exclusive != 0 || snap.Size != 3<<20 {
		t.Errorf("a-snap: %+v", snap)
	}
	if a.Snapshot || a.Origin != "" || a.Shared != 3<<20 || a.Exclusive != 0 {
		t.Errorf("a.raw: %+v", a)
	}
	lines := strings.Split(strings.TrimSpace(mustRun(t, "ls", "--bytes", store).stdout), "\n")
	if got := strings.Join(strings.Fields(lines[0]), " "); got != "NAME SIZE ALLOCATED EXCLUSIVE SHARED EXTENTS AVG-EXTENT MODIFIED ORIGIN" {
		t.Errorf("header %q", got)
	}
	if f := strings.Fields(lines[1]); f[0] != "a-snap" || f[3] != "0" || f[4] != "3145728" || strings.Join(f[len(f)-3:], " ") != "snapshot of a.raw" {
		t.Errorf("a-snap line %q", lines[1])
	}
	if f := strings.Fields(lines[2]); f[0] != "a.raw" || f[len(f)-1] != "-" {
		t.Errorf("a.raw line %q", lines[2])
	}
	var in infoJSON
	if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", store).stdout), &in); err != nil {
		t.Fatal(err)
	}
	if in.FormatVersion != 2 || in.Snapshots != 1 || in.Clones != 0 || in.MappedBytes != 6<<20 || in.SharedBytes != 6<<20 || in.ExclusiveBytes != 0 {
		t.Errorf("info --json: %+v", in)
	}
	if out := mustRun(t, "info", store).stdout; !strings.Contains(out, "disks map:") || !strings.Contains(out, "6 MiB: 0 B exclusive, 6 MiB shared") || !strings.Contains(out, "snapshots: 1") {
		t.Errorf("info:\n%s", out)
	}
	back := filepath.Join(t.TempDir(), "back")
	mustRun(t, "export", store, "a-snap", back)
	if got := readFileT(t, back); !bytes.Equal(got, data) {
		t.Error("the snapshot does not read as its origin")
	}

	wantFail(t, exitFailure, []string{`snapshot "a.raw" as "a-snap"`, "already exists"}, "snapshot", store, "a.raw", "a-snap")
	wantFail(t, exitFailure, []string{`"none.raw"`, "no such disk"}, "snapshot", store, "none.raw", "x")
	wantFail(t, exitFailure, []string{"invalid disk name"}, "snapshot", store, "a.raw", "a/b")
	wantFail(t, exitFailure, []string{"takes 2 arguments (MOUNTPOINT/DISK NAME) or 3 (STORE DISK NAME), got 1"}, "snapshot", store)
	wantFail(t, exitFailure, []string{"is not a disk of a vdiskfs mount", "vdisk snapshot STORE DISK NAME"}, "snapshot", filepath.Join(t.TempDir(), "a.raw"), "x")

	mustRun(t, "rm", store, "a.raw")
	snap = diskByName(t, store, "a-snap")
	if snap.Origin != "" || snap.OriginID != a.ID || snap.Shared != 0 || snap.Exclusive != 3<<20 {
		t.Errorf("a-snap after its origin's removal: %+v", snap)
	}
	if out := mustRun(t, "ls", store).stdout; !strings.Contains(out, fmt.Sprintf("snapshot of disk id %d (removed)", a.ID)) {
		t.Errorf("ls after the origin's removal:\n%s", out)
	}
}

// TestUpgrade: a new store is version 1 until its first share; vdisk
// upgrade makes it 2 and says so, and then does nothing.
func TestUpgrade(t *testing.T) {
	store := newStore(t)
	if out := mustRun(t, "info", store).stdout; !strings.Contains(out, "format version:") || !strings.Contains(out, " 1 (no shared blocks yet") {
		t.Errorf("info of a new store:\n%s", out)
	}
	if r := mustRun(t, "upgrade", store); r.stdout != fmt.Sprintf("upgraded %s from format version 1 to 2 (shared blocks: clones and snapshots); vdisk builds that know only version 1 refuse it now\n", store) {
		t.Errorf("upgrade: %q", r.stdout)
	}
	if r := mustRun(t, "upgrade", store); r.stdout != store+" is format version 2 already: nothing to do\n" {
		t.Errorf("second upgrade: %q", r.stdout)
	}
	var in infoJSON
	if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", store).stdout), &in); err != nil {
		t.Fatal(err)
	}
	if in.FormatVersion != 2 {
		t.Errorf("format_version %d after upgrade", in.FormatVersion)
	}
	wantFail(t, exitFailure, []string{"no such file"}, "upgrade", filepath.Join(t.TempDir(), "none.img"))
}

// TestSnapshotMounted: on a mounted store, vdisk snapshot MOUNTPOINT/DISK
// NAME goes through the daemon and the snapshot is in the mount when it
// returns; the offline form is refused and points at the mount; a cp on the
// mount is a clone that ls names; fsck is clean.
func TestSnapshotMounted(t *testing.T) {
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	data := randomBytes(2<<20, 6)
	if err := os.WriteFile(filepath.Join(mnt, "a.raw"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("snapshot a-snap of a.raw taken: 2 MiB, read-only, shares every block (%s)\n", filepath.Join(mnt, "a-snap"))
	if r := mustRun(t, "snapshot", filepath.Join(mnt, "a.raw"), "a-snap"); r.stdout != want {
		t.Errorf("output %q, want %q", r.stdout, want)
	}
	if got := readFileT(t, filepath.Join(mnt, "a-snap")); !bytes.Equal(got, data) {
		t.Error("the snapshot does not read as its origin")
	}
	f, err := os.OpenFile(filepath.Join(mnt, "a-snap"), os.O_WRONLY, 0)
	if err == nil {
		f.Close()
	}
	if !errors.Is(err, syscall.EROFS) {
		t.Errorf("open of the snapshot for writing: %v, want EROFS", err)
	}
	wantFail(t, exitFailure, []string{"already exists"}, "snapshot", filepath.Join(mnt, "a.raw"), "a-snap")
	wantFail(t, exitFailure, []string{"no such disk"}, "snapshot", filepath.Join(mnt, "none.raw"), "x")
	wantFail(t, exitFailure, []string{"locked", "is mounted at " + mnt, "vdisk snapshot " + filepath.Join(mnt, "a.raw") + " b-snap"},
		"snapshot", store, "a.raw", "b-snap")
	// cp on the mount makes a clone, which ls names.
	out, err := exec.Command("cp", filepath.Join(mnt, "a.raw"), filepath.Join(mnt, "b.raw")).CombinedOutput()
	if err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	if d := diskByName(t, store, "a-snap"); !d.Snapshot || d.Origin != "a.raw" || d.Shared != 2<<20 {
		t.Errorf("a-snap after unmount: %+v", d)
	}
	if d := diskByName(t, store, "b.raw"); d.Snapshot || !d.Clone || d.Origin != "a.raw" || d.Shared != 2<<20 || d.Exclusive != 0 {
		t.Errorf("b.raw, a cp of a.raw: %+v", d)
	}
	if !strings.Contains(mustRun(t, "ls", store).stdout, "clone of a.raw") {
		t.Error("ls does not name b.raw a clone of a.raw")
	}
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck: exit %d: %+v", code, res.Findings)
	}
}

// TestClone: vdisk clone makes a writable disk sharing every block of a
// disk with holes, which cp of coreutils 9.1 would copy byte by byte: on
// a mount (through its socket), where it shows at once and takes writes
// that leave its origin alone, and offline; ls names it a clone; fsck is
// clean.
func TestClone(t *testing.T) {
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	a := filepath.Join(mnt, "a.raw")
	data := randomBytes(1<<20, 8)
	f, err := os.Create(a)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(16 << 20); err != nil { // 15 MiB of holes around 1 MiB of data
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data, 4<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := fmt.Sprintf("clone b.raw of a.raw taken: 16 MiB, writable, shares every block (%s)\n", filepath.Join(mnt, "b.raw"))
	if r := mustRun(t, "clone", a, "b.raw"); r.stdout != want {
		t.Errorf("output %q, want %q", r.stdout, want)
	}
	orig := readFileT(t, a)
	if got := readFileT(t, filepath.Join(mnt, "b.raw")); !bytes.Equal(got, orig) {
		t.Fatal("the clone does not read as its origin")
	}
	b, err := os.OpenFile(filepath.Join(mnt, "b.raw"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("open of the clone for writing: %v", err)
	}
	if _, err := b.WriteAt([]byte("the clone's own"), 4<<20); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if got := readFileT(t, a); !bytes.Equal(got, orig) {
		t.Error("a write to the clone changed its origin")
	}
	wantFail(t, exitFailure, []string{"already exists"}, "clone", a, "b.raw")
	wantFail(t, exitFailure, []string{"locked", "is mounted at " + mnt, "vdisk clone " + a + " c.raw"}, "clone", store, "a.raw", "c.raw")
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	if d := diskByName(t, store, "b.raw"); d.Snapshot || !d.Clone || d.Origin != "a.raw" || d.Size != 16<<20 || d.Shared != 1<<20-4096 {
		t.Errorf("b.raw after unmount: %+v", d)
	}
	if r := mustRun(t, "clone", store, "b.raw", "c.raw"); r.stdout != "clone c.raw of b.raw taken: 16 MiB, writable, shares every block\n" {
		t.Errorf("offline clone: output %q", r.stdout)
	}
	if d := diskByName(t, store, "c.raw"); !d.Clone || d.Origin != "b.raw" || d.Exclusive != 0 {
		t.Errorf("c.raw: %+v", d)
	}
	if !strings.Contains(mustRun(t, "ls", store).stdout, "clone of b.raw") {
		t.Error("ls does not name c.raw a clone of b.raw")
	}
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck: exit %d: %+v", code, res.Findings)
	}
}

// Snapshot of a disk being written (issue 18's second must-show).
//
// Writers write generations of a known pattern to slots of a.raw with
// O_DIRECT, each writer its own slots in a fixed order, one write at a
// time. A snapshot taken in one step against the writes in flight holds,
// for each writer, a prefix of its writes: its slots read, in order, some
// generation g+1 then g, every block of a slot the same generation (no
// write half in); every write acknowledged before the snapshot was asked
// for is in it, and no write that started after it returned.
const (
	slotSize    = 64 << 10
	patternSize = 4096 // one header per 4 KiB block
)

// fillSlot writes the pattern of generation gen of slot into p (one slot).
func fillSlot(p []byte, slot, gen uint64) {
	for off := 0; off < len(p); off += patternSize {
		b := p[off : off+patternSize]
		binary.LittleEndian.PutUint64(b[0:], 0x736e617073686f74) // "snapshot"
		binary.LittleEndian.PutUint64(b[8:], slot)
		binary.LittleEndian.PutUint64(b[16:], gen)
		binary.LittleEndian.PutUint64(b[24:], uint64(off/patternSize))
		for i := 32; i < len(b); i++ {
			b[i] = byte(slot*31 + gen*7 + uint64(i))
		}
	}
}

// slotGen returns the generation slot holds in p (a slot read back): 0 for
// a slot never written (zeros), or an error when the slot is not exactly
// one generation's pattern.
func slotGen(p []byte, slot uint64) (uint64, error) {
	if isZero(p) {
		return 0, nil
	}
	gen := binary.LittleEndian.Uint64(p[16:])
	want := make([]byte, len(p))
	fillSlot(want, slot, gen)
	if !bytes.Equal(p, want) {
		return 0, fmt.Errorf("slot %d is not one whole generation (first block says generation %d)", slot, gen)
	}
	return gen, nil
}

// slotWriters writes generations to slots of a disk until stopped.
type slotWriters struct {
	writers, slots int
	started, acked []atomic.Uint64 // per slot: last generation begun, last acknowledged
	writes         atomic.Uint64
	stop           atomic.Bool
	wg             sync.WaitGroup
	errs           chan error
}

// startWriters starts writers goroutines writing the slots of the file at
// path, writer w owning slots w, w+writers, ... in that order.
func startWriters(t *testing.T, path string, writers, slots int) *slotWriters {
	sw := &slotWriters{writers: writers, slots: slots, started: make([]atomic.Uint64, slots), acked: make([]atomic.Uint64, slots),
		errs: make(chan error, writers)}
	for w := 0; w < writers; w++ {
		f, err := os.OpenFile(path, os.O_RDWR|syscall.O_DIRECT, 0)
		if err != nil {
			t.Fatal(err)
		}
		sw.wg.Add(1)
		go func() {
			defer sw.wg.Done()
			defer f.Close()
			buf := directio.AlignedBlock(slotSize)
			for gen := uint64(1); ; gen++ {
				for s := w; s < slots; s += writers {
					if sw.stop.Load() {
						return
					}
					fillSlot(buf, uint64(s), gen)
					sw.started[s].Store(gen)
					if _, err := f.WriteAt(buf, int64(s)*slotSize); err != nil {
						sw.errs <- fmt.Errorf("writer %d: slot %d generation %d: %w", w, s, gen, err)
						return
					}
					sw.acked[s].Store(gen)
					sw.writes.Add(1)
				}
			}
		}()
	}
	t.Cleanup(sw.halt)
	return sw
}

// waitWrites returns once n more writes than now are acknowledged (or a
// writer failed).
func (sw *slotWriters) waitWrites(t *testing.T, n uint64) {
	t.Helper()
	target := sw.writes.Load() + n
	for sw.writes.Load() < target {
		select {
		case err := <-sw.errs:
			t.Fatal(err)
		default:
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
}

func (sw *slotWriters) halt() {
	sw.stop.Store(true)
	sw.wg.Wait()
}

func load(v []atomic.Uint64) []uint64 {
	out := make([]uint64, len(v))
	for i := range v {
		out[i] = v[i].Load()
	}
	return out
}

// checkCut checks the snapshot's contents snap (all slots) against what
// was acknowledged before the snapshot was asked for and what had started
// when it returned.
func (sw *slotWriters) checkCut(t *testing.T, snap []byte, ackedBefore, startedAfter []uint64) {
	t.Helper()
	gens := make([]uint64, sw.slots)
	for s := range gens {
		g, err := slotGen(snap[s*slotSize:(s+1)*slotSize], uint64(s))
		if err != nil {
			t.Fatal(err)
		}
		if g < ackedBefore[s] || g > startedAfter[s] {
			t.Errorf("slot %d: the snapshot holds generation %d; %d was acknowledged before the snapshot, %d had started when it returned", s, g, ackedBefore[s], startedAfter[s])
		}
		gens[s] = g
	}
	for w := 0; w < sw.writers; w++ {
		hi := gens[w]
		lo := hi
		for s := w; s < sw.slots; s += sw.writers {
			if gens[s] > lo || gens[s]+1 < hi {
				t.Fatalf("writer %d: slot %d holds generation %d after generations %d..%d: not a prefix of the writer's writes", w, s, gens[s], lo, hi)
			}
			lo = gens[s]
		}
	}
}

// TestSnapshotWhileWriting: vdisk snapshot MNT/a.raw a-snap while four
// writers write a.raw with O_DIRECT through the real daemon: the snapshot
// holds a consistent cut (see above), cannot be opened for writing, and
// survives kill -9 of the daemon and a remount; the store checks clean.
func TestSnapshotWhileWriting(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	pid := startDaemon(t, bin, store, mnt)
	slots, rounds := 256, uint64(4) // 16 MiB; the writers go round about 4 times each side of the snapshot
	if testing.Short() {
		slots, rounds = 64, 2
	}
	path := filepath.Join(mnt, "a.raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(slots) * slotSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	sw := startWriters(t, path, 4, slots)
	sw.waitWrites(t, rounds*uint64(slots))
	before := load(sw.acked)
	mustRun(t, "snapshot", path, "a-snap")
	after := load(sw.started)
	sw.waitWrites(t, rounds*uint64(slots)) // the writes after the snapshot must not reach it
	sw.halt()
	select {
	case err := <-sw.errs:
		t.Fatal(err)
	default:
	}
	t.Logf("%d writes of %d KiB; slot 0 at generation %d before the snapshot, %d after", sw.writes.Load(), slotSize>>10, before[0], load(sw.acked)[0])

	snapPath := filepath.Join(mnt, "a-snap")
	snap := readFileT(t, snapPath)
	if len(snap) != slots*slotSize {
		t.Fatalf("a-snap: %d bytes, want %d", len(snap), slots*slotSize)
	}
	sw.checkCut(t, snap, before, after)
	for _, fl := range []int{os.O_WRONLY, os.O_RDWR | syscall.O_DIRECT} {
		f, err := os.OpenFile(snapPath, fl, 0)
		if err == nil {
			f.Close()
		}
		if !errors.Is(err, syscall.EROFS) {
			t.Errorf("open of the snapshot for writing (flags %#x): %v, want EROFS", fl, err)
		}
	}

	killDaemon(t, pid)
	stop := mountForeground(t, bin, store, mnt)
	if got := readFileT(t, snapPath); !bytes.Equal(got, snap) {
		t.Error("the snapshot reads differently after kill -9 and a remount")
	}
	stop()
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck after kill -9 and remount: exit %d: %+v", code, res.Findings)
	}
	if d := diskByName(t, store, "a-snap"); !d.Snapshot || d.Origin != "a.raw" || d.Size != int64(slots)*slotSize {
		t.Errorf("a-snap: %+v", d)
	}
}
