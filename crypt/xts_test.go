package crypt

import (
	"bytes"
	"crypto/aes"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"golang.org/x/crypto/xts"
)

// testDataKey makes a DataKey of given bytes.
func testDataKey(t testing.TB, b []byte) *DataKey {
	t.Helper()
	buf, err := newLockedBuf(DataKeySize)
	if err != nil {
		t.Fatal(err)
	}
	copy(buf.bytes(), b)
	k := &DataKey{buf: buf}
	t.Cleanup(k.Close)
	return k
}

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// IEEE 1619-2007 Annex B, vectors 10 to 14: XTS-AES-256 over a 512-byte
// data unit, all with the same keys and plaintext.
const (
	ieeeKey1 = "2718281828459045235360287471352662497757247093699959574966967627"
	ieeeKey2 = "3141592653589793238462643383279502884197169399375105820974944592"
)

var ieeeVectors = []struct {
	n          int
	tweak      uint64
	ciphertext string
}{
	{10, 0xff, "1c3b3a102f770386e4836c99e370cf9bea00803f5e482357a4ae12d414a3e63b5d31e276f8fe4a8d66b317f9ac683f44680a86ac35adfc3345befecb4bb188fd5776926c49a3095eb108fd1098baec70aaa66999a72a82f27d848b21d4a741b0c5cd4d5fff9dac89aeba122961d03a757123e9870f8acf1000020887891429ca2a3e7a7d7df7b10355165c8b9a6d0a7de8b062c4500dc4cd120c0f7418dae3d0b5781c34803fa75421c790dfe1de1834f280d7667b327f6c8cd7557e12ac3a0f93ec05c52e0493ef31a12d3d9260f79a289d6a379bc70c50841473d1a8cc81ec583e9645e07b8d9670655ba5bbcfecc6dc3966380ad8fecb17b6ba02469a020a84e18e8f84252070c13e9f1f289be54fbc481457778f616015e1327a02b140f1505eb309326d68378f8374595c849d84f4c333ec4423885143cb47bd71c5edae9be69a2ffeceb1bec9de244fbe15992b11b77c040f12bd8f6a975a44a0f90c29a9abc3d4d893927284c58754cce294529f8614dcd2aba991925fedc4ae74ffac6e333b93eb4aff0479da9a410e4450e0dd7ae4c6e2910900575da401fc07059f645e8b7e9bfdef33943054ff84011493c27b3429eaedb4ed5376441a77ed43851ad77f16f541dfd269d50d6a5f14fb0aab1cbb4c1550be97f7ab4066193c4caa773dad38014bd2092fa755c824bb5e54c4f36ffda9fcea70b9c6e693e148c151"},
	{11, 0xffff, "77a31251618a15e6b92d1d66dffe7b50b50bad552305ba0217a610688eff7e11e1d0225438e093242d6db274fde801d4cae06f2092c728b2478559df58e837c2469ee4a4fa794e4bbc7f39bc026e3cb72c33b0888f25b4acf56a2a9804f1ce6d3d6e1dc6ca181d4b546179d55544aa7760c40d06741539c7e3cd9d2f6650b2013fd0eeb8c2b8e3d8d240ccae2d4c98320a7442e1c8d75a42d6e6cfa4c2eca1798d158c7aecdf82490f24bb9b38e108bcda12c3faf9a21141c3613b58367f922aaa26cd22f23d708dae699ad7cb40a8ad0b6e2784973dcb605684c08b8d6998c69aac049921871ebb65301a4619ca80ecb485a31d744223ce8ddc2394828d6a80470c092f5ba413c3378fa6054255c6f9df4495862bbb3287681f931b687c888abf844dfc8fc28331e579928cd12bd2390ae123cf03818d14dedde5c0c24c8ab018bfca75ca096f2d531f3d1619e785f1ada437cab92e980558b3dce1474afb75bfedbf8ff54cb2618e0244c9ac0d3c66fb51598cd2db11f9be39791abe447c63094f7c453b7ff87cb5bb36b7c79efb0872d17058b83b15ab0866ad8a58656c5a7e20dbdf308b2461d97c0ec0024a2715055249cf3b478ddd4740de654f75ca686e0d7345c69ed50cdc2a8b332b1f8824108ac937eb050585608ee734097fc09054fbff89eeaeea791f4a7ab1f9868294a4f9e27b42af8100cb9d59cef9645803"},
	{12, 0xffffff, "e387aaa58ba483afa7e8eb469778317ecf4cf573aa9d4eac23f2cdf914e4e200a8b490e42ee646802dc6ee2b471b278195d60918ececb44bf79966f83faba0499298ebc699c0c8634715a320bb4f075d622e74c8c932004f25b41e361025b5a87815391f6108fc4afa6a05d9303c6ba68a128a55705d415985832fdeaae6c8e19110e84d1b1f199a2692119edc96132658f09da7c623efcec712537a3d94c0bf5d7e352ec94ae5797fdb377dc1551150721adf15bd26a8efc2fcaad56881fa9e62462c28f30ae1ceaca93c345cf243b73f542e2074a705bd2643bb9f7cc79bb6e7091ea6e232df0f9ad0d6cf502327876d82207abf2115cdacf6d5a48f6c1879a65b115f0f8b3cb3c59d15dd8c769bc014795a1837f3901b5845eb491adfefe097b1fa30a12fc1f65ba22905031539971a10f2f36c321bb51331cdefb39e3964c7ef079994f5b69b2edd83a71ef549971ee93f44eac3938fcdd61d01fa71799da3a8091c4c48aa9ed263ff0749df95d44fef6a0bb578ec69456aa5408ae32c7af08ad7ba8921287e3bbee31b767be06a0e705c864a769137df28292283ea81a2480241b44d9921cdbec1bc28dc1fda114bd8e5217ac9d8ebafa720e9da4f9ace231cc949e5b96fe76ffc21063fddc83a6b8679c00d35e09576a875305bed5f36ed242c8900dd1fa965bc950dfce09b132263a1eef52dd6888c309f5a7d712826"},
	{13, 0xffffffff, "bf53d2dade78e822a4d949a9bc6766b01b06a8ef70d26748c6a7fc36d80ae4c5520f7c4ab0ac8544424fa405162fef5a6b7f229498063618d39f0003cb5fb8d1c86b643497da1ff945c8d3bedeca4f479702a7a735f043ddb1d6aaade3c4a0ac7ca7f3fa5279bef56f82cd7a2f38672e824814e10700300a055e1630b8f1cb0e919f5e942010a416e2bf48cb46993d3cb6a51c19bacf864785a00bc2ecff15d350875b246ed53e68be6f55bd7e05cfc2b2ed6432198a6444b6d8c247fab941f569768b5c429366f1d3f00f0345b96123d56204c01c63b22ce78baf116e525ed90fdea39fa469494d3866c31e05f295ff21fea8d4e6e13d67e47ce722e9698a1c1048d68ebcde76b86fcf976eab8aa9790268b7068e017a8b9b749409514f1053027fd16c3786ea1bac5f15cb79711ee2abe82f5cf8b13ae73030ef5b9e4457e75d1304f988d62dd6fc4b94ed38ba831da4b7634971b6cd8ec325d9c61c00f1df73627ed3745a5e8489f3a95c69639c32cd6e1d537a85f75cc844726e8a72fc0077ad22000f1d5078f6b866318c668f1ad03d5a5fced5219f2eabbd0aa5c0f460d183f04404a0d6f469558e81fab24a167905ab4c7878502ad3e38fdbe62a41556cec37325759533ce8f25f367c87bb5578d667ae93f9e2fd99bcbc5f2fbba88cf6516139420fcff3b7361d86322c4bd84c82f335abb152c4a93411373aaa8220"},
	{14, 0xffffffffff, "64497e5a831e4a932c09be3e5393376daa599548b816031d224bbf50a818ed2350eae7e96087c8a0db51ad290bd00c1ac1620857635bf246c176ab463be30b808da548081ac847b158e1264be25bb0910bbc92647108089415d45fab1b3d2604e8a8eff1ae4020cfa39936b66827b23f371b92200be90251e6d73c5f86de5fd4a950781933d79a28272b782a2ec313efdfcc0628f43d744c2dc2ff3dcb66999b50c7ca895b0c64791eeaa5f29499fb1c026f84ce5b5c72ba1083cddb5ce45434631665c333b60b11593fb253c5179a2c8db813782a004856a1653011e93fb6d876c18366dd8683f53412c0c180f9c848592d593f8609ca736317d356e13e2bff3a9f59cd9aeb19cd482593d8c46128bb32423b37a9adfb482b99453fbe25a41bf6feb4aa0bef5ed24bf73c762978025482c13115e4015aac992e5613a3b5c2f685b84795cb6e9b2656d8c88157e52c42f978d8634c43d06fea928f2822e465aa6576e9bf419384506cc3ce3c54ac1a6f67dc66f3b30191e698380bc999b05abce19dc0c6dcc2dd001ec535ba18deb2df1a101023108318c75dc98611a09dc48a0acdec676fabdf222f07e026f059b672b56e5cbc8e1d21bbd867dd927212054681d70ea737134cdfce93b6f82ae22423274e58a0821cc5502e2d0ab4585e94de6975be5e0b4efce51cd3e70c25a1fbbbd609d273ad5b0d59631c531f6a0a57b9"},
}

// ieeePlaintext is the vectors' plaintext: bytes 0x00 to 0xff, twice.
func ieeePlaintext() []byte {
	p := make([]byte, 512)
	for i := range p {
		p[i] = byte(i)
	}
	return p
}

// ciphers returns this package's Cipher and x/crypto/xts's for key.
func ciphers(t testing.TB, key []byte, blockSize int) (*Cipher, *xts.Cipher) {
	t.Helper()
	c, err := NewCipher(testDataKey(t, key), blockSize)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := xts.NewCipher(aes.NewCipher, key)
	if err != nil {
		t.Fatal(err)
	}
	return c, ref
}

func TestKnownAnswersIEEE1619(t *testing.T) {
	c, ref := ciphers(t, mustHex(t, ieeeKey1+ieeeKey2), 512)
	for _, v := range ieeeVectors {
		want := mustHex(t, v.ciphertext)
		got := make([]byte, 512)
		c.EncryptBlocks(got, ieeePlaintext(), v.tweak)
		if !bytes.Equal(got, want) {
			t.Errorf("vector %d: encrypt:\n got %x\nwant %x", v.n, got, want)
		}
		// The transcribed vector agrees with x/crypto/xts as well.
		ref.Encrypt(got, ieeePlaintext(), v.tweak)
		if !bytes.Equal(got, want) {
			t.Errorf("vector %d: x/crypto/xts disagrees with the vector", v.n)
		}
		c.DecryptBlocks(got, want, v.tweak)
		if !bytes.Equal(got, ieeePlaintext()) {
			t.Errorf("vector %d: decrypt: got %x", v.n, got)
		}
		// In place, both ways.
		buf := ieeePlaintext()
		c.EncryptBlocks(buf, buf, v.tweak)
		if !bytes.Equal(buf, want) {
			t.Errorf("vector %d: encrypt in place differs", v.n)
		}
		c.DecryptBlocks(buf, buf, v.tweak)
		if !bytes.Equal(buf, ieeePlaintext()) {
			t.Errorf("vector %d: decrypt in place differs", v.n)
		}
	}
}

// genericCipher is the Cipher of key with crypto/aes for the data key,
// the path NewCipher takes without AES-NI kernels, so that tests check it
// on every machine.
func genericCipher(t testing.TB, key []byte, blockSize int) *Cipher {
	t.Helper()
	k1, err := aes.NewCipher(key[:DataKeySize/2])
	if err != nil {
		t.Fatal(err)
	}
	k2, err := aes.NewCipher(key[DataKeySize/2:])
	if err != nil {
		t.Fatal(err)
	}
	return &Cipher{k1: k1, k2: k2, blockSize: blockSize}
}

// checkAgainstReference encrypts data as consecutive blocks from tweak,
// with NewCipher's Cipher and with genericCipher, apart and in place, and
// compares every block with x/crypto/xts under tweak+i, then decrypts
// both ways.
func checkAgainstReference(t *testing.T, key, data []byte, blockSize int, tweak uint64) {
	t.Helper()
	c, ref := ciphers(t, key, blockSize)
	want := make([]byte, len(data))
	for i := 0; i*blockSize < len(data); i++ {
		ref.Encrypt(want[i*blockSize:(i+1)*blockSize], data[i*blockSize:(i+1)*blockSize], tweak+uint64(i))
	}
	for _, p := range []struct {
		name string
		c    *Cipher
	}{{"NewCipher", c}, {"generic", genericCipher(t, key, blockSize)}} {
		got := make([]byte, len(data))
		p.c.EncryptBlocks(got, data, tweak)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: block size %d tweak %#x: ciphertext differs from x/crypto/xts", p.name, blockSize, tweak)
		}
		back := make([]byte, len(data))
		p.c.DecryptBlocks(back, got, tweak)
		if !bytes.Equal(back, data) {
			t.Fatalf("%s: block size %d tweak %#x: round trip differs", p.name, blockSize, tweak)
		}
		copy(got, data)
		p.c.EncryptBlocks(got, got, tweak)
		if !bytes.Equal(got, want) {
			t.Fatalf("%s: block size %d tweak %#x: ciphertext in place differs from x/crypto/xts", p.name, blockSize, tweak)
		}
		p.c.DecryptBlocks(got, got, tweak)
		if !bytes.Equal(got, data) {
			t.Fatalf("%s: block size %d tweak %#x: round trip in place differs", p.name, blockSize, tweak)
		}
	}
}

func TestConsecutiveBlocksMatchReference(t *testing.T) {
	seed := testutil.Seed(t)
	r := rand.New(rand.NewPCG(seed, 0))
	key := make([]byte, DataKeySize)
	// Sizes of 1 to 9 AES blocks and across a batch of tweaks (tweakChunk)
	// exercise the kernels' groups of eight and their single-block tails.
	for _, bs := range []int{16, 32, 48, 112, 128, 144, 512, 1040, 4096, 4112, 65536, 1 << 20} {
		for _, tweak := range []uint64{0, 1, 0xffffffff, 1<<63 - 1, ^uint64(0) - 3, ^uint64(0), r.Uint64() >> 1, r.Uint64()} {
			for i := range key {
				key[i] = byte(r.Uint32())
			}
			n := 4
			if bs == 1<<20 {
				n = 2
			}
			if tweak > ^uint64(0)-uint64(n) {
				n = int(^uint64(0) - tweak + 1)
			}
			data := make([]byte, n*bs)
			for i := range data {
				data[i] = byte(r.Uint32())
			}
			checkAgainstReference(t, key, data, bs, tweak)
		}
	}
}

func FuzzRoundTrip(f *testing.F) {
	f.Add(make([]byte, DataKeySize), []byte("sixteen byte blk"), uint64(0), uint8(1))
	f.Add(bytes.Repeat([]byte{0xa5}, DataKeySize), bytes.Repeat([]byte("0123456789abcdef"), 64), ^uint64(0)-7, uint8(4))
	f.Fuzz(func(t *testing.T, key, data []byte, tweak uint64, units uint8) {
		if len(key) != DataKeySize || units == 0 {
			t.Skip()
		}
		data = data[:len(data)/aesBlock*aesBlock]
		if len(data) == 0 || len(data)%int(units) != 0 || (len(data)/int(units))%aesBlock != 0 {
			t.Skip()
		}
		if tweak > ^uint64(0)-uint64(units-1) {
			t.Skip()
		}
		checkAgainstReference(t, key, data, len(data)/int(units), tweak)
	})
}

func TestCipherRefusesMisuse(t *testing.T) {
	c, err := NewCipher(testDataKey(t, make([]byte, DataKeySize)), 4096)
	if err != nil {
		t.Fatal(err)
	}
	for _, bs := range []int{0, -16, 15, 4097, aesBlock<<20 + aesBlock} {
		if _, err := NewCipher(testDataKey(t, make([]byte, DataKeySize)), bs); err == nil {
			t.Errorf("NewCipher accepted a data unit of %d bytes", bs)
		}
	}
	buf := make([]byte, 3*4096)
	cases := []struct {
		name     string
		dst, src []byte
		tweak    uint64
		panic    string
	}{
		{"partial block", buf[:4096], buf[4096 : 2*4096+16], 0, "whole number"},
		{"short dst", buf[:4095], buf[4096 : 2*4096], 0, "shorter"},
		{"overlap", buf[16 : 4096+16], buf[:4096], 0, "overlap"},
		{"tweak wraps", buf[:2*4096], buf[:2*4096], ^uint64(0), "wraps"},
	}
	for _, tc := range cases {
		for _, f := range []func([]byte, []byte, uint64){c.EncryptBlocks, c.DecryptBlocks} {
			func() {
				defer func() {
					r := recover()
					if s, _ := r.(string); !strings.Contains(s, tc.panic) {
						t.Errorf("%s: panic %v, want one saying %q", tc.name, r, tc.panic)
					}
				}()
				f(tc.dst, tc.src, tc.tweak)
			}()
		}
	}
	// The last tweak itself is fine; an empty call too.
	c.EncryptBlocks(buf[:4096], buf[:4096], ^uint64(0))
	c.EncryptBlocks(nil, nil, ^uint64(0))
}

func TestCipherDoesNotAllocate(t *testing.T) {
	c, err := NewCipher(testDataKey(t, make([]byte, DataKeySize)), 4096)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 8*4096)
	if n := testing.AllocsPerRun(20, func() {
		c.EncryptBlocks(buf, buf, 7)
		c.DecryptBlocks(buf, buf, 7)
	}); n != 0 {
		t.Errorf("%v allocations per call, want 0", n)
	}
}

func benchmarkCipher(b *testing.B, size int, encrypt func(dst, src []byte, tweak uint64)) {
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	for i := 0; b.Loop(); i++ {
		encrypt(buf, buf, uint64(i))
	}
}

func BenchmarkXTS(b *testing.B) {
	key := make([]byte, DataKeySize)
	key[0] = 1
	c, ref := ciphers(b, key, 4096)
	// x/crypto/xts over the same 4 KiB data units, for comparison.
	refBlocks := func(decrypt bool) func(dst, src []byte, tweak uint64) {
		return func(dst, src []byte, tweak uint64) {
			for off := 0; off < len(src); off += 4096 {
				if decrypt {
					ref.Decrypt(dst[off:off+4096], src[off:off+4096], tweak)
				} else {
					ref.Encrypt(dst[off:off+4096], src[off:off+4096], tweak)
				}
				tweak++
			}
		}
	}
	for _, size := range []struct {
		name string
		n    int
	}{{"4KiB", 4096}, {"1MiB", 1 << 20}} {
		b.Run("crypt/encrypt/"+size.name, func(b *testing.B) { benchmarkCipher(b, size.n, c.EncryptBlocks) })
		b.Run("crypt/decrypt/"+size.name, func(b *testing.B) { benchmarkCipher(b, size.n, c.DecryptBlocks) })
		b.Run("xcrypto/encrypt/"+size.name, func(b *testing.B) { benchmarkCipher(b, size.n, refBlocks(false)) })
		b.Run("xcrypto/decrypt/"+size.name, func(b *testing.B) { benchmarkCipher(b, size.n, refBlocks(true)) })
	}
}

// A Cipher is used by many queue threads at once: each goroutine's
// result must equal the one computed alone (run with -race).
func TestCipherConcurrentUse(t *testing.T) {
	key := bytes.Repeat([]byte{0x5c}, DataKeySize)
	c, _ := ciphers(t, key, 4096)
	data := bytes.Repeat([]byte("concurrent use! "), 4*4096/16)
	want := make([]byte, len(data))
	c.EncryptBlocks(want, data, 40)
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		go func() {
			buf := make([]byte, len(data))
			for i := 0; i < 50; i++ {
				copy(buf, data)
				c.EncryptBlocks(buf, buf, 40)
				if !bytes.Equal(buf, want) {
					errs <- fmt.Errorf("round %d: ciphertext differs", i)
					return
				}
				c.DecryptBlocks(buf, buf, 40)
				if !bytes.Equal(buf, data) {
					errs <- fmt.Errorf("round %d: plaintext differs", i)
					return
				}
			}
			errs <- nil
		}()
	}
	for g := 0; g < 8; g++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
