package image

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// Commit makes every write, map change and catalog change acknowledged
// before the call durable, the disks' access and modification times too
// (fsync, O_SYNC). Concurrent callers share commits (group commit): a
// caller whose work a commit already covered returns at once, and one that
// waited for a commit in progress covers every caller that came meanwhile
// with the next. Once a flush has failed, Commit always fails (ErrFailed).
func (s *Store) Commit() error { return s.commit(true, false) }

// CommitData is Commit without the times: every acknowledged write and
// the metadata needed to read it back (maps, sizes, the catalog) are
// durable when it returns (fdatasync, O_DSYNC). When only overwrites in
// place happened since the last commit, it is one flush of the backing and
// no journal write. Times wait for the next Commit (the timer's, an fsync,
// or the close). Concurrent callers share commits and flushes as in Commit.
func (s *Store) CommitData() error { return s.commit(false, false) }

// commitBackground is the commit timer's: Commit, except that a commit
// holding only the disks' times, which nobody waits for, is written
// without a flush. It becomes durable with the next flush (any later
// commit's, an fsync's), and a crash before then loses only those times,
// as a disk with a volatile write cache loses what nobody flushed. Why:
// the data behind such a commit are overwrites in place, which the
// contract does not make durable before an fsync either, and on a host
// whose flush writes back its own cache, a flush every interval stalled
// every write in flight while the host wrote back. A commit with any other
// record (maps, sizes, names, punches, deletes) is flushed as Commit's is:
// the timer still bounds how long a write into a hole or a change to the
// catalog can be lost, and freed blocks leave quarantine only once their
// record is durable.
func (s *Store) commitBackground() error { return s.commit(true, true) }

func (s *Store) commit(times, background bool) error {
	s.mu.Lock()
	closed, want := s.mu.closed, s.mu.recGen
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	wantWrites := s.writeGen.Load()
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.commitLockedCommit(want, wantWrites, times, background)
}

// commitLockedCommit writes one journal commit with every pending record, or
// a checkpoint when the journal is three quarters full; with times, the
// disks' dirty access and modification times are journalled first. It
// returns at once when an earlier commit covered wantRec records and a flush
// covered wantWrites data writes. The last quarter of the journal is kept
// for commits that must go through while a full store has no room for a
// checkpoint: see commitReserveLockedCommit. With background (the
// timer's), a commit of times alone is written without a flush
// (commitBackground). Caller holds commitMu.
func (s *Store) commitLockedCommit(wantRec, wantWrites uint64, times, background bool) error {
	s.mu.Lock()
	err := s.mu.failed
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if s.opts.ReadOnly {
		return nil
	}
	if s.durableRec.Load() >= wantRec && s.flushedWrites >= wantWrites && (!times || !s.timesDirty()) {
		return nil
	}
	if times {
		s.appendDirtyTimes()
	}
	writes := s.writeGen.Load()

	s.mu.Lock()
	p := &s.mu.pend
	if p.count == 0 && len(p.quarantine) == 0 && (background ||
		writes == s.flushedWrites && s.durableRec.Load() >= s.mu.recGen) {
		// Nothing to write. A background commit does not flush
		// overwrites in place; any other flushes when a background one
		// left records written but not yet durable.
		s.mu.Unlock()
		return nil
	}
	if s.jOff+commitSize(len(p.recs), p.count) <= s.journalLen*3/4 {
		// A lazy commit holds the times of every disk written since the
		// last flush (Store.lazy); past maxLazyBytes the timer flushes.
		lazy := background && !p.more && len(p.quarantine) == 0 && len(s.lazy.recs) < maxLazyBytes
		return s.writeCommitLockedCommit(p.take(), writes, lazy)
	}
	s.mu.Unlock()
	err = s.checkpointLockedCommit()
	if !errors.Is(err, ErrNoSpace) {
		return err
	}
	return s.commitReserveLockedCommit(writes, err)
}

// commitReserveLockedCommit commits into the journal's last quarter because
// a full store has no room for a checkpoint (ckptErr): its metadata grew
// (punches split extents, disks were created) and the blocks that would make
// room are in quarantine until the records freeing them are durable. A batch
// larger than the room left goes in parts, each ending between two
// mutations; every part releases the blocks its records freed, and then the
// checkpoint is tried again. Caller holds commitMu.
func (s *Store) commitReserveLockedCommit(writes uint64, ckptErr error) error {
	for {
		s.mu.Lock()
		part, ok := s.mu.pend.takePrefix(s.journalLen - s.jOff)
		if !ok {
			s.mu.Unlock()
			return ckptErr
		}
		rest := s.mu.pend.count > 0
		s.log.WithError(ckptErr).WithField("records", part.count).Warn("no space for a checkpoint; committing to the journal's reserve")
		if err := s.writeCommitLockedCommit(part, writes, false); err != nil || !rest {
			return err
		}
		ckptErr = s.checkpointLockedCommit()
		if !errors.Is(ckptErr, ErrNoSpace) {
			return ckptErr
		}
	}
}

// lazyCommit is a commit written without a flush: Store.lazy.
type lazyCommit struct {
	off   int64  // its journal offset
	seq   uint64 // its sequence number
	recs  []byte // its records
	count uint32 // how many
}

// maxLazyBytes bounds the records of a lazy commit (Store.lazy), which
// holds a times record for every disk written since the last flush
// (dropSupersededTimes): a commit past it is flushed.
const maxLazyBytes = 64 << 10

// dropSupersededTimes returns the records of older, the times records of
// a lazy commit (Store.lazy), less those of the disks that newer, the next
// tick's, has a times record for: a disk's later record carries everything
// its earlier one did (mode, owner, times), and so a lazy commit grows with
// the number of disks written, not with every tick. On a record it cannot
// decode it keeps them all, which is only larger.
func dropSupersededTimes(older []byte, olderCount uint32, newer []byte, newerCount uint32) ([]byte, uint32) {
	olds, err := decodeRecords(older, olderCount)
	if err != nil {
		return older, olderCount
	}
	news, err := decodeRecords(newer, newerCount)
	if err != nil {
		return older, olderCount
	}
	fresh := make(map[uint64]bool, len(news))
	for _, r := range news {
		if r.Type == recAttr {
			fresh[r.ID] = true
		}
	}
	var kept []byte
	var n uint32
	for i := range olds {
		if olds[i].Type == recAttr && fresh[olds[i].ID] {
			continue
		}
		kept = appendRecord(kept, &olds[i])
		n++
	}
	return kept, n
}

// writeCommitLockedCommit writes part, taken from s.mu.pend, as one journal
// commit: flush the data its records point to, write the commit, flush it,
// then release the blocks its records freed. Caller holds commitMu and
// s.mu, which it releases.
//
// Only map records, and the zeroing a truncate or punch did in place before
// its record (pending.dataFirst), make a record depend on data (part.maps):
// a commit without either (times, sizes, names, punches of whole blocks)
// skips the first flush, and the flush after it makes the data written
// before it durable too. Should power fail between the two,
// such a commit may be durable without that data, which is harmless: the
// data's blocks were mapped by earlier commits and still read as either
// their old or their new bytes. That halves the flushes of a timed commit
// over overwrites, where the only records are the disks' times.
//
// With lazy (a background commit of times alone and no quarantine:
// commitBackground) the commit is written and not flushed. Its records are
// not durable yet, so durableRec and flushedWrites stay where they were and
// the next commit that must be durable flushes even with nothing new to
// write. Until a flush covers it, it stays the journal's last commit: a
// commit written before that flush replaces it (Store.lazy). A crash
// before the flush leaves it (or what replaced it) whole, torn or missing;
// replay applies it only whole, and stops there either way.
func (s *Store) writeCommitLockedCommit(part pending, writes uint64, lazy bool) error {
	rec := s.mu.recGen - uint64(s.mu.pend.count) // records after part are not in it
	preFlush := !lazy && (part.count == 0 || part.maps)
	seq := s.mu.nextSeq
	switch {
	case part.count == 0:
	case s.lazy.count > 0 && !preFlush:
		// Written over the lazy commit, which no flush covers yet.
		seq = s.lazy.seq
		s.jOff = s.lazy.off
		older, n := s.lazy.recs, s.lazy.count
		if lazy {
			older, n = dropSupersededTimes(older, n, part.recs, part.count)
		}
		part.recs = append(append(make([]byte, 0, len(older)+len(part.recs)), older...), part.recs...)
		part.count += n
	default:
		s.mu.nextSeq++
	}
	size := commitSize(len(part.recs), part.count)
	s.mu.releasing++
	defer s.doneReleasing()
	s.mu.Unlock()

	start := time.Now()
	if preFlush {
		if err := s.flush(); err != nil {
			return s.fail(fmt.Errorf("flush data before commit %d: %w", seq, err))
		}
		s.flushedWrites = writes
		s.lazy = lazyCommit{} // durable now; the next commit goes after it
	}
	if part.count > 0 {
		buf := s.pool.Get(int(size))
		page := encodeCommit(buf[:0], seq, s.uuid, part.count, part.recs)
		_, err := s.be.WriteAt(page, journalOffset+s.jOff)
		s.pool.Put(buf)
		if err != nil {
			return s.fail(fmt.Errorf("write journal commit %d at %d: %w", seq, s.jOff, err))
		}
		s.stats.metaWrite(int(size))
		s.stats.Commits.Add(1)
		s.stats.JournalBytes.Add(uint64(size))
		if lazy {
			s.lazy = lazyCommit{off: s.jOff, seq: seq, recs: part.recs, count: part.count}
			s.jOff += size
			s.stats.UnflushedCommits.Add(1)
			return nil
		}
		s.jOff += size
		if err := s.flush(); err != nil {
			return s.fail(fmt.Errorf("flush journal commit %d: %w", seq, err))
		}
		s.flushedWrites = writes
		s.lazy = lazyCommit{}
		s.stats.CommitLatency.observeSince(start)
	}
	s.durableRec.Store(rec)
	s.releaseLockedCommit(part.quarantine)
	return s.strictCheckLockedCommit()
}

// strictCheckLockedCommit runs Check after a commit in Strict mode. Caller
// holds commitMu.
func (s *Store) strictCheckLockedCommit() error {
	if !s.opts.Strict {
		return nil
	}
	if rep := s.checkLockedCommit(); !rep.Clean() {
		return fmt.Errorf("strict check after commit: %s: %w", rep.Findings[0].Message, ErrCorrupt)
	}
	return nil
}

func (s *Store) timesDirty() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.mu.disks {
		if d.timesDirty.Load() {
			return true
		}
	}
	return false
}

// appendDirtyTimes journals the access and modification times of disks
// written since the last commit.
func (s *Store) appendDirtyTimes() {
	s.mu.Lock()
	var ds []*disk
	for _, d := range s.mu.disks {
		if d.timesDirty.Load() {
			ds = append(ds, d)
		}
	}
	s.mu.Unlock()
	for _, d := range ds {
		if !d.timesDirty.Swap(false) {
			continue
		}
		s.cut.RLock()
		d.mu.RLock()
		s.mu.Lock()
		if !d.deleted {
			s.appendTimesLockedMu(d.attrRecordLockedMu())
		}
		s.mu.Unlock()
		d.mu.RUnlock()
		s.cut.RUnlock()
	}
}

// doneReleasing ends a commit's hold on the quarantine it took, whether it
// released it or failed.
func (s *Store) doneReleasing() {
	s.mu.Lock()
	s.mu.releasing--
	s.mu.Unlock()
}

// releaseLockedCommit discards blocks whose freeing is now durable and
// returns them to the allocator. Caller holds commitMu.
func (s *Store) releaseLockedCommit(q []pext) {
	if len(q) == 0 {
		return
	}
	sort.Slice(q, func(i, j int) bool { return q[i].Start < q[j].Start })
	merged := q[:1]
	for _, e := range q[1:] {
		last := &merged[len(merged)-1]
		if last.End() == e.Start {
			last.Len += e.Len
		} else {
			merged = append(merged, e)
		}
	}
	// Each held extent loses one reference; what loses its last is free.
	s.mu.Lock()
	var freed []refcount.Range
	for _, e := range merged {
		freed = s.mu.shared.Drop(e.Start, e.Len, freed)
	}
	s.mu.Unlock()
	merged = merged[:0]
	for _, f := range freed {
		merged = append(merged, pext{Start: f.Start, Len: f.Len})
	}
	for _, e := range merged {
		off, n := s.discardRange(e)
		if n == 0 {
			continue
		}
		err := s.be.Discard(off, n)
		if err == nil {
			s.stats.Discards.Add(1)
		} else if !errors.Is(err, backend.ErrUnsupported) {
			s.log.WithError(err).Warn("discard of freed blocks failed")
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range merged {
		if err := s.mu.alloc.Free(e); err != nil {
			s.log.WithError(err).Error("releasing freed blocks")
		}
	}
}

// replay applies the journal's commits after the checkpoint: commit
// CkptSeq+1 at journal byte 0, then each following commit with the next
// sequence number, until a page is not such a commit. A commit that fails
// its checksum ends replay; it is a torn tail (normal after a crash) unless
// a valid later commit follows it, which means damage in the middle.
func (s *Store) replay() error {
	jlen := int(s.journalLen)
	buf := make([]byte, jlen+pageSize)
	j := alignedPage(buf, jlen)
	for off := 0; off < jlen; off += maxRunBytes {
		n := min(maxRunBytes, jlen-off)
		if _, err := s.be.ReadAt(j[off:off+n], journalOffset+int64(off)); err != nil {
			return fmt.Errorf("read journal at %d: %w", off, err)
		}
		s.stats.metaRead(n)
	}
	expect := s.sb.CkptSeq + 1
	off := 0
	for off+pageSize <= jlen {
		h, ok := decodeCommitHeader(j[off:], s.uuid)
		if !ok || h.Seq != expect {
			break
		}
		end := off + int(h.pages())*pageSize
		if end > jlen {
			break
		}
		payload, ok := verifyCommit(j[off:end], h)
		if !ok {
			break
		}
		recs, err := decodeRecords(payload, h.Count)
		if err != nil {
			s.openFindings = append(s.openFindings, Finding{Severity: Fatal, Code: CodeJournalRecord,
				Message: fmt.Sprintf("journal commit %d at byte %d has a valid checksum but cannot be decoded: %v", h.Seq, off, err)})
			break
		}
		for i := range recs {
			s.applyRecord(&recs[i], h.Seq)
		}
		expect++
		off = end
	}
	// Anything valid and newer past the stopping point means the stop was
	// damage, not a torn tail.
	for p := off + pageSize; p+pageSize <= jlen; p += pageSize {
		h, ok := decodeCommitHeader(j[p:], s.uuid)
		if !ok || h.Seq < expect {
			continue
		}
		end := p + int(h.pages())*pageSize
		if end > jlen {
			continue
		}
		if _, ok := verifyCommit(j[p:end], h); ok {
			s.openFindings = append(s.openFindings, Finding{Severity: Fatal, Code: CodeJournalBroken,
				Message: fmt.Sprintf("journal is damaged at byte %d (commit %d expected) but commit %d at byte %d follows; the commits after the damage cannot be replayed", off, expect, h.Seq, p)})
			break
		}
	}
	s.jOff = int64(off)
	s.mu.nextSeq = expect
	s.mu.extents = 0
	for _, d := range s.mu.disks {
		s.mu.extents += d.m.Len()
	}
	return nil
}

// applyRecord replays one journal record onto the in-memory state during
// Open. Inconsistencies become findings; replay goes on so that fsck sees
// everything.
func (s *Store) applyRecord(r *record, seq uint64) {
	bad := func(format string, args ...any) {
		s.openFindings = append(s.openFindings, Finding{Severity: Fatal, Code: CodeJournalRecord,
			Message: fmt.Sprintf("journal commit %d: ", seq) + fmt.Sprintf(format, args...)})
	}
	d := s.mu.disks[r.ID]
	if r.Type == recCreate {
		if d != nil {
			bad("creates disk %d, which already exists", r.ID)
			return
		}
		d = s.newDisk(r.ID, r.Name, r.Attr)
		s.mu.disks[r.ID] = d
		if _, taken := s.mu.names[r.Name]; !taken {
			s.mu.names[r.Name] = d
		}
		s.mu.nextID = max(s.mu.nextID, r.ID+1)
		return
	}
	if d == nil {
		bad("record type %d names disk %d, which does not exist", r.Type, r.ID)
		return
	}
	switch r.Type {
	case recAttr:
		size := d.attr.Size
		d.attr = r.Attr
		d.attr.Size = size
		d.atime.Store(r.Attr.Atime)
		d.mtime.Store(r.Attr.Mtime)
	case recSize:
		d.attr.Size = r.Attr.Size
		keep := (uint64(r.Attr.Size) + s.bs - 1) / s.bs
		s.replayFree(d.m.Punch(keep, ^uint64(0)-keep, nil), bad)
	case recRename:
		if s.mu.names[d.name] == d {
			delete(s.mu.names, d.name)
		}
		d.name = r.Name
		s.mu.names[r.Name] = d
		d.orphan = false // a hidden disk published (Disk.Publish)
	case recUnlink:
		if s.mu.names[d.name] == d {
			delete(s.mu.names, d.name)
		}
		d.orphan = true
	case recDelete:
		s.replayFree(d.m.Punch(0, ^uint64(0), nil), bad)
		if s.mu.names[d.name] == d {
			delete(s.mu.names, d.name)
		}
		delete(s.mu.disks, d.id)
	case recClone, recFlags:
		if s.sb.version() != sharedVersion {
			bad("record type %d in a store of version %d", r.Type, s.sb.version())
			return
		}
		s.replayShared(d, r, bad)
	case recMap:
		if r.Phys >= s.sb.DataBlocks || r.Len > s.sb.DataBlocks-r.Phys {
			bad("disk %d maps physical blocks [%d,+%d) outside the data region", d.id, r.Phys, r.Len)
		} else if err := s.mu.alloc.Take(pext{Start: r.Phys, Len: r.Len}); err != nil {
			bad("disk %d maps physical blocks [%d,+%d) that are not free: %v", d.id, r.Phys, r.Len, err)
		}
		s.replayFree(d.m.Insert(blockmap.Extent{Virt: r.Virt, Phys: r.Phys, Len: r.Len}, nil), bad)
	case recPunch:
		s.replayFree(d.m.Punch(r.Virt, r.Len, nil), bad)
	}
}

// replayFree drops one reference to each extent a replayed record
// unmapped, freeing the blocks that lose their last.
func (s *Store) replayFree(unmapped []blockmap.Extent, bad func(string, ...any)) {
	var freed []refcount.Range
	for _, u := range unmapped {
		freed = s.mu.shared.Drop(u.Phys, u.Len, freed[:0])
		for _, f := range freed {
			if err := s.mu.alloc.Free(pext{Start: f.Start, Len: f.Len}); err != nil {
				bad("freeing physical blocks [%d,+%d): %v", f.Start, f.Len, err)
			}
		}
	}
}

// discardRange is the byte range of the backing to discard for the freed
// blocks e: all of them, except on a backing whose chunks are prepared
// ahead of first writes (backend.Preparer, a store file), where only the
// whole chunks inside e are: a hole punched in a chunk in use would make
// the host file system allocate again under a later first write there,
// and preparing the chunk again would write zeros over all of its free
// blocks. So a store file gives space back to its host file system in
// chunks, as whole chunks come free.
func (s *Store) discardRange(e pext) (off, n int64) {
	off, end := s.dataOff+int64(e.Start*s.bs), s.dataOff+int64(e.End()*s.bs)
	if p, ok := s.be.(backend.Preparer); ok {
		chunk := p.PrepareChunk()
		off, end = (off+chunk-1)/chunk*chunk, end/chunk*chunk
	}
	return off, max(end-off, 0)
}
