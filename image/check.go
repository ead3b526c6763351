package image

import (
	"fmt"
	"sort"
	"strings"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/image/placement"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// Severity tells leaks from everything else.
type Severity int

const (
	// Leak: blocks that nothing uses and the free map does not list. Space
	// is lost; no data is at risk. Repair returns them.
	Leak Severity = 1
	// Fatal: anything that can lose or expose data or break an invariant.
	Fatal Severity = 2
)

func (s Severity) String() string {
	switch s {
	case Leak:
		return "leak"
	case Fatal:
		return "fatal"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// MarshalText makes Severity readable in JSON.
func (s Severity) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText wrote.
func (s *Severity) UnmarshalText(b []byte) error {
	switch string(b) {
	case "leak":
		*s = Leak
	case "fatal":
		*s = Fatal
	default:
		return fmt.Errorf("unknown severity %q", b)
	}
	return nil
}

// Finding codes: stable identifiers for scripts and tests.
const (
	CodeSuperblockCopy   = "superblock-copy"     // one superblock copy is unreadable
	CodeJournalBroken    = "journal-broken"      // damage in the middle of the journal
	CodeJournalRecord    = "journal-record"      // a journal record contradicts the state
	CodeFreeMap          = "free-map"            // the stored free map is malformed
	CodeMapInvariant     = "map-invariant"       // a disk's extent map breaks its invariants
	CodeExtentOutside    = "extent-outside-data" // an extent points outside the data region
	CodeExtentBeyondSize = "extent-beyond-size"  // an extent lies past its disk's size
	CodeSharedBlock      = "shared-block"        // two users of one physical block
	CodeUsedFree         = "used-block-free"     // a used block is also marked free
	CodeLeak             = "leaked-blocks"       // blocks used by nothing and not free
	CodeRefCount         = "refcount-table"      // the stored reference counts are malformed
	CodeRefHigh          = "refcount-high"       // a block's count exceeds its users: it would never be freed
	CodeRefLow           = "refcount-low"        // a block's count is below its users: it would be freed while used
	CodeInvalidName      = "invalid-name"
	CodeDuplicateName    = "duplicate-name"
)

// Finding is one problem Check found.
type Finding struct {
	Severity Severity `json:"severity"`
	Code     string   `json:"code"`
	Disk     string   `json:"disk,omitempty"`
	Message  string   `json:"message"`
}

func (f Finding) String() string {
	if f.Disk != "" {
		return fmt.Sprintf("%s %s: disk %q: %s", f.Severity, f.Code, f.Disk, f.Message)
	}
	return fmt.Sprintf("%s %s: %s", f.Severity, f.Code, f.Message)
}

// Report is the result of Check: every finding, in a stable order, and what
// was counted.
type Report struct {
	Findings     []Finding `json:"findings"`
	Disks        int       `json:"disks"`
	Extents      int       `json:"extents"`
	MappedBlocks uint64    `json:"mapped_blocks"` // blocks the disks' extents map: Extents over them is the fragmentation
	DataBlocks   uint64    `json:"data_blocks"`
	UsedBlocks   uint64    `json:"used_blocks"`
	FreeBlocks   uint64    `json:"free_blocks"`
	LeakedBlocks uint64    `json:"leaked_blocks"`
}

// Clean reports whether there are no findings at all.
func (r *Report) Clean() bool { return len(r.Findings) == 0 }

// Fatal reports whether any finding is fatal.
func (r *Report) Fatal() bool { return r.FatalCount() > 0 }

// FatalCount counts fatal findings.
func (r *Report) FatalCount() int {
	n := 0
	for _, f := range r.Findings {
		if f.Severity == Fatal {
			n++
		}
	}
	return n
}

// FirstFatal describes the first fatal finding, or "".
func (r *Report) FirstFatal() string {
	for _, f := range r.Findings {
		if f.Severity == Fatal {
			return f.String()
		}
	}
	return ""
}

// Has reports whether a finding with code exists.
func (r *Report) Has(code string) bool {
	for _, f := range r.Findings {
		if f.Code == code {
			return true
		}
	}
	return false
}

// maxPerCode bounds the findings listed per code; the rest are summarised.
const maxPerCode = 50

func (r *Report) add(f Finding, counts map[string]int) {
	counts[f.Code]++
	if counts[f.Code] <= maxPerCode {
		r.Findings = append(r.Findings, f)
	} else if counts[f.Code] == maxPerCode+1 {
		r.Findings = append(r.Findings, Finding{Severity: f.Severity, Code: f.Code, Message: "more findings of this kind not listed"})
	}
}

// ref is one user of physical blocks, for cross-checking: a disk extent
// (disk set, at virtual block virt) or what kind names.
type ref struct {
	pext
	kind string // "the checkpoint", "a write in flight", ...; "" for a disk extent
	disk *disk
	virt uint64
}

// owner names the user, formatted only when a finding needs it: a store
// has millions of refs.
func (r ref) owner(bs uint64) string {
	if r.disk == nil {
		return r.kind
	}
	return fmt.Sprintf("disk %s bytes [%d,%d)", diskName(r.disk), r.virt*bs, (r.virt+r.Len)*bs)
}

// Check verifies the whole store: the findings made while opening (bad
// superblock copy, broken journal), every disk's name and map, that every
// extent lies inside the data region and inside its disk's size, that no two
// users share a physical block, and that the free map is exactly the blocks
// nobody uses (used-but-free is fatal, used-by-nobody is a leak). It stops
// writers while it runs; readers go on.
func (s *Store) Check() *Report {
	return s.CheckProgress(nil)
}

// CheckProgress is Check, calling progress now and then with the number
// of extents checked so far and the total (for a progress bar on large
// stores). progress may be nil.
func (s *Store) CheckProgress(progress func(done, total int)) *Report {
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	return s.checkProgressLockedCommit(progress)
}

// checkLockedCommit is Check. Caller holds commitMu.
func (s *Store) checkLockedCommit() *Report { return s.checkProgressLockedCommit(nil) }

// checkProgressLockedCommit is CheckProgress. Caller holds commitMu.
func (s *Store) checkProgressLockedCommit(progress func(done, total int)) *Report {
	s.cut.Lock()
	defer s.cut.Unlock()
	rep := &Report{DataBlocks: s.sb.DataBlocks}
	counts := map[string]int{}
	for _, f := range s.openFindings {
		rep.add(f, counts)
	}
	refs, free, ds, shared := s.collectRefsLockedCut(rep, counts, progress)
	rep.Disks = len(ds)
	sort.Slice(refs, func(i, j int) bool { return refs[i].Start < refs[j].Start })

	// Two users of one block: sweep the users in physical order. Disk
	// extents and the references awaiting a commit may share blocks the
	// reference counts list (their counts are compared below); anything
	// else sharing a block is damage.
	var union []pext
	var cur ref
	for i, r := range refs {
		if i > 0 && r.Start < cur.End() {
			lo, hi := r.Start, min(r.End(), cur.End())
			if !r.counted() || !cur.counted() || !allShared(shared, lo, hi) {
				rep.add(Finding{Severity: Fatal, Code: CodeSharedBlock, Disk: diskName(r.disk),
					Message: fmt.Sprintf("physical blocks [%d,%d) are used by both %s and %s", lo, hi, cur.owner(s.bs), r.owner(s.bs))}, counts)
			}
		}
		if i == 0 || r.End() > cur.End() {
			cur = r
		}
		if n := len(union); n > 0 && r.Start <= union[n-1].End() {
			union[n-1].Len = max(union[n-1].End(), r.End()) - union[n-1].Start
		} else {
			union = append(union, r.pext)
		}
	}

	// Used versus free: walk both sorted lists.
	var usedFree, freeBlocks, usedBlocks uint64
	var firstUsedFree *pext
	for _, u := range union {
		usedBlocks += u.Len
	}
	j := 0
	for _, f := range free {
		freeBlocks += f.Len
		for j < len(union) && union[j].End() <= f.Start {
			j++
		}
		for k := j; k < len(union) && union[k].Start < f.End(); k++ {
			lo, hi := max(f.Start, union[k].Start), min(f.End(), union[k].End())
			usedFree += hi - lo
			if firstUsedFree == nil {
				firstUsedFree = &pext{Start: lo, Len: hi - lo}
			}
		}
	}
	if usedFree > 0 {
		rep.add(Finding{Severity: Fatal, Code: CodeUsedFree,
			Message: fmt.Sprintf("%d used blocks are marked free, first [%d,+%d); the allocator could hand them to another disk", usedFree, firstUsedFree.Start, firstUsedFree.Len)}, counts)
	}
	accounted := usedBlocks + freeBlocks - usedFree
	if accounted < s.sb.DataBlocks {
		leaked := s.sb.DataBlocks - accounted
		rep.LeakedBlocks = leaked
		rep.add(Finding{Severity: Leak, Code: CodeLeak,
			Message: fmt.Sprintf("%d blocks are used by nothing and not free (%s)", leaked, describeLeaks(union, free, s.sb.DataBlocks))}, counts)
	}
	rep.UsedBlocks, rep.FreeBlocks = usedBlocks, freeBlocks
	s.checkCounts(rep, counts, refs, shared)
	return rep
}

// counted reports whether the user holds a reference the counts keep: a
// disk extent, or a reference awaiting the commit that drops it.
func (r ref) counted() bool { return r.disk != nil || r.kind == kindAwaiting }

// allShared reports whether the counts list every block of [lo, hi).
func allShared(t *refcount.Table, lo, hi uint64) bool {
	all := true
	t.Pieces(lo, hi-lo, func(_, _ uint64, refs uint32) { all = all && refs > 1 })
	return all
}

// checkCounts compares the stored reference counts with the users counted
// from the maps and the references awaiting a commit: a count above them is
// a leak (the blocks would never be freed), below them fatal (they would
// be freed while a disk still maps them). refs is sorted by Start.
func (s *Store) checkCounts(rep *Report, counts map[string]int, refs []ref, shared *refcount.Table) {
	var uses []refcount.Range
	for _, r := range refs {
		if r.counted() {
			uses = append(uses, refcount.Range{Start: r.Start, Len: r.Len})
		}
	}
	depth := refcount.Profile(uses)
	shared.Ascend(func(e refcount.Extent) bool {
		at := e.Start
		report := func(lo, hi uint64, users uint32) {
			switch {
			case users < e.Refs:
				rep.add(Finding{Severity: Leak, Code: CodeRefHigh,
					Message: fmt.Sprintf("physical blocks [%d,%d) have a reference count of %d but %d users: they would never be freed", lo, hi, e.Refs, users)}, counts)
			case users > e.Refs:
				rep.add(Finding{Severity: Fatal, Code: CodeRefLow,
					Message: fmt.Sprintf("physical blocks [%d,%d) have a reference count of %d but %d users: they would be freed while still mapped", lo, hi, e.Refs, users)}, counts)
			}
		}
		i := sort.Search(len(depth), func(i int) bool { return depth[i].End() > e.Start })
		for ; i < len(depth) && depth[i].Start < e.End(); i++ {
			lo, hi := max(depth[i].Start, e.Start), min(depth[i].End(), e.End())
			if at < lo {
				report(at, lo, 0)
			}
			report(lo, hi, depth[i].Refs)
			at = hi
		}
		if at < e.End() {
			report(at, e.End(), 0)
		}
		return true
	})
}

// collectRefsLockedCut checks every disk's name and map and returns every
// user of physical blocks: disk extents (inside the data region), the
// checkpoint, writes in flight and blocks waiting for their release to
// commit, and the free map. Caller holds s.cut exclusively.
func (s *Store) collectRefsLockedCut(rep *Report, counts map[string]int, progress func(done, total int)) ([]ref, []pext, []*disk, *refcount.Table) {
	// Allocations and releases go on under s.mu alone (they do not need the
	// cut), so the free map, writes in flight and the quarantine are read
	// in one critical section.
	s.mu.Lock()
	free := s.mu.alloc.Extents()
	totalExtents := s.mu.extents
	ds := make([]*disk, 0, len(s.mu.disks))
	for _, d := range s.mu.disks {
		ds = append(ds, d)
	}
	var refs []ref
	for _, e := range s.mu.ckptExts {
		refs = append(refs, ref{pext: e, kind: "the checkpoint"})
	}
	for start, n := range s.mu.inflight {
		refs = append(refs, ref{pext: pext{Start: start, Len: n}, kind: "a write in flight"})
	}
	for _, e := range s.mu.pend.quarantine {
		refs = append(refs, ref{pext: e, kind: kindAwaiting})
	}
	for _, e := range s.reservedExtentsLockedMu() {
		refs = append(refs, ref{pext: e, kind: "a disk's allocation unit"})
	}
	shared := s.mu.shared.Clone()
	s.mu.Unlock()
	sort.Slice(ds, func(i, j int) bool { return ds[i].id < ds[j].id })

	names := map[string]uint64{}
	total := s.sb.DataBlocks
	for _, d := range ds {
		d.mu.RLock()
		label := diskName(d)
		if !d.orphan {
			if err := ValidateName(d.name); err != nil {
				rep.add(Finding{Severity: Fatal, Code: CodeInvalidName, Disk: d.name, Message: fmt.Sprintf("disk %d: %v", d.id, err)}, counts)
			}
			if other, dup := names[d.name]; dup {
				rep.add(Finding{Severity: Fatal, Code: CodeDuplicateName, Disk: d.name,
					Message: fmt.Sprintf("disks %d and %d have the same name", other, d.id)}, counts)
			} else {
				names[d.name] = d.id
			}
		}
		if err := d.m.Check(); err != nil {
			rep.add(Finding{Severity: Fatal, Code: CodeMapInvariant, Disk: label, Message: err.Error()}, counts)
		}
		sizeBlocks := (uint64(d.attr.Size) + s.bs - 1) / s.bs
		d.m.Ascend(func(e blockmap.Extent) bool {
			rep.Extents++
			rep.MappedBlocks += e.Len
			if progress != nil && rep.Extents%65536 == 0 {
				progress(rep.Extents, max(totalExtents, rep.Extents))
			}
			if e.Phys >= total || e.Len > total-e.Phys {
				rep.add(Finding{Severity: Fatal, Code: CodeExtentOutside, Disk: label,
					Message: fmt.Sprintf("bytes [%d,%d) map to physical blocks [%d,+%d), outside the data region of %d blocks",
						e.Virt*s.bs, e.End()*s.bs, e.Phys, e.Len, total)}, counts)
			} else {
				refs = append(refs, ref{pext: pext{Start: e.Phys, Len: e.Len}, disk: d, virt: e.Virt})
			}
			if e.End() > sizeBlocks {
				rep.add(Finding{Severity: Fatal, Code: CodeExtentBeyondSize, Disk: label,
					Message: fmt.Sprintf("bytes [%d,%d) are mapped but the disk is %d bytes", max(e.Virt, sizeBlocks)*s.bs, e.End()*s.bs, d.attr.Size)}, counts)
			}
			return true
		})
		d.mu.RUnlock()
	}
	if progress != nil {
		progress(rep.Extents, rep.Extents)
	}
	return refs, free, ds, shared
}

// kindAwaiting names the references a commit that is not yet durable drops
// (the quarantine).
const kindAwaiting = "blocks awaiting a commit"

func diskName(d *disk) string {
	if d == nil {
		return ""
	}
	if d.orphan {
		return fmt.Sprintf("(unlinked disk %d)", d.id)
	}
	return d.name
}

// describeLeaks names the first few leaked ranges.
func describeLeaks(used, free []pext, total uint64) string {
	all := append(append([]pext{}, used...), free...)
	sort.Slice(all, func(i, j int) bool { return all[i].Start < all[j].Start })
	leaks := placement.Complement(all, total)
	var b strings.Builder
	for i, l := range leaks {
		if i == 5 {
			fmt.Fprintf(&b, ", and %d more ranges", len(leaks)-5)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "[%d,+%d)", l.Start, l.Len)
	}
	return b.String()
}
