// Package crypt is vdiskfs's encryption at rest: the block cipher that
// encrypts a disk's data blocks, the disk's data key, and the key slots
// that seal that key under key files and passphrases. It knows nothing of
// the store: the store records where each block's tweak comes from and
// keeps a disk's encoded slot table; this package turns a tweak and a key
// into ciphertext, and a secret and a slot table into a key.
//
// # Block cipher
//
// AES-XTS-256 (IEEE 1619) with one store block per data unit (Cipher). A
// block's tweak, the data unit sequence number, is a 64-bit value the map
// gives the block, not its physical or virtual address: so blocks can be
// moved and shared (defrag, clones, snapshots, copy_file_range, receive)
// without the key. EncryptBlocks and DecryptBlocks take a run of
// consecutive blocks with consecutive tweaks, work in place, and allocate
// nothing. The data unit is the whole block because the store never
// reads or writes less than a block (a partial request goes through whole
// blocks in a buffer of its own), so a block's tweak is one number and the
// map's tweak arithmetic is its block arithmetic; IEEE 1619 allows data
// units up to 2^20 AES blocks (16 MiB), above the largest store block. The
// price: ciphertext moves between stores (a raw stream) only where the
// block sizes are equal. Using a tweak twice for different contents of a block under one
// key is what the store must avoid; this package cannot see it.
//
// # Keys and slots
//
// A disk has one random 64-byte data key (NewDataKey). Its SlotTable holds
// that key sealed with AES-256-GCM once per slot, under a key-encryption
// key (KEK) derived from the slot's secret and its own random salt: HKDF-
// SHA256 of a 32-byte key file, or Argon2id of a passphrase with the
// slot's recorded cost. A seal also authenticates the slot's parameters
// and the table's key check value, so a slot whose parameters were
// changed, or moved from another disk's table, does not open. Unlock tries
// every slot of the secret's kind: a tag failure means "not this slot's
// secret", and when no slot opens the answer is ErrWrongKey; damage to the
// encoding is found first by checksums and is ErrCorrupt. The encoding is
// in slotformat.go (and FORMAT.md); adding and removing slots never
// touches data.
//
// # Key material
//
// Data keys, KEKs and secrets live in their own anonymous mappings, locked
// in RAM, left out of core dumps and wiped in a forked child, and are
// zeroed on Close (see lockedBuf). Three copies escape that and are out of this package's
// reach: the AES key schedules crypto/aes keeps in the Go heap for as long
// as a Cipher or a slot's AEAD lives, HMAC's padded copy of the key while
// a check value is computed, and the KDFs' heap results, which are copied
// and zeroed at once. No error, String or GoString shows key material.
//
// # Concurrency
//
// A Cipher is immutable and safe for concurrent use. DataKey and Secret
// may be read concurrently but must not be closed while in use. SlotTable
// is a plain value: its caller serialises changes.
package crypt
