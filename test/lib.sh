# Shared by test/run, test/demo and the benchmark runner: install what the build
# needs, build and install the extension, start and stop throwaway clusters.
# Works as root (clusters run as the postgres user) or as a user with sudo.

# The PostgreSQL major version under test: 15 from the host's packages (the
# default), 17 or 18 in a chroot (chroot.sh); "--pg N" sets it per run.
IDEM_PG_MAJOR=${IDEM_PG_MAJOR:-15}
IDEM_HOST_PG_MAJOR=15
# idem_packages MAJOR: the Debian packages the build and the tests need.
idem_packages() {
    echo "make gcc postgresql-$1 postgresql-server-dev-$1 postgresql-$1-repack" \
        "postgresql-$1-pgtap postgresql-$1-plproxy postgresql-$1-cron postgresql-$1-auto-failover libtap-parser-sourcehandler-pgtap-perl libipc-run-perl" \
        "pgbouncer python3 python3-psycopg rabbitmq-server python3-pika curl"
}
IDEM_PACKAGES=$(idem_packages "$IDEM_PG_MAJOR")
IDEM_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

idem_log() { printf '== %s\n' "$*" >&2; }

. "$IDEM_ROOT/test/chroot.sh"

# idem_dispatch SCRIPT ARGS...: the start of every script that takes "--pg N".
# Sets IDEM_PG_MAJOR and leaves the other arguments in IDEM_ARGS; for a major
# version the host does not have, runs SCRIPT (its path in the checkout) with
# them in that version's chroot instead and exits with its status.
idem_dispatch() {
    local script=$1
    shift
    IDEM_ARGS=()
    while [ $# -gt 0 ]; do
        case $1 in
            --pg) [ $# -ge 2 ] || { idem_log "--pg needs a version: 15, 17 or 18"; exit 2; }
                  IDEM_PG_MAJOR=$2; shift 2 ;;
            --pg=*) IDEM_PG_MAJOR=${1#--pg=}; shift ;;
            *) IDEM_ARGS+=("$1"); shift ;;
        esac
    done
    case $IDEM_PG_MAJOR in
        15|17|18) ;;
        *) idem_log "PostgreSQL $IDEM_PG_MAJOR is not supported: 15, 17 and 18 are"; exit 2 ;;
    esac
    IDEM_PACKAGES=$(idem_packages "$IDEM_PG_MAJOR")
    if [ "$IDEM_PG_MAJOR" != "$IDEM_HOST_PG_MAJOR" ] && [ -z "${IDEM_IN_CHROOT:-}" ]; then
        local rc=0
        idem_in_chroot "$IDEM_PG_MAJOR" "$script" "${IDEM_ARGS[@]}" || rc=$?
        exit $rc
    fi
}

# Run a command as root (directly, or through sudo).
idem_as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# idem_install_packages [EXTRA...]: install the Debian packages that are
# missing (apt-get update first): the build's and test's, and EXTRA.
idem_install_packages() {
    local missing=() pkg
    for pkg in $IDEM_PACKAGES "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    idem_log "installing ${missing[*]}"
    idem_as_root apt-get update -qq
    idem_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

# IDEM_PG_BINDIR points at another (relocated) installation of the same major
# version, so that several checkouts can install and test side by side.
idem_bindir() { echo "${IDEM_PG_BINDIR:-/usr/lib/postgresql/$IDEM_PG_MAJOR/bin}"; }

# IDEM_EDITION=sql runs a script against the SQL edition instead (sql/edition):
# then IDEM_PG_BINDIR is a tree of idem_sql_edition_tree, made here unless
# given, nothing is built, and nothing is preloaded.
IDEM_EDITION=${IDEM_EDITION:-c}

# Build with -Werror and install into the server's directories.
idem_build_install() {
    local pg_config
    if [ "$IDEM_EDITION" = sql ]; then
        if [ -z "${IDEM_PG_BINDIR:-}" ]; then
            IDEM_PG_BINDIR=$(idem_sql_edition_tree "$(mktemp -d /tmp/idempotency-sql-tree.XXXXXX)") || return 1
            export IDEM_PG_BINDIR
        fi
        [ -f "$("$IDEM_PG_BINDIR/pg_config" --sharedir)/extension/idempotency.control" ] &&
            ! grep -q module_pathname "$("$IDEM_PG_BINDIR/pg_config" --sharedir)/extension/idempotency.control" || {
            idem_log "IDEM_EDITION=sql: $IDEM_PG_BINDIR is not a tree of the SQL edition"; return 1; }
        idem_log "the SQL edition, in $IDEM_PG_BINDIR"
        return 0
    fi
    pg_config="$(idem_bindir)/pg_config"
    idem_log "building and installing the extension"
    make -C "$IDEM_ROOT" -s PG_CONFIG="$pg_config" >/dev/null
    idem_as_root make -C "$IDEM_ROOT" -s PG_CONFIG="$pg_config" install >/dev/null
}

# idem_demo_shows_every_outcome LOG: test/demo's output in LOG shows each
# claim outcome, and its only errors are the three it shows on purpose
# (IK001, IK002, IK005).
idem_demo_shows_every_outcome() {
    local outcome
    for outcome in new replay in_progress takeover unknown; do
        grep -qE "^ $outcome +\|" "$1" || return 1
    done
    [ "$(grep -c 'ERROR:' "$1")" = 3 ] &&
        [ "$(grep -cE 'ERROR:  (idempotency key "order-7f3a" was already used|token 1 is not the current fencing token|invalid transition from "PAID" to "PENDING")' "$1")" = 3 ]
}

# The user that owns the throwaway clusters: postgres when we are root.
idem_cluster_user() {
    if [ "$(id -u)" -eq 0 ]; then echo postgres; else id -un; fi
}

idem_as_cluster_user() {
    if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

# idem_free_port: a TCP port of 127.0.0.1 that nothing holds now, below the
# kernel's ephemeral range (32768-60999), where the thousands of connections
# of the load tests leave ports that a listener cannot bind.  Bound with
# SO_REUSEADDR, as PostgreSQL binds.
idem_free_port() {
    local p
    for _ in $(seq 200); do
        p=$(( 20000 + RANDOM % 12000 ))
        perl -MIO::Socket::INET -e 'IO::Socket::INET->new(LocalAddr => "127.0.0.1",
            LocalPort => $ARGV[0], Listen => 1, ReuseAddr => 1) or exit 1' "$p" && break
    done
    echo "$p"
}

# idem_cluster_start DIR: initdb and start a cluster in DIR on a free private
# port, listening only on a unix socket in DIR and on 127.0.0.1.  Sets PGHOST,
# PGPORT, PGUSER, PGDATABASE for the clients.  IDEM_EXTRA_CONF holds extra
# postgresql.conf lines.
idem_cluster_start() {
    local dir=$1 bindir port
    bindir=$(idem_bindir)
    mkdir -p "$dir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$dir"
    port=$(idem_free_port)
    idem_as_cluster_user "$bindir/initdb" -D "$dir/data" -A trust -U postgres \
        --no-sync -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1
    {
        echo "listen_addresses = '127.0.0.1'"
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "fsync = off"
        echo "max_prepared_transactions = 10"
        printf '%s\n' "${IDEM_EXTRA_CONF:-}"
    } | idem_as_cluster_user tee -a "$dir/data/postgresql.conf" >/dev/null
    idem_as_cluster_user "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w start >/dev/null
    export PGHOST=$dir PGPORT=$port PGUSER=postgres PGDATABASE=postgres
    IDEM_CLUSTER_DIR=$dir
}

# idem_preload_conf DB...: the postgresql.conf lines of the configuration the
# README recommends, for IDEM_EXTRA_CONF: the library preloaded and the purge
# worker purging databases DB... every second (so that its runs overlap the
# tests that use those databases).
idem_preload_conf() {
    local IFS=,
    [ "$IDEM_EDITION" = sql ] && return 0     # no library, no worker
    printf '%s\n' "shared_preload_libraries = 'idempotency'" \
        "idempotency.databases = '$*'" \
        "idempotency.purge_interval = 1"
}

# idem_edition_owner: the role that creates the extension on the running
# cluster and owns what a test makes (databases, tables, the roles of its
# workloads); echoes its name.  The C edition's extension is not trusted:
# the superuser postgres.  The SQL edition's is: the role idem_owner, LOGIN
# CREATEDB CREATEROLE and no superuser, what a managed service gives its
# customer; the superuser only creates it here (a DBA's step).  On 16 and
# later a role gets only ADMIN on the roles it creates: createrole_self_grant
# makes it a member of them too, so that it may SET ROLE to them (on 15 it
# grants itself the membership: GRANT r TO idem_owner).  Not INHERIT: a
# member that inherits a role is bound by its policies too, and the kind
# global_reconciler's restrictive ones would let the owner update only
# unknown records.
idem_edition_owner() {
    [ "$IDEM_EDITION" = sql ] || { echo postgres; return 0; }
    "$(idem_bindir)/psql" -X -q -v ON_ERROR_STOP=1 -U postgres -d postgres >/dev/null <<'SQL' || return 1
SELECT 'CREATE ROLE idem_owner LOGIN CREATEDB CREATEROLE NOSUPERUSER'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'idem_owner') \gexec
SELECT $$ALTER ROLE idem_owner SET createrole_self_grant = 'set'$$
 WHERE current_setting('server_version_num')::int >= 160000 \gexec
SQL
    echo idem_owner
}

# idem_roles_note ROLE...: a TAP comment naming the roles a run connects
# as, each marked if it is a superuser (from the server, not assumed).
idem_roles_note() {
    "$(idem_bindir)/psql" -X -Atq -U postgres -d postgres -v roles="$*" <<'SQL'
SELECT '# connects as ' || string_agg(rolname || CASE WHEN rolsuper THEN ' (superuser)' ELSE '' END,
                                      ', ' ORDER BY rolname)
  FROM pg_roles WHERE rolname = ANY (string_to_array(:'roles', ' '))
SQL
}

idem_cluster_stop() {
    [ -n "${IDEM_CLUSTER_DIR:-}" ] || return 0
    idem_as_cluster_user "$(idem_bindir)/pg_ctl" -D "$IDEM_CLUSTER_DIR/data" -m fast -w stop \
        >/dev/null 2>&1 || true
    IDEM_CLUSTER_DIR=
}

# idem_source_build MAJOR: a build of PostgreSQL MAJOR from Debian's source
# package (sid's; Debian 12 has no binaries of newer majors that run on the
# host), installed in a prefix of its own under IDEM_CACHE and
# kept there: a second call only echoes the prefix.  The stamp file is
# written last, so an interrupted build is redone from the start.  Progress
# on stderr; the prefix on stdout; the build's output in build.log there.
# Used where two majors must be on one filesystem (pg_upgrade, TAP 012).
# Two callers at once (two checkouts' test/run) take turns on a lock file.
idem_source_build() {
    local lock=$IDEM_CACHE/src-$1.lock
    idem_as_root mkdir -p "$IDEM_CACHE"
    idem_as_root touch "$lock" && idem_as_root chmod 666 "$lock"
    (
        flock 9 || exit 1
        idem_source_build_locked "$1"
    ) 9>>"$lock"
}

idem_source_build_locked() {
    local major=$1 cache=$IDEM_CACHE/src-$1 uri apt_opts started
    local prefix=$cache/install
    if [ -f "$cache/stamp" ]; then echo "$prefix"; return 0; fi
    started=$SECONDS
    idem_install_packages bison flex libreadline-dev zlib1g-dev libipc-run-perl dpkg-dev || return 1
    uri=$(idem_debian_archive) || return 1
    idem_as_root rm -rf "$cache"
    idem_as_root mkdir -p "$cache/apt/sources" "$cache/apt/state/lists/partial" \
        "$cache/apt/cache/archives/partial" "$cache/download"
    idem_as_root chown -R "$(id -u):$(id -g)" "$cache"
    printf '%s\n' 'Types: deb-src' "URIs: $uri" 'Suites: sid' 'Components: main' \
        'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
        idem_as_root tee "$cache/apt/sources/sid.sources" >/dev/null
    # A private apt: its own sources, lists and cache; the system's untouched.
    apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$cache/apt/sources"
        -o "Dir::State=$cache/apt/state" -o "Dir::Cache=$cache/apt/cache")
    idem_log "PostgreSQL $major: downloading Debian's source package (sid)"
    idem_as_root apt-get "${apt_opts[@]}" update -qq >"$cache/build.log" 2>&1 &&
        (cd "$cache/download" && idem_as_root apt-get "${apt_opts[@]}" source --download-only \
            "postgresql-$major" >>"$cache/build.log" 2>&1) ||
        { idem_log "download failed, see $cache/build.log"; return 1; }
    # The build runs as the calling user (root, or a user with sudo).
    idem_as_root chown -R "$(id -u):$(id -g)" "$cache"
    # The upstream tarball inside it (Debian's packaging patches are not needed).
    mkdir -p "$cache/source"
    tar -xf "$cache"/download/postgresql-"$major"_*.orig.tar.* -C "$cache/source" \
        --strip-components=1 || return 1
    idem_log "PostgreSQL $major: configure, make, make install (a few minutes)"
    (
        cd "$cache/source" &&
        ./configure --prefix="$prefix" --enable-tap-tests --without-icu &&
        make -j"$(nproc)" && make install
    ) >>"$cache/build.log" 2>&1 || { idem_log "build failed, see $cache/build.log"; return 1; }
    idem_as_root rm -rf "$cache/apt"
    touch "$cache/stamp"
    idem_log "PostgreSQL $major built in $((SECONDS - started)) s: $prefix"
    echo "$prefix"
}

# idem_build_install_into PREFIX: build the extension with PREFIX's pg_config
# and install it there.  The build runs in a temporary copy of this tree
# (its tracked and untracked files, not the ignored ones), so that the object
# files of the checkout's own build are not mixed with another major's; the
# copy reports the checkout's build id.
idem_build_install_into() {
    local prefix=$1 tmp id
    tmp=$(mktemp -d /tmp/idempotency-build.XXXXXX)
    idem_log "building and installing the extension into $prefix"
    (cd "$IDEM_ROOT" && git -c safe.directory="$IDEM_ROOT" ls-files -co --exclude-standard -z |
        while IFS= read -r -d '' f; do [ ! -e "$f" ] || printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$tmp" || { rm -rf "$tmp"; return 1; }
    id=$(git -c safe.directory="$IDEM_ROOT" -C "$IDEM_ROOT" describe --always --dirty 2>/dev/null ||
        cat "$IDEM_ROOT/src/.build_id" 2>/dev/null || true)
    [ -n "$id" ] && echo "$id" >"$tmp/src/.build_id"
    make -C "$tmp" -s PG_CONFIG="$prefix/bin/pg_config" >/dev/null &&
        idem_as_root make -C "$tmp" -s PG_CONFIG="$prefix/bin/pg_config" install >/dev/null
    local rc=$?
    rm -rf "$tmp"
    return $rc
}

# idem_sql_edition_tree DIR: a copy of this major's installation in DIR
# (Debian's PostgreSQL is relocatable) that holds no file of the C edition,
# with the SQL edition's control file and script installed instead, so that
# CREATE EXTENSION idempotency there can only be the SQL edition.  Echoes
# its bindir; IDEM_PG_BINDIR=that runs the other functions against it.
idem_sql_edition_tree() {
    local dir=$1 lib share
    lib=/usr/lib/postgresql/$IDEM_PG_MAJOR
    share=/usr/share/postgresql/$IDEM_PG_MAJOR
    idem_as_root rm -rf "$dir"
    idem_as_root mkdir -p "$dir$lib" "$dir$share"
    idem_as_root cp -a "$lib/." "$dir$lib/"
    idem_as_root cp -a "$share/." "$dir$share/"
    # the router (SQL for PL/Proxy's proxy database) is no part of either edition
    idem_as_root rm -f "$dir$lib"/lib/idempotency.so "$dir$lib"/lib/bitcode/idempotency.index.bc \
        "$dir$share"/extension/idempotency.control "$dir$share"/extension/idempotency--*
    idem_as_root rm -rf "$dir$lib"/lib/bitcode/idempotency "$dir$lib/include/server/extension/idempotency"
    if ! compgen -G "$IDEM_ROOT/sql/edition/idempotency--*[0-9].sql" >/dev/null; then
        idem_log "sql/edition has no extension script: make -C sql/edition (or draft)"
        return 1
    fi
    idem_as_root cp "$IDEM_ROOT/sql/edition/idempotency.control" \
        "$IDEM_ROOT"/sql/edition/idempotency--*[0-9].sql "$dir$share/extension/"
    if find "$dir" -mindepth 1 -name 'idempotency*' -not -name 'idempotency_router*' |
        grep -v "$dir$share/extension/idempotency[.-]" | grep -q .; then
        idem_log "the SQL edition's tree still holds a file of the C edition:"
        find "$dir" -mindepth 1 -name 'idempotency*' >&2
        return 1
    fi
    echo "$dir$lib/bin"
}

# pg_tle (Trusted Language Extensions), which the SQL edition's pg_tle
# install needs, is in no package archive: its source archive is taken from
# IDEM_PG_TLE_SRC, a folder holding pg_tle-VERSION.tar.gz or such a file
# itself, by default ../shared/components next to the checkout (where the
# project's machines keep it).  IDEM_PG_TLE_VERSION picks the release
# (1.5.2: what the managed services run).
IDEM_PG_TLE_VERSION=${IDEM_PG_TLE_VERSION:-1.5.2}

# idem_pg_tle_tarball: the path of pg_tle's source archive; nothing and
# status 1 where there is none.
idem_pg_tle_tarball() {
    local src=${IDEM_PG_TLE_SRC:-$IDEM_ROOT/../shared/components}
    [ -d "$src" ] && src=$src/pg_tle-$IDEM_PG_TLE_VERSION.tar.gz
    [ -f "$src" ] || return 1
    (cd "$(dirname "$src")" && echo "$(pwd -P)/$(basename "$src")")
}

# idem_pg_tle_missing: the one line that says why pg_tle stages are skipped.
idem_pg_tle_missing() {
    echo "pg_tle's source is missing: no pg_tle-$IDEM_PG_TLE_VERSION.tar.gz in" \
        "${IDEM_PG_TLE_SRC:-../shared/components} (set IDEM_PG_TLE_SRC to its folder or archive)"
}

# idem_pg_tle_build [BINDIR]: build pg_tle for this major version and install
# it into the installation of BINDIR (by default idem_bindir's, e.g. a tree
# of idem_sql_edition_tree); the server must then preload it
# (shared_preload_libraries = 'pg_tle').  It compiles with BINDIR's
# pg_config where that installation has the server headers, else with the
# packaged one of the same major (a relocated copy of Debian's tree has no
# headers), installs into a staging folder kept under IDEM_CACHE (a second
# call only copies it), and copies that into BINDIR's pkglibdir and
# extension folder.  Returns 2, saying why in one line, where the source is
# missing; two callers at once take turns on a lock file.
idem_pg_tle_build() {
    local bindir=${1:-$(idem_bindir)} tarball lock
    if ! tarball=$(idem_pg_tle_tarball); then
        idem_log "$(idem_pg_tle_missing)"
        return 2
    fi
    lock=$IDEM_CACHE/pg_tle-$IDEM_PG_MAJOR.lock
    idem_as_root mkdir -p "$IDEM_CACHE"
    idem_as_root touch "$lock" && idem_as_root chmod 666 "$lock"
    (
        flock 9 || exit 1
        idem_pg_tle_build_locked "$bindir" "$tarball"
    ) 9>>"$lock"
}

idem_pg_tle_build_locked() {
    local bindir=$1 tarball=$2 pg_config major sum cache started
    local from_lib from_share to_lib to_share
    pg_config=$bindir/pg_config
    [ -x "$pg_config" ] || { idem_log "pg_tle: no pg_config in $bindir"; return 1; }
    major=$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
    [ -f "$("$pg_config" --includedir-server)/postgres.h" ] ||
        pg_config=/usr/lib/postgresql/$major/bin/pg_config
    [ -f "$("$pg_config" --includedir-server)/postgres.h" ] ||
        { idem_log "pg_tle: no server headers for PostgreSQL $major (postgresql-server-dev-$major)"; return 1; }
    # one build per archive, major version and compiling pg_config
    sum=$( { sha256sum <"$tarball"; echo "$pg_config"; } | sha256sum | cut -c1-12)
    cache=$IDEM_CACHE/pg_tle-$major-$sum
    if [ ! -f "$cache/stamp" ]; then
        started=$SECONDS
        idem_install_packages libkrb5-dev flex bison || return 1
        idem_as_root rm -rf "$cache"
        idem_as_root mkdir -p "$cache/source" "$cache/stage"
        idem_as_root chown -R "$(id -u):$(id -g)" "$cache"
        idem_log "pg_tle: building $(basename "$tarball") for PostgreSQL $major"
        tar -xzf "$tarball" -C "$cache/source" --strip-components=1 || return 1
        (
            make -C "$cache/source" PG_CONFIG="$pg_config" -j"$(nproc)" &&
            make -C "$cache/source" PG_CONFIG="$pg_config" DESTDIR="$cache/stage" install
        ) >"$cache/build.log" 2>&1 || { idem_log "pg_tle: build failed, see $cache/build.log"; return 1; }
        touch "$cache/stamp"
        idem_log "pg_tle built in $((SECONDS - started)) s"
    fi
    from_lib=$cache/stage$("$pg_config" --pkglibdir)
    from_share=$cache/stage$("$pg_config" --sharedir)/extension
    to_lib=$("$bindir/pg_config" --pkglibdir)
    to_share=$("$bindir/pg_config" --sharedir)/extension
    idem_as_root cp -a "$from_lib/." "$to_lib/" &&
        idem_as_root cp -a "$from_share/." "$to_share/" ||
        { idem_log "pg_tle: could not install into $to_lib and $to_share"; return 1; }
}

# idem_rabbit_start DIR: a throwaway RabbitMQ node of its own in DIR (as
# test/outbox/run starts one): private ports below the ephemeral range, its
# own epmd (started here, so that its pid is known), no plugins, listening on
# 127.0.0.1 only; waits until it is up.  Sets IDEM_RABBIT_PORT (AMQP, user
# guest) and what idem_rabbit_stop needs.  Needs rabbitmq-server.
idem_rabbit_start() {
    local dir=$1 epmd_port dist_port
    IDEM_RABBIT_PORT=$(idem_free_port)
    # three different ports (nothing holds them until the node starts)
    epmd_port=$IDEM_RABBIT_PORT dist_port=$IDEM_RABBIT_PORT
    while [ "$epmd_port" = "$IDEM_RABBIT_PORT" ]; do epmd_port=$(idem_free_port); done
    while [ "$dist_port" = "$IDEM_RABBIT_PORT" ] || [ "$dist_port" = "$epmd_port" ]; do
        dist_port=$(idem_free_port)
    done
    mkdir -p "$dir/mnesia" "$dir/log"
    echo '[].' >"$dir/enabled_plugins"
    echo "listeners.tcp.default = 127.0.0.1:$IDEM_RABBIT_PORT" >"$dir/rabbitmq.conf"
    # Debian's rabbitmq-server and rabbitmqctl run as the user rabbitmq
    if id rabbitmq >/dev/null 2>&1; then chown -R rabbitmq "$dir"; fi
    IDEM_RABBIT_ENV=(HOME="$dir" RABBITMQ_NODENAME="idem$IDEM_RABBIT_PORT@localhost"
        RABBITMQ_NODE_PORT="$IDEM_RABBIT_PORT" RABBITMQ_DIST_PORT="$dist_port" ERL_EPMD_PORT="$epmd_port"
        RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log"
        RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_CONFIG_FILE="$dir/rabbitmq")
    ERL_EPMD_PORT=$epmd_port epmd -port "$epmd_port" >"$dir/epmd.out" 2>&1 &
    IDEM_EPMD_PID=$!
    env "${IDEM_RABBIT_ENV[@]}" rabbitmq-server >>"$dir/server.out" 2>&1 &
    IDEM_RABBIT_PID=$!
    for _ in $(seq 120); do
        env "${IDEM_RABBIT_ENV[@]}" rabbitmqctl -q await_startup >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    idem_log "RabbitMQ did not start"; tail -20 "$dir/server.out" >&2
    return 1
}

# idem_rabbit_stop: stops the node of idem_rabbit_start and its epmd, by
# their pids (rabbitmq-server runs the node under su: its process tree).
idem_rabbit_stop() {
    [ -n "${IDEM_RABBIT_PID:-}" ] || return 0
    env "${IDEM_RABBIT_ENV[@]}" rabbitmqctl -q stop >/dev/null 2>&1 || true
    idem_kill_tree "$IDEM_RABBIT_PID"
    kill -9 "$IDEM_EPMD_PID" 2>/dev/null || true
    IDEM_RABBIT_PID=
}

# idem_kill_tree PID: SIGKILL a process we started and its descendants.
idem_kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do idem_kill_tree "$child"; done
    kill -9 "$1" 2>/dev/null || true
}
