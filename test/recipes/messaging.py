"""What test/recipes/inbox/check and test/recipes/outbox/check share: TAP
lines, the recipes' programs (built, started, killed and stopped by their
pids), a RabbitMQ channel with publisher confirms, the admin connection.

The environment is the runner's (test/recipes/run): IDEM_RECIPE_DSN (through
PgBouncer, as the application's role), IDEM_RECIPE_ADMIN_DSN (direct,
superuser), IDEM_RECIPE_WORK (scratch), IDEM_AMQP_URL, IDEM_RECIPE_LANGS."""
import atexit
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pika
import psycopg

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DSN = os.environ["IDEM_RECIPE_DSN"]
ADMIN_DSN = os.environ["IDEM_RECIPE_ADMIN_DSN"]
WORK = os.environ["IDEM_RECIPE_WORK"]
AMQP_URL = os.environ["IDEM_AMQP_URL"]
LANGS = os.environ.get("IDEM_RECIPE_LANGS", "python").replace(",", " ").split()

_count = 0
_failed = 0


def ok(cond, name, diag=""):
    """One TAP line; diag (on failure) as comments."""
    global _count, _failed
    _count += 1
    if not cond:
        _failed += 1
    print(f"{'ok' if cond else 'not ok'} {_count} - {name}", flush=True)
    if not cond and diag:
        print("\n".join("# " + line for line in str(diag).splitlines()), flush=True)
    return cond


def note(text):
    print("\n".join("# " + line for line in str(text).splitlines()), flush=True)


def done():
    print(f"1..{_count}", flush=True)
    sys.exit(1 if _failed else 0)


def admin():
    return psycopg.connect(ADMIN_DSN, autocommit=True)


def install(*packages):
    """The Debian packages missing, through test/lib.sh (apt-get)."""
    subprocess.run(["bash", "-c", '. "$0/test/lib.sh" && idem_install_packages "$@"', ROOT, *packages],
                   check=True, stdout=sys.stderr)


def go_build(src, out):
    """A Go program built against Debian's Go sources (GOPATH mode, offline);
    its build cache kept in IDEM_RECIPE_CACHE (the runner's) if it can be."""
    cache = os.path.join(os.environ.get("IDEM_RECIPE_CACHE", "/var/cache/idempotency/recipes"), "go-build")
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        cache = os.path.join(WORK, "go-build")
    env = dict(os.environ, GO111MODULE="off", GOPATH="/usr/share/gocode", GOCACHE=cache, GOFLAGS="")
    subprocess.run(["go", "build", "-o", out, "."], cwd=src, env=env, check=True, stdout=sys.stderr)
    return out


def npm_ci(src, name):
    """The recipe's package.json and package-lock.json installed (npm ci) in
    WORK/NAME: its node_modules, for NODE_PATH."""
    dest = os.path.join(WORK, name)
    os.makedirs(dest, exist_ok=True)
    for f in ("package.json", "package-lock.json"):
        shutil.copy(os.path.join(src, f), dest)
    subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=dest, check=True,
                   stdout=sys.stderr)
    return os.path.join(dest, "node_modules")


def apply_schema(path):
    with admin() as db:
        db.execute("CREATE EXTENSION IF NOT EXISTS idempotency")
        db.execute(open(path).read())


def consumer_argv(lang):
    """The inbox recipe's consumer in LANG (python or go), built if need be."""
    here = os.path.join(ROOT, "test", "recipes", "inbox")
    if lang == "python":
        install("python3-psycopg", "python3-pika")
        return ["/usr/bin/python3", os.path.join(here, "python", "consumer.py")]
    install("golang-go", "golang-github-jackc-pgx-v4-dev", "golang-github-rabbitmq-amqp091-go-dev")
    return [go_build(os.path.join(here, "go"), os.path.join(WORK, "inbox-consumer-go"))]


_programs = []


class Program:
    """A recipe's program, its output in WORK/NAME.log."""

    def __init__(self, name, argv, env, cwd=None):
        self.name = name
        self.log = os.path.join(WORK, name + ".log")
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, env=dict(os.environ, **env), cwd=cwd, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        _programs.append(self)

    def alive(self):
        return self.proc.poll() is None

    def kill(self, sig=signal.SIGKILL):
        if self.alive():
            os.kill(self.proc.pid, sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT):
            return
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self):
        self.kill(signal.SIGTERM)

    def tail(self, lines=15):
        try:
            return "".join(open(self.log, errors="replace").readlines()[-lines:])
        except OSError:
            return ""


@atexit.register
def _stop_all():
    for p in _programs:
        if p.alive():
            p.kill()


def stop_when(prog, cond, timeout=30, linger=0.004):
    """Stop prog (SIGSTOP) at a moment when cond() holds; whether it was.  A
    program may get through its work in milliseconds, too fast to be caught
    by polling from outside: so it is sampled, stopped at random moments,
    cond() asked, and let go on (SIGCONT) until cond() holds; then once more
    for up to linger seconds (to be caught further in), and left stopped if
    cond() still holds, else sampled again with a shorter linger."""
    end = time.monotonic() + timeout
    while prog.alive() and time.monotonic() < end:
        prog.kill(signal.SIGSTOP)
        if cond():
            prog.kill(signal.SIGCONT)
            time.sleep(random.uniform(0, linger))
            prog.kill(signal.SIGSTOP)
            if cond():
                return True
            linger /= 4         # got away: sooner next time
        prog.kill(signal.SIGCONT)
        time.sleep(random.uniform(0, 0.005))
    return False


def kill_when(prog, cond, timeout=30, linger=0.004):
    """SIGKILL prog at a moment when cond() holds (stop_when); whether it was."""
    caught = stop_when(prog, cond, timeout, linger)
    prog.kill()
    return caught


def wait_until(cond, timeout, step=0.2):
    end = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() > end:
            return False
        time.sleep(step)


def amqp_channel():
    """A channel that waits for the broker's confirm of each publish."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    ch = conn.channel()
    ch.confirm_delivery()
    return conn, ch


def declare_stream(ch, name, fresh=True):
    """A stream queue, emptied first (a run again starts from nothing)."""
    if fresh:
        ch.queue_delete(name)
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": "stream"})


def stream_length(name):
    """The number of messages in a stream (its offsets), via a passive declare."""
    conn = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        return conn.channel().queue_declare(name, passive=True).method.message_count
    finally:
        conn.close()
