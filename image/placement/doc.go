// Package placement decides where a store's data blocks go: which
// physical blocks are free (Allocator), which a disk's small first writes
// take from a reservation (Unit), and where the holes of a write are
// aimed (Fill). It does no I/O and takes no lock: the store (package
// image) owns an Allocator and its Units under its own lock, and gives a
// write's holes their blocks through Fill and a Space it implements.
//
// # Free space
//
// An Allocator holds the free blocks of the data region as maximal free
// extents, indexed by start and by length. Invariants: free extents are
// non-empty, inside [0, Total), never overlap and never touch (touching
// extents are merged); both indexes hold the same set; FreeBlocks is their
// total length. Free fails on a block already free, Take on a block not
// free (ErrCorrupt), and neither changes anything then. Alloc takes all n
// blocks or none (ErrNoSpace), preferring blocks at its goal, so a
// sequential writer's extents stay physically contiguous. Base and Region
// choose where a whole disk's layout starts and where a defragmented disk
// goes, outside the layouts other disks claim; they take nothing.
//
// # Aiming new blocks
//
// Placement follows the virtual offset, not the order of the writes: a
// hole is aimed at its nearest mapped neighbour's physical block plus the
// virtual distance (as ext4's ext4_ext_find_goal does), the extent before
// it, else the one after; a disk with nothing mapped gets one layout base,
// outside the layouts other disks follow. A neighbour whose blocks are
// shared does not count (Neighbours.DropShared), and a copy-on-write with
// no neighbour of its own aims at a second layout of the disk's. So a
// sequential stream stays one extent, and a disk filled in random order
// too where its layout is free.
//
// # Allocation units
//
// The first small write into an aligned UnitBytes of a disk reserves the
// unit's whole physical stretch where the layout puts it (ReserveUnit);
// the unit's later first writes take their blocks from the reservation
// (Give) without searching or splitting the allocator's free extents:
// virtual block i of the unit is always physical block Phys+i, so the unit
// ends up one extent whatever order its blocks were written in. A reserved
// block is in no free extent, no map and no write in flight. A reservation
// is memory only: it holds no data, is never journalled, counts as free
// space, and gives way (Release) when space is short, when its disk is
// deleted or shrinks past it, or its map empties.
//
// # Concurrency
//
// Nothing here is safe for concurrent use. An Allocator and the Units
// taken from it are guarded by one lock of their owner (image's Store.mu);
// Fill holds no lock and calls its Space, which takes the owner's locks
// for each call.
package placement
