package image

import "sync"

// rangeLock orders overlapping requests on one disk. A request locks the
// block range it touches, shared (reads) or exclusive (writes, punches,
// truncates), and waits while any held range conflicts with it: two ranges
// conflict when they overlap and at least one is exclusive.
//
// It is what makes read-modify-write of partial blocks and the allocation of a
// hole safe while FUSE sends parallel direct writes, and what keeps a read
// from racing a punch that frees (and lets another disk reuse) its blocks.
//
// The lock is held across the backend I/O of its range (docs/DESIGN.md,
// rule 4): it orders requests, it does not guard shared memory.
type rangeLock struct {
	mu      sync.Mutex
	cond    *sync.Cond // signalled when a range is released and someone waits
	held    []heldRange
	waiters int
}

type heldRange struct {
	first, end uint64 // blocks [first, end)
	exclusive  bool
	id         uint64
}

// lockedRange is a token for releasing a range.
type lockedRange struct {
	l  *rangeLock
	id uint64
}

func newRangeLock() *rangeLock {
	l := &rangeLock{}
	l.cond = sync.NewCond(&l.mu)
	return l
}

// lock acquires blocks [first, first+count), count > 0; count may run to
// the end of the block space (truncate).
func (l *rangeLock) lock(first, count uint64, exclusive bool) lockedRange {
	end := rangeEnd(first, count)
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.conflicts(first, end, exclusive) {
		l.waiters++
		l.cond.Wait()
		l.waiters--
	}
	return l.addLockedMu(first, end, exclusive)
}

// tryLock is lock without waiting: ok is false, and nothing is held, when
// the range conflicts with a held one.
func (l *rangeLock) tryLock(first, count uint64, exclusive bool) (r lockedRange, ok bool) {
	end := rangeEnd(first, count)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conflicts(first, end, exclusive) {
		return lockedRange{}, false
	}
	return l.addLockedMu(first, end, exclusive), true
}

// rangeEnd is the end of blocks [first, first+count), clamped to the end
// of the block space.
func rangeEnd(first, count uint64) uint64 {
	if end := first + count; end >= first {
		return end
	}
	return ^uint64(0)
}

// addLockedMu records a held range. Caller holds l.mu and has checked that it
// does not conflict.
func (l *rangeLock) addLockedMu(first, end uint64, exclusive bool) lockedRange {
	id := uint64(0)
	for _, h := range l.held {
		id = max(id, h.id)
	}
	id++
	l.held = append(l.held, heldRange{first: first, end: end, exclusive: exclusive, id: id})
	return lockedRange{l: l, id: id}
}

func (l *rangeLock) conflicts(first, end uint64, exclusive bool) bool {
	for _, h := range l.held {
		if h.first < end && first < h.end && (exclusive || h.exclusive) {
			return true
		}
	}
	return false
}

func (r lockedRange) unlock() {
	l := r.l
	l.mu.Lock()
	for i, h := range l.held {
		if h.id == r.id {
			last := len(l.held) - 1
			l.held[i] = l.held[last]
			l.held = l.held[:last]
			break
		}
	}
	if l.waiters > 0 {
		l.cond.Broadcast()
	}
	l.mu.Unlock()
}
