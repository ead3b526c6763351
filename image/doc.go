// Package image is the vdiskfs store: many virtual disks on one backing
// target (a block device or a regular file), with everything needed to find
// them again kept on that target. It knows nothing about FUSE.
//
// # Layout
//
// Two superblock copies, a metadata journal, and the data region, where
// data blocks and checkpoints are allocated. FORMAT.md at the repository
// root gives every structure byte by byte; format.go is its only encoder and
// decoder.
//
// # What a disk promises (the crash contract of docs/DESIGN.md)
//
// A Disk behaves like a real disk with a volatile write cache. After Sync
// (fsync) or SyncData (fdatasync) returns, every write acknowledged before
// it survives a crash of the process or of the machine, data and mapping
// alike. A WriteAtSync (O_DSYNC, O_SYNC) survives once it returns, like a
// disk's FUA write: it promises its own bytes, not other unsynced writes.
// Before that a write may be lost but never corrupts anything else. Never-written bytes, holes,
// punched and zero-ranged bytes, and the unwritten part of a newly allocated
// block read as zeros: a disk never shows bytes it did not write.
//
// The crash rules that give this are numbered in docs/DESIGN.md ("crash
// rule N" in comments means that list); this package keeps them so:
//
//   - Crash rule 1: new data goes to newly allocated blocks; its mapping is
//     journalled only after the data write completed, and a commit holding
//     mappings flushes the data before it writes the journal (a commit
//     without one has no data to order and flushes once, after its journal
//     write, unless a truncate or punch zeroed part of a block in place
//     before its record: that zeroing is flushed first too).
//   - Crash rule 2: writes to mapped, unshared blocks go in place.
//   - Crash rule 3: freed blocks (punch, truncate, remove) stay in
//     quarantine (quarantineLockedMu) until the record that frees them is
//     durable; only then may another disk get them (releaseLockedCommit).
//   - Crash rule 4: a journal commit carries a CRC-32C and a sequence
//     number; replay stops at the first commit that fails either. A failing
//     commit followed by a valid later one is damage (ErrCorrupt), not a
//     torn tail.
//   - Crash rule 5: Sync commits, the timer commits (commitBackground: a
//     commit of times alone is written without a flush, and the next
//     commit replaces it), and Close checkpoints. A checkpoint (catalog,
//     every map, the free map) goes to fresh blocks; both superblock copies
//     then point to it, one after the other, each flushed. The old
//     checkpoint's blocks are released only after that.
//   - Crash rule 6: after a failed flush the store refuses further writes
//     and syncs (ErrFailed): no later sync may pretend to cover data that
//     was lost.
//   - Crash rule 7: a shared block (a clone's, a snapshot's: share.go) is
//     never written in place; the write goes to new blocks, and the old one
//     loses a reference only when that record is durable (the quarantine of
//     crash rule 3), so its other owner writes around it until then. A
//     block is free at count 0.
//
// # One data path
//
// Every read and write of a disk is an IOPlan (ioplan.go): planned once
// (range lock, map lookup, read-modify-write of partial blocks, blocks
// for the holes, coalescing into runs), submitted through the backend's
// seam (package backend, "Submission"), and finished once (the map and
// its records published, the counters). Disk.ReadAt and WriteAt make the
// plan waiting as needed and perform it on the caller's goroutine; the
// FUSE io_uring queue threads make it without waiting (PlanRead,
// PlanWrite, PlanWriteSync decline what would need a wait) and submit it
// on their own rings. So tests that use ReadAt and WriteAt on the memory
// and crash backends run the same planning and finishing as a mount.
// The store's own I/O on a disk is planned too, without a handle
// (runLockedRange, under a range lock its caller holds): the
// read-modify-write of a partial block (a write's edges, a punch's, a
// truncate's) and defrag's reads. Three writes are not disk requests and
// go to the backend without a plan, counted alike (io.go): defrag's copy
// into blocks no map holds until it remaps them, the zeros that prepare
// a chunk of a store file (free blocks of no disk), and Open's zeroing of
// a crash's stale tails.
//
// # Keeping large I/O large
//
// Maps hold extents (package blockmap), and package placement decides
// where new blocks go (see its doc): a hole is aimed at its nearest mapped
// neighbour's physical block plus the virtual distance, a disk with
// nothing mapped gets one layout base outside the layouts other disks
// follow, and a small first write takes its block from its allocation
// unit's reservation. The store owns the placement's state (the
// Allocator, the disks' Units, Store.mu guarding both) and does its I/O;
// a write's holes get their blocks in one call, placement.Fill, through
// the store's side of it (placement.go: diskSpace). So a sequential
// stream stays one extent, a disk filled in random order too where its
// layout is free, one rewritten at random over a snapshot too, and
// package coalesce turns a request's lookup segments into one backend
// I/O per physically contiguous run. Reserved blocks count as free, are
// given up when space is short, and live in memory only. A
// disk whose blocks are scattered all the same (laid out before placement
// followed the virtual offset, or where its layout was taken) is rewritten
// into one run by Store.Defrag (defrag.go), chunk by chunk, as crash-safe
// as a write into holes: new blocks, then the map, then the old blocks
// through the quarantine.
//
// On a store file the host file system's own cost of a first write is
// taken ahead, a chunk at a time (backend.Preparer): before a chunk of the
// file first holds new blocks of a small write (placement.PrepareBelow),
// zeros are written over its free blocks in large writes
// (Store.prepareChunk), so
// every later first write there is an overwrite for ext4 or XFS, not an
// allocation under the file's lock. Large first writes allocate as they
// go: preparing for them would write their blocks twice.
// Only blocks the allocator holds free, taken for the while, are written;
// what a free block holds is never read. Freed blocks are punched out of
// the file only in whole chunks (Store.discardRange).
//
// A block-aligned request whose buffer is 4 KiB aligned in memory (what
// go-fuse hands over) goes to O_DIRECT without a copy; anything else goes
// through one pooled aligned buffer, with at most two read-modify-write
// edge blocks.
//
// # Concurrency
//
// Store and Disk methods are safe for concurrent use. Locks, always taken
// in this order (see Store for what each guards):
//
//	disk range lock → Store.prepMu → Store.commitMu → Store.cut → disk.mu → Store.mu
//
// Rename over an existing disk holds two disks' mu at once, the lower id
// first.
//
// Three of them are held across backend I/O (docs/DESIGN.md, rule 4). The
// range lock orders overlapping requests on one disk (shared for reads,
// exclusive for writes, punches and truncates) and is held across the data
// I/O of its range: an IOPlan (PlanRead, PlanWrite) holds it, taken without
// waiting, while its caller's own I/O is in flight, from the plan to Finish
// or Abort. prepMu is held across the zeros that prepare a chunk of the
// backing (Store.prepareChunk). commitMu is held across metadata I/O, which
// only commits, checkpoints, format upgrades, Check and Repair do. The
// others guard memory only. Store.cut is taken shared by every change of
// state together with its journal records, and exclusively by a
// checkpoint's capture and by Check, which therefore see one consistent cut.
//
// A function that needs its caller to hold a lock ends in Locked and the
// name of that lock, and its doc comment has a line "Caller holds ..."
// naming every lock it needs (the suffix names the one that guards what it
// reads or changes; the doc line also names the others, such as s.cut
// around a journalled change):
//
//	...LockedRange   the disk's range lock over the blocks it touches
//	                 (publishWriteLockedRange, setSizeLockedRange)
//	...LockedCommit  Store.commitMu (commitLockedCommit, checkpointLockedCommit)
//	...LockedCut     Store.cut, shared or exclusive as the doc line says
//	                 (lockNamedLockedCut, collectRefsLockedCut)
//	...LockedMu      the receiver's own mu: Store.mu for a *Store
//	                 (appendLockedMu), disk.mu for a *disk
//	                 (attrRecordLockedMu), rangeLock.mu, a backend's mu
//
// A bare Locked suffix is not used: with five locks it would not say which.
//
// # Checking
//
// Store.Check is the one checker: vdisk fsck runs it, tests run it on every
// store they open, and Options.Strict runs it after every commit. It reports
// every finding in a stable order and tells leaks (blocks used by nothing:
// space lost, nothing at risk) from fatal findings. Store.Repair fixes what
// it can and says what it dropped.
package image
