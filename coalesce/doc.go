// Package coalesce is the block arithmetic of vdiskfs and its pool of aligned
// buffers. It keeps large I/O large: a request for a byte range of a virtual
// disk becomes as few backend I/Os as the physical layout allows.
//
// It is pure: no I/O, no locks (beyond those inside sync.Pool), no knowledge
// of disks or stores. The image package asks blockmap where a range lives and
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
// # Concurrency
//
// Split, BlockRange, Runs and the arithmetic helpers are pure functions and
// safe to call from any number of goroutines. A Pool is safe for concurrent
// use. A buffer belongs to whoever got it until it is handed back with Put;
// it must not be used after that.
//
// # Contract violations
//
// Breaking a precondition (a block size that is not a power of two, a range
// that wraps past 2^64, segments that are not consecutive) panics: each of
// those would otherwise send data to the wrong place. The checks are a few
// comparisons and stay on.
package coalesce
