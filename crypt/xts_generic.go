//go:build !amd64 || purego

package crypt

// dataKeys is empty: without the AES-NI kernels the data key is crypto/aes's.
type dataKeys struct{}

// init reports that the Cipher must use crypto/aes for the data key.
func (k *dataKeys) init(key []byte) bool { return false }

// xorCrypt sets dst to the data key's AES of src XOR tw, XOR tw, for each
// 16-byte block of src with the tweak of the same index in tw, its low and
// high halves of IEEE 1619's little-endian 128-bit value.
func (c *Cipher) xorCrypt(dst, src []byte, tw [][2]uint64, encrypt bool) {
	c.xorCryptGeneric(dst, src, tw, encrypt)
}
