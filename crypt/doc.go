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
// Each data unit's tweaks are computed up front in Go (T0 with crypto/aes,
// then T0·α^j), a batch at a time. On amd64 with AES-NI (and without the
// purego build tag) the data key's AES runs in assembly kernels
// (xts_amd64.s) that XOR the tweaks in, run the rounds on eight blocks at
// once so the AES unit's latency is hidden, and XOR the tweaks again, with
// round keys this package expands (aeskey_amd64.go); elsewhere crypto/aes
// encrypts one block at a time.
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
// zeroed on Close (see lockedBuf). Three copies escape that: the AES key
// schedules in the Go heap for as long as a Cipher or a slot's AEAD lives
// (a Cipher's own schedule of the data key where it has AES-NI kernels,
// otherwise crypto/aes's, and crypto/aes's of the tweak key and the
// KEKs), which nothing zeroes; HMAC's padded copy of the key while a
// check value is computed; and the KDFs' heap results, which are copied
// and zeroed at once. No error, String or GoString shows key material.
//
// # Concurrency
//
// A Cipher is immutable and safe for concurrent use. DataKey and Secret
// may be read concurrently but must not be closed while in use. SlotTable
// is a plain value: its caller serialises changes.
package crypt
