package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"

	"golang.org/x/crypto/argon2"
)

// SlotKind says what opens a key slot.
type SlotKind uint8

const (
	// KindKeyFile: a 32-byte key file; KEK = HKDF-SHA256(file, salt).
	KindKeyFile SlotKind = 1
	// KindPassphrase: a passphrase; KEK = Argon2id(passphrase, salt, params).
	KindPassphrase SlotKind = 2
)

func (k SlotKind) String() string {
	switch k {
	case KindKeyFile:
		return "keyfile"
	case KindPassphrase:
		return "passphrase"
	}
	return fmt.Sprintf("kind%d", uint8(k))
}

// Labels bound into the derivations, part of the format.
const (
	checkLabel   = "vdiskfs data key check v1"
	keyFileLabel = "vdiskfs key file slot v1"
	kekSize      = 32
)

// Argon2Params are a passphrase slot's Argon2id cost, recorded in the slot.
type Argon2Params struct {
	Time      uint32 // passes over the memory
	MemoryKiB uint32
	Threads   uint8
}

// Bounds on Argon2Params. The upper ones keep a crafted slot table from
// making Unlock spend unbounded time or memory.
const (
	maxArgon2Time      = 64
	maxArgon2MemoryKiB = 4 << 20 // 4 GiB
)

// DefaultArgon2 is RFC 9106's second recommended option: 3 passes over
// 64 MiB, 4 lanes.
var DefaultArgon2 = Argon2Params{Time: 3, MemoryKiB: 64 << 10, Threads: 4}

// Validate checks p against Argon2's own limits and this package's bounds.
func (p Argon2Params) Validate() error {
	switch {
	case p.Threads < 1:
		return fmt.Errorf("crypt: Argon2id with %d threads: %w", p.Threads, ErrInvalid)
	case p.Time < 1 || p.Time > maxArgon2Time:
		return fmt.Errorf("crypt: Argon2id time %d, want 1 to %d: %w", p.Time, maxArgon2Time, ErrInvalid)
	case p.MemoryKiB < 8*uint32(p.Threads) || p.MemoryKiB > maxArgon2MemoryKiB:
		return fmt.Errorf("crypt: Argon2id memory %d KiB, want %d to %d for %d threads: %w",
			p.MemoryKiB, 8*uint32(p.Threads), maxArgon2MemoryKiB, p.Threads, ErrInvalid)
	}
	return nil
}

// SlotTable is a disk's key slots: its data key sealed once per slot, each
// slot under a key-encryption key (KEK) derived from its own secret. The
// encoding is in slotformat.go. A SlotTable is a value with no locks: the
// caller serialises changes.
type SlotTable struct {
	Cipher uint16
	// Check is the data key's check value (checkValue): it identifies the
	// key without revealing it, so that a slot that authenticates but holds
	// another key is found, and a key is matched to a table without a slot.
	Check [checkSize]byte
	Slots []Slot
}

// Slot is one sealed copy of the data key.
type Slot struct {
	ID      uint32
	Kind    SlotKind
	Argon2  Argon2Params // zero for KindKeyFile
	Salt    [saltSize]byte
	Nonce   [nonceSize]byte
	Wrapped [wrappedSize]byte // AES-256-GCM(KEK, nonce, data key, slotAAD)
}

// NewSlotTable returns a table for key with no slots yet: it is valid once
// AddSlot has added one.
func NewSlotTable(key *DataKey) *SlotTable {
	return &SlotTable{Cipher: CipherAESXTS256, Check: checkValue(key)}
}

// checkValue is HMAC-SHA256(key, checkLabel) cut to 16 bytes.
func checkValue(key *DataKey) [checkSize]byte {
	m := hmac.New(sha256.New, key.bytes())
	m.Write([]byte(checkLabel))
	var c [checkSize]byte
	copy(c[:], m.Sum(nil))
	return c
}

// Matches reports whether key is this table's data key.
func (t *SlotTable) Matches(key *DataKey) bool {
	c := checkValue(key)
	return subtle.ConstantTimeCompare(c[:], t.Check[:]) == 1
}

// AddSlot seals key into a new slot opened by s and returns the slot's id.
// params is used for a passphrase slot only. key must be the table's.
func (t *SlotTable) AddSlot(key *DataKey, s *Secret, params Argon2Params) (uint32, error) {
	if !t.Matches(key) {
		return 0, fmt.Errorf("crypt: adding a key slot: the key is not this table's: %w", ErrInvalid)
	}
	if len(t.Slots) >= MaxSlots {
		return 0, fmt.Errorf("crypt: adding a key slot: %d slots: %w", len(t.Slots), ErrTooManySlots)
	}
	slot := Slot{Kind: s.kind}
	for _, o := range t.Slots {
		slot.ID = max(slot.ID, o.ID)
	}
	slot.ID++
	if slot.ID == 0 {
		return 0, fmt.Errorf("crypt: adding a key slot: slot ids exhausted: %w", ErrTooManySlots)
	}
	switch s.kind {
	case KindPassphrase:
		if err := params.Validate(); err != nil {
			return 0, fmt.Errorf("crypt: adding a key slot: %w", err)
		}
		slot.Argon2 = params
	case KindKeyFile:
	default:
		return 0, fmt.Errorf("crypt: adding a key slot: secret of kind %v: %w", s.kind, ErrInvalid)
	}
	if _, err := rand.Read(slot.Salt[:]); err != nil {
		return 0, fmt.Errorf("crypt: key slot salt: %w", err)
	}
	if _, err := rand.Read(slot.Nonce[:]); err != nil {
		return 0, fmt.Errorf("crypt: key slot nonce: %w", err)
	}
	aead, err := slotAEAD(s, &slot)
	if err != nil {
		return 0, err
	}
	aad := slotAAD(t, &slot)
	aead.Seal(slot.Wrapped[:0], slot.Nonce[:], key.bytes(), aad[:])
	t.Slots = append(t.Slots, slot)
	return slot.ID, nil
}

// RemoveSlot removes the slot with that id. It refuses to remove the last
// slot (ErrLastSlot): the data key would be lost with it.
func (t *SlotTable) RemoveSlot(id uint32) error {
	for i := range t.Slots {
		if t.Slots[i].ID != id {
			continue
		}
		if len(t.Slots) == 1 {
			return fmt.Errorf("crypt: removing key slot %d: %w", id, ErrLastSlot)
		}
		t.Slots = append(t.Slots[:i:i], t.Slots[i+1:]...)
		return nil
	}
	return fmt.Errorf("crypt: removing key slot %d: %w", id, ErrNoSlot)
}

// Unlock opens the data key with s, trying every slot of s's kind in turn,
// and returns the key and the id of the slot that opened it. When none
// opens it returns ErrWrongKey; a slot that opens but holds a key other
// than the table's is ErrCorrupt.
func (t *SlotTable) Unlock(s *Secret) (*DataKey, uint32, error) {
	if err := t.Validate(); err != nil {
		return nil, 0, err
	}
	tried := 0
	for i := range t.Slots {
		slot := &t.Slots[i]
		if slot.Kind != s.kind {
			continue
		}
		tried++
		aead, err := slotAEAD(s, slot)
		if err != nil {
			return nil, 0, err
		}
		buf, err := newLockedBuf(DataKeySize)
		if err != nil {
			return nil, 0, err
		}
		aad := slotAAD(t, slot)
		// Open writes the key straight into the locked buffer's capacity.
		if _, err := aead.Open(buf.mem[:0], slot.Nonce[:], slot.Wrapped[:], aad[:]); err != nil {
			buf.close()
			continue // the tag failed: not this slot's secret
		}
		key := &DataKey{buf: buf}
		if !t.Matches(key) {
			key.Close()
			return nil, 0, fmt.Errorf("crypt: key slot %d opens but holds another key: %w", slot.ID, ErrCorrupt)
		}
		return key, slot.ID, nil
	}
	return nil, 0, fmt.Errorf("crypt: no key slot opens with this %v (%d of %d slots are of that kind): %w",
		s.kind, tried, len(t.Slots), ErrWrongKey)
}

// slotAEAD is AES-256-GCM under the KEK that s derives for slot.
func slotAEAD(s *Secret, slot *Slot) (cipher.AEAD, error) {
	kek, err := deriveKEK(s, slot)
	if err != nil {
		return nil, err
	}
	defer kek.close()
	block, err := aes.NewCipher(kek.bytes())
	if err != nil {
		return nil, fmt.Errorf("crypt: key slot %d cipher: %w", slot.ID, err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("crypt: key slot %d cipher: %w", slot.ID, err)
	}
	return aead, nil
}

// deriveKEK derives slot's key-encryption key from s. The derivations
// return their result in the Go heap; it is copied to locked memory and
// the heap copy zeroed at once.
func deriveKEK(s *Secret, slot *Slot) (*lockedBuf, error) {
	var k []byte
	switch slot.Kind {
	case KindKeyFile:
		var err error
		k, err = hkdf.Key(sha256.New, s.bytes(), slot.Salt[:], keyFileLabel, kekSize)
		if err != nil {
			return nil, fmt.Errorf("crypt: key slot %d: HKDF: %w", slot.ID, err)
		}
	case KindPassphrase:
		if err := slot.Argon2.Validate(); err != nil {
			return nil, fmt.Errorf("crypt: key slot %d: %w", slot.ID, err)
		}
		p := slot.Argon2
		k = argon2.IDKey(s.bytes(), slot.Salt[:], p.Time, p.MemoryKiB, p.Threads, kekSize)
	default:
		return nil, fmt.Errorf("crypt: key slot %d of kind %v: %w", slot.ID, slot.Kind, ErrVersion)
	}
	defer clear(k)
	buf, err := newLockedBuf(kekSize)
	if err != nil {
		return nil, err
	}
	copy(buf.bytes(), k)
	return buf, nil
}
