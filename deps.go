//go:build tools

package deps

import (
	_ "github.com/google/btree"
	_ "github.com/hanwen/go-fuse/v2/fs"
	_ "github.com/ncw/directio"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/schollz/progressbar/v3"
	_ "github.com/sirupsen/logrus"
	_ "github.com/spf13/cobra"
	_ "golang.org/x/sys/unix"
)
