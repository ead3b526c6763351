package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"unsafe"
)

// aesBlock is the AES block size: XTS works on 16-byte blocks and a data
// unit must be a whole number of them.
const aesBlock = 16

// Cipher is AES-XTS-256 (IEEE 1619) over data units of one store block.
// Block i of a call is one data unit whose tweak (IEEE 1619's data unit
// sequence number) is tweak+i, encoded as a 128-bit little-endian number.
//
// A Cipher is safe for concurrent use: it holds only the expanded AES
// keys, in the Go heap, which nobody zeroes. The data key's are this
// package's own (keys) where there are AES-NI kernels for them, crypto/aes's
// (k1) otherwise; the tweak key's are crypto/aes's (k2).
type Cipher struct {
	keys      dataKeys     // the data key's round keys for the AES-NI kernels, if keys.init took them
	k1        cipher.Block // encrypts the data when keys does not; nil when it does
	k2        cipher.Block // encrypts the tweaks
	blockSize int
}

// NewCipher returns the cipher of key for data units of blockSize bytes, a
// multiple of 16 no larger than IEEE 1619's 2^20 AES blocks (16 MiB).
func NewCipher(key *DataKey, blockSize int) (*Cipher, error) {
	if blockSize <= 0 || blockSize%aesBlock != 0 || blockSize > aesBlock<<20 {
		return nil, fmt.Errorf("crypt: data unit of %d bytes is not a multiple of %d in [%d, %d]: %w",
			blockSize, aesBlock, aesBlock, aesBlock<<20, ErrInvalid)
	}
	k := key.bytes()
	c := &Cipher{blockSize: blockSize}
	if !c.keys.init(k[:DataKeySize/2]) {
		k1, err := aes.NewCipher(k[:DataKeySize/2])
		if err != nil {
			return nil, fmt.Errorf("crypt: data cipher: %w", err)
		}
		c.k1 = k1
	}
	k2, err := aes.NewCipher(k[DataKeySize/2:])
	if err != nil {
		return nil, fmt.Errorf("crypt: tweak cipher: %w", err)
	}
	c.k2 = k2
	return c, nil
}

// BlockSize is the data unit: the length EncryptBlocks and DecryptBlocks
// take per tweak.
func (c *Cipher) BlockSize() int { return c.blockSize }

// EncryptBlocks encrypts src, a whole number of blocks, into dst, block i
// under tweak+i. dst and src may be the same slice (in place) but must not
// overlap otherwise. It allocates nothing. It panics when src is not a
// whole number of blocks, dst is shorter, the buffers overlap inexactly, or
// the tweaks would wrap past 2^64-1: the caller's arithmetic is wrong, and
// encrypting anyway could reuse a tweak.
func (c *Cipher) EncryptBlocks(dst, src []byte, tweak uint64) {
	c.check(dst, src, tweak)
	for off := 0; off < len(src); off += c.blockSize {
		c.unit(dst[off:off+c.blockSize], src[off:off+c.blockSize], tweak, true)
		tweak++
	}
}

// DecryptBlocks is the inverse of EncryptBlocks, with the same rules.
func (c *Cipher) DecryptBlocks(dst, src []byte, tweak uint64) {
	c.check(dst, src, tweak)
	for off := 0; off < len(src); off += c.blockSize {
		c.unit(dst[off:off+c.blockSize], src[off:off+c.blockSize], tweak, false)
		tweak++
	}
}

func (c *Cipher) check(dst, src []byte, tweak uint64) {
	if len(src)%c.blockSize != 0 {
		panic(fmt.Sprintf("crypt: %d bytes are not a whole number of %d-byte blocks", len(src), c.blockSize))
	}
	if len(dst) < len(src) {
		panic("crypt: destination shorter than source")
	}
	if n := uint64(len(src) / c.blockSize); n > 0 && tweak+(n-1) < tweak {
		panic("crypt: tweak range wraps")
	}
	if inexactOverlap(dst[:len(src)], src) {
		panic("crypt: destination and source overlap")
	}
}

// tweakChunk is how many AES blocks unit handles per batch.
const tweakChunk = 64

// unit transforms one data unit.
//
// The running tweak T lives in two uint64s, the low and high halves of
// IEEE 1619's little-endian 128-bit value. T0 = E_k2(tweak) is computed in
// dst's first AES block, whose input is kept aside and put back (so in
// place works, and the AES interface sees only the caller's buffers:
// nothing escapes to the heap). The blocks then go in batches of up to
// tweakChunk: their tweaks are written out as pairs of words into a stack
// buffer, and xorCrypt XORs them into the data, runs AES and XORs them
// again. Computing the tweaks apart from the AES lets the AES-NI kernel
// pipeline eight blocks at a time; words rather than bytes keep the
// computation to a few instructions a tweak.
func (c *Cipher) unit(dst, src []byte, tweak uint64, encrypt bool) {
	le := binary.LittleEndian
	p0, p1 := le.Uint64(src[0:]), le.Uint64(src[8:])
	le.PutUint64(dst[0:], tweak)
	le.PutUint64(dst[8:], 0)
	c.k2.Encrypt(dst[:aesBlock], dst[:aesBlock])
	t0, t1 := le.Uint64(dst[0:]), le.Uint64(dst[8:])
	le.PutUint64(dst[0:], p0)
	le.PutUint64(dst[8:], p1)

	var tw [tweakChunk][2]uint64
	for off := 0; off < len(src); off += len(tw) * aesBlock {
		n := min(len(src)-off, len(tw)*aesBlock)
		k := n / aesBlock
		for i := range tw[:k] {
			tw[i] = [2]uint64{t0, t1}
			t0, t1 = mulAlpha(t0, t1)
		}
		c.xorCrypt(dst[off:off+n], src[off:off+n], tw[:k], encrypt)
	}
}

// xorCryptGeneric is xorCrypt with crypto/aes's k1: the tweaks as bytes,
// crypto/subtle's vector XOR around one AES call per block. XORing each
// block in 8-byte halves next to its AES call instead is much slower:
// among other things, the AES call's 16-byte load of the two 8-byte stores
// just made cannot be forwarded from them and waits.
func (c *Cipher) xorCryptGeneric(dst, src []byte, tw [][2]uint64, encrypt bool) {
	le := binary.LittleEndian
	var buf [tweakChunk * aesBlock]byte
	twb := buf[:len(tw)*aesBlock]
	for i, t := range tw {
		le.PutUint64(twb[i*aesBlock:], t[0])
		le.PutUint64(twb[i*aesBlock+8:], t[1])
	}
	subtle.XORBytes(dst, src, twb)
	for i := 0; i < len(dst); i += aesBlock {
		b := dst[i : i+aesBlock]
		if encrypt {
			c.k1.Encrypt(b, b)
		} else {
			c.k1.Decrypt(b, b)
		}
	}
	subtle.XORBytes(dst, dst, twb)
}

// mulAlpha is T·α in GF(2^128) modulo x^128 + x^7 + x^2 + x + 1, T given
// as its low and high halves: shift left by one, fold the carry back.
// The carry becomes a mask by an arithmetic shift, without a branch.
func mulAlpha(t0, t1 uint64) (uint64, uint64) {
	return t0<<1 ^ uint64(int64(t1)>>63)&0x87, t1<<1 | t0>>63
}

// inexactOverlap reports whether x and y share memory other than at the
// same start (crypto/internal/alias, which is not importable).
func inexactOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 || &x[0] == &y[0] {
		return false
	}
	xs, ys := uintptrOf(x), uintptrOf(y)
	return xs <= ys+uintptr(len(y)-1) && ys <= xs+uintptr(len(x)-1)
}

// uintptrOf is the address of b's first byte, only for comparing ranges.
func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
