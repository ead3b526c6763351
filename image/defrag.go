package image

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// defragChunkBytes is how much of a disk's virtual space Defrag moves per
// commit: it bounds the journal records of one commit and how much work a
// crash can make Defrag do again.
const defragChunkBytes = 64 << 20

// Why Defrag left a disk alone (DefragResult.Skipped).
const (
	// DefragContiguous: the disk's blocks already lie in one run on the
	// backing: physically adjacent, or apart only by the holes between
	// them.
	DefragContiguous = "already contiguous"
	// DefragNoRoom: the free space cannot hold the disk's blocks in fewer
	// runs than they lie in now.
	DefragNoRoom = "free space too small or too fragmented to improve it"
)

// DefragResult says what Store.Defrag did to one disk.
type DefragResult struct {
	Name string
	// ExtentsBefore and ExtentsAfter count the extents of the disk's map.
	// A disk with holes keeps at least one extent per stretch of data
	// between two holes.
	ExtentsBefore, ExtentsAfter int
	// MappedBytes is the bytes of the blocks the disk maps, which Defrag
	// does not change.
	MappedBytes int64
	// MovedBytes is the bytes copied to new blocks.
	MovedBytes int64
	// FreeRuns is how many physically separate runs of free blocks the
	// data was copied into: 1 when one free run held all of it; more when
	// none did and the largest ones were used instead. 0 when nothing
	// moved.
	FreeRuns int
	// Skipped says why the disk was left alone (DefragContiguous,
	// DefragNoRoom); empty when it was moved.
	Skipped string
}

// Defrag rewrites the disk called name so that its mapped blocks lie in
// one physically contiguous run, in virtual order: a sequential read of it
// then goes to the backend in I/Os as large as its requests, whatever
// order it was written in. progress, when not nil, is called with the bytes copied so
// far and the bytes to copy.
//
// Invariants:
//   - The disk reads the same bytes before, during and after: only mapped
//     blocks are copied, holes stay holes, and the size and times stay as
//     they are.
//   - It is crash-safe like any write into holes (docs/DESIGN.md, crash
//     rules 1 and 3): the data is copied into newly allocated blocks, the
//     commit that maps them flushes that data before it writes their
//     records, and the old blocks go to the quarantine, free only once the
//     records freeing them are durable. After a crash every block of the disk is mapped
//     either to its old copy or to its new one.
//   - It works in chunks of defragChunkBytes of virtual space, each under
//     the disk's exclusive range lock and followed by a commit, so the
//     journal holds one chunk's records at a time, and a handle open on
//     the disk meanwhile sees the copy ordered with its own requests as a
//     write would be. On an error the chunks committed so far stay moved.
//   - The data goes to the smallest free run outside the other disks'
//     layouts that holds all of it (placement.Allocator.Region); when
//     there is none, to the largest free runs, and FreeRuns says how many.
//   - The disk's blocks end up adjacent on the backing: holes take no
//     space between them (a write into a hole later goes wherever the
//     allocator finds room).
//   - Blocks the disk shares with others (a clone's, a snapshot's) stay
//     where they are: moving them would store them twice.
//   - A disk whose blocks already lie in one run on the backing (a single
//     extent, or extents that each start where the one before ends, or
//     apart by just the holes between them: layoutRunsLockedMu) is left
//     alone, and so is a disk that the free space cannot put in fewer runs
//     than it lies in now; Skipped says which.
func (s *Store) Defrag(name string, progress func(done, total uint64)) (DefragResult, error) {
	h, err := s.OpenDisk(name)
	if err != nil {
		return DefragResult{Name: name}, fmt.Errorf("defrag: %w", err)
	}
	defer h.Close()
	res, err := h.d.defrag(name, max(defragChunkBytes/s.bs, 1), progress)
	if err != nil {
		return res, fmt.Errorf("defrag disk %q: %w", name, err)
	}
	return res, nil
}

// defrag is Defrag in chunks of chunk blocks of virtual space.
func (d *disk) defrag(name string, chunk uint64, progress func(done, total uint64)) (DefragResult, error) {
	s := d.s
	res := DefragResult{Name: name}
	if err := s.writable(); err != nil {
		return res, err
	}
	d.mu.RLock()
	res.ExtentsBefore, res.ExtentsAfter = d.m.Len(), d.m.Len()
	mapped := d.m.Blocks()
	runs := d.layoutRunsLockedMu()
	d.mu.RUnlock()
	res.MappedBytes = int64(mapped * s.bs)
	if runs <= 1 {
		res.Skipped = DefragContiguous
		return res, nil
	}
	claimed := s.claimedLayouts(d)()
	s.mu.Lock()
	region := s.mu.alloc.Region(mapped, claimed)
	s.mu.Unlock()
	if blocksOf(region) < mapped || len(region) >= runs {
		res.Skipped = DefragNoRoom
		return res, nil
	}

	target := defragTarget{region: region}
	total, done := mapped*s.bs, uint64(0)
	copied := func(blocks uint64) {
		done += blocks * s.bs
		if progress != nil {
			progress(done, total)
		}
	}
	for v := uint64(0); ; {
		d.mu.RLock()
		next, ok := d.m.NextData(v)
		d.mu.RUnlock()
		if !ok {
			break
		}
		first := next - next%chunk
		moved, err := d.defragChunk(first, chunk, &target, copied)
		res.MovedBytes += int64(moved * s.bs)
		res.FreeRuns = target.runs
		if err != nil {
			return res, fmt.Errorf("move virtual blocks [%d,+%d): %w", first, chunk, err)
		}
		if err := s.Commit(); err != nil {
			return res, fmt.Errorf("commit the move of virtual blocks [%d,+%d): %w", first, chunk, err)
		}
		v = first + chunk
	}
	d.mu.RLock()
	res.ExtentsAfter = d.m.Len()
	d.mu.RUnlock()
	return res, nil
}

// layoutRunsLockedMu counts the runs the disk's extents make on the
// backing, in virtual order: a run goes on while each extent starts where
// the one before it ends on the backing, or where the layout of the one
// before puts it (the hole between them is a gap of the same size on the
// backing, as placement by virtual offset leaves it). Either way a
// sequential read goes on at the next block the backing holds for it: 1
// run is as contiguous as the disk can be. Caller holds d.mu (either mode).
func (d *disk) layoutRunsLockedMu() int {
	runs := 0
	var prev blockmap.Extent
	d.m.Ascend(func(e blockmap.Extent) bool {
		adjacent := e.Phys == prev.PhysEnd()
		sameLayout := e.Phys >= prev.Phys && e.Phys-prev.Phys == e.Virt-prev.Virt
		if runs == 0 || !adjacent && !sameLayout {
			runs++
		}
		prev = e
		return true
	})
	return runs
}

func blocksOf(exts []pext) uint64 {
	var n uint64
	for _, e := range exts {
		n += e.Len
	}
	return n
}

// defragTarget hands out the blocks a disk is copied into, in order: the
// region's runs front to back and, should they run out (a handle open on
// the disk wrote more meanwhile), wherever the allocator finds room after
// the last block handed out.
type defragTarget struct {
	region []pext // what is left of the region chosen for the disk
	end    uint64 // the physical end of the blocks handed out last
	runs   int    // physically separate runs handed out
}

// alloc takes n blocks for the next chunk, in flight until they are mapped
// or returned with unallocate; on error it has returned them.
func (t *defragTarget) alloc(s *Store, n uint64) ([]pext, error) {
	var allocs []pext
	for n > 0 {
		want, goal := n, t.end
		if len(t.region) > 0 {
			want, goal = min(n, t.region[0].Len), t.region[0].Start
		}
		start := len(allocs)
		var err error
		allocs, err = s.allocData(allocs, want, goal, true, true)
		if err != nil {
			s.unallocate(allocs)
			return nil, err
		}
		for _, e := range allocs[start:] {
			if t.runs == 0 || e.Start != t.end {
				t.runs++
			}
			t.end = e.End()
		}
		if len(t.region) > 0 {
			t.region[0].Start += want
			t.region[0].Len -= want
			if t.region[0].Len == 0 {
				t.region = t.region[1:]
			}
		}
		n -= want
	}
	return allocs, nil
}

// defragChunk moves the mapped blocks among virtual blocks [first,
// first+count) to blocks from t, under an exclusive range lock over them,
// and returns how many it moved. The move is journalled, not committed.
func (d *disk) defragChunk(first, count uint64, t *defragTarget, copied func(blocks uint64)) (uint64, error) {
	s := d.s
	lr := d.ranges.lock(first, count, true)
	defer lr.unlock()
	if err := s.writable(); err != nil {
		return 0, err
	}
	d.mu.RLock()
	segs := d.m.Lookup(nil, first, count)
	if d.mayShare.Load() {
		// Shared blocks stay where they are: moving them would copy
		// them for this disk alone, and the store would hold them twice.
		s.mu.Lock()
		segs, _ = s.sharedAsHolesLockedMu(nil, segs)
		s.mu.Unlock()
	}
	d.mu.RUnlock()
	data := segs[:0]
	var n uint64
	for _, sg := range segs {
		if !sg.Hole {
			data = append(data, sg)
			n += sg.Len
		}
	}
	if n == 0 {
		return 0, nil
	}
	dst, err := t.alloc(s, n)
	if err != nil {
		return 0, err
	}
	if err := d.copyBlocksLockedRange(data, dst, copied); err != nil {
		s.unallocate(dst)
		return 0, err
	}
	d.remapLockedRange(data, dst)
	return n, nil
}

// copyBlocksLockedRange copies the blocks of d's data segments src, laid
// end to end in virtual order, to the blocks of dst, as many, in order. It
// goes through one pooled buffer of maxRunBytes: each read is a read plan
// of the store's own over one segment's part in the buffer (issued
// concurrently: readPartsLockedRange), so one backend read per data
// segment's part (two segments adjacent on the backing across a hole are
// two reads); each write is the part of one destination extent; both are
// aligned like every data I/O.
// copied is told the blocks written after each buffer. The writes count
// for the next commit's flush. Caller holds an exclusive range lock over
// src.
func (d *disk) copyBlocksLockedRange(src []blockmap.Segment, dst []pext, copied func(blocks uint64)) error {
	s, bs := d.s, d.s.bs
	virt := make([]pext, len(src)) // the segments' virtual blocks, as runs
	for i, sg := range src {
		virt[i] = pext{Start: sg.Virt, Len: sg.Len}
	}
	buf := s.pool.Get(maxRunBytes)
	defer s.pool.Put(buf)
	sc := getScratch()
	defer putScratch(sc)
	c := s.stats.shard(sc)
	window := uint64(maxRunBytes) / bs
	total := blocksOf(dst)
	var reads []bufPart
	for at := uint64(0); at < total; at += window {
		n := min(window, total-at)
		reads = reads[:0]
		_ = forParts(virt, at, n, func(off, v, count uint64) error {
			reads = append(reads, bufPart{buf: buf[off*bs : (off+count)*bs], virt: v})
			return nil
		})
		if err := d.readPartsLockedRange(reads); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		err := forParts(dst, at, n, func(off, phys, count uint64) error {
			return s.writeData(c, buf[off*bs:(off+count)*bs], phys, false)
		})
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		copied(n)
	}
	s.writeGen.Add(1)
	return nil
}

// defragReaders is how many reads of one buffer copyBlocksLockedRange has
// in flight at once: a fragmented disk's blocks are many small runs, each
// a read of its own, and one at a time they would take a device round trip
// each.
const defragReaders = 16

// bufPart is one read of copyBlocksLockedRange: len(buf) bytes of the disk
// from virtual block virt.
type bufPart struct {
	buf  []byte
	virt uint64
}

// readPartsLockedRange performs the reads parts, defragReaders at a time,
// each through a read plan of the store's own (readRawLockedRange: an
// encrypted disk's blocks are copied as they are, no key needed), and
// returns their errors once all have completed. Caller holds a range lock
// over them.
func (d *disk) readPartsLockedRange(parts []bufPart) error {
	workers := min(defragReaders, len(parts))
	errs := make([]error, workers)
	var next atomic.Int64 // the index of the next part to read
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for errs[w] == nil {
				i := int(next.Add(1)) - 1
				if i >= len(parts) {
					return
				}
				errs[w] = d.readRawLockedRange(parts[i].buf, int64(parts[i].virt*d.s.bs))
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// forParts calls fn for each part of blocks [at, at+n) of the stream that
// exts make when laid end to end: off is the part's distance in blocks
// from at, phys the block of exts where it starts.
func forParts(exts []pext, at, n uint64, fn func(off, phys, count uint64) error) error {
	var pos uint64 // where exts[i] starts in the stream
	for _, e := range exts {
		if pos >= at+n {
			break
		}
		lo, hi := max(at, pos), min(at+n, pos+e.Len)
		if lo < hi {
			if err := fn(lo-at, e.Start+(lo-pos), hi-lo); err != nil {
				return err
			}
		}
		pos += e.Len
	}
	return nil
}

// remapLockedRange maps the data segments src to the blocks they were
// copied to, dst (as many blocks, in order), with their records as one
// mutation, and quarantines the blocks src was on. Caller holds an
// exclusive range lock over src.
func (d *disk) remapLockedRange(src []blockmap.Segment, dst []pext) {
	exts := zipExtents(src, dst)
	d.changeMap(nil, func() (mapChange, error) {
		var freed []blockmap.Extent
		recs := make([]record, 0, len(exts))
		for _, e := range exts {
			freed = d.m.Insert(e, freed)
			recs = append(recs, d.mapRecord(e))
		}
		var old uint64
		for _, f := range freed {
			old += f.Len
		}
		if n := blocksOf(dst); old != n {
			panic(fmt.Sprintf("image: disk %d: defrag moved %d blocks but replaced %d while holding their range lock", d.id, n, old))
		}
		return mapChange{recs: recs, freed: freed, mapped: dst}, nil
	})
}

// zipExtents pairs the data segments src, laid end to end, with the blocks
// of dst, as many, in order: the extents that map src's virtual blocks to
// dst with their tweaks (on a plain disk a block's tweak is its virtual
// block: offset 0), neighbours contiguous in both spaces and in tweaks
// merged.
func zipExtents(src []blockmap.Segment, dst []pext) []blockmap.Extent {
	var out []blockmap.Extent
	i, j := 0, 0
	var si, dj uint64 // blocks of src[i] and dst[j] used so far
	for i < len(src) && j < len(dst) {
		n := min(src[i].Len-si, dst[j].Len-dj)
		e := blockmap.Extent{Virt: src[i].Virt + si, Phys: dst[j].Start + dj, Len: n, TweakOff: src[i].Tweak - src[i].Virt}
		if k := len(out); k > 0 && out[k-1].End() == e.Virt && out[k-1].PhysEnd() == e.Phys && out[k-1].TweakOff == e.TweakOff {
			out[k-1].Len += n
		} else {
			out = append(out, e)
		}
		si, dj = si+n, dj+n
		if si == src[i].Len {
			i, si = i+1, 0
		}
		if dj == dst[j].Len {
			j, dj = j+1, 0
		}
	}
	return out
}
