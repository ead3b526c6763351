package image

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// testSecret is a key file secret of 32 bytes of fill.
func testSecret(t testing.TB, fill byte) *crypt.Secret {
	t.Helper()
	s, err := crypt.KeyFileSecret(bytes.Repeat([]byte{fill}, crypt.KeyFileSize))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// mustCreateEncrypted creates an encrypted disk opened by the key file
// secret of fill, and opens it.
func mustCreateEncrypted(t testing.TB, s *Store, name string, size int64, fill byte) *Disk {
	t.Helper()
	if _, err := s.CreateEncrypted(name, size, Attr{Mode: 0o600}, testSecret(t, fill), crypt.Argon2Params{}); err != nil {
		t.Fatalf("create encrypted %s: %v", name, err)
	}
	d, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// textPattern is n recognisable bytes: a marker repeated, numbered by 64-byte
// line, so that any 64 bytes of it are found only where it was written.
func textPattern(tag string, n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "%-16s line %08d of the pattern, plain as day.....\n", tag, i)
	}
	return b.Bytes()[:n]
}

// readDisk reads the whole of the named disk.
func readDisk(t testing.TB, s *Store, name string) ([]byte, error) {
	t.Helper()
	h, err := s.OpenDisk(name)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	info, err := s.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, info.Size)
	_, err = h.ReadAt(buf, 0)
	return buf, err
}

// checkReads fails the test unless the named disk reads want from its
// start.
func checkReads(t *testing.T, s *Store, name string, want []byte) {
	t.Helper()
	if got, err := readDisk(t, s, name); err != nil || !bytes.Equal(got[:len(want)], want) {
		t.Fatalf("%s reads back wrong (%v)", name, err)
	}
}

// An encrypted disk's data is nowhere in the store in clear, a plain
// disk's is; both read back as written, through a checkpoint and through
// journal replay, and the encrypted one only once unlocked.
func TestEncryptedDiskRoundTrip(t *testing.T) {
	for _, how := range []string{"checkpoint", "journal"} {
		t.Run(how, func(t *testing.T) {
			ms := newMemStore(t, 32<<20, FormatOptions{BlockSize: 4096})
			s := ms.s
			plain := mustCreate(t, s, "plain.raw", 1<<20)
			enc := mustCreateEncrypted(t, s, "secret.raw", 1<<20, 7)
			pp, ep := textPattern("PLAINDISK", 300000), textPattern("SECRETDISK", 300000)
			for _, w := range []struct {
				h   *Disk
				p   []byte
				off int64
			}{{plain, pp, 0}, {enc, ep, 0}} {
				// Aligned and unaligned pieces: 64 KiB at once, then odd sizes.
				if _, err := w.h.WriteAt(w.p[:65536], w.off); err != nil {
					t.Fatal(err)
				}
				for off := 65536; off < len(w.p); off += 7777 {
					end := min(off+7777, len(w.p))
					if _, err := w.h.WriteAt(w.p[off:end], int64(off)); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := s.Commit(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(ep))
			if _, err := enc.ReadAt(got, 0); err != nil || !bytes.Equal(got, ep) {
				t.Fatalf("encrypted disk reads back wrong (%v)", err)
			}
			if info, _ := s.Stat("secret.raw"); !info.Encrypted || info.Locked {
				t.Errorf("info %+v: want encrypted and unlocked", info)
			}
			plain.Close()
			enc.Close()
			img := ms.mem.Bytes()
			if !bytes.Contains(img, pp[100000:100064]) {
				t.Fatal("the plain disk's pattern is not in the store: the search cannot fail")
			}
			for off := 0; off+64 <= len(ep); off += 4096 {
				if bytes.Contains(img, ep[off:off+64]) {
					t.Fatalf("the encrypted disk's bytes at %d are in the store in clear", off)
				}
			}

			if how == "checkpoint" {
				ms.reopen()
			} else {
				ms.mem.Reopen() // as after a crash: the journal is replayed
				ms.open()
			}
			s = ms.s
			if info, _ := s.Stat("secret.raw"); !info.Encrypted || !info.Locked {
				t.Errorf("info %+v after reopening: want encrypted and locked", info)
			}
			if _, err := readDisk(t, s, "secret.raw"); !errors.Is(err, ErrLocked) {
				t.Fatalf("read of a locked disk: %v, want ErrLocked", err)
			}
			if _, err := s.Unlock("secret.raw", testSecret(t, 8)); !errors.Is(err, ErrWrongKey) {
				t.Fatalf("unlock with the wrong key: %v, want ErrWrongKey", err)
			}
			if n := s.Metrics().Counters.UnlockFailures; n != 1 {
				t.Errorf("%d unlock failures counted, want 1", n)
			}
			if _, err := s.Unlock("plain.raw", testSecret(t, 7)); !errors.Is(err, ErrNotEncrypted) {
				t.Fatalf("unlock of a plain disk: %v, want ErrNotEncrypted", err)
			}
			if _, err := s.Unlock("secret.raw", testSecret(t, 7)); err != nil {
				t.Fatal(err)
			}
			checkReads(t, s, "secret.raw", ep)
			checkReads(t, s, "plain.raw", pp)
		})
	}
}

// A locked disk can be snapshotted, cloned, copied into a disk with its
// key and defragmented without the key, and checked; after unlocking,
// every disk reads as written, and writes after the snapshot do not show
// in it. Copies between different keys are refused.
func TestLockedDiskSharing(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{BlockSize: 4096})
	s := ms.s
	seed := testutil.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	const size = 2 << 20
	h := mustCreateEncrypted(t, s, "a.raw", size, 1)
	other := mustCreateEncrypted(t, s, "b.raw", size, 2)
	other.Close()
	want := make([]byte, size)
	// Scattered writes, so that defrag has something to do.
	for range 200 {
		off := rng.IntN(size - 20000)
		n := 1 + rng.IntN(20000)
		p := textPattern(fmt.Sprintf("A%d", off), n)
		copy(want[off:], p)
		if _, err := h.WriteAt(p, int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	ms.reopen()
	s = ms.s

	if _, err := s.Snapshot("a.raw", "a.snap"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Clone("a.raw", "a.clone"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Defrag("a.raw", nil); err != nil {
		t.Fatal(err)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings)
	}
	// A copy into another key's disk is refused; into the clone (same
	// key) it shares, locked or not.
	b, err := s.OpenDisk("b.raw")
	if err != nil {
		t.Fatal(err)
	}
	a, err := s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.CopyFrom(a, 0, 0, 4096); !errors.Is(err, ErrCrossKey) {
		t.Errorf("copy between keys: %v, want ErrCrossKey", err)
	}
	b.Close()
	c, err := s.OpenDisk("a.clone")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CopyFrom(a, 0, size/2, size/2); err != nil {
		t.Fatalf("copy within one key, locked: %v", err)
	}
	wantClone := append(append([]byte(nil), want[:size/2]...), want[:size/2]...)
	c.Close()
	a.Close()
	ms.reopen()
	s = ms.s
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings)
	}

	if n, err := s.Unlock("a.snap", testSecret(t, 1)); err != nil || n != 3 {
		t.Fatalf("unlock: %d disks, %v; want the three with the key", n, err)
	}
	if _, err := readDisk(t, s, "b.raw"); !errors.Is(err, ErrLocked) {
		t.Fatalf("read of the other key's disk: %v, want ErrLocked", err)
	}
	// Writes after the snapshot, into blocks it shares, go around it.
	a, err = s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	later := textPattern("LATER", 10000)
	if _, err := a.WriteAt(later, 5000); err != nil {
		t.Fatal(err)
	}
	a.Close()
	wantA := append([]byte(nil), want...)
	copy(wantA[5000:], later)
	for name, w := range map[string][]byte{"a.raw": wantA, "a.snap": want, "a.clone": wantClone} {
		got, err := readDisk(t, s, name)
		if err != nil || !bytes.Equal(got, w) {
			t.Errorf("%s reads back wrong after unlocking (%v)", name, err)
		}
	}
}

// A store holding an encrypted disk that shares blocks with a disk of
// another key is damage, and Check says so.
func TestCheckFindsBlocksSharedBetweenKeys(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{BlockSize: 4096})
	s := ms.s
	a := mustCreateEncrypted(t, s, "a.raw", 1<<20, 1)
	b := mustCreateEncrypted(t, s, "b.raw", 1<<20, 2)
	if _, err := a.WriteAt(make([]byte, 8192), 0); err != nil {
		t.Fatal(err)
	}
	// What a bug would do: map a's blocks into b.
	a.d.mu.Lock()
	e, _ := a.d.m.First()
	a.d.mu.Unlock()
	b.d.mu.Lock()
	b.d.m.Insert(e, nil)
	b.d.mu.Unlock()
	s.mu.Lock()
	s.mu.shared.Add(e.Phys, e.Len)
	s.mu.Unlock()
	rep := s.Check()
	if !rep.Has(CodeCrossKey) {
		t.Errorf("findings %v, want %s", rep.Findings, CodeCrossKey)
	}
	// Undo, for the cleanup's check.
	b.d.mu.Lock()
	b.d.m.Punch(0, e.Len, nil)
	b.d.mu.Unlock()
	s.mu.Lock()
	s.mu.shared.Drop(e.Phys, e.Len, nil)
	s.mu.Unlock()
	a.Close()
	b.Close()
}

// Key slots change without touching data: a second key opens the disk,
// removing the first leaves only the second, and the last is kept.
func TestKeySlots(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{BlockSize: 4096})
	s := ms.s
	h := mustCreateEncrypted(t, s, "a.raw", 1<<20, 1)
	p := textPattern("KEYS", 10000)
	if _, err := h.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	h.Close()
	id, err := s.AddKey("a.raw", testSecret(t, 1), testSecret(t, 2), crypt.Argon2Params{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddKey("a.raw", testSecret(t, 3), testSecret(t, 4), crypt.Argon2Params{}); !errors.Is(err, ErrWrongKey) {
		t.Errorf("add a key with a wrong one: %v", err)
	}
	slots, err := s.KeySlots("a.raw")
	if err != nil || len(slots) != 2 {
		t.Fatalf("slots %+v, %v", slots, err)
	}
	if err := s.RemoveKey("a.raw", testSecret(t, 2), slots[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveKey("a.raw", testSecret(t, 2), id); !errors.Is(err, crypt.ErrLastSlot) {
		t.Errorf("remove the last slot: %v", err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	ms.mem.Reopen() // replay the slot changes from the journal
	ms.open()
	s = ms.s
	if _, err := s.Unlock("a.raw", testSecret(t, 1)); !errors.Is(err, ErrWrongKey) {
		t.Errorf("the removed key: %v, want ErrWrongKey", err)
	}
	if _, err := s.Unlock("a.raw", testSecret(t, 2)); err != nil {
		t.Fatal(err)
	}
	checkReads(t, s, "a.raw", p)
}

// Punch, truncate and fallocate of an encrypted disk keep reading as a
// disk must: zeros where punched or allocated, the rest as written.
func TestEncryptedSpaceOps(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{BlockSize: 4096})
	s := ms.s
	h := mustCreateEncrypted(t, s, "a.raw", 1<<20, 1)
	defer h.Close()
	want := textPattern("SPACE", 1<<20)
	if _, err := h.WriteAt(want, 0); err != nil {
		t.Fatal(err)
	}
	if err := h.Punch(1000, 20000); err != nil {
		t.Fatal(err)
	}
	clear(want[1000:21000])
	if err := h.Truncate(500000); err != nil {
		t.Fatal(err)
	}
	if err := h.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	clear(want[500000:])
	if err := h.Allocate(1<<20, 100000, false); err != nil {
		t.Fatal(err)
	}
	want = append(want, make([]byte, 100000)...)
	got, err := readDisk(t, s, "a.raw")
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("reads back wrong (%v)", err)
	}
}

// A raw copy (ReadRaw, CreateHiddenRaw, WriteRaw) of a locked disk needs
// no key, keeps the tweaks, and reads as the original once unlocked.
func TestRawCopyWithoutKey(t *testing.T) {
	ms := newMemStore(t, 32<<20, FormatOptions{BlockSize: 4096})
	s := ms.s
	h := mustCreateEncrypted(t, s, "a.raw", 1<<20+100, 1)
	want := textPattern("RAW", 1<<20+100)
	if _, err := h.WriteAt(want[:300000], 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.WriteAt(want[700000:], 700000); err != nil {
		t.Fatal(err)
	}
	clear(want[300000:700000])
	h.Close()
	ms.reopen()
	s = ms.s
	src, err := s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	buf := make([]byte, 1<<20+4096)
	pieces, err := src.ReadRaw(buf, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	slots, _ := src.SlotTable()
	dst, err := s.CreateHiddenRaw(src.Size(), Attr{Mode: 0o600}, slots, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	for _, p := range pieces {
		if p.Hole {
			continue
		}
		if err := dst.WriteRaw(buf[p.Off:p.Off+p.Len], p.Off, p.Tweak); err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.WriteRaw(buf[:8192], 1<<20+4096, 5); !errors.Is(err, ErrInvalid) {
		t.Errorf("a raw write past the last block: %v", err)
	}
	if err := dst.Publish("b.raw", true, [16]byte{}); err != nil {
		t.Fatal(err)
	}
	if info, _ := s.Stat("b.raw"); info.Size != src.Size() || !info.Locked {
		t.Errorf("raw copy %+v", info)
	}
	if _, err := s.Unlock("b.raw", testSecret(t, 1)); err != nil {
		t.Fatal(err)
	}
	checkReads(t, s, "b.raw", want)
	checkReads(t, s, "a.raw", want)
}

// Bytes a crash left past the end of an encrypted disk (a growing write
// whose size record was lost) are zeroed when its key is given, as Open
// zeroes a plain disk's, so that they never show when the disk grows.
func TestUnlockZeroesStaleTail(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{BlockSize: 4096})
	s := ms.s
	h := mustCreateEncrypted(t, s, "a.raw", 0, 1)
	defer h.Close()
	if _, err := h.WriteAt(textPattern("TAIL", 12288), 0); err != nil {
		t.Fatal(err)
	}
	// What the crash leaves: the size of before the write, and no key.
	h.d.mu.Lock()
	h.d.attr.Size = 10000
	h.d.mu.Unlock()
	h.d.enc.cipher.Store(nil)
	s.mu.Lock()
	s.mu.ciphers = nil
	s.mu.Unlock()
	if _, err := s.Unlock("a.raw", testSecret(t, 1)); err != nil {
		t.Fatal(err)
	}
	if err := h.Truncate(12288); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 2288)
	if _, err := h.ReadAt(got, 10000); err != nil {
		t.Fatal(err)
	}
	if !allZero(got) {
		t.Error("bytes past the old end show after the disk grew")
	}
}

// TestCopyWithinDiskFreshTweaks: after a copy from one range of an
// encrypted disk to another, a write at the source takes a tweak of its
// own, never the tweak of the blocks the copy put at the destination
// (two ciphertexts under one key and tweak would stand in the store side
// by side, telling which of their 16-byte pieces are equal).
func TestCopyWithinDiskFreshTweaks(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{BlockSize: 4096})
	h := mustCreateEncrypted(t, ms.s, "a.raw", 1<<20, 1)
	defer h.Close()
	if _, err := h.WriteAt(textPattern("old", 4096), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.CopyFrom(h, 0, 8<<12, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := h.WriteAt(textPattern("new", 4096), 0); err != nil {
		t.Fatal(err)
	}
	d := h.d
	d.mu.RLock()
	src, dst := d.m.Lookup(nil, 0, 1)[0], d.m.Lookup(nil, 8, 1)[0]
	d.mu.RUnlock()
	if src.Hole || dst.Hole || src.Phys == dst.Phys {
		t.Fatalf("source %+v and copy %+v: want two mapped, distinct blocks", src, dst)
	}
	if src.Tweak == dst.Tweak {
		t.Fatalf("the rewritten source block and the copy share tweak %d", src.Tweak)
	}
	checkReads(t, ms.s, "a.raw", append(append(textPattern("new", 4096), make([]byte, 7<<12)...), append(textPattern("old", 4096), make([]byte, 1<<20-9<<12)...)...))
}

// TestPlanMaxCipherWrite: a plan without wait whose MaxCipherWrite is set
// declines (DeclineCipher, counted as "cipher") a larger write of an
// encrypted disk, and takes one of at most that size, a read of any size,
// and a plain disk's large write; WriteAt, which may block, writes it.
func TestPlanMaxCipherWrite(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{BlockSize: 4096})
	enc := mustCreateEncrypted(t, ms.s, "e.raw", 1<<20, 1)
	defer enc.Close()
	plain := mustCreate(t, ms.s, "p.raw", 1<<20)
	defer plain.Close()
	p := directio.AlignedBlock(64 << 10)
	copy(p, textPattern("large", len(p)))
	pl := IOPlan{PlanOptions: PlanOptions{MaxCipherWrite: 32 << 10}}
	if enc.PlanWrite(&pl, p, 0, 64) {
		t.Fatal("planned a 64 KiB write of an encrypted disk with MaxCipherWrite 32 KiB")
	}
	for _, tc := range []struct {
		what string
		plan func() bool
	}{
		{"a 32 KiB write of the encrypted disk", func() bool { return enc.PlanWrite(&pl, p[:32<<10], 0, 64) }},
		{"a 64 KiB read of the encrypted disk", func() bool { return enc.PlanRead(&pl, p, 0, 64) }},
		{"a 64 KiB write of the plain disk", func() bool { return plain.PlanWrite(&pl, p, 0, 64) }},
	} {
		if !tc.plan() {
			t.Fatalf("%s: not planned", tc.what)
		}
		pl.Abort()
	}
	// The plan keeps its limit from request to request.
	if enc.PlanWrite(&pl, p, 0, 64) {
		t.Fatal("planned a 64 KiB write of an encrypted disk after the plan's earlier requests ended")
	}
	if got := ms.s.Metrics().Counters.PlanDeclines; len(got) != 1 || got["cipher"] != 2 {
		t.Fatalf("declines %v, want two cipher", got)
	}
	if _, err := enc.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(p))
	if _, err := enc.ReadAt(got, 0); err != nil || !bytes.Equal(got, p) {
		t.Fatalf("read back after WriteAt: %v, equal %v", err, bytes.Equal(got, p))
	}
}
