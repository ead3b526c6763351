package image

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/image/placement"
	"github.com/vdiskfs/vdiskfs/refcount"
)

// DefaultCommitInterval bounds how much acknowledged-but-unsynced work a
// crash can lose: the store commits on this timer when anything is dirty.
// What it bounds is the metadata (writes into holes, sizes, the catalog);
// overwrites in place and the times they change are durable at the next
// flush, as on a disk with a volatile write cache (Store.commitBackground).
const DefaultCommitInterval = 5 * time.Second

// maxRunBytes is the largest single backend data I/O. Runs longer than this
// are split (one of the two reasons a run is ever split; the other is a
// physical discontinuity).
const maxRunBytes = 4 << 20

// Options tune Open.
type Options struct {
	// Logger receives structured logs; nil means logrus.StandardLogger().
	Logger logrus.FieldLogger
	// ReadOnly opens without writing anything: no owner record, no
	// commits, no replay side effects on disk. Disks may be read only.
	ReadOnly bool
	// Tolerant opens a store even when it has fatal findings (for fsck),
	// read-only: a damaged store is checked or repaired, never written.
	Tolerant bool
	// Repair opens a damaged store read-write so that Store.Repair can
	// fix it; call Repair before anything else. Implies Tolerant.
	Repair bool
	// CommitInterval is the background commit period; 0 means
	// DefaultCommitInterval, negative disables the timer.
	CommitInterval time.Duration
	// Strict runs Check after every commit and fails the commit on a
	// finding. For tests.
	Strict bool
	// Program names the opener in the owner record ("vdisk mount").
	Program string
	// Force takes over a store whose owner record names another host. Only
	// after that host is fenced.
	Force bool
	// IOEngine is how OpenPath's backend issues data reads: io_uring when
	// the kernel allows it (the default), or pread; writes are pwrite. See
	// backend.Engine.
	IOEngine backend.Engine
}

// Store is an open vdiskfs store: a catalog of disks on one backing target.
//
// Concurrency: every exported method is safe for concurrent use. Locks, in
// the order they are taken:
//
//	prepMu    serialises the preparation of the backing's chunks;
//	commitMu  serialises commits, checkpoints, Check, Repair and Close;
//	cut       shared by every state change (a map or catalog update together
//	          with its journal records), exclusive for a checkpoint's capture
//	          and for Check, so that both see one consistent cut;
//	disk.mu   one disk's map and attributes (two disks' at once, in Rename:
//	          the lower id first);
//	mu        the catalog, allocator, pending journal records and quarantine.
//
// Held across backend I/O (docs/DESIGN.md, rule 4): a disk's range lock
// (taken before all of these) across its range's data I/O, prepMu across
// a preparation's zeros, commitMu across metadata I/O, which only commits,
// checkpoints, format upgrades, Check and Repair do. A function that needs
// one of these held names it in its suffix (LockedMu, LockedCommit,
// LockedCut; see the package doc, Concurrency).
type Store struct {
	be         backend.Backend
	log        logrus.FieldLogger
	opts       Options
	bs         uint64 // block size in bytes
	dataOff    int64  // byte offset of data block 0
	dataEnd    int64  // byte offset just past the last data block
	unitBlocks uint64 // blocks per allocation unit, 0 for none (placement.UnitBlocks)
	journalLen int64
	uuid       [16]byte
	pool       *coalesce.Pool
	stats      Counters

	// openFindings are problems found while opening (a bad superblock
	// copy, a broken journal); Check reports them first.
	openFindings []Finding

	// prepMu serializes the preparation of the backing's chunks
	// (prepareChunk): one chunk at a time, so two writers into the same
	// new chunk prepare it once. Held while zeros are written; taken
	// before mu, never while holding it.
	prepMu sync.Mutex

	commitMu sync.Mutex
	// Guarded by commitMu:
	sb            superblock // as last written
	jOff          int64      // next free byte in the journal
	flushedWrites uint64     // writeGen value covered by the last flush
	// durableRec is the mu.recGen value covered by the last commit:
	// written under commitMu, read without it by a synchronous overwrite
	// asking whether every mapping is durable (Disk.WriteAtSync).
	durableRec atomic.Uint64
	// lazy is the timer's commit of times written without a flush
	// (commitBackground) while no flush has covered it yet: its journal
	// offset, sequence number and records. Invariant: when count > 0 it
	// is the journal's last commit (jOff is its end, mu.nextSeq is seq+1).
	// A commit written before the next flush replaces it, at the same
	// offset and with the same sequence number, holding its records
	// first (writeCommitLockedCommit), so the journal never holds a
	// commit after one that is not durable: a power cut could lose that
	// one and keep the next, which replay must take for damage.
	lazy lazyCommit

	cut sync.RWMutex

	mu struct {
		sync.Mutex
		disks     map[uint64]*disk // every live disk, orphans included
		names     map[string]*disk // named disks
		nextID    uint64
		alloc     *placement.Allocator
		shared    *refcount.Table   // reference counts of blocks more than one map holds
		inflight  map[uint64]uint64 // allocated, data being written: start → len
		releasing int               // commits that took a quarantine and have not released it yet
		pend      pending           // records not yet committed, the blocks they free
		recGen    uint64            // records ever appended
		moreGen   uint64            // recGen after the last record but dirty times (Store.mappingsDurable)
		nextSeq   uint64            // sequence number of the next commit
		extents   int               // extents in all maps, for the checkpoint reserve
		failed    error             // set once a flush or metadata write failed
		closed    bool
		ckptExts  []pext // blocks of the current checkpoint
		reserved  uint64 // blocks in disks' allocation units (placement.go)
		// ciphers are the data keys given (Store.Unlock, CreateEncrypted),
		// by key check value: every disk with that key uses its cipher.
		ciphers map[[16]byte]*crypt.Cipher
	}
	// crypted says the store is version 3 (may hold encrypted disks): its
	// checkpoints hold tweaks and slot tables (ckptReserveLockedMu).
	crypted atomic.Bool

	// writeGen counts completed backend data writes; a flush that starts
	// after reading it makes all those writes durable.
	writeGen atomic.Uint64

	timerStop chan struct{}
	timerDone chan struct{}
}

// FormatOptions describe a new store.
type FormatOptions struct {
	// BlockSize is the allocation unit: a power of two from 4 KiB to 1 MiB;
	// 0 means DefaultBlockSize.
	BlockSize int
	// JournalSize in bytes; 0 chooses 1/64 of the store, between 1 MiB and
	// 64 MiB.
	JournalSize int64
}

// Format writes an empty store over the whole backing. Everything on it is
// lost (it is not erased: a store never reads blocks it has not written).
func Format(be backend.Backend, fo FormatOptions) error {
	bs := uint64(fo.BlockSize)
	if bs == 0 {
		bs = DefaultBlockSize
	}
	if bs < MinBlockSize || bs > MaxBlockSize || bs&(bs-1) != 0 {
		return fmt.Errorf("format: block size %d is not a power of two from %d to %d: %w", bs, MinBlockSize, MaxBlockSize, ErrInvalid)
	}
	size := uint64(be.Size())
	jlen := uint64(fo.JournalSize)
	if jlen == 0 {
		jlen = min(max(size/64, 1<<20), 64<<20)
	}
	jlen = coalesce.RoundUp(jlen, pageSize)
	dataOff := coalesce.RoundUp(journalOffset+jlen, max(dataAlign, bs))
	if size < dataOff+16*bs {
		return fmt.Errorf("format: backing of %d bytes is too small (need at least %d): %w", size, dataOff+16*bs, ErrInvalid)
	}
	sb := superblock{
		Generation:  1,
		BlockSize:   uint32(bs),
		StoreSize:   size,
		JournalOff:  journalOffset,
		JournalLen:  jlen,
		DataOff:     dataOff,
		DataBlocks:  (size - dataOff) / bs,
		CreatedNano: time.Now().UnixNano(),
		State:       stateClean,
	}
	if _, err := rand.Read(sb.UUID[:]); err != nil {
		return fmt.Errorf("format: uuid: %w", err)
	}
	// The first checkpoint is empty: no disks, everything free but itself.
	s := &Store{be: be, bs: bs, dataOff: int64(dataOff), uuid: sb.UUID, pool: coalesce.NewPool(maxRunBytes), log: logrus.StandardLogger()}
	defer s.closePool()
	s.stats.init()
	s.sb = sb
	s.mu.alloc = placement.NewAllocator(sb.DataBlocks)
	s.mu.shared = refcount.New()
	if err := s.mu.alloc.Free(pext{Start: 0, Len: sb.DataBlocks}); err != nil {
		return fmt.Errorf("format: %w", err)
	}
	c := &checkpoint{Version: formatVersion, Seq: 0, UUID: sb.UUID, NextID: 1}
	exts, stream, err := s.writeCheckpointStream(c)
	if err != nil {
		return fmt.Errorf("format: %w", err)
	}
	sb.CkptExts, sb.CkptLen, sb.CkptCRC = exts, uint64(len(stream)), crc(stream)
	if err := s.writeSuper(&sb); err != nil {
		return fmt.Errorf("format: %w", err)
	}
	return nil
}

// FormatPath formats the store at path, creating its backing of size bytes
// when nothing exists there: a sparse file, or an RBD image for an RBD store
// name (size is ignored for an existing file, device or image).
func FormatPath(path string, size int64, fo FormatOptions) error {
	created := false
	if _, err := backend.Stat(path); errors.Is(err, os.ErrNotExist) {
		if size <= 0 {
			return fmt.Errorf("format %s: it does not exist and no size was given: %w", path, ErrInvalid)
		}
		if err := backend.Create(path, size); err != nil {
			return fmt.Errorf("format %s: %w", path, err)
		}
		created = true
	}
	be, err := backend.Open(path, backend.OpenOptions{})
	if err != nil {
		if errors.Is(err, backend.ErrLocked) {
			return fmt.Errorf("format: %w%s", err, describeOwner(path))
		}
		return fmt.Errorf("format: %w", err)
	}
	if err := Format(be, fo); err != nil {
		be.Close()
		if created {
			backend.Remove(path)
		}
		return fmt.Errorf("format %s: %w", path, err)
	}
	return be.Close()
}

// LockHolder names the client the store holds its backing's lock as, for a
// backing whose lock names its holders (an RBD image: "client.4133 at
// 127.0.0.1:0/495665570"); "" for a file or device.
func (s *Store) LockHolder() string { return backend.LockHolder(s.be) }

// IOEngine reports how the store's backend issues data reads (see
// backend.EngineOf): io_uring or pread, and why not io_uring when the
// default fell back to pread.
func (s *Store) IOEngine() (backend.Engine, string) { return backend.EngineOf(s.be) }

// OpenPath opens the store at path (a file, a block device or an RBD store
// name) with its lock.
// When the lock is held by an owner on this host that no longer exists, it
// waits up to lockWait for the kernel to release it.
func OpenPath(path string, opts Options) (*Store, error) {
	be, err := openBackend(path, backend.OpenOptions{ReadOnly: opts.ReadOnly && !opts.Repair, Engine: opts.IOEngine})
	if err != nil {
		if errors.Is(err, backend.ErrLocked) {
			return nil, fmt.Errorf("open store %s: %w%s", path, err, describeOwner(path))
		}
		return nil, fmt.Errorf("open store: %w", err)
	}
	s, err := Open(be, opts)
	if err != nil {
		be.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return s, nil
}

// readSuperblocks reads both copies and returns the valid one with the
// highest generation, plus findings about the other copy.
func readSuperblocks(be backend.Backend) (*superblock, []Finding, error) {
	if be.Size() < 2*pageSize {
		return nil, nil, fmt.Errorf("%s is %d bytes, too small to hold a store's superblocks: %w", be.Describe(), be.Size(), ErrNotStore)
	}
	buf := make([]byte, 2*pageSize+pageSize)
	page := alignedPage(buf, 2*pageSize)
	if _, err := be.ReadAt(page, superAOffset); err != nil {
		return nil, nil, fmt.Errorf("read superblocks: %w", err)
	}
	a, errA := decodeSuperblock(page[:pageSize])
	b, errB := decodeSuperblock(page[pageSize:])
	var findings []Finding
	switch {
	case errors.Is(errA, ErrVersion):
		// A newer vdisk wrote this copy (an upgrade that crashed between
		// the copies, say): this build must not touch the store.
		return nil, nil, fmt.Errorf("superblock copy A: %w", errA)
	case errors.Is(errB, ErrVersion):
		return nil, nil, fmt.Errorf("superblock copy B: %w", errB)
	case errA != nil && errB != nil:
		return nil, nil, errA
	case errA != nil:
		findings = append(findings, Finding{Severity: Fatal, Code: CodeSuperblockCopy,
			Message: fmt.Sprintf("superblock copy A is unreadable (%v); using copy B", errA)})
		return b, findings, nil
	case errB != nil:
		findings = append(findings, Finding{Severity: Fatal, Code: CodeSuperblockCopy,
			Message: fmt.Sprintf("superblock copy B is unreadable (%v); using copy A", errB)})
		return a, findings, nil
	case b.Generation > a.Generation:
		// A crash between writing copy A and copy B leaves A older... or
		// rather, we write A first, so B newer means A's write was lost.
		return b, nil, nil
	default:
		return a, nil, nil
	}
}

// alignedPage returns n bytes of buf starting at a 4096-aligned address;
// buf must have n+4096 bytes.
func alignedPage(buf []byte, n int) []byte {
	for off := 0; off < pageSize; off++ {
		if coalesce.IsAligned(buf[off:]) {
			return buf[off : off+n]
		}
	}
	panic("image: no aligned offset in buffer")
}

// Open opens a formatted store on be: it reads the superblocks and the
// checkpoint, replays the journal, deletes disks that were unlinked while
// open, records the owner, and (unless opts.Tolerant or opts.Repair) refuses
// a store with fatal findings; opened read-write, it then zeroes what a
// crash left past the end of a disk in its last block (zeroStaleTails).
// The store takes ownership of be.
func Open(be backend.Backend, opts Options) (_ *Store, err error) {
	if opts.Logger == nil {
		opts.Logger = logrus.StandardLogger()
	}
	switch {
	case opts.Repair:
		opts.Tolerant, opts.ReadOnly = true, false
	case opts.Tolerant:
		opts.ReadOnly = true // a damaged store is checked, not written
	}
	sb, findings, err := readSuperblocks(be)
	if err != nil {
		return nil, err
	}
	if size := be.Size(); uint64(size) < sb.StoreSize {
		return nil, fmt.Errorf("store is truncated: the backing has %d bytes, the superblock says %d: %w", size, sb.StoreSize, ErrCorrupt)
	}
	host, _ := os.Hostname()
	// A backing whose lock fences other hosts (RBD's exclusive lock) was
	// granted only once the previous owner could no longer write: its
	// owner record is history, not a claim.
	fenced := backend.FencesOtherHosts(be)
	if sb.State == stateOpen && sb.Host != host && !opts.Force && !opts.ReadOnly && !fenced {
		return nil, fmt.Errorf("store was opened by %s (pid %d) on host %q and not closed; fence that host, then open with --force: %w",
			orUnknown(sb.Program), sb.OwnerPID, sb.Host, ErrOwned)
	}
	if sb.State == stateOpen && sb.Host != host && fenced {
		opts.Logger.WithFields(logrus.Fields{"backing": be.Describe(), "owner_host": sb.Host, "owner_pid": sb.OwnerPID,
			"owner_program": sb.Program}).Warn("taking over a store another host did not close; the backing's lock fenced that host")
	}
	s := &Store{
		be:           be,
		log:          opts.Logger,
		opts:         opts,
		bs:           uint64(sb.BlockSize),
		dataOff:      int64(sb.DataOff),
		dataEnd:      int64(sb.DataOff + sb.DataBlocks*uint64(sb.BlockSize)),
		unitBlocks:   placement.UnitBlocks(uint64(sb.BlockSize)),
		journalLen:   int64(sb.JournalLen),
		uuid:         sb.UUID,
		pool:         coalesce.NewPool(maxRunBytes),
		openFindings: findings,
		sb:           *sb,
	}
	defer func() {
		if err != nil {
			s.closePool() // a store that failed to open holds no buffer
		}
	}()
	s.stats.init()
	s.mu.disks = make(map[uint64]*disk)
	s.mu.names = make(map[string]*disk)
	s.mu.inflight = make(map[uint64]uint64)
	s.mu.alloc = placement.NewAllocator(sb.DataBlocks)
	s.mu.shared = refcount.New()
	s.crypted.Store(sb.version() >= cryptVersion)
	if err := s.loadCheckpoint(); err != nil {
		return nil, err
	}
	if err := s.replay(); err != nil {
		return nil, err
	}
	s.markSharingLockedMu()
	for _, f := range s.openFindings {
		s.log.WithFields(logrus.Fields{"code": f.Code, "disk": f.Disk}).Warn(f.Message)
	}
	if !opts.ReadOnly {
		s.deleteOrphans()
		sb := s.sb
		sb.Generation++
		sb.State, sb.OwnerPID, sb.MountGen = stateOpen, uint32(os.Getpid()), sb.MountGen+1
		sb.OpenedNano, sb.Host, sb.Program = time.Now().UnixNano(), host, opts.Program
		if err := s.writeSuper(&sb); err != nil {
			return nil, fmt.Errorf("record owner: %w", err)
		}
		s.sb = sb
		// Both copies were just rewritten: a copy torn by a crash during
		// the last superblock update is healed.
		s.openFindings = slices.DeleteFunc(s.openFindings, func(f Finding) bool { return f.Code == CodeSuperblockCopy })
	}
	if !opts.Tolerant {
		if rep := s.Check(); rep.Fatal() {
			return nil, fmt.Errorf("store has %d fatal finding(s), first: %s; run vdisk fsck: %w", rep.FatalCount(), rep.FirstFatal(), ErrCorrupt)
		}
		// Only on a store whose maps Check found sound: a damaged one
		// (Repair) could map a disk's last block into another's data.
		if !opts.ReadOnly {
			if err := s.zeroStaleTails(); err != nil {
				return nil, fmt.Errorf("open: %w", err)
			}
		}
	}
	if !opts.ReadOnly && opts.CommitInterval >= 0 {
		iv := opts.CommitInterval
		if iv == 0 {
			iv = DefaultCommitInterval
		}
		s.timerStop, s.timerDone = make(chan struct{}), make(chan struct{})
		go s.commitTimer(iv)
	}
	return s, nil
}

// commitTimer commits every interval (commitBackground), bounding the loss
// window of metadata changes that no one fsyncs.
func (s *Store) commitTimer(iv time.Duration) {
	defer close(s.timerDone)
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-s.timerStop:
			return
		case <-t.C:
			if err := s.commitBackground(); err != nil && !errors.Is(err, ErrClosed) {
				s.log.WithError(err).Error("background commit failed")
			}
		}
	}
}

// Close commits, writes a checkpoint (so the next open replays nothing),
// marks the store clean and releases the backing. Disks still open are
// closed with it.
func (s *Store) Close() error {
	if s.timerStop != nil {
		close(s.timerStop)
		<-s.timerDone
		s.timerStop = nil
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.mu.Lock()
	closed, failed := s.mu.closed, s.mu.failed
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	var err error
	if !s.opts.ReadOnly && failed == nil {
		if err = s.checkpointLockedCommit(); errors.Is(err, ErrNoSpace) {
			// A full store whose metadata grew: commit through the
			// journal instead; the next open replays it.
			s.log.WithError(err).Warn("no space for a checkpoint at close; committing to the journal")
			s.mu.Lock()
			want := s.mu.recGen
			s.mu.Unlock()
			err = s.commitLockedCommit(want, s.writeGen.Load(), true, false)
		}
		if err == nil {
			sb := s.sb
			sb.Generation++
			sb.State, sb.OwnerPID, sb.OpenedNano, sb.Program = stateClean, 0, 0, ""
			if err = s.writeSuper(&sb); err == nil {
				s.sb = sb
			}
		}
	}
	s.mu.Lock()
	s.mu.closed = true
	s.mu.Unlock()
	if cerr := s.be.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close backing: %w", cerr)
	}
	s.closePool()
	if err == nil && failed != nil {
		err = failed
	}
	return err
}

// closePool gives back the buffer pool's memory once the store does no
// more I/O. A buffer still out (a bug, not a data error) keeps the pool's
// memory mapped, which is logged.
func (s *Store) closePool() {
	if err := s.pool.Close(); err != nil {
		s.log.WithError(err).Warn("buffer pool: memory left mapped")
	}
}

// fail poisons the store after a failed flush or metadata write: every later
// write, commit and sync returns an error wrapping ErrFailed.
func (s *Store) fail(err error) error {
	s.mu.Lock()
	if s.mu.failed == nil {
		s.mu.failed = fmt.Errorf("%w: %w", ErrFailed, err)
		s.log.WithError(err).Error("store failed: refusing further writes and syncs")
	}
	failed := s.mu.failed
	s.mu.Unlock()
	return failed
}

// usableLockedMu returns the reason the store cannot take writes, if any.
// Caller holds s.mu.
func (s *Store) usableLockedMu() error {
	switch {
	case s.mu.closed:
		return ErrClosed
	case s.mu.failed != nil:
		return s.mu.failed
	case s.opts.ReadOnly:
		return ErrReadOnly
	}
	return nil
}

// writable returns why the store cannot take writes, if it cannot.
func (s *Store) writable() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usableLockedMu()
}

// appendLockedMu queues journal records. Caller holds s.cut (shared) and
// s.mu, and the disk's mu when the record is about a disk.
func (s *Store) appendLockedMu(recs ...record) {
	s.mu.pend.add(recs)
	s.mu.recGen += uint64(len(recs))
	s.mu.moreGen = s.mu.recGen
}

// appendTimesLockedMu queues the attr record of a disk's dirty times
// (appendDirtyTimes), which alone lets the timer's commit skip its flush
// (pending.addTimes). Locking as appendLockedMu.
func (s *Store) appendTimesLockedMu(rec record) {
	s.mu.pend.addTimes(rec)
	s.mu.recGen++
}

// quarantineLockedMu holds the references to blocks that the records
// appended last drop (blocks a punch, truncate, delete or copy-on-write
// unmapped) until those records are durable (docs/DESIGN.md, crash rule 3):
// only then does each block lose the reference, and a block that loses
// its last one becomes free (releaseLockedCommit). So a shared block's
// count stays as it is on the backing until the records are durable, and
// its last owner writes around it (copy-on-write) rather than into it
// until then. Caller holds s.mu.
func (s *Store) quarantineLockedMu(freed []blockmap.Extent) {
	for _, f := range freed {
		s.mu.pend.quarantine = append(s.mu.pend.quarantine, pext{Start: f.Phys, Len: f.Len})
	}
}

// quarantinedFreeLockedMu counts the held blocks the next commit frees:
// those the quarantine holds as many references of as they have (a block
// not shared has one; a shared block that only loses one of several stays
// used). Caller holds s.mu.
func (s *Store) quarantinedFreeLockedMu() uint64 {
	held := make([]refcount.Range, len(s.mu.pend.quarantine))
	for i, e := range s.mu.pend.quarantine {
		held[i] = refcount.Range{Start: e.Start, Len: e.Len}
	}
	var n uint64
	for _, h := range refcount.Profile(held) {
		s.mu.shared.Pieces(h.Start, h.Len, func(_, l uint64, refs uint32) {
			if refs <= h.Refs {
				n += l
			}
		})
	}
	return n
}

// BlockSize returns the store's allocation unit in bytes.
func (s *Store) BlockSize() int { return int(s.bs) }

// Info describes the store as a whole.
type Info struct {
	UUID        string
	Backing     string
	BlockSize   int
	StoreSize   int64 // bytes of backing
	DataBlocks  uint64
	FreeBlocks  uint64 // includes blocks waiting for a commit to be released
	LargestFree uint64 // blocks
	// ReservedBlocks of FreeBlocks are held by disks' allocation units
	// (placement of their next first writes; given up when space is short).
	ReservedBlocks uint64
	Disks          int
	Extents        int
	JournalBytes   int64
	JournalUsed    int64
	CkptBytes      int64
	Generation     uint64
	MountGen       uint64
	CreatedAt      time.Time
	CapacityBytes  int64 // data region bytes
	FreeBytes      int64
}

// Info returns the store's capacity and use.
func (s *Store) Info() Info {
	s.commitMu.Lock()
	sb, jOff := s.sb, s.jOff
	s.commitMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	free := s.mu.alloc.FreeBlocks() + s.quarantinedFreeLockedMu() + s.mu.reserved
	return Info{
		UUID:           fmt.Sprintf("%x-%x-%x-%x-%x", sb.UUID[0:4], sb.UUID[4:6], sb.UUID[6:8], sb.UUID[8:10], sb.UUID[10:16]),
		Backing:        s.be.Describe(),
		BlockSize:      int(s.bs),
		StoreSize:      int64(sb.StoreSize),
		DataBlocks:     sb.DataBlocks,
		FreeBlocks:     free,
		ReservedBlocks: s.mu.reserved,
		LargestFree:    s.mu.alloc.Largest(),
		Disks:          len(s.mu.names),
		Extents:        s.mu.extents,
		JournalBytes:   s.journalLen,
		JournalUsed:    jOff,
		CkptBytes:      int64(sb.CkptLen),
		Generation:     sb.Generation,
		MountGen:       sb.MountGen,
		CreatedAt:      time.Unix(0, sb.CreatedNano),
		CapacityBytes:  int64(sb.DataBlocks * s.bs),
		FreeBytes:      int64(free * s.bs),
	}
}

// Counters returns a snapshot of the store's I/O counters.
func (s *Store) Counters() CounterSnapshot { return s.stats.snapshot() }

// writeSuper writes sb to both superblock copies, A then B, each flushed,
// so that at every moment at least one copy is complete and current or
// previous.
func (s *Store) writeSuper(sb *superblock) error {
	buf := make([]byte, 2*pageSize)
	page := alignedPage(buf, pageSize)
	sb.encode(page)
	for _, off := range []int64{superAOffset, superBOffset} {
		if _, err := s.be.WriteAt(page, off); err != nil {
			return fmt.Errorf("write superblock at %d: %w", off, err)
		}
		s.stats.metaWrite(pageSize)
		if err := s.flush(); err != nil {
			return fmt.Errorf("flush superblock: %w", err)
		}
	}
	return nil
}
