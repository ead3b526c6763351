module github.com/vdiskfs/vdiskfs/tools/compare

go 1.26.8

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/sirupsen/logrus v1.10.2
	github.com/vdiskfs/vdiskfs v0.0.0
	golang.org/x/sys v0.50.0
	gonum.org/v1/plot v0.17.0
)

require (
	codeberg.org/go-fonts/liberation v0.5.0 // indirect
	codeberg.org/go-latex/latex v0.2.0 // indirect
	codeberg.org/go-pdf/fpdf v0.11.1 // indirect
	git.sr.ht/~sbinet/gg v0.7.0 // indirect
	github.com/ajstarks/svgo v0.0.0-20211024235047-1546f124cd8b // indirect
	github.com/ceph/go-ceph v0.28.0 // indirect
	github.com/golang/freetype v0.0.0-20170609003504-e2365dfdc4a0 // indirect
	github.com/google/btree v1.1.3 // indirect
	github.com/ncw/directio v1.0.5 // indirect
	golang.org/x/crypto v0.59.0 // indirect
	golang.org/x/image v0.30.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)

// The compare tool is built from this checkout's vdiskfs, never a published one.
replace github.com/vdiskfs/vdiskfs => ../..
