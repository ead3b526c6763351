# The two commands of the README.
#   make run    mounts the default store (created on first use) at $(MNT)
#   make test   runs the whole test suite (what CI runs)

MNT ?= /mnt/vdisks

.PHONY: run test build

build:
	go build -o bin/vdisk ./cmd/vdisk

run: build
	bin/vdisk mount $(MNT)

test:
	tools/test.sh
