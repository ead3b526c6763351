package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestFsckRepairThenMount: every damaged-store fixture of testdata/fsck,
// repaired with `vdisk fsck --repair`, then mounted with `vdisk mount`
// (in process, --foreground --ready-fd), and every disk read entirely
// through the mount. What repair keeps and drops per damage class is
// asserted byte for byte here and written down in testdata/fsck/README.md.
//
// The fixtures are built by image/fixtures_test.go: a.raw is 3 MiB, with
// 1 MiB of 'A' at 0 and 4 KiB of 'a' at 2 MiB; b.raw is 256 KiB of 'B';
// the journal fixtures add c.raw, three 8 KiB runs of 'C' at 0, 64 KiB and
// 128 KiB, each synced in its own journal commit; the shared ones add
// a-snap and a-clone.raw, sharing a.raw's blocks.
func TestFsckRepairThenMount(t *testing.T) {
	requireFUSE(t)
	fill := func(size int64, runs ...fixRun) []byte {
		p := make([]byte, size)
		for _, r := range runs {
			copy(p[r.off:], bytes.Repeat([]byte{r.b}, int(r.n)))
		}
		return p
	}
	a := fill(3<<20, fixRun{0, 1 << 20, 'A'}, fixRun{2 << 20, 4096, 'a'})
	b := fill(256<<10, fixRun{0, 256 << 10, 'B'})
	// The shared fixtures: a-snap and a-clone.raw hold a.raw as it was
	// before 4 KiB of 'X' were written at its start (copy-on-write).
	aX := fill(3<<20, fixRun{0, 1 << 20, 'A'}, fixRun{2 << 20, 4096, 'a'}, fixRun{0, 4096, 'X'})
	shared := map[string][]byte{"a.raw": aX, "a-snap": a, "a-clone.raw": a, "b.raw": b}
	c1 := fill(8<<10, fixRun{0, 8 << 10, 'C'})
	c2 := fill(72<<10, fixRun{0, 8 << 10, 'C'}, fixRun{64 << 10, 8 << 10, 'C'})
	cases := []struct {
		fixture string
		repair  int               // exit code of fsck --repair
		disks   map[string][]byte // every disk after repair, as the mount reads it
	}{
		{"clean", exitOK, map[string][]byte{"a.raw": a, "b.raw": b}},
		// The torn last commit is lost, as after any crash.
		{"torn-journal-tail", exitOK, map[string][]byte{"a.raw": a, "b.raw": b, "c.raw": c2}},
		{"superblock-copy-bad", exitRepaired, map[string][]byte{"a.raw": a, "b.raw": b}},
		// Replay stops at the damaged commit: c.raw keeps its first write only.
		{"journal-broken", exitRepaired, map[string][]byte{"a.raw": a, "b.raw": b, "c.raw": c1}},
		// b.raw's extent pointed outside the store: dropped, reads zeros.
		{"extent-outside-data", exitRepaired, map[string][]byte{"a.raw": a, "b.raw": make([]byte, 256<<10)}},
		// b.raw pointed into a.raw's blocks: a.raw (lower id) keeps them,
		// b.raw reads zeros there, never a.raw's bytes.
		{"shared-block", exitRepaired, map[string][]byte{"a.raw": a, "b.raw": make([]byte, 256<<10)}},
		// a.raw's size was cut to 1 MiB: the block mapped at 2 MiB is dropped.
		{"extent-beyond-size", exitRepaired, map[string][]byte{"a.raw": a[:1<<20], "b.raw": b}},
		{"leak", exitRepaired, map[string][]byte{"a.raw": a, "b.raw": b}},
		{"used-block-free", exitRepaired, map[string][]byte{"a.raw": a, "b.raw": b}},
		// The unusable names give way to recovered-ID.raw, data intact.
		{"invalid-name", exitRepaired, map[string][]byte{"recovered-1.raw": a, "b.raw": b}},
		{"duplicate-name", exitRepaired, map[string][]byte{"a.raw": a, "recovered-2.raw": b}},
		// Wrong reference counts are rebuilt from the maps: no disk loses
		// a byte, none shows another's.
		{"shared-clean", exitOK, shared},
		{"refcount-high", exitRepaired, shared},
		{"refcount-low", exitRepaired, shared},
	}
	for _, c := range cases {
		t.Run(c.fixture, func(t *testing.T) {
			store := unpackFixture(t, c.fixture)
			res, code := fsckJSON(t, store, "--repair")
			if code != c.repair {
				t.Fatalf("fsck --repair: exit %d, want %d: %+v", code, c.repair, res)
			}
			for _, a := range res.Repaired {
				t.Logf("repaired: %s", a)
			}
			mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
			ents, err := os.ReadDir(mnt)
			if err != nil {
				t.Fatal(err)
			}
			var names, want []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			for name := range c.disks {
				want = append(want, name)
			}
			slices.Sort(want)
			if !slices.Equal(names, want) {
				t.Errorf("disks after repair: %q, want %q", names, want)
			}
			for _, name := range names {
				got := readFileT(t, filepath.Join(mnt, name))
				exp, ok := c.disks[name]
				if !ok {
					continue
				}
				if !bytes.Equal(got, exp) {
					t.Errorf("%s after repair: %d bytes, %s; want %d bytes, %s", name, len(got), summary(got), len(exp), summary(exp))
				}
			}
			if err := unix.Unmount(mnt, 0); err != nil {
				t.Fatal(err)
			}
			if r := <-exit; r.code != exitOK {
				t.Fatalf("mount exited %d: %s", r.code, r.stderr)
			}
			if res, code := fsckJSON(t, store); code != exitOK {
				t.Fatalf("fsck after repair and mount: exit %d: %+v", code, res.Findings)
			}
		})
	}
}

type fixRun struct {
	off, n int64
	b      byte
}

// summary describes p as runs of equal bytes, for messages.
func summary(p []byte) string {
	var out []byte
	for i := 0; i < len(p); {
		j := i
		for j < len(p) && p[j] == p[i] {
			j++
		}
		if len(out) > 200 {
			return string(out) + " …"
		}
		out = fmt.Appendf(out, " %q×%d", p[i], j-i)
		i = j
	}
	return "[" + string(out) + " ]"
}
