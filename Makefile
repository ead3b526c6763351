# The two commands of the README.
#   make run    mounts the default store (created on first use) at $(MNT)
#   make test   runs the whole test suite (what CI runs)
# TAGS=rbd builds in the Ceph RBD backend (rbd:POOL/IMAGE stores; needs
# librbd-dev and librados-dev): make build TAGS=rbd.
# For operators and packagers:
#   make install [PREFIX=/usr/local] [DESTDIR=]   binary, man pages, completion, systemd unit, contrib files
#   make deb                                      build/vdiskfs_VERSION_ARCH.deb (nfpm)
#   make docs                                     man pages and completion into $(BUILD)/docs
# For measuring:
#   make compare                                  bin/compare, the compare tool (its own module, tools/compare)

MNT ?= /mnt/vdisks
TAGS ?=
PREFIX ?= /usr/local
DESTDIR ?=
# Generated files (man pages, completion, package staging, the .deb): ignored by git.
BUILD ?= build
NFPM_VERSION ?= v2.45.2

# vdisk version reads the version and revision from the Go build
# information; these fill in for builds without a VCS stamp (GOFLAGS
# -buildvcs=false, git worktrees).
GIT_VERSION := $(shell git describe --tags --always --dirty 2>/dev/null)
GIT_REVISION := $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
LDFLAGS := -X main.buildVersion=$(GIT_VERSION) -X main.buildRevision=$(GIT_REVISION)
# A Debian version must start with a digit: 0.0.0~gitDATE.REV until the
# project tags releases (v1.2.3 then gives 1.2.3, and 1.2.3+4+gHASH after it).
DEB_VERSION ?= $(shell v=$$(git describe --tags --match 'v[0-9]*' 2>/dev/null | sed 's/^v//; s/-/+/g'); \
	[ -n "$$v" ] && echo "$$v" || \
	echo "0.0.0~git$$(git log -1 --format=%cd --date=format:%Y%m%d%H%M%S 2>/dev/null).$$(git rev-parse --short=12 HEAD 2>/dev/null)")
DEB_ARCH ?= $(shell go env GOARCH)

SHARE = $(DESTDIR)$(PREFIX)/share
DEB_ROOT = $(abspath $(BUILD))/deb/root

.PHONY: run test build compare docs install deb clean

build:
	go build -tags '$(TAGS)' -ldflags '$(LDFLAGS)' -o bin/vdisk ./cmd/vdisk

# The compare tool is a module of its own (its chart needs a plotting
# stack that vdisk users should not download).
compare:
	cd tools/compare && go build -o ../../bin/compare .

run: build
	bin/vdisk mount $(MNT)

test:
	tools/test.sh

docs: build
	rm -rf $(BUILD)/docs
	bin/vdisk gendocs $(BUILD)/docs

# The unit runs /usr/bin/vdisk; installed elsewhere, it runs $(PREFIX)/bin/vdisk.
install: build docs
	install -D -m 0755 bin/vdisk $(DESTDIR)$(PREFIX)/bin/vdisk
	install -d $(SHARE)/man/man1
	install -m 0644 $(BUILD)/docs/man/man1/*.1 $(SHARE)/man/man1/
	install -D -m 0644 $(BUILD)/docs/completion/vdisk.bash $(SHARE)/bash-completion/completions/vdisk
	install -D -m 0644 $(BUILD)/docs/completion/_vdisk $(SHARE)/zsh/vendor-completions/_vdisk
	install -D -m 0644 $(BUILD)/docs/completion/vdisk.fish $(SHARE)/fish/vendor_completions.d/vdisk.fish
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system
	sed 's|/usr/bin/vdisk |$(PREFIX)/bin/vdisk |g' contrib/systemd/vdiskfs@.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/vdiskfs@.service
	chmod 0644 $(DESTDIR)$(PREFIX)/lib/systemd/system/vdiskfs@.service
	install -D -m 0644 contrib/systemd/vdiskfs.env $(SHARE)/vdiskfs/systemd/vdiskfs.env
	install -D -m 0644 contrib/fstab/fstab.example $(SHARE)/vdiskfs/fstab.example
	install -D -m 0644 contrib/grafana/vdiskfs.json $(SHARE)/vdiskfs/grafana/vdiskfs.json
	install -D -m 0644 contrib/prometheus/alerts.yml $(SHARE)/vdiskfs/prometheus/alerts.yml

# Debian wants man pages gzipped (gzip -9n: no name or time, reproducible).
# nfpm runs in $(BUILD)/deb, where tools/deb/nfpm.yaml finds ./root and the
# maintainer scripts.
deb:
	rm -rf $(BUILD)/deb $(BUILD)/vdiskfs_*.deb
	$(MAKE) install DESTDIR=$(DEB_ROOT) PREFIX=/usr BUILD=$(BUILD)
	gzip -9n $(DEB_ROOT)/usr/share/man/man1/*.1
	cp tools/deb/postinst tools/deb/postrm $(BUILD)/deb/
	cd $(BUILD)/deb && VDISK_DEB_VERSION='$(DEB_VERSION)' VDISK_DEB_ARCH='$(DEB_ARCH)' GOFLAGS= \
		go run github.com/goreleaser/nfpm/v2/cmd/nfpm@$(NFPM_VERSION) package \
		--config $(CURDIR)/tools/deb/nfpm.yaml --packager deb --target $(abspath $(BUILD))/
	@ls $(BUILD)/*.deb

clean:
	rm -rf bin $(BUILD)
