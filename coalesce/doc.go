// Package coalesce is the block arithmetic of vdiskfs and its pool of aligned
// buffers. It keeps large I/O large: a request for a byte range of a virtual
// disk becomes as few backend I/Os as the physical layout allows.
//
// Its arithmetic is pure: no I/O, no locks, no knowledge of disks or
// stores; only the Pool holds state. The image package asks blockmap where a range lives and
// asks coalesce how to read or write it.
//
// # Byte ranges to blocks: Split and BlockRange
//
// Split cuts a byte range [off, off+n) into at most three spans:
//
//   - a partial head, when off is not block-aligned, or when the whole range
//     lies inside one block without covering all of it;
//   - one span of whole blocks, when there are any;
//   - a partial tail, when off+n is not block-aligned.
//
// Invariants of the result:
//   - The spans cover [off, off+n) exactly, in order, with no gap or overlap;
//     n == 0 gives no spans.
//   - A span is Partial exactly when it does not cover whole blocks. A partial
//     span covers part of one block (Blocks == 1) and needs read-modify-write;
//     only the first span may start inside a block (Off != 0).
//   - There is at most one span of whole blocks, it starts on a block boundary
//     and its Len is Blocks*bs.
//   - BufOff is the distance from off, so BufOff of span i+1 is BufOff+Len of
//     span i, and the first span has BufOff 0.
//   - Split does not allocate: Spans is a fixed array.
//
// # Segments to backend runs: Runs
//
// Runs turns the lookup segments of a block range (data and holes, as
// blockmap returns them) into backend I/Os, one Run each. Invariants:
//   - Runs cover exactly the data blocks of the segments; holes get no run.
//   - Each run is contiguous both virtually and physically, so it is one
//     pread or pwrite into one piece of the caller's buffer, at
//     BufOff = (Virt-base)*bs.
//   - No run is longer than maxBlocks (when maxBlocks != 0).
//   - The number of runs is minimal: every maximal stretch of blocks that is
//     contiguous in both spaces gives ceil(length/maxBlocks) runs (one run
//     when maxBlocks == 0), however many segments it was cut into. This is
//     the lesson of the seed block store: 256 contiguous 4 KiB blocks are one
//     1 MiB I/O, never 256 small ones.
//   - Runs appends to the caller's slice and does not allocate when it has
//     room; it never merges with runs that were already in that slice.
//
// # Aligned buffers: Pool
//
// O_DIRECT needs buffers whose address is aligned to directio.AlignSize and
// whose length is a multiple of it. Pool hands them out from power-of-two
// size classes (4 KiB up to the pool's maximum), so the hot path does not
// allocate per request. Requests above the maximum are allocated directly
// and dropped on Put.
//
// Classes from 64 KiB up come from slabs: 2 MiB-aligned anonymous mappings
// advised for transparent huge pages (internal/hugepage), carved into
// buffers of the class size. The block layer takes one segment per
// physically contiguous piece of a buffer, and a virtio-blk device takes
// at most max_segments (254) per request: a 1 MiB buffer on the heap's
// 4 KiB pages is 256 pieces, and the device gets each such write as two
// requests or more, while on a huge page it is one. Writes to encrypted
// disks always go from a pool buffer (their ciphertext), so this is what
// keeps them as large at the device as plain writes from FUSE's payload
// buffers. Smaller classes stay on sync.Pool and the Go heap.
//
// Slab invariants:
//   - A slab belongs to one class and is max(class size, 2 MiB) long; its
//     buffers start at multiples of the class size from the slab's start.
//   - A slab buffer is either on its class's free list or handed out,
//     never both; Put takes back only a buffer that starts where one of
//     its class's slabs carved one, and drops anything else of a slab
//     class (a heap buffer from past the limit) for the garbage collector.
//   - The pool maps at most its slab limit (DefaultSlabLimit) in all;
//     past it, Get allocates on the heap. Slabs are kept until Close (or
//     until the garbage collector finds the pool unreachable), so the
//     pool holds its peak use, at most the limit.
//   - Close unmaps the slabs only when no slab buffer is out; otherwise
//     it leaves them mapped and says so, since unmapping memory in use
//     would fault.
//
// # Concurrency
//
// Split, BlockRange, Runs and the arithmetic helpers are pure functions and
// safe to call from any number of goroutines. A Pool is safe for concurrent
// use: heap classes through sync.Pool, slab classes under the pool's one
// mutex (held for a free-list operation or while a slab is mapped, never
// across I/O, and no other lock is taken under it). A buffer belongs to
// whoever got it until it is handed back with Put; it must not be used
// after that.
//
// # Contract violations
//
// Breaking a precondition (a block size that is not a power of two, a range
// that wraps past 2^64, segments that are not consecutive) panics: each of
// those would otherwise send data to the wrong place. The checks are a few
// comparisons and stay on.
package coalesce
