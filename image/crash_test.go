package image

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// The crash test runs a random workload with syncs on the crashable
// backend, then cuts power at every flush boundary and at random points
// (with unflushed writes dropped, kept at random, or torn at sector
// granularity), reopens each possible state and checks the contract of
// docs/DESIGN.md: the store opens, Check is clean, every byte acknowledged before
// the last completed Sync reads back exactly, and no disk shows a byte of
// another disk or of a deleted one.
//
// Every byte a disk instance ever writes carries that instance's tag in its
// high nibble (and a non-zero low nibble), so a foreign byte is recognisable
// wherever it shows up. A disk may show another instance's tag only where it
// got it by a copy (CopyFrom, Snapshot): allowed collects the tags a copy
// brought in.
//
// The workload shares blocks too: copies between and within disks (whole
// blocks shared, edges copied), snapshots (read-only disks "sa", "sb", "sc"
// of "a", "b", "c", made and removed), and the writes, punches and
// truncates that follow go copy-on-write over the shared blocks. The commit
// timer's commits come in between (commitBackground).

type crashInstance struct {
	id      uint64
	name    string
	tag     byte
	allowed [16]bool // tags this instance may show: its own, and what copies brought
}

// crashStep is one workload operation, spanning backend ops (start, end].
type crashStep struct {
	start, end int
	name       string
	lo, hi     int64  // byte range it may have changed
	vals       []byte // what it wrote over [lo, hi); nil: zeros (punch, truncate)
	resize     bool   // it may have changed the size
	lifecycle  bool   // create or remove
}

// crashSync is the model at a completed Sync: the op index it completed at,
// and each named disk's instance and content.
type crashSync struct {
	op    int
	steps int // len(log) when the sync completed: later steps come after it
	disks map[string]crashDisk
}

type crashDisk struct {
	inst *crashInstance
	data []byte
}

func TestCrashConsistency(t *testing.T) {
	runs, steps := 4, 220
	if testing.Short() {
		runs, steps = 1, 120
	}
	total := 0
	for r := 0; r < runs; r++ {
		t.Run(fmt.Sprintf("run%d", r), func(t *testing.T) {
			total += runCrash(t, testutil.Seed(t), steps)
		})
	}
	t.Logf("%d crash states checked", total)
	if !testing.Short() && total < 1000 {
		t.Errorf("only %d crash states checked, want at least 1000", total)
	}
}

func runCrash(t *testing.T, seed uint64, steps int) int {
	rng := rand.New(rand.NewPCG(seed, 1))
	c := backend.NewCrash(8 << 20)
	c.CheckAlignment(512)
	// A tiny journal makes checkpoints frequent, so power cuts land in
	// their middle too.
	if err := Format(c, FormatOptions{JournalSize: 48 << 10}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(c, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	key := testSecret(t, 0x5a) // of the encrypted disks (crashEncrypted)
	instances := map[uint64]*crashInstance{}
	live := map[string]*crashInstance{}
	data := map[string][]byte{}
	handles := map[string]*Disk{}
	nextTag := byte(1)
	var log []crashStep
	snapshot := func(op int) crashSync {
		cs := crashSync{op: op, steps: len(log), disks: map[string]crashDisk{}}
		for name, inst := range live {
			cs.disks[name] = crashDisk{inst: inst, data: append([]byte(nil), data[name]...)}
		}
		return cs
	}
	syncs := []crashSync{snapshot(c.OpCount())}
	names := []string{"a", "b", "c"}
	const limit = 1 << 20

	for i := 0; i < steps; i++ {
		name := names[rng.IntN(len(names))]
		st := crashStep{start: c.OpCount(), name: name}
		h, exists := handles[name]
		op := rng.IntN(100)
		if exists && op >= 55 && op < 66 {
			srcName := names[rng.IntN(len(names))]
			if src, ok := handles[srcName]; ok && op < 62 && crashEncrypted(srcName) == crashEncrypted(name) {
				// A copy: mostly block-aligned ranges (shared), sometimes
				// not (copied), between disks or within one.
				srcOff, n := randRange(rng, 4096, limit)
				off := rng.Int64N(limit/4096) * 4096
				if rng.IntN(4) == 0 {
					off = rng.Int64N(limit)
				}
				n = min(n, 256<<10)
				srcLen := int64(len(data[srcName]))
				if srcName == name && srcOff < off+n && off < srcOff+n {
					continue // overlapping copies within a disk are refused
				}
				got, err := h.CopyFrom(src, srcOff, off, n)
				if err != nil {
					t.Fatalf("copy %s [%d,+%d) to %s at %d: %v", srcName, srcOff, n, name, off, err)
				}
				want := max(0, min(n, srcLen-srcOff))
				if got != want {
					t.Fatalf("copy %s [%d,+%d) to %s at %d: copied %d, want %d", srcName, srcOff, n, name, off, got, want)
				}
				var p []byte
				if want > 0 {
					p = append([]byte(nil), data[srcName][srcOff:srcOff+want]...)
					(&model{disks: data}).write(name, p, off)
					for tag, ok := range live[srcName].allowed {
						live[name].allowed[tag] = live[name].allowed[tag] || ok
					}
				}
				st.lo, st.hi, st.resize = off, off+want, true
				st.vals = p
				st.end = c.OpCount()
				log = append(log, st)
				continue
			}
			// A snapshot of name, replacing the one before; Snapshot commits.
			snap := "s" + name
			st.name, st.lifecycle = snap, true
			if _, ok := live[snap]; ok {
				if err := s.Remove(snap); err != nil {
					t.Fatal(err)
				}
				delete(live, snap)
				delete(data, snap)
			}
			info, err := s.Snapshot(name, snap)
			if err != nil {
				t.Fatal(err)
			}
			inst := &crashInstance{id: info.ID, name: snap, allowed: live[name].allowed}
			instances[info.ID], live[snap], data[snap] = inst, inst, append([]byte(nil), data[name]...)
			st.end = c.OpCount()
			log = append(log, st)
			syncs = append(syncs, snapshot(st.end))
			continue
		}
		switch {
		case !exists || op < 3:
			if exists {
				h.Close()
				delete(handles, name)
				if err := s.Remove(name); err != nil {
					t.Fatal(err)
				}
				delete(live, name)
				delete(data, name)
			}
			if nextTag > 15 { // no tags left: the disk stays removed
				if exists {
					st.end, st.lifecycle = c.OpCount(), true
					log = append(log, st)
				}
				continue
			}
			var info DiskInfo
			var err error
			if crashEncrypted(name) {
				info, err = s.CreateEncrypted(name, 0, Attr{Mode: 0o644}, key, crypt.Argon2Params{})
			} else {
				info, err = s.Create(name, 0, Attr{Mode: 0o644})
			}
			if err != nil {
				t.Fatal(err)
			}
			inst := &crashInstance{id: info.ID, name: name, tag: nextTag}
			inst.allowed[nextTag] = true
			nextTag++
			instances[info.ID], live[name], data[name] = inst, inst, nil
			handles[name], _ = s.OpenDisk(name)
			st.lifecycle = true
		case op < 65:
			off, n := randRange(rng, 4096, limit)
			n = min(n, 128<<10)
			p := make([]byte, n)
			for j := range p {
				p[j] = live[name].tag<<4 | byte(1+rng.IntN(15))
			}
			if _, err := h.WriteAt(p, off); err != nil {
				t.Fatal(err)
			}
			m := &model{disks: data}
			m.write(name, p, off)
			st.lo, st.hi, st.vals = off, off+n, p
			st.resize = true
		case op < 73:
			off, n := randRange(rng, 4096, limit)
			if err := h.Punch(off, n); err != nil {
				t.Fatal(err)
			}
			(&model{disks: data}).zero(name, off, n, true)
			st.lo, st.hi = off, off+n
		case op < 80:
			size := rng.Int64N(limit)
			if err := h.Truncate(size); err != nil {
				t.Fatal(err)
			}
			old := int64(len(data[name]))
			(&model{disks: data}).truncate(name, size)
			st.lo, st.hi, st.resize = min(old, size), 1<<62, true
		case op < 85:
			// The commit timer's, then an overwrite of a block the disk
			// holds and the timer again: when the overwrite went in
			// place, the second commit holds the times alone and is
			// written without a flush. Neither is a sync.
			if err := s.commitBackground(); err != nil {
				t.Fatal(err)
			}
			if size := int64(len(data[name])); size >= 4096 {
				off := rng.Int64N(size/4096) * 4096
				p := make([]byte, 4096)
				for j := range p {
					p[j] = live[name].tag<<4 | byte(1+rng.IntN(15))
				}
				if _, err := h.WriteAt(p, off); err != nil {
					t.Fatal(err)
				}
				(&model{disks: data}).write(name, p, off)
				st.lo, st.hi, st.vals = off, off+4096, p
			}
			if err := s.commitBackground(); err != nil {
				t.Fatal(err)
			}
		default:
			if err := h.Sync(); err != nil {
				t.Fatal(err)
			}
			st.end = c.OpCount()
			log = append(log, st)
			syncs = append(syncs, snapshot(st.end))
			continue
		}
		st.end = c.OpCount()
		log = append(log, st)
	}
	t.Logf("%d commits by the timer written without a flush", s.Metrics().Counters.UnflushedCommits)
	for _, h := range handles {
		h.Close()
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	syncs = append(syncs, snapshot(c.OpCount()))

	// Cut points: every flush, then random points, with every mode.
	type cut struct {
		op   int
		mode backend.CrashMode
	}
	var cuts []cut
	first := syncs[0].op
	for _, f := range c.FlushOps() {
		if f >= first {
			cuts = append(cuts, cut{f, backend.DropUnflushed}, cut{f, backend.RandomSubset})
		}
	}
	last := c.OpCount()
	for i := 0; i < 120; i++ {
		cuts = append(cuts, cut{first + rng.IntN(last-first+1), backend.Torn})
	}
	for _, k := range cuts {
		verifyCrashState(t, c, k.op, k.mode, rng, syncs, log, instances, key)
	}
	return len(cuts)
}

func verifyCrashState(t *testing.T, c *backend.Crash, op int, mode backend.CrashMode, rng *rand.Rand,
	syncs []crashSync, log []crashStep, instances map[uint64]*crashInstance, key *crypt.Secret) {
	t.Helper()
	where := fmt.Sprintf("power cut after op %d (%s)", op, mode)
	mem := c.MemAt(op, rng, mode)
	s, err := Open(mem, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatalf("%s: open: %v", where, err)
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("%s: check: %v", where, rep.Findings)
	}
	for _, info := range s.List() {
		if info.Locked {
			if _, err := s.Unlock(info.Name, key); err != nil {
				t.Fatalf("%s: unlock %q: %v", where, info.Name, err)
			}
		}
	}
	// The last sync that completed before the cut.
	k := 0
	for i, sy := range syncs {
		if sy.op <= op {
			k = i
		}
	}
	synced := syncs[k]
	// Steps after that sync that may have reached the backing by the cut.
	// A step that changed only the map (a punch of whole blocks, a
	// truncate) has no op of its own: it lands with a later commit, so it
	// counts when it started at or before the cut.
	after := func(name string) []crashStep {
		var out []crashStep
		for _, st := range log[synced.steps:] {
			if st.name == name && st.start <= op {
				out = append(out, st)
			}
		}
		return out
	}
	for _, info := range s.List() {
		inst := instances[info.ID]
		if inst == nil {
			t.Fatalf("%s: disk %q id %d was never created", where, info.Name, info.ID)
		}
		got := readAll(t, s, info.Name)
		for i, b := range got {
			if b != 0 && !inst.allowed[b>>4] {
				t.Fatalf("%s: disk %q (tag %d) byte %d is %#x: a byte of another disk (tag %d) that no copy brought", where, info.Name, inst.tag, i, b, b>>4)
			}
		}
		want, ok := synced.disks[info.Name]
		if !ok || want.inst != inst {
			continue // created (or replaced) after the sync: only isolation applies
		}
		steps := after(info.Name)
		resized := false
		for _, st := range steps {
			resized = resized || st.resize || st.lifecycle
		}
		if !resized && int64(len(got)) != int64(len(want.data)) {
			t.Fatalf("%s: disk %q size %d, synced %d (sync at op %d)", where, info.Name, len(got), len(want.data), synced.op)
		}
		for i := 0; i < min(len(got), len(want.data)); i++ {
			if got[i] == want.data[i] {
				continue
			}
			// A byte may hold what any step since the sync wrote there
			// (those that reached the backing land in any order), and
			// nothing else.
			explained, touched := false, false
			for _, st := range steps {
				if st.lifecycle {
					explained = true
					break
				}
				if int64(i) < st.lo || int64(i) >= st.hi {
					continue
				}
				touched = true
				v := byte(0)
				if st.vals != nil {
					v = st.vals[int64(i)-st.lo]
				}
				if got[i] == v {
					explained = true
					break
				}
			}
			if !explained && !touched {
				t.Fatalf("%s: disk %q byte %d is %#x, synced %#x, and nothing wrote it since", where, info.Name, i, got[i], want.data[i])
			}
			if !explained {
				t.Fatalf("%s: disk %q byte %d is %#x, synced %#x, and no step since wrote that there", where, info.Name, i, got[i], want.data[i])
			}
		}
	}
	// Every disk of the sync that nothing removed since must still exist.
	for name, want := range synced.disks {
		removed := false
		for _, st := range after(name) {
			removed = removed || st.lifecycle
		}
		if _, err := s.Stat(name); err != nil && !removed {
			t.Fatalf("%s: synced disk %q (id %d) is gone: %v", where, name, want.inst.id, err)
		}
	}
}

// crashEncrypted says the crash test's disk called name (b, and its
// snapshot sb) is encrypted: copies between it and the plain ones are
// refused, and skipped.
func crashEncrypted(name string) bool { return strings.HasSuffix(name, "b") }

func readAll(t *testing.T, s *Store, name string) []byte {
	t.Helper()
	d, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	p := make([]byte, d.Size())
	if _, err := d.ReadAt(p, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return p
}
