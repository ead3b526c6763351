package image

// pending is what the next commit makes durable: the journal records
// appended since the last commit and the blocks they free, in append order.
//
// Invariant: cuts mark where one mutation's records, and the blocks it
// freed, end and the next mutation's begin, so that a commit too large for
// the room it has may take a prefix ending at a cut (takePrefix), never
// part of a mutation. Guarded by Store.mu, like everything in it.
type pending struct {
	recs       []byte // encoded records
	count      uint32 // records in recs
	quarantine []pext // blocks freed by those records, held until they are durable
	cuts       []pendingCut
	// maps: the data some record relies on must be durable before the
	// commit holding it is written: a record maps blocks (the data written
	// into them), or a truncate or punch zeroed part of a block in place
	// before its record (dataFirst). Kept for the whole batch: parts split
	// from it by takePrefix inherit it.
	maps bool
	// more: some record is not a disk's dirty times (addTimes): a
	// truncate, a chmod, a map... A commit of dirty times alone that
	// nobody waits for (the timer's) needs no flush: see
	// Store.commitBackground. Kept for the whole batch, like maps.
	more bool
}

// pendingCut is the state of a pending just before one of its mutations
// (the first has none: a prefix that ends there is empty).
type pendingCut struct {
	bytes int    // len(recs)
	count uint32 // count
	quar  int    // len(quarantine)
}

// add appends one mutation's records.
func (p *pending) add(recs []record) {
	if p.count > 0 {
		p.cuts = append(p.cuts, pendingCut{bytes: len(p.recs), count: p.count, quar: len(p.quarantine)})
	}
	for i := range recs {
		p.recs = appendRecord(p.recs, &recs[i])
		p.maps = p.maps || recs[i].Type == recMap || recs[i].Type == recMapTweak || recs[i].Type == recClone
	}
	p.count += uint32(len(recs))
	p.more = true
}

// addTimes appends the attr record that journals a disk's dirty access and
// modification times (Store.appendDirtyTimes): one mutation, which alone
// does not make the batch need a flush (more).
func (p *pending) addTimes(rec record) {
	more := p.more
	p.add([]record{rec})
	p.more = more
}

// dataFirst makes the next commit flush the data before it writes the
// journal, as for a map record: data was written in place that a record
// appended later relies on (a truncate or punch zeroed the tail of a
// partial block, and its size or punch record must not be durable without
// that zeroing). Call it after that write completed: whichever commit takes
// the flag flushes after the write, before the record can be durable.
func (p *pending) dataFirst() { p.maps = true }

// hold quarantines blocks freed by the mutation added last.
func (p *pending) hold(freed []pext) { p.quarantine = append(p.quarantine, freed...) }

// take removes and returns everything.
func (p *pending) take() pending {
	all := *p
	*p = pending{}
	return all
}

// takePrefix removes and returns the longest prefix of whole mutations
// whose commit (commitSize) takes at most room bytes; false, and nothing
// taken, when not even the first mutation fits.
func (p *pending) takePrefix(room int64) (pending, bool) {
	if commitSize(len(p.recs), p.count) <= room {
		return p.take(), true
	}
	i := len(p.cuts) - 1
	for i >= 0 && commitSize(p.cuts[i].bytes, p.cuts[i].count) > room {
		i--
	}
	if i < 0 {
		return pending{}, false
	}
	c := p.cuts[i]
	c.quar = min(c.quar, len(p.quarantine)) // Repair may have dropped the quarantine
	part := pending{recs: p.recs[:c.bytes:c.bytes], count: c.count, quarantine: p.quarantine[:c.quar:c.quar], cuts: p.cuts[:i:i], maps: p.maps, more: p.more}
	rest := pending{
		recs:       append([]byte(nil), p.recs[c.bytes:]...),
		count:      p.count - c.count,
		quarantine: append([]pext(nil), p.quarantine[c.quar:]...),
		maps:       p.maps,
		more:       p.more,
	}
	for _, later := range p.cuts[i+1:] {
		rest.cuts = append(rest.cuts, pendingCut{bytes: later.bytes - c.bytes, count: later.count - c.count, quar: max(later.quar-c.quar, 0)})
	}
	*p = rest
	return part, true
}

// prepend puts earlier, taken before everything now in p, back in front.
func (p *pending) prepend(earlier pending) {
	if earlier.count == 0 && len(earlier.quarantine) == 0 {
		return
	}
	joined := pending{
		recs:       append(earlier.recs, p.recs...),
		count:      earlier.count + p.count,
		quarantine: append(earlier.quarantine, p.quarantine...),
		cuts:       earlier.cuts,
		maps:       earlier.maps || p.maps,
	}
	if p.count > 0 && earlier.count > 0 {
		joined.cuts = append(joined.cuts, pendingCut{bytes: len(earlier.recs), count: earlier.count, quar: len(earlier.quarantine)})
	}
	for _, c := range p.cuts {
		joined.cuts = append(joined.cuts, pendingCut{bytes: c.bytes + len(earlier.recs), count: c.count + earlier.count, quar: c.quar + len(earlier.quarantine)})
	}
	*p = joined
}

// commitSize is the journal space a commit of count records encoded in
// bytes takes: whole pages, none when there are no records.
func commitSize(bytes int, count uint32) int64 {
	if count == 0 {
		return 0
	}
	return (commitHeaderLen + int64(bytes) + pageSize - 1) / pageSize * pageSize
}
