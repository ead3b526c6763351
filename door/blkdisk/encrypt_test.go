package blkdisk

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// An encrypted disk served on vhost-user is encrypted by the shared data
// path: what a frontend writes reads back through the door and through the
// disk, and is nowhere on the backing in clear; the same bytes written to
// a plain disk are (so the search can fail).
func TestEncryptedDiskThroughVhostUser(t *testing.T) {
	for _, encrypted := range []bool{false, true} {
		s, be := newMemStore(t)
		var key *crypt.Secret
		var err error
		if encrypted {
			if key, err = crypt.KeyFileSecret(bytes.Repeat([]byte{9}, crypt.KeyFileSize)); err != nil {
				t.Fatal(err)
			}
			defer key.Close()
		}
		tc := newCaseWith(t, s, key)
		d := tc.dial(frontend.Options{})
		seed := testutil.Seed(t)
		rng := rand.New(rand.NewPCG(seed, 1))
		for i, n := range []int{4096, 1 << 20, 1536, 64 << 10} {
			q := d.Queues()[i%2]
			buf := alloc(t, d, n, 4096)
			for j := range buf.Bytes {
				buf.Bytes[j] = byte(rng.Uint32())
			}
			want := append([]byte(nil), buf.Bytes...)
			sector := uint64(i) * 4096
			mustOK(t, q, frontend.Request{Type: proto.BlkTOut, Sector: sector, Data: []frontend.Buffer{buf}, Tag: uint64(i)})
			clear(buf.Bytes)
			mustOK(t, d.Queues()[(i+1)%2], frontend.Request{Type: proto.BlkTIn, Sector: sector, Data: []frontend.Buffer{buf}, Tag: uint64(i)})
			if !bytes.Equal(buf.Bytes, want) {
				t.Fatalf("encrypted %v, %d bytes: read back differs", encrypted, n)
			}
			got := make([]byte, n)
			if _, err := tc.disk.ReadAt(got, int64(sector*512)); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("encrypted %v, %d bytes: the disk holds other bytes (%v)", encrypted, n, err)
			}
			if found := bytes.Contains(be.Bytes(), want[:64]); found == encrypted {
				t.Fatalf("encrypted %v, %d bytes: found in the backing in clear: %v", encrypted, n, found)
			}
			d.Free(buf)
		}
	}
}
