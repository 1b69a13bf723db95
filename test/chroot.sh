# PostgreSQL 17 and 18 for the tests on a Debian 12 machine, sourced by lib.sh.
#
# Debian 12 ships PostgreSQL 15 only.  Debian's own binary packages of 17
# (trixie) and 18 (sid) need their release's glibc, so each major version runs
# in a chroot of the release that ships it, made with debootstrap from the
# machine's own Debian archive (read from its apt sources, never written here)
# and cached under IDEM_CACHE between runs.  A script given "--pg 17" copies the
# checkout into the chroot and runs itself there: inside, the chroot is a
# Debian machine whose packaged PostgreSQL is 17, so the same script builds,
# installs and tests with the chroot's gcc, PGXS and servers.  /proc is
# mounted only while a run is inside; one run at a time per chroot (a lock),
# since each installs the extension into the chroot's PostgreSQL.

IDEM_CACHE=${IDEM_CACHE:-/var/cache/idempotency}
# Bump to rebuild every cached chroot (a change of what idem_chroot_make does).
IDEM_CHROOT_FORMAT=2

# idem_chroot_suite MAJOR: the Debian release whose packages are MAJOR.
idem_chroot_suite() {
    case $1 in
        15) echo bookworm ;;
        17) echo trixie ;;
        18) echo sid ;;
        *) return 1 ;;
    esac
}

# idem_debian_archive [SUITE]: the machine's Debian archive: the URI of the
# Debian entry of its apt sources for SUITE (default: its own release) (deb822 .sources, or a one-line sources.list),
# so that another vendor's repository listed first is not taken.  A
# "mirror+file:" URI names a file of mirrors: the first one is used.
idem_debian_archive() {
    local codename=${1:-} uri
    [ -n "$codename" ] || codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v cn="$codename" '
        BEGIN { RS = ""; FS = "\n" }
        {
            types = uris = suites = ""; enabled = "yes"
            for (i = 1; i <= NF; i++) {
                key = tolower($i); sub(/:.*/, "", key)
                val = $i; sub(/^[^:]*:[ \t]*/, "", val)
                if (key == "types") types = val
                else if (key == "uris") uris = val
                else if (key == "suites") suites = val
                else if (key == "enabled") enabled = tolower(val)
            }
            if (enabled != "no" && (" " types " ") ~ / deb / && (" " suites " ") ~ (" " cn " ")) {
                split(uris, u, " "); print u[1]; exit
            }
        }')
    [ -n "$uri" ] || uri=$(awk -v cn="$codename" '$1 == "deb" {
            for (i = 2; i < NF; i++) if ($i ~ /:\/\//) { if ($(i + 1) == cn) { print $i; exit } break }
        }' /etc/apt/sources.list 2>/dev/null)
    case $uri in
        mirror+file:*) uri=$(grep -m1 -vE '^[[:space:]]*(#|$)' "${uri#mirror+file:}" | awk '{ print $1 }') ;;
        mirror+*) uri=${uri#mirror+} ;;
    esac
    [ -n "$uri" ] || { idem_log "no Debian archive for $codename in /etc/apt/sources*"; return 1; }
    echo "${uri%/}"
}

# idem_chroot_empty DIR: DIR empty, whatever was there; an interrupted run
# may have left /proc (or debootstrap's /sys) mounted in it.
idem_chroot_empty() {
    awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
        xargs -r -n1 umount -l
    rm -rf --one-file-system "$1" && mkdir -p "$1"
}

# idem_chroot_bootstrap SUITE DIR: debootstrap SUITE into DIR (replacing
# whatever is there) and set apt up the way every chroot here needs.
idem_chroot_bootstrap() {
    local suite=$1 dir=$2 archive
    archive=$(idem_debian_archive) || return 1
    idem_chroot_empty "$dir" || return 1
    debootstrap --variant=minbase "$suite" "$dir" "$archive" >"$dir.debootstrap.log" 2>&1 ||
        { tail -20 "$dir.debootstrap.log" >&2; return 1; }
    # Only what is asked for (no mail server, no systemd), and no service
    # started by a package's installation.  sid's Release files may be older
    # than their Valid-Until on a mirror.
    echo 'APT::Install-Recommends "false";' >"$dir/etc/apt/apt.conf.d/99idempotency"
    [ "$suite" = sid ] &&
        echo 'Acquire::Check-Valid-Until "false";' >>"$dir/etc/apt/apt.conf.d/99idempotency"
    printf '#!/bin/sh\nexit 101\n' >"$dir/usr/sbin/policy-rc.d"
    chmod 755 "$dir/usr/sbin/policy-rc.d"
    cp /etc/resolv.conf "$dir/etc/resolv.conf"
}

# idem_chroot_make SUITE DIR: the chroot of SUITE in DIR for the tests, with
# what every build needs.  A stamp written last marks it done.
idem_chroot_make() {
    local suite=$1 dir=$2 started
    started=$(date +%s)
    idem_log "making the $suite chroot in $dir (debootstrap --variant=minbase)"
    idem_chroot_bootstrap "$suite" "$dir" || return 1
    printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-exclude /usr/share/man/*' \
        'path-exclude /usr/share/locale/*' >"$dir/etc/dpkg/dpkg.cfg.d/99idempotency"
    idem_chroot_exec "$dir" sh -c 'apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            make gcc libc6-dev ca-certificates >/dev/null' || return 1
    echo "$IDEM_CHROOT_FORMAT" >"$dir/.idempotency-chroot"
    idem_log "the $suite chroot took $(( $(date +%s) - started )) s"
}

# idem_chroot_clean SUITE DIR: a clean chroot of SUITE in DIR, replacing
# whatever is there: debootstrap's minbase, apt's settings and the release's
# updates and security suites, nothing else
# installed (what a package needs, apt must bring).  Unpacked from a tarball
# made once and cached under IDEM_CACHE; the caller holds no lock on it, so
# the tarball is written under a temporary name and renamed.
idem_chroot_clean() {
    local suite=$1 dir=$2 tarball started archive security
    tarball=$IDEM_CACHE/$suite-minbase-$IDEM_CHROOT_FORMAT.tar
    if [ ! -f "$tarball" ]; then
        started=$(date +%s)
        idem_log "making a clean $suite chroot (debootstrap --variant=minbase)"
        mkdir -p "$IDEM_CACHE" && idem_chroot_bootstrap "$suite" "$dir" || return 1
        # A server of a stable release takes its updates and security fixes
        # too (a package built against the newest minor release needs them);
        # sid has neither.
        if [ "$suite" != sid ]; then
            archive=$(idem_debian_archive) && security=$(idem_debian_archive "$(
                . /etc/os-release && echo "$VERSION_CODENAME")-security" 2>/dev/null ||
                echo "${archive%/debian}/debian-security") || return 1
            printf 'deb %s %s main\n' "$archive" "$suite-updates" "$security" "$suite-security" \
                >>"$dir/etc/apt/sources.list"
        fi
        tar -C "$dir" -cf "$tarball.$$" . && mv "$tarball.$$" "$tarball" ||
            { rm -f "$tarball.$$"; return 1; }
        idem_log "the clean $suite chroot took $(( $(date +%s) - started )) s"
        return 0
    fi
    idem_chroot_empty "$dir" && tar -C "$dir" -xf "$tarball" &&
        cp /etc/resolv.conf "$dir/etc/resolv.conf"
}

# idem_chroot_exec DIR CMD...: run CMD in the chroot with /proc mounted,
# unmounting it afterwards and ending what the command left running there,
# also when the run is interrupted.  The command does not inherit the lock
# (fd 9): a server it leaves behind must not hold it.
idem_chroot_exec() (
    dir=$1
    shift
    trap 'idem_chroot_end_processes "$dir"; umount "$dir/proc" 2>/dev/null || umount -l "$dir/proc" 2>/dev/null' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mountpoint -q "$dir/proc" || mount -t proc proc "$dir/proc" || exit 1
    # Python's multiprocessing keeps its shared memory in /dev/shm, which
    # debootstrap leaves as a plain directory only root may write
    mkdir -p "$dir/dev/shm" && chmod 1777 "$dir/dev/shm"
    chroot "$dir" "$@" 9>&-
)

# idem_chroot_end_processes DIR: terminate, then kill, the processes whose
# root is DIR (a server a killed test left behind), so /proc can go.
idem_chroot_end_processes() {
    local dir sig pid left
    dir=$(realpath "$1")
    for sig in TERM KILL; do
        left=
        for pid in $(ls /proc | grep -E '^[0-9]+$'); do
            [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$dir" ] || continue
            kill -s "$sig" "$pid" 2>/dev/null && left=1
        done
        [ -n "$left" ] || return 0
        sleep 2
    done
}

# idem_in_chroot MAJOR SCRIPT ARGS...: run SCRIPT (a path inside the checkout)
# with ARGS in the chroot of MAJOR, making the chroot first if it is missing.
# Every IDEM_* and BENCH_* variable goes along; benchmark results come back.
idem_in_chroot() {
    local major=$1 script=$2 suite dir copy rc=0
    shift 2
    suite=$(idem_chroot_suite "$major") ||
        { idem_log "PostgreSQL $major is not supported (15, 17 and 18 are)"; return 2; }
    [ "$(id -u)" -eq 0 ] || { idem_log "--pg $major needs root (chroot)"; return 2; }
    command -v debootstrap >/dev/null || IDEM_PACKAGES="debootstrap" idem_install_packages
    dir=$IDEM_CACHE/$suite
    mkdir -p "$IDEM_CACHE" || return 1
    exec 9>"$IDEM_CACHE/$suite.lock" || return 1
    if ! flock -w 3600 9; then
        idem_log "the $suite chroot stayed locked for an hour ($IDEM_CACHE/$suite.lock)"
        exec 9>&-
        return 1
    fi
    [ "$(cat "$dir/.idempotency-chroot" 2>/dev/null)" = "$IDEM_CHROOT_FORMAT" ] ||
        idem_chroot_make "$suite" "$dir" || { exec 9>&-; return 1; }
    # A fresh copy of the checkout (its tracked and untracked files, none of
    # its build products), and an empty /tmp, each run.
    copy=$dir/build/idempotency
    rm -rf "$copy" "$dir"/tmp/* && mkdir -p "$copy" || { exec 9>&-; return 1; }
    if git -c safe.directory="$IDEM_ROOT" -C "$IDEM_ROOT" rev-parse --git-dir >/dev/null 2>&1; then
        (cd "$IDEM_ROOT" && git -c safe.directory="$IDEM_ROOT" ls-files -co --exclude-standard -z |
            while IFS= read -r -d '' f; do [ ! -e "$f" ] || printf '%s\0' "$f"; done |
            xargs -0 cp --parents -t "$copy") || { exec 9>&-; return 1; }
        git -c safe.directory="$IDEM_ROOT" -C "$IDEM_ROOT" describe --always --dirty \
            >"$copy/src/.build_id" 2>/dev/null || true
    else
        (cd "$IDEM_ROOT" && tar --exclude='*.o' --exclude='*.so' --exclude='*.bc' -cf - .) |
            tar -xf - -C "$copy" || { exec 9>&-; return 1; }
    fi
    # pg_tle's source archive (test/lib.sh idem_pg_tle_tarball), where the
    # machine has it, at the default place relative to the copy.
    local tle
    rm -rf "$dir/build/shared"
    if tle=$(idem_pg_tle_tarball); then
        mkdir -p "$dir/build/shared/components" && cp "$tle" "$dir/build/shared/components/" ||
            { exec 9>&-; return 1; }
    fi
    # The machine's own trust anchors go along, as its resolv.conf does: where
    # a proxy re-signs TLS (npm's registry, say), the chroot must trust it too.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        mkdir -p "$dir/usr/local/share/ca-certificates" &&
            cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/" &&
            chroot "$dir" update-ca-certificates >/dev/null 2>&1 ||
            idem_log "could not add the machine's CA certificates to the chroot"
    fi
    # The settings of this run go along (values may span lines).
    local -a envs=()
    local name
    for name in $(compgen -e); do
        case $name in
            IDEM_ROOT|IDEM_PACKAGES|IDEM_PG_BINDIR|IDEM_CACHE|IDEM_PG_MAJOR|IDEM_IN_CHROOT) ;;
            # a path of the machine: the archive is copied (above)
            IDEM_PG_TLE_SRC) [ -z "${tle:-}" ] || envs+=("IDEM_PG_TLE_SRC=/build/shared/components/$(basename "$tle")") ;;
            IDEM_*|BENCH_*) envs+=("$name=${!name}") ;;
            # Node.js reads no system store by itself; point it at the chroot's
            NODE_EXTRA_CA_CERTS) envs+=("NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt") ;;
        esac
    done
    idem_log "PostgreSQL $major: running $script in the $suite chroot ($dir)"
    idem_chroot_exec "$dir" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
        LANG=C.UTF-8 TERM=dumb ${envs[@]+"${envs[@]}"} IDEM_PG_MAJOR="$major" IDEM_IN_CHROOT=1 \
        bash "/build/idempotency/$script" "$@" || rc=$?
    if [ -d "$copy/test/bench/results" ]; then
        mkdir -p "$IDEM_ROOT/test/bench/results"
        cp -a -n "$copy/test/bench/results/." "$IDEM_ROOT/test/bench/results/"
    fi
    exec 9>&-
    return $rc
}
