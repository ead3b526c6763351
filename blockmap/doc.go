// Package blockmap is the in-memory extent map of one virtual disk: for each
// virtual block of the disk, the physical block of the store that holds it,
// or nothing (a hole).
//
// A Map is a set of extents {Virt, Phys, Len, TweakOff} kept in a B-tree
// (github.com/google/btree BTreeG) ordered by Virt. Every quantity is in
// blocks (the store's allocation unit), never in bytes. The package does no
// I/O, takes no locks and knows nothing of disks, files or allocation: the
// image package decides where data goes, blockmap records it and answers
// questions about it.
//
// # Operations
//
//   - Lookup turns a virtual range into data and hole segments. Each data
//     segment is physically contiguous, and a data segment right after it
//     never continues it physically, so each is exactly one backend I/O.
//   - Insert maps a range, replacing what was there and returning the old
//     mappings so that the caller can free them; Punch unmaps a range.
//   - NextData and NextHole answer SEEK_DATA and SEEK_HOLE; Before finds the
//     extent a write continues, so the allocator can place it right after.
//   - Clone takes an O(1) copy for checkpoints and snapshots.
//   - Check verifies the invariants below.
//
// # Invariants
//
// After every operation:
//
//   - Extents are sorted by Virt and do not overlap: e.End() <= next.Virt.
//   - Every extent has Len > 0.
//   - No two neighbours are contiguous in both spaces with one tweak offset
//     (e.End() == next.Virt, e.PhysEnd() == next.Phys and e.TweakOff ==
//     next.TweakOff): Insert always merges them. So a mapping
//     has exactly one representation, with the fewest extents, and a long
//     sequential write that was allocated contiguously is a single extent.
//   - Virt+Len and Phys+Len never overflow uint64. Hence block
//     math.MaxUint64 is never mapped and NextHole always has an answer.
//     Insert panics on an extent that would overflow and Lookup on a range
//     that would; Punch and AscendRange read such a range as "to the end".
//   - Blocks() is the sum of the extents' Len.
//
// Physical ranges of different extents may overlap: the map does not own
// physical space, and shared blocks (snapshots, clones) are counted by the
// image package, not here.
//
// # Memory
//
// An Extent is 32 bytes with no pointers and is stored by value in the
// B-tree nodes. A map of a million extents takes about 61 bytes per extent
// when built in Virt order and 40 when built in random order
// (BenchmarkMemoryPerExtent). The bound is about 69: a node other than the
// root is at least half full, 31 extents in a slice of at most 64. The
// tweak offset is 8 of the 32 bytes, on plain disks too.
//
// # Concurrency
//
// A Map is not safe for concurrent use; callers lock. Precisely:
//
//   - Insert, Punch and Clone modify the Map (Clone gives it a new
//     copy-on-write context) and need exclusive access to it.
//   - Every other method only reads. Any number of reads may run at once,
//     for instance under the read side of a sync.RWMutex, but not alongside
//     a modifying call on the same Map.
//   - Callbacks passed to Ascend and AscendRange must not modify the Map.
//
// Clone is O(1) and copy-on-write. Once it has returned, the original and
// the clone are independent Maps: each may be used, read or modified, by one
// goroutine while another goroutine uses the other. That is the guarantee
// google/btree v1.1.3 gives for BTreeG.Clone: "Clone should not be called
// concurrently, but the original tree (t) and the new tree (t2) can be used
// concurrently once the Clone call completes." The two trees share nodes,
// which neither modifies (a write first copies the node), and a free list of
// nodes, which FreeListG guards with a mutex ("Two Btrees using the same
// freelist are safe for concurrent write access"). The only other state of a
// Map, its block count, is copied by Clone.
//
// A checkpoint is therefore: with the disk's map lock held, c := m.Clone();
// unlock; hand c to a goroutine that writes it out while I/O goes on updating
// m. The hand-over must order the goroutines (a channel send, or starting the
// goroutine after Clone), as any hand-over of data does.
// TestCloneConcurrentUse checks this under the race detector.
package blockmap
