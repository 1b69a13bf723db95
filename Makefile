# idempotency: PGXS build.  The README's commands (test/demo, test/run) install
# what the build needs first; `include $(PGXS)` fails without pg_config.

EXTENSION = idempotency
EXTVERSION = 0.2.0

MODULE_big = idempotency
OBJS = $(patsubst %.c,%.o,$(wildcard src/*.c))
HEADERS = src/idempotency.h

# Released scripts never change.  Every SQL change after a release goes into
# the upgrade script to the next version; the install script of the current
# version is built from the first release and the upgrade chain, so a fresh
# install and an updated one cannot drift apart (test/t/005_upgrade.pl compares
# their catalogs and checks that an update keeps the data; sql/upgrade_chain.sql
# walks the chain).
UPGRADE_CHAIN = sql/$(EXTENSION)--0.1.0.sql sql/$(EXTENSION)--0.1.0--0.2.0.sql
DATA = $(UPGRADE_CHAIN)
DATA_built = sql/$(EXTENSION)--$(EXTVERSION).sql

# Tests are found by wildcard: adding a file is enough.
#   sql/*.sql + expected/*.out          pg_regress (the SQL surface and errors)
#   test/specs/*.spec + test/expected   isolation (races)
#   test/t/*.pl                         TAP (crashes, restarts, standbys)
#   test/pgtap/*.sql                    pgTAP, run by pg_prove (see test/run)
REGRESS = $(filter-out $(EXTENSION)--%,$(patsubst sql/%.sql,%,$(wildcard sql/*.sql)))
REGRESS_OPTS = --load-extension=$(EXTENSION)
ISOLATION = $(patsubst test/specs/%.spec,%,$(wildcard test/specs/*.spec))
ISOLATION_OPTS = --inputdir=test --load-extension=$(EXTENSION)
TAP_TESTS = 1
PROVE_TESTS = $(wildcard test/t/*.pl)

PG_CFLAGS += -Wall -Wextra -Werror -Wno-unused-parameter

# The build's identity, for idem_version() (src/version.c): the library's
# version is EXTVERSION, and the build id the checkout's git describe.  The
# last id seen is kept in src/.build_id, so that a rebuild where git does not
# answer (a tarball, or root's make install in a user's checkout) keeps it,
# and src/version.o is rebuilt only when it changes.  Without either the
# library says "unknown (not built from a git checkout)".
IDEM_BUILD_ID := $(or $(shell git -C '$(CURDIR)' describe --always --dirty 2>/dev/null),$(shell cat src/.build_id 2>/dev/null))
PG_CPPFLAGS += -DIDEM_LIBRARY_VERSION='"$(EXTVERSION)"'
ifneq ($(IDEM_BUILD_ID),)
PG_CPPFLAGS += -DIDEM_BUILD_ID='"$(IDEM_BUILD_ID)"'
endif
EXTRA_CLEAN += src/.build_id
EXTRA_CLEAN = results regression.diffs regression.out output_iso tmp_check log

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

sql/$(EXTENSION)--$(EXTVERSION).sql: $(UPGRADE_CHAIN)
	cat $^ > $@

# Every module includes the one shared header.
$(OBJS): src/idempotency.h

src/version.o: src/.build_id Makefile
src/.build_id: FORCE
	@[ -f $@ ] && [ "$$(cat $@)" = '$(IDEM_BUILD_ID)' ] || echo '$(IDEM_BUILD_ID)' > $@
.PHONY: FORCE
FORCE:

# The pg_regress and isolation suites under valgrind memcheck (slow: about
# 12 minutes on 2 cores; not part of test/run).
.PHONY: valgrind
valgrind:
	test/valgrind/run
