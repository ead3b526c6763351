package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// A prefix taken from pending ends between mutations, carries exactly the
// blocks those mutations freed, and what is left (or put back) keeps its
// cuts.
func TestPendingTakePrefix(t *testing.T) {
	var p pending
	for i := range 5 { // mutation i: i+1 punch records, freeing block i
		recs := make([]record, i+1)
		for j := range recs {
			recs[j] = record{Type: recPunch, ID: 1, Virt: uint64(i), Len: 1}
		}
		p.add(recs)
		p.hold([]pext{{Start: uint64(i), Len: 1}})
	}
	recLen := len(appendRecord(nil, &record{Type: recPunch, ID: 1, Len: 1}))
	if p.count != 15 || len(p.recs) != 15*recLen || len(p.cuts) != 4 {
		t.Fatalf("after 5 mutations: %d records, %d bytes, %d cuts", p.count, len(p.recs), len(p.cuts))
	}
	if _, ok := p.takePrefix(commitSize(1, 1) - 1); ok {
		t.Fatal("took a prefix into less room than one record needs")
	}
	if p.count != 15 || len(p.cuts) != 4 {
		t.Fatalf("a refused takePrefix changed pending: %d records, %d cuts", p.count, len(p.cuts))
	}
	// Force small rooms by making records large: one page per mutation.
	var q pending
	pageRecs := (pageSize + recLen - 1) / recLen
	for i := range 4 {
		recs := make([]record, pageRecs)
		for j := range recs {
			recs[j] = record{Type: recPunch, ID: 2, Virt: uint64(i), Len: 1}
		}
		q.add(recs)
		q.hold([]pext{{Start: uint64(10 + i), Len: 1}, {Start: uint64(20 + i), Len: 1}})
	}
	room := commitSize(2*pageRecs*recLen, uint32(2*pageRecs))
	part, ok := q.takePrefix(room)
	if !ok || part.count != uint32(2*pageRecs) || len(part.quarantine) != 4 {
		t.Fatalf("prefix into room for two mutations: ok %v, %d records, %d freed extents", ok, part.count, len(part.quarantine))
	}
	if part.quarantine[3].Start != 21 || q.quarantine[0].Start != 12 || q.count != uint32(2*pageRecs) || len(q.cuts) != 1 {
		t.Fatalf("split in the wrong place: part frees %v, rest frees %v with %d cuts", part.quarantine, q.quarantine, len(q.cuts))
	}
	if c := q.cuts[0]; c.bytes != pageRecs*recLen || c.count != uint32(pageRecs) || c.quar != 2 {
		t.Fatalf("rest's cut not shifted: %+v", c)
	}
	q.prepend(part)
	if q.count != uint32(4*pageRecs) || len(q.quarantine) != 8 || len(q.cuts) != 3 || q.cuts[1].quar != 4 {
		t.Fatalf("put back: %d records, %d freed extents, cuts %+v", q.count, len(q.quarantine), q.cuts)
	}
	all, ok := q.takePrefix(1 << 30)
	if !ok || all.count != uint32(4*pageRecs) || q.count != 0 || len(q.cuts) != 0 {
		t.Fatalf("take everything: ok %v, %d records, %d left", ok, all.count, q.count)
	}
}

// TestFullStoreSplitsCommit: on a full store whose metadata grew (1024
// punches) with the journal past its checkpoint point, the punch records
// do not fit the journal's reserve in one commit and the checkpoint has no
// room until the punched blocks come out of quarantine. The commit goes
// in parts between punches; after a power cut at any flush on the way the
// store reopens clean, holding every write and a prefix of the punches.
func TestFullStoreSplitsCommit(t *testing.T) {
	c := backend.NewCrash(24 << 20)
	c.CheckAlignment(512)
	if err := Format(c, FormatOptions{JournalSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(c, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := mustCreate(t, s, "d.raw", 0)
	defer d.Close()
	bs := int64(s.BlockSize())
	var data []byte
	for _, size := range []int64{1 << 20, bs} { // fill in 1 MiB writes, then the rest in blocks
		for {
			chunk := bytes.Repeat([]byte{byte(len(data)/int(bs)) | 1}, int(size))
			if _, err := d.WriteAt(chunk, int64(len(data))); err != nil {
				if !errors.Is(err, ErrNoSpace) {
					t.Fatal(err)
				}
				break
			}
			data = append(data, chunk...)
		}
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ { // small commits up to just below the checkpoint point
		info := s.Info()
		if info.JournalUsed+2*pageSize >= info.JournalBytes*3/4 {
			break
		}
		if i > 1000 {
			t.Fatalf("the journal does not fill: %+v", info)
		}
		if _, err := d.WriteAt(data[:bs], 0); err != nil {
			t.Fatal(err)
		}
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	const punches = 1024
	before := s.Counters()
	startOp := c.OpCount()
	for i := range int64(punches) {
		if err := d.Punch(2*i*bs, bs); err != nil {
			t.Fatalf("punch %d: %v", i, err)
		}
	}
	if err := d.Sync(); err != nil {
		t.Fatalf("sync after %d punches on a full store: %v", punches, err)
	}
	after := s.Counters()
	if after.Commits == before.Commits || after.Checkpoints == before.Checkpoints {
		t.Errorf("want a commit into the reserve, then a checkpoint: %d commits, %d checkpoints", after.Commits-before.Commits, after.Checkpoints-before.Checkpoints)
	}
	punched := append([]byte(nil), data...)
	for i := range int64(punches) {
		clear(punched[2*i*bs : (2*i+1)*bs])
	}
	tag := bytes.Repeat([]byte{0xee}, int(bs))
	if _, err := d.WriteAt(tag, 2*bs); err != nil {
		t.Fatalf("write into a punched hole: %v", err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	final := append([]byte(nil), punched...)
	copy(final[2*bs:], tag)

	// Power cuts at every flush from the first punch on.
	rng := rand.New(rand.NewPCG(1, 2))
	flushes := 0
	for _, op := range c.FlushOps() {
		if op < startOp {
			continue
		}
		flushes++
		got := reopenAt(t, c.MemAt(op, rng, backend.DropUnflushed), op)
		if bytes.Equal(got, final) {
			continue
		}
		// A prefix of the punches is durable: every punched block after the
		// first one still holding data holds it too.
		k := 0
		for k < punches && isZeroBytes(got[2*int64(k)*bs:(2*int64(k)+1)*bs]) {
			k++
		}
		want := append([]byte(nil), data...)
		for i := range int64(k) {
			clear(want[2*i*bs : (2*i+1)*bs])
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("power cut at op %d: the disk is neither the final state nor the first %d punches applied", op, k)
		}
	}
	if flushes < 4 {
		t.Errorf("only %d flushes after the first punch", flushes)
	}
	if got := reopenAt(t, c.MemAt(c.OpCount(), rng, backend.DropUnflushed), c.OpCount()); !bytes.Equal(got, final) {
		t.Error("after the last sync the disk differs")
	}
}

// reopenAt opens the store a power cut left on mem, checks it and returns
// d.raw's bytes.
func reopenAt(t *testing.T, mem *backend.Mem, op int) []byte {
	t.Helper()
	s, err := Open(mem, testOptions())
	if err != nil {
		t.Fatalf("open after a power cut at op %d: %v", op, err)
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check after a power cut at op %d: %v", op, rep.Findings)
	}
	return readAll(t, s, "d.raw")
}
