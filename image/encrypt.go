package image

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
	"github.com/vdiskfs/vdiskfs/crypt"
)

// Encrypted disks (format version 3, featEncrypted). The rules:
//
//   - A disk is encrypted from its creation (CreateEncrypted: records
//     recCreate and recCrypt in one unit) and stays so; d.enc is set then
//     (or when the store is loaded) and never changes, so it is read
//     without a lock.
//   - Every block of an encrypted disk is AES-XTS ciphertext under the
//     disk's data key, with the tweak its extent gives it (blockmap: block
//     v's tweak is v+TweakOff). A block keeps its tweak wherever it is
//     moved or shared (defrag, clones, snapshots, copies), so none of
//     those needs the key. New blocks get the disk's tweak base plus their
//     virtual block; a snapshot, clone or copy (within one disk too) gives
//     the disks that can be written a fresh base, so a copy-on-write block
//     never takes the tweak its shared original has under the same key.
//   - Writes are encrypted in the plan into the store's own bounce buffer,
//     never in the caller's; reads are decrypted in place in the buffer
//     they were read into, when the plan finishes. A locked disk (no key
//     given since the store opened) refuses data I/O with ErrLocked; its
//     catalog entry, map and slot table need no key.
//   - Blocks are shared only between disks with the same data key (the
//     slot table's check value): Check reports anything else as fatal.
//   - The store keeps one Cipher per key (Store.mu.ciphers), so unlocking
//     one disk unlocks every disk with its key (its clones and snapshots).

// diskCrypt is an encrypted disk's state.
type diskCrypt struct {
	// check is the data key's check value (crypt.SlotTable.Check): the
	// key's identity. Never changes.
	check [16]byte
	// Guarded by disk.mu (changed with a recCrypt record):
	tweakBase uint64 // the tweak of virtual block 0 for new blocks
	slots     string // the encoded crypt.SlotTable
	// cipher is the data key's cipher once given (nil: locked); the same
	// for every disk with this key.
	cipher atomic.Pointer[crypt.Cipher]
}

// newDiskCrypt decodes slots (validated by the record's or checkpoint's
// decoder) into a locked disk's state.
func newDiskCrypt(tweakBase uint64, slots string) (*diskCrypt, error) {
	tab, err := crypt.DecodeSlotTable([]byte(slots))
	if err != nil {
		return nil, fmt.Errorf("key slots: %w: %w", ErrCorrupt, err)
	}
	return &diskCrypt{check: tab.Check, tweakBase: tweakBase, slots: slots}, nil
}

// newTweakBase is a random tweak base below 2^63: with virtual blocks
// below 2^50 a block's tweak never wraps.
func newTweakBase() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("tweak base: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) & maxTweakBase, nil
}

// cryptRecordLockedMu is d's recCrypt record as it stands. Caller holds
// d.mu.
func (d *disk) cryptRecordLockedMu() record {
	return record{Type: recCrypt, ID: d.id, Tweak: d.enc.tweakBase, Slots: d.enc.slots}
}

// freshTweakBasesLockedMu gives each of ds a new tweak base and returns
// recs with their records appended. Caller holds the d.mu of each; each is
// encrypted.
func freshTweakBasesLockedMu(recs []record, ds ...*disk) ([]record, error) {
	for _, d := range ds {
		base, err := newTweakBase()
		if err != nil {
			return recs, err
		}
		d.enc.tweakBase = base
		recs = append(recs, d.cryptRecordLockedMu())
	}
	return recs, nil
}

// cipher returns the cipher of d's data (nil for a plain disk), or
// ErrLocked, naming the disk, when its key has not been given.
func (d *disk) cipher() (*crypt.Cipher, error) {
	if d.enc == nil {
		return nil, nil
	}
	if c := d.enc.cipher.Load(); c != nil {
		return c, nil
	}
	d.mu.RLock()
	name := d.name
	d.mu.RUnlock()
	return nil, fmt.Errorf("disk %q: %w", name, ErrLocked)
}

// sameKey reports whether blocks may be shared between a and b: both
// plain, or both encrypted under one data key.
func sameKey(a, b *disk) bool {
	if a.enc == nil || b.enc == nil {
		return a.enc == nil && b.enc == nil
	}
	return a.enc.check == b.enc.check
}

// mapRecord is the record that maps e on d: recMapTweak, with e's tweak,
// on an encrypted disk.
func (d *disk) mapRecord(e blockmap.Extent) record {
	if d.enc != nil {
		return record{Type: recMapTweak, ID: d.id, Virt: e.Virt, Phys: e.Phys, Len: e.Len, Tweak: e.Tweak()}
	}
	return record{Type: recMap, ID: d.id, Virt: e.Virt, Phys: e.Phys, Len: e.Len}
}

// tweakNew gives the segments of out carved from allocs (a write's new
// blocks) the tweaks of new blocks: base plus their virtual block.
func tweakNew(out []blockmap.Segment, allocs []pext, base uint64) {
	for i := range out {
		if isAllocated(out[i], allocs) {
			out[i].Tweak = base + out[i].Virt
		}
	}
}

// encryptSegs encrypts the data segments segs (covering virtual blocks
// from first on) of src into buf, each with its tweak. src may be buf.
func encryptSegs(c *crypt.Cipher, buf, src []byte, segs []blockmap.Segment, first, bs uint64) {
	for _, sg := range segs {
		if sg.Hole {
			continue
		}
		lo, hi := (sg.Virt-first)*bs, (sg.Virt-first+sg.Len)*bs
		c.EncryptBlocks(buf[lo:hi], src[lo:hi], sg.Tweak)
	}
}

// decryptSegs decrypts in place the data segments segs of buf (covering
// virtual blocks from first on), and returns the bytes decrypted.
func decryptSegs(c *crypt.Cipher, buf []byte, segs []blockmap.Segment, first, bs uint64) uint64 {
	var n uint64
	for _, sg := range segs {
		if sg.Hole {
			continue
		}
		lo, hi := (sg.Virt-first)*bs, min((sg.Virt-first+sg.Len)*bs, uint64(len(buf)))
		c.DecryptBlocks(buf[lo:hi], buf[lo:hi], sg.Tweak)
		n += hi - lo
	}
	return n
}

// upgradeCrypt makes the store version 3 (encrypted disks) if it is not:
// shared blocks and encrypted disks, superblock first.
func (s *Store) upgradeCrypt() error {
	if err := s.upgradeTo(featShared|featEncrypted, cryptVersion); err != nil {
		return err
	}
	s.crypted.Store(true)
	return nil
}

// CreateEncrypted makes a new empty encrypted disk of size bytes, with a
// new random data key sealed in one key slot opened by secret (params:
// the Argon2id cost of a passphrase slot; zero for crypt.DefaultArgon2).
// The disk is unlocked at once. The store becomes version 3.
func (s *Store) CreateEncrypted(name string, size int64, a Attr, secret *crypt.Secret, params crypt.Argon2Params) (DiskInfo, error) {
	if err := s.upgradeCrypt(); err != nil {
		return DiskInfo{}, fmt.Errorf("create disk %q: %w", name, err)
	}
	enc, c, err := s.newKey(secret, params)
	if err != nil {
		return DiskInfo{}, fmt.Errorf("create disk %q: %w", name, err)
	}
	info, err := s.create(name, size, a, enc)
	if err != nil {
		return DiskInfo{}, err
	}
	s.shareCipher(enc.check, c)
	return info, nil
}

// newKey makes a data key, its slot table with one slot opened by secret,
// a disk's state for it with a new tweak base, and its cipher. The data
// key itself is closed before it returns.
func (s *Store) newKey(secret *crypt.Secret, params crypt.Argon2Params) (*diskCrypt, *crypt.Cipher, error) {
	if params == (crypt.Argon2Params{}) {
		params = crypt.DefaultArgon2
	}
	key, err := crypt.NewDataKey()
	if err != nil {
		return nil, nil, err
	}
	defer key.Close()
	tab := crypt.NewSlotTable(key)
	if _, err := tab.AddSlot(key, secret, params); err != nil {
		return nil, nil, err
	}
	slots, err := tab.MarshalBinary()
	if err != nil {
		return nil, nil, err
	}
	c, err := crypt.NewCipher(key, int(s.bs))
	if err != nil {
		return nil, nil, err
	}
	base, err := newTweakBase()
	if err != nil {
		return nil, nil, err
	}
	return &diskCrypt{check: tab.Check, tweakBase: base, slots: string(slots)}, c, nil
}

// shareCipher makes c the cipher of every disk whose key has check value
// check, and of those made later with it (clones, snapshots).
func (s *Store) shareCipher(check [16]byte, c *crypt.Cipher) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.ciphers == nil {
		s.mu.ciphers = make(map[[16]byte]*crypt.Cipher)
	}
	if old := s.mu.ciphers[check]; old != nil {
		c = old
	}
	s.mu.ciphers[check] = c
	n := 0
	for _, d := range s.mu.disks {
		if d.enc != nil && d.enc.check == check {
			d.enc.cipher.Store(c)
			n++
		}
	}
	return n
}

// slotTable returns the named disk and its slot table as it stands.
func (s *Store) slotTable(name string) (*disk, *crypt.SlotTable, error) {
	s.mu.Lock()
	d, ok := s.mu.names[name]
	s.mu.Unlock()
	if !ok {
		return nil, nil, fmt.Errorf("disk %q: %w", name, ErrNotExist)
	}
	if d.enc == nil {
		return nil, nil, fmt.Errorf("disk %q: %w", name, ErrNotEncrypted)
	}
	d.mu.RLock()
	slots := d.enc.slots
	d.mu.RUnlock()
	tab, err := crypt.DecodeSlotTable([]byte(slots))
	if err != nil {
		return nil, nil, fmt.Errorf("disk %q: key slots: %w: %w", name, ErrCorrupt, err)
	}
	return d, tab, nil
}

// openSlot opens tab with secret: the data key, or ErrWrongKey.
func openSlot(name string, tab *crypt.SlotTable, secret *crypt.Secret) (*crypt.DataKey, error) {
	key, _, err := tab.Unlock(secret)
	switch {
	case errors.Is(err, crypt.ErrWrongKey):
		return nil, fmt.Errorf("disk %q: %w: %w", name, ErrWrongKey, err)
	case err != nil:
		return nil, fmt.Errorf("disk %q: %w", name, err)
	}
	return key, nil
}

// Unlock gives the key of the encrypted disk called name: secret must
// open one of its key slots (else ErrWrongKey, and nothing changes). The
// disk, and every disk with the same data key, can then be read and
// written until the store closes. It returns how many disks that is. A
// disk unlocked already is unlocked again (the secret is still checked).
func (s *Store) Unlock(name string, secret *crypt.Secret) (int, error) {
	d, tab, err := s.slotTable(name)
	if err != nil {
		return 0, fmt.Errorf("unlock: %w", err)
	}
	key, err := openSlot(name, tab, secret)
	if err != nil {
		if errors.Is(err, ErrWrongKey) {
			s.stats.UnlockFailures.Add(1)
		}
		return 0, fmt.Errorf("unlock: %w", err)
	}
	c, err := crypt.NewCipher(key, int(s.bs))
	key.Close()
	if err != nil {
		return 0, fmt.Errorf("unlock disk %q: %w", name, err)
	}
	n := s.shareCipher(d.enc.check, c)
	s.log.WithField("disk", name).WithField("disks", n).Info("encrypted disks unlocked")
	s.zeroEncryptedTails(d.enc.check, c)
	return n, nil
}

// zeroEncryptedTails is zeroStaleTails (which Open cannot do without the
// key) for the disks with key check value check, once their key c is
// given. Failures are logged: the disks are unlocked all the same.
func (s *Store) zeroEncryptedTails(check [16]byte, c *crypt.Cipher) {
	if s.writable() != nil {
		return
	}
	s.mu.Lock()
	var ds []*disk
	for _, d := range s.mu.disks {
		if d.enc != nil && d.enc.check == check {
			ds = append(ds, d)
		}
	}
	s.mu.Unlock()
	for _, d := range ds {
		if err := d.zeroEncryptedTail(c); err != nil {
			s.log.WithError(err).WithField("disk_id", d.id).Warn("zeroing bytes past the end of an encrypted disk")
		}
	}
}

// zeroEncryptedTail zeroes, in place, the bytes past the end of d in its
// last block, decrypted with c, where a crash left anything else there
// (zeroTail, as zeroStaleTails does for plain disks), under an exclusive
// range lock of the block.
func (d *disk) zeroEncryptedTail(c *crypt.Cipher) error {
	s, bs := d.s, d.s.bs
	d.mu.RLock()
	v := uint64(d.attr.Size) / bs
	d.mu.RUnlock()
	lr := d.ranges.lock(v, 1, true)
	defer lr.unlock()
	d.mu.RLock()
	size := uint64(d.attr.Size)
	sg := d.m.Lookup(nil, v, 1)[0]
	gone := d.deleted
	d.mu.RUnlock()
	if gone || size%bs == 0 || size/bs != v || sg.Hole {
		return nil
	}
	s.mu.Lock()
	shared := s.mu.shared.Shared(sg.Phys, 1)
	s.mu.Unlock()
	buf := s.pool.Get(int(bs))
	defer s.pool.Put(buf)
	sc := getScratch()
	defer putScratch(sc)
	fields := logrus.Fields{"disk_id": d.id, "encrypted": true, "size": size, "block": sg.Phys}
	return s.zeroTail(s.stats.shard(sc), buf, size, sg, shared, c, fields)
}

// Lock forgets the key of the encrypted disk called name: it and every
// disk with its key are locked again, as after the store opened. It is
// refused (ErrBusy) while any of them is open. It returns how many disks
// it locked.
func (s *Store) Lock(name string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.mu.names[name]
	switch {
	case !ok:
		return 0, fmt.Errorf("lock disk %q: %w", name, ErrNotExist)
	case d.enc == nil:
		return 0, fmt.Errorf("lock disk %q: %w", name, ErrNotEncrypted)
	}
	var family []*disk
	for _, x := range s.mu.disks {
		if x.enc != nil && x.enc.check == d.enc.check {
			if x.opens > 0 {
				return 0, fmt.Errorf("lock disk %q: disk %q has its key and is open: %w", name, x.name, ErrBusy)
			}
			family = append(family, x)
		}
	}
	for _, x := range family {
		x.enc.cipher.Store(nil)
	}
	delete(s.mu.ciphers, d.enc.check)
	s.log.WithField("disk", name).WithField("disks", len(family)).Info("encrypted disks locked")
	return len(family), nil
}

// KeySlot describes one key slot of an encrypted disk (no key material).
type KeySlot struct {
	ID     uint32
	Kind   string // "keyfile" or "passphrase"
	Argon2 crypt.Argon2Params
}

// KeySlots lists the key slots of the encrypted disk called name; no key
// is needed.
func (s *Store) KeySlots(name string) ([]KeySlot, error) {
	_, tab, err := s.slotTable(name)
	if err != nil {
		return nil, err
	}
	out := make([]KeySlot, 0, len(tab.Slots))
	for _, sl := range tab.Slots {
		out = append(out, KeySlot{ID: sl.ID, Kind: sl.Kind.String(), Argon2: sl.Argon2})
	}
	return out, nil
}

// AddKey adds a key slot opened by add (params: its Argon2id cost when it
// is a passphrase; zero for crypt.DefaultArgon2) to the encrypted disk
// called name; have must open one of its slots. No data is touched. It
// returns the new slot's id.
func (s *Store) AddKey(name string, have, add *crypt.Secret, params crypt.Argon2Params) (uint32, error) {
	if params == (crypt.Argon2Params{}) {
		params = crypt.DefaultArgon2
	}
	var id uint32
	err := s.changeSlots(name, have, func(tab *crypt.SlotTable, key *crypt.DataKey) error {
		var err error
		id, err = tab.AddSlot(key, add, params)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("add key to disk %q: %w", name, err)
	}
	return id, nil
}

// RemoveKey removes key slot id of the encrypted disk called name; have
// must open one of its slots (it may be the one removed). The last slot
// is never removed (crypt.ErrLastSlot).
func (s *Store) RemoveKey(name string, have *crypt.Secret, id uint32) error {
	err := s.changeSlots(name, have, func(tab *crypt.SlotTable, _ *crypt.DataKey) error {
		return tab.RemoveSlot(id)
	})
	if err != nil {
		return fmt.Errorf("remove key slot %d of disk %q: %w", id, name, err)
	}
	return nil
}

// changeSlots applies change to the named disk's slot table, opened with
// have, and journals the new table. The slow part (a passphrase's
// Argon2id) runs without locks; if the table changed meanwhile it starts
// again.
func (s *Store) changeSlots(name string, have *crypt.Secret, change func(*crypt.SlotTable, *crypt.DataKey) error) error {
	for {
		d, tab, err := s.slotTable(name)
		if err != nil {
			return err
		}
		before, err := tab.MarshalBinary()
		if err != nil {
			return err
		}
		key, err := openSlot(name, tab, have)
		if err != nil {
			return err
		}
		err = change(tab, key)
		key.Close()
		if err != nil {
			return err
		}
		after, err := tab.MarshalBinary()
		if err != nil {
			return err
		}
		done, err := s.replaceSlots(d, string(before), string(after))
		if done || err != nil {
			return err
		}
	}
}

// replaceSlots journals after as d's slot table if it still is before,
// and reports whether it did.
func (s *Store) replaceSlots(d *disk, before, after string) (bool, error) {
	unlock, err := s.lockCatalog(d)
	if err != nil {
		return false, err
	}
	defer unlock()
	if d.deleted {
		return false, ErrNotExist
	}
	if d.enc.slots != before {
		return false, nil
	}
	d.enc.slots = after
	s.appendLockedMu(d.cryptRecordLockedMu())
	return true, nil
}

// crossKey is ErrCrossKey for blocks of src shared into dst.
func crossKey(dst, src *disk) error {
	return fmt.Errorf("disk %d (%s) and disk %d (%s): %w", src.id, kindOf(src), dst.id, kindOf(dst), ErrCrossKey)
}

// kindOf says whether d is plain or encrypted, for messages.
func kindOf(d *disk) string {
	if d.enc == nil {
		return "plain"
	}
	return "encrypted"
}

// replayCrypt replays a recCrypt record onto d: it makes d encrypted (the
// record that follows its creation) or changes its tweak base and slot
// table. A disk's key never changes.
func (s *Store) replayCrypt(d *disk, r *record, bad func(string, ...any)) {
	if s.sb.version() < cryptVersion {
		bad("record type %d in a store of version %d", r.Type, s.sb.version())
		return
	}
	enc, err := newDiskCrypt(r.Tweak, r.Slots)
	switch {
	case err != nil:
		bad("disk %d: %v", d.id, err)
	case d.enc == nil && d.m.Len() > 0:
		bad("disk %d is made encrypted with blocks mapped", d.id)
	case d.enc == nil:
		d.enc = enc
	case d.enc.check != enc.check:
		bad("disk %d changes its data key", d.id)
	default:
		d.enc.tweakBase, d.enc.slots = enc.tweakBase, enc.slots
	}
}

// extentOf is the extent that maps, at virtual block virt of d, the
// blocks of data segment sg (of a lookup, of d or of another disk, or of a
// write's new blocks): on an encrypted disk they keep their tweaks.
func (d *disk) extentOf(sg blockmap.Segment, virt uint64) blockmap.Extent {
	e := blockmap.Extent{Virt: virt, Phys: sg.Phys, Len: sg.Len}
	if d.enc != nil {
		e.TweakOff = sg.Tweak - virt
	}
	return e
}

// writeEncryptedZeros writes the blocks of data segment sg (new blocks of
// an encrypted disk) as zeros encrypted under their tweaks.
func (s *Store) writeEncryptedZeros(c *crypt.Cipher, sg blockmap.Segment) error {
	buf := s.pool.Get(maxRunBytes)
	defer s.pool.Put(buf)
	sc := getScratch()
	defer putScratch(sc)
	shard := s.stats.shard(sc)
	per := uint64(maxRunBytes) / s.bs
	for done := uint64(0); done < sg.Len; done += per {
		n := min(per, sg.Len-done)
		b := buf[:n*s.bs]
		clear(b)
		c.EncryptBlocks(b, b, sg.Tweak+done)
		if err := s.writeData(shard, b, sg.Phys+done, false); err != nil {
			return err
		}
	}
	return nil
}

// CreateHiddenEncrypted is CreateHidden for an encrypted disk: with a new
// data key sealed in one slot opened by secret, or, when like is not nil,
// with like's data key and key slots (like must be an unlocked encrypted
// disk), so that like's blocks can be shared into it (an incremental
// receive starts from its base).
func (s *Store) CreateHiddenEncrypted(size int64, a Attr, secret *crypt.Secret, like *Disk) (*Disk, error) {
	if err := s.upgradeCrypt(); err != nil {
		return nil, fmt.Errorf("create hidden disk: %w", err)
	}
	var enc *diskCrypt
	var c *crypt.Cipher
	if like != nil {
		l := like.d
		var err error
		if c, err = l.cipher(); err != nil {
			return nil, fmt.Errorf("create hidden disk: %w", err)
		}
		if c == nil {
			return nil, fmt.Errorf("create hidden disk like disk %d: %w", l.id, ErrNotEncrypted)
		}
		base, err := newTweakBase()
		if err != nil {
			return nil, err
		}
		l.mu.RLock()
		enc = &diskCrypt{check: l.enc.check, slots: l.enc.slots, tweakBase: base}
		l.mu.RUnlock()
	} else {
		var err error
		if enc, c, err = s.newKey(secret, crypt.Argon2Params{}); err != nil {
			return nil, fmt.Errorf("create hidden disk: %w", err)
		}
	}
	h, err := s.createHidden(size, a, enc)
	if err != nil {
		return nil, err
	}
	s.shareCipher(enc.check, c)
	return h, nil
}

// Encrypted reports whether the disk is encrypted, and Locked whether its
// key is still to be given.
func (h *Disk) Encrypted() (encrypted, locked bool) {
	d := h.d
	return d.enc != nil, d.enc != nil && d.enc.cipher.Load() == nil
}

// RawPiece is a piece of an encrypted disk's blocks as ReadRaw found
// them: a hole, or ciphertext whose first block has tweak Tweak (the next
// blocks' following).
type RawPiece struct {
	Off, Len int64 // bytes: whole blocks
	Hole     bool
	Tweak    uint64
}

// rawRange checks that the disk is encrypted and [off, off+n) whole
// blocks, and returns its blocks.
func (h *Disk) rawRange(off int64, n int) (first, count uint64, err error) {
	if err := h.live(); err != nil {
		return 0, 0, err
	}
	d, bs := h.d, h.d.s.bs
	if d.enc == nil {
		return 0, 0, fmt.Errorf("disk %d: %w", d.id, ErrNotEncrypted)
	}
	if off < 0 || uint64(off)%bs != 0 || uint64(n)%bs != 0 || n == 0 {
		return 0, 0, fmt.Errorf("disk %d: raw blocks [%d,+%d) of %d bytes each: %w", d.id, off, n, bs, ErrInvalid)
	}
	return uint64(off) / bs, uint64(n) / bs, nil
}

// ReadRaw reads the blocks [off, off+len(p)) of an encrypted disk as they
// are stored, ciphertext, into p (holes, and blocks past the last one
// holding the size, as zeros), and appends to dst the pieces it found with
// their tweaks. It needs no key: a raw send.
func (h *Disk) ReadRaw(p []byte, off int64, dst []RawPiece) ([]RawPiece, error) {
	first, count, err := h.rawRange(off, len(p))
	if err != nil {
		return dst, err
	}
	d, bs := h.d, h.d.s.bs
	lr := d.ranges.lock(first, count, false)
	defer lr.unlock()
	d.mu.RLock()
	segs := d.m.Lookup(nil, first, count)
	d.mu.RUnlock()
	if err := d.readRawLockedRange(p, off); err != nil {
		return dst, fmt.Errorf("disk %d raw read at %d: %w", d.id, off, err)
	}
	for _, sg := range segs {
		dst = append(dst, RawPiece{Off: int64(sg.Virt * bs), Len: int64(sg.Len * bs), Hole: sg.Hole, Tweak: sg.Tweak})
	}
	return dst, nil
}

// WriteRaw writes p, ciphertext under the disk's data key (a raw
// stream's), as the blocks [off, off+len(p)) of an encrypted disk, the
// first with tweak tweak and each next one's the next: into new blocks,
// whatever was mapped there. It needs no key. The disk does not grow: the
// blocks must end by the last one holding the size.
func (h *Disk) WriteRaw(p []byte, off int64, tweak uint64) error {
	if _, _, err := h.rawRange(off, len(p)); err != nil {
		return err
	}
	d := h.d
	if math.MaxUint64-tweak < uint64(len(p))/d.s.bs-1 {
		return fmt.Errorf("disk %d raw write at %d: tweaks from %d wrap: %w", d.id, off, tweak, ErrInvalid)
	}
	d.mu.RLock()
	end := int64(coalesce.RoundUp(uint64(d.attr.Size), d.s.bs))
	d.mu.RUnlock()
	if off+int64(len(p)) > end {
		return fmt.Errorf("disk %d raw write [%d,+%d) past its last block: %w", d.id, off, len(p), ErrInvalid)
	}
	var pl IOPlan
	if err := h.prepare(&pl, p, off, planMode{write: true, wait: true, raw: true, rawTweak: tweak}); err != nil {
		return fmt.Errorf("disk %d raw write at %d: %w", d.id, off, err)
	}
	if err := pl.perform(); err != nil {
		return fmt.Errorf("disk %d raw write at %d: %w", d.id, off, err)
	}
	return nil
}

// SlotTable is an encrypted disk's encoded key slot table (crypt), and
// false for a plain disk.
func (h *Disk) SlotTable() (string, bool) {
	d := h.d
	if d.enc == nil {
		return "", false
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.enc.slots, true
}

// CreateHiddenRaw is CreateHidden for a disk a raw stream fills
// (WriteRaw): encrypted under the data key the encoded slot table slots
// seals, or, when like is not nil, like's (an incremental raw stream's
// base, whose blocks it shares). It needs no key; the disk is unlocked
// when another disk with its key is.
func (s *Store) CreateHiddenRaw(size int64, a Attr, slots string, like *Disk) (*Disk, error) {
	if like != nil {
		var ok bool
		if slots, ok = like.SlotTable(); !ok {
			return nil, fmt.Errorf("create hidden disk like disk %d: %w", like.d.id, ErrNotEncrypted)
		}
	}
	if err := validateCrypt(0, slots); err != nil {
		return nil, fmt.Errorf("create hidden disk: %w", err)
	}
	if err := s.upgradeCrypt(); err != nil {
		return nil, fmt.Errorf("create hidden disk: %w", err)
	}
	base, err := newTweakBase()
	if err != nil {
		return nil, err
	}
	enc, err := newDiskCrypt(base, slots)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	enc.cipher.Store(s.mu.ciphers[enc.check])
	s.mu.Unlock()
	return s.createHidden(size, a, enc)
}
