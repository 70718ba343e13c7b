# corral: build, install, test.
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin

.PHONY: all install uninstall installer-image test bench demo

all:
	cargo build --workspace --bins

# The static release shim, where containerd looks for io.containerd.corral.v2, the link
# containerd runs for io.containerd.corral-node.v2 (node mode), and the builtin OCI runtime
# beside them (runtime.binary = "builtin").
install:
	bin=$$(bash scripts/build-release.sh) && install -D -m 0755 "$$bin" "$(DESTDIR)$(BINDIR)/containerd-shim-corral-v2" \
	  && install -D -m 0755 "$$(dirname "$$bin")/corral-oci" "$(DESTDIR)$(BINDIR)/corral-oci"
	ln -sfn containerd-shim-corral-v2 "$(DESTDIR)$(BINDIR)/containerd-shim-corral-node-v2"

uninstall:
	rm -f "$(DESTDIR)$(BINDIR)/containerd-shim-corral-v2" "$(DESTDIR)$(BINDIR)/containerd-shim-corral-node-v2" "$(DESTDIR)$(BINDIR)/corral-oci"

# The node-installer image of deploy/corral-deploy.yaml, as an OCI archive (no image builder needed).
installer-image:
	bash scripts/build-installer-image.sh target/corral-deploy.tar

test:
	bash scripts/test.sh

bench:
	bash scripts/bench.sh

demo:
	bash scripts/demo.sh
