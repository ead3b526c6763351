package crypt

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// The key slot table's bytes. This file is their only encoder and decoder;
// FORMAT.md ("Key slot table") gives the same layout. Every constant here is
// part of the format. All integers are little-endian.
//
// Header, slotHeaderSize bytes:
//
//	 0  [8]  magic "VDKSLOTS"
//	 8  u16  version (SlotTableVersion)
//	10  u16  cipher (CipherAESXTS256)
//	12  u16  number of slots, 1..MaxSlots
//	14  u16  reserved, 0
//	16  [16] key check value: HMAC-SHA256(data key, checkLabel)[:16]
//	32  u32  CRC-32C (Castagnoli) of bytes 0..32
//	36  u32  reserved, 0
//
// Then the slots, slotSize bytes each:
//
//	  0  u32  slot id, non-zero, unique in the table
//	  4  u8   kind: 1 key file, 2 passphrase
//	  5  u8   Argon2id threads (0 for a key file slot)
//	  6  u16  reserved, 0
//	  8  u32  Argon2id time (passes; 0 for a key file slot)
//	 12  u32  Argon2id memory in KiB (0 for a key file slot)
//	 16  [32] salt of the key derivation
//	 48  [12] AES-256-GCM nonce
//	 60  [80] the data key sealed by AES-256-GCM: 64 bytes and a 16-byte tag
//	140  u32  CRC-32C of bytes 0..140 of the slot
const (
	slotTableMagic = "VDKSLOTS"
	// SlotTableVersion is the version this package writes and reads.
	SlotTableVersion = 1
	// CipherAESXTS256 is AES-XTS-256 with one store block per data unit.
	CipherAESXTS256 = 1
	// MaxSlots bounds the slots of one table.
	MaxSlots = 8

	slotHeaderSize = 40
	slotSize       = 144
	checkSize      = 16
	saltSize       = 32
	nonceSize      = 12
	wrappedSize    = DataKeySize + 16
	// slotAADSize: the bytes each slot's GCM seal authenticates besides the
	// key (slotAAD).
	slotAADSize = 2 + 2 + checkSize + 48
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// EncodedSize is the length of t's encoding.
func (t *SlotTable) EncodedSize() int { return slotHeaderSize + len(t.Slots)*slotSize }

// MarshalBinary encodes t. It refuses a table that fails Validate.
func (t *SlotTable) MarshalBinary() ([]byte, error) {
	if err := t.Validate(); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	b := make([]byte, t.EncodedSize())
	copy(b[0:8], slotTableMagic)
	le.PutUint16(b[8:], SlotTableVersion)
	le.PutUint16(b[10:], t.Cipher)
	le.PutUint16(b[12:], uint16(len(t.Slots)))
	copy(b[16:32], t.Check[:])
	le.PutUint32(b[32:], crc32.Checksum(b[0:32], castagnoli))
	for i := range t.Slots {
		encodeSlot(b[slotHeaderSize+i*slotSize:][:slotSize], &t.Slots[i])
	}
	return b, nil
}

func encodeSlot(b []byte, s *Slot) {
	le := binary.LittleEndian
	encodeSlotParams(b[:48], s)
	copy(b[48:60], s.Nonce[:])
	copy(b[60:140], s.Wrapped[:])
	le.PutUint32(b[140:], crc32.Checksum(b[0:140], castagnoli))
}

// encodeSlotParams writes a slot's first 48 bytes: everything but the
// sealed key, which its seal authenticates (slotAAD).
func encodeSlotParams(b []byte, s *Slot) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], s.ID)
	b[4] = byte(s.Kind)
	b[5] = s.Argon2.Threads
	le.PutUint16(b[6:], 0)
	le.PutUint32(b[8:], s.Argon2.Time)
	le.PutUint32(b[12:], s.Argon2.MemoryKiB)
	copy(b[16:48], s.Salt[:])
}

// slotAAD is what a slot's seal authenticates besides the key: the table's
// version, cipher and key check value, and the slot's id, kind, KDF
// parameters and salt. So a slot moved into another table, or with its
// parameters changed, no longer opens.
func slotAAD(t *SlotTable, s *Slot) [slotAADSize]byte {
	var a [slotAADSize]byte
	binary.LittleEndian.PutUint16(a[0:], SlotTableVersion)
	binary.LittleEndian.PutUint16(a[2:], t.Cipher)
	copy(a[4:20], t.Check[:])
	encodeSlotParams(a[20:], s)
	return a
}

// DecodeSlotTable decodes and validates a slot table. It checks the magic,
// then the version, then the header checksum, each with its own error,
// then the length, every slot's checksum and Validate.
func DecodeSlotTable(b []byte) (*SlotTable, error) {
	le := binary.LittleEndian
	if len(b) < slotHeaderSize {
		return nil, fmt.Errorf("crypt: slot table of %d bytes, shorter than its header: %w", len(b), ErrCorrupt)
	}
	if string(b[0:8]) != slotTableMagic {
		return nil, fmt.Errorf("crypt: slot table magic %q: %w", b[0:8], ErrCorrupt)
	}
	if v := le.Uint16(b[8:]); v != SlotTableVersion {
		return nil, fmt.Errorf("crypt: slot table version %d, this build reads %d: %w", v, SlotTableVersion, ErrVersion)
	}
	if got, want := crc32.Checksum(b[0:32], castagnoli), le.Uint32(b[32:]); got != want {
		return nil, fmt.Errorf("crypt: slot table header checksum %08x, want %08x: %w", got, want, ErrCorrupt)
	}
	if le.Uint16(b[14:]) != 0 || le.Uint32(b[36:]) != 0 {
		return nil, fmt.Errorf("crypt: slot table header reserved bytes are not zero: %w", ErrCorrupt)
	}
	n := int(le.Uint16(b[12:]))
	if n < 1 || n > MaxSlots {
		return nil, fmt.Errorf("crypt: slot table has %d slots, want 1 to %d: %w", n, MaxSlots, ErrCorrupt)
	}
	if len(b) != slotHeaderSize+n*slotSize {
		return nil, fmt.Errorf("crypt: slot table of %d bytes, want %d for %d slots: %w", len(b), slotHeaderSize+n*slotSize, n, ErrCorrupt)
	}
	t := &SlotTable{Cipher: le.Uint16(b[10:]), Slots: make([]Slot, n)}
	copy(t.Check[:], b[16:32])
	for i := range t.Slots {
		p := b[slotHeaderSize+i*slotSize:][:slotSize]
		if got, want := crc32.Checksum(p[0:140], castagnoli), le.Uint32(p[140:]); got != want {
			return nil, fmt.Errorf("crypt: key slot %d checksum %08x, want %08x: %w", i, got, want, ErrCorrupt)
		}
		if le.Uint16(p[6:]) != 0 {
			return nil, fmt.Errorf("crypt: key slot %d reserved bytes are not zero: %w", i, ErrCorrupt)
		}
		s := &t.Slots[i]
		s.ID = le.Uint32(p[0:])
		s.Kind = SlotKind(p[4])
		s.Argon2 = Argon2Params{Threads: p[5], Time: le.Uint32(p[8:]), MemoryKiB: le.Uint32(p[12:])}
		copy(s.Salt[:], p[16:48])
		copy(s.Nonce[:], p[48:60])
		copy(s.Wrapped[:], p[60:140])
	}
	if err := t.Validate(); err != nil {
		return nil, err
	}
	return t, nil
}

// Validate checks what the encoding cannot: a known cipher and slot kinds
// (ErrVersion), 1 to MaxSlots slots with distinct non-zero ids, Argon2id
// parameters within bounds for a passphrase slot and zero for a key file
// slot (ErrCorrupt).
func (t *SlotTable) Validate() error {
	if t.Cipher != CipherAESXTS256 {
		return fmt.Errorf("crypt: slot table cipher %d: %w", t.Cipher, ErrVersion)
	}
	if len(t.Slots) < 1 || len(t.Slots) > MaxSlots {
		return fmt.Errorf("crypt: slot table has %d slots, want 1 to %d: %w", len(t.Slots), MaxSlots, ErrCorrupt)
	}
	for i := range t.Slots {
		s := &t.Slots[i]
		if s.ID == 0 {
			return fmt.Errorf("crypt: key slot %d has id 0: %w", i, ErrCorrupt)
		}
		for j := range i {
			if t.Slots[j].ID == s.ID {
				return fmt.Errorf("crypt: key slots %d and %d share id %d: %w", j, i, s.ID, ErrCorrupt)
			}
		}
		switch s.Kind {
		case KindKeyFile:
			if s.Argon2 != (Argon2Params{}) {
				return fmt.Errorf("crypt: key slot %d (id %d): key file slot with Argon2id parameters: %w", i, s.ID, ErrCorrupt)
			}
		case KindPassphrase:
			if err := s.Argon2.Validate(); err != nil {
				return fmt.Errorf("crypt: key slot %d (id %d): %w: %w", i, s.ID, ErrCorrupt, err)
			}
		default:
			return fmt.Errorf("crypt: key slot %d (id %d) of kind %d: %w", i, s.ID, s.Kind, ErrVersion)
		}
	}
	return nil
}
