//go:build !amd64 || purego

package crypt

// dataKeys is empty: without the AES-NI kernels the data key is crypto/aes's.
type dataKeys struct{}

// init reports that the Cipher must use crypto/aes for the data key.
func (k *dataKeys) init(key []byte) bool { return false }

// xorCrypt sets dst to the data key's AES of src XOR tw, XOR tw, for each
// 16-byte block of src with the block of tw at the same offset.
func (c *Cipher) xorCrypt(dst, src, tw []byte, encrypt bool) {
	c.xorCryptGeneric(dst, src, tw, encrypt)
}
