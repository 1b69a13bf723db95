# idempotency: PGXS build.  The README's commands (test/demo, test/run) install
# what the build needs first; `include $(PGXS)` fails without pg_config.

# Two extensions: idempotency (the library and its SQL, on every server that
# holds records) and idempotency_router (SQL only, for the PL/Proxy proxy
# database of a sharded deployment; README "Scaling out").  PGXS installs
# each one's control file; their scripts are in DATA.
MAIN = idempotency
ROUTER = idempotency_router
EXTENSION = $(MAIN) $(ROUTER)
EXTVERSION = 0.3.0
# The router's SQL has not changed since 0.2.0.
ROUTER_VERSION = 0.2.0

MODULE_big = idempotency
OBJS = $(patsubst %.c,%.o,$(wildcard src/*.c))
HEADERS = src/idempotency.h

# Released scripts never change.  Every SQL change after a release goes into
# the upgrade script to the next version; the install script of the current
# version is built from the first release and the upgrade chain, so a fresh
# install and an updated one cannot drift apart (test/t/009_upgrade.pl compares
# their catalogs and checks that an update keeps the data; sql/upgrade_chain.sql
# walks the chain).
UPGRADE_CHAIN = sql/$(MAIN)--0.1.0.sql sql/$(MAIN)--0.1.0--0.2.0.sql \
	sql/$(MAIN)--0.2.0--0.3.0.sql
DATA = $(UPGRADE_CHAIN) sql/$(ROUTER)--$(ROUTER_VERSION).sql
DATA_built = sql/$(MAIN)--$(EXTVERSION).sql

# The operator's tools (src/tools/README.md), installed into the server's
# bindir (pg_config --bindir) by their file name.
SCRIPTS = src/tools/idem_move_partition

# Tests are found by wildcard: adding a file is enough.
#   sql/*.sql + expected/*.out          pg_regress (the SQL surface and errors;
#                                       not the extensions' scripts)
#   test/specs/*.spec + test/expected   isolation (races)
#   test/t/*.pl                         TAP (crashes, restarts, standbys)
#   test/pgtap/*.sql                    pgTAP, run by pg_prove (see test/run)
REGRESS = $(filter-out $(MAIN)--% $(ROUTER)--%,$(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=$(MAIN)
ISOLATION = $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec))
ISOLATION_OPTS = --inputdir=test --load-extension=$(MAIN)
TAP_TESTS = 1
PROVE_TESTS = $(wildcard test/t/*.pl)

PG_CFLAGS += -Wall -Wextra -Werror -Wno-unused-parameter

# The build's identity, for idem_version() (src/version.c): the library's
# version is EXTVERSION, and the build id the checkout's git describe.  Only
# when this directory is the top of a git work tree: a tarball unpacked
# inside another checkout must not take that one's commit.  safe.directory:
# git refuses a work tree owned by another user (root's make install in a
# user's checkout) unless told it is safe.  The last id seen is kept in
# src/.build_id, so that a rebuild where git does not answer keeps it, and
# src/version.o is rebuilt only when it changes.  Without either the id
# says so.
IDEM_GIT = git -c safe.directory='$(CURDIR)' -C '$(CURDIR)'
IDEM_GIT_TOP := $(shell $(IDEM_GIT) rev-parse --show-toplevel 2>/dev/null)
IDEM_GIT_ID := $(if $(IDEM_GIT_TOP),$(if $(filter $(realpath $(CURDIR)),$(realpath $(IDEM_GIT_TOP))),$(shell $(IDEM_GIT) describe --always --dirty 2>/dev/null)))
IDEM_BUILD_ID := $(or $(IDEM_GIT_ID),$(shell cat src/.build_id 2>/dev/null),unknown (git describe unavailable))
PG_CPPFLAGS += -DIDEM_LIBRARY_VERSION='"$(EXTVERSION)"'
PG_CPPFLAGS += -DIDEM_BUILD_ID='"$(IDEM_BUILD_ID)"'
EXTRA_CLEAN = results regression.diffs regression.out output_iso tmp_check log src/.build_id

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

sql/$(MAIN)--$(EXTVERSION).sql: $(UPGRADE_CHAIN)
	cat $^ > $@

# A module includes the headers of the modules it uses (src/README.md, "The
# headers"); the version guards are in src/pg_compat.h.  Any header's change
# rebuilds every module.
$(OBJS): $(wildcard src/*.h)

src/version.o src/version.bc: src/.build_id Makefile
src/.build_id: FORCE
	@[ -f $@ ] && [ "$$(cat $@)" = '$(IDEM_BUILD_ID)' ] || echo '$(IDEM_BUILD_ID)' > $@
.PHONY: FORCE
FORCE:

# PGXS's uninstall removes $(bindir)/$(SCRIPTS), path and all: the tools are
# installed by their file name.
uninstall: uninstall-tools
.PHONY: uninstall-tools
uninstall-tools:
	rm -f $(addprefix '$(DESTDIR)$(bindir)'/, $(notdir $(SCRIPTS)))

# The pg_regress and isolation suites under valgrind memcheck (slow: about
# 12 minutes on 2 cores; not part of test/run).
.PHONY: valgrind
valgrind:
	test/valgrind/run

# Packages (src/packaging): `make deb` builds the Debian packages of this
# tree for PG_CONFIG's major version (postgresql-N-idempotency and
# postgresql-N-idempotency-router) into DEB_OUT (DEB_VERSION: the version
# src/packaging/deb would choose otherwise); `make dist` the PGXN archive
# idempotency-$(EXTVERSION).zip of HEAD, once META.json agrees with the
# control files.
DEB_OUT ?= .
deb:
	bash src/packaging/deb --pg-config '$(PG_CONFIG)' --out '$(DEB_OUT)' \
		$(if $(DEB_VERSION),--version '$(DEB_VERSION)')
dist:
	bash src/packaging/dist
.PHONY: deb dist
