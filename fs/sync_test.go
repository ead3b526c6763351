package fs

import (
	"os"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// TestSyncWritePaths checks which path each kind of synchronous write
// takes, on both transports, by the store's counters: an O_DSYNC overwrite
// in place of committed blocks is a durable (FUA) write and nothing else
// (on the ring, served by the queue thread itself); a write into a hole,
// and any O_SYNC write, commits. That each is durable when it returns is
// TestPowerLossUnderMount's and tests/crashloop's business.
func TestSyncWritePaths(t *testing.T) {
	requireFUSE(t)
	for _, tr := range []Transport{TransportDev, TransportIOURing} {
		t.Run(string(tr), func(t *testing.T) {
			if tr == TransportIOURing {
				requireIOURing(t)
			}
			testSyncWritePaths(t, tr)
		})
	}
}

func testSyncWritePaths(t *testing.T, tr Transport) {
	// No commit timer: every commit and flush counted is the writes' own.
	tc := newTestCase(t, withMountOptions(Options{Transport: tr}),
		withStoreOptions(image.Options{CommitInterval: -1, Strict: true}))
	name := tc.path("a.raw")
	buf := directio.AlignedBlock(1 << 20)
	f, err := directio.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	counters := tc.store.Counters
	ownerWrites := func() uint64 {
		if tc.srv.ring == nil {
			return 0
		}
		_, w := tc.srv.ring.OwnerIO()
		return w
	}

	df, err := os.OpenFile(name, os.O_RDWR|unix.O_DIRECT|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	const n = 32
	before, owned := counters(), ownerWrites()
	for i := range n {
		if _, err := df.WriteAt(buf[:4096], int64(i)*8192); err != nil {
			t.Fatal(err)
		}
	}
	after := counters()
	if got := after.DurableWrites - before.DurableWrites; got != n {
		t.Errorf("%d O_DSYNC overwrites in place made %d durable writes, want %d", n, got, n)
	}
	if after.Commits != before.Commits || after.Flushes != before.Flushes {
		t.Errorf("O_DSYNC overwrites in place committed (%d commits, %d flushes): they need only durable writes",
			after.Commits-before.Commits, after.Flushes-before.Flushes)
	}
	if got := ownerWrites() - owned; tr == TransportIOURing && got != n {
		t.Errorf("the queue threads served %d of %d O_DSYNC overwrites, want all", got, n)
	}

	// Into a hole: the mapping must be committed before the reply.
	before = counters()
	if _, err := df.WriteAt(buf[:4096], 4<<20); err != nil {
		t.Fatal(err)
	}
	if after := counters(); after.Commits != before.Commits+1 || after.DurableWrites != before.DurableWrites {
		t.Errorf("an O_DSYNC write into a hole: %d commits, %d durable writes; want 1 commit and no durable write",
			after.Commits-before.Commits, after.DurableWrites-before.DurableWrites)
	}
	// O_SYNC: the times too, so a commit even for an overwrite.
	sf, err := os.OpenFile(name, os.O_RDWR|unix.O_DIRECT|unix.O_SYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sf.Close()
	before = counters()
	if _, err := sf.WriteAt(buf[:4096], 0); err != nil {
		t.Fatal(err)
	}
	if after := counters(); after.Commits != before.Commits+1 {
		t.Errorf("an O_SYNC overwrite: %d commits, want 1 (the times)", after.Commits-before.Commits)
	}
}
