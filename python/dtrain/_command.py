"""The `dtrain train` command behind dtrain.Trainer: where the command is, its flag table (read
from the command itself, `dtrain man --flags train`: the table --help and the man page print, so
a flag added to it is a keyword here with no change), keywords -> argv, and one supervised run
that streams its output, hands each metrics record to a callback and stops cleanly on request."""
import ctypes
import difflib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

from . import _lib


class Error(RuntimeError):
    """A dtrain call failed. The message is dtrain's own (it names the flag, file or rank at fault
    and what to do); .status is the library's status name or "exit N" of the command."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


Error.__module__ = "dtrain"


def _command_candidates():
    env = os.environ.get("DTRAIN_COMMAND")
    if env:
        yield env
    yield os.path.join(_lib.NATIVE, "dtrain")
    yield os.path.join(_lib.TREE_BUILD, "dtrain")
    found = shutil.which("dtrain")
    if found:
        yield found


@functools.lru_cache(maxsize=None)
def command():
    """The path of the dtrain command this package drives: $DTRAIN_COMMAND, the copy inside the
    installed package, a source tree's build/dtrain, or the one on $PATH (make install)."""
    for path in _command_candidates():
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
    raise Error("ENOENT", "cannot find the dtrain command: reinstall the package from a built tree (make; "
                "pip install ./python), run `make install`, or set DTRAIN_COMMAND=/path/to/dtrain")


@functools.lru_cache(maxsize=None)
def flag_table(cmd="train"):
    """The flags of `dtrain CMD` as dicts {name, type, meta, help, default}, in --help order."""
    r = subprocess.run([command(), "man", "--flags", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise Error("exit %d" % r.returncode, "%s man --flags %s: %s" % (command(), cmd, r.stderr.decode().strip()))
    return json.loads(r.stdout.decode())["flags"]


def keyword(flag):
    """The Python keyword of a flag name: max-steps -> max_steps."""
    return flag.replace("-", "_")


def _flags_by_keyword():
    return {keyword(f["name"]): f for f in flag_table()}


def check_keywords(opts):
    """Raises Error naming the first keyword that is no `dtrain train` flag, with the closest ones."""
    known = _flags_by_keyword()
    for k in opts:
        if keyword(k) not in known:
            close = difflib.get_close_matches(keyword(k), list(known), n=3)
            raise Error("EINVAL", "unknown keyword '%s': it is no flag of `dtrain train`%s; dtrain.option_keys() "
                        "lists them all" % (k, " (did you mean %s?)" % " or ".join(close) if close else ""))


def _text(name, v, f):
    if f["type"] == "bool":
        if not isinstance(v, (bool, int)) or v not in (0, 1):
            raise Error("EINVAL", "%s=%r: --%s is a switch; pass True or False" % (keyword(name), v, f["name"]))
        return "true" if v else "false"
    if f["type"] == "int" and isinstance(v, float):
        if not v.is_integer():
            raise Error("EINVAL", "%s=%r: --%s takes a whole number" % (keyword(name), v, f["name"]))
        v = int(v)
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    return repr(v) if isinstance(v, float) else str(v)


def argv(opts):
    """`dtrain train` with these keywords as flags (None leaves a flag out)."""
    check_keywords(opts)
    known = _flags_by_keyword()
    args = [command(), "train"]
    for k, v in opts.items():
        if v is not None:
            f = known[keyword(k)]
            args.append("--%s=%s" % (f["name"], _text(k, v, f)))
    return args


def _die_with_parent():
    """In the child before exec: SIGTERM when this Python process dies (no orphaned training)."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _pump(stream, sink, keep):
    for line in iter(stream.readline, b""):
        text = line.decode(errors="replace")
        keep.append(text)
        del keep[:-200]
        if sink is not None:
            sink.write(text)
            sink.flush()
    stream.close()


class _Records:
    """The new records of a JSON Lines file another process appends to: complete lines that were
    not in it before (`old`) and not read yet. A file rewritten meanwhile (a resumed run drops the
    records after its checkpoint, then appends) is read again from its start: it is another file,
    shorter, or the bytes before the read position changed."""

    def __init__(self, path, old=()):
        self.path, self.offset, self.mark, self.ino = path, 0, b"", None
        self.old, self.seen = set(old), set()

    def _rewritten(self, f, st):
        if st.st_ino != self.ino or st.st_size < self.offset:
            return True
        f.seek(self.offset - len(self.mark))
        return f.read(len(self.mark)) != self.mark

    def read(self):
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if self._rewritten(f, st):
                    self.offset, self.mark, self.ino = 0, b"", st.st_ino
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        cut = data.rfind(b"\n") + 1  # complete lines only; a partial one is read again next time
        if cut == 0:
            return []
        self.offset += cut
        self.mark = data[max(0, cut - 64):cut]
        new = [l for l in data[:cut].split(b"\n") if l.strip() and l not in self.old and l not in self.seen]
        self.seen.update(new)
        out = []
        for line in new:
            try:
                out.append(json.loads(line))
            except ValueError:  # not a record of ours: say so, lose nothing else
                print("dtrain: note: %s: skipped a line that is not JSON: %.80r" % (self.path, line), file=sys.stderr)
        return out


def _error_message(lines, rc):
    said = [l.rstrip("\n") for l in lines if l.startswith(("dtrain: error:", "HINT:", "dtrain: stopped"))]
    if not said:
        said = [l.rstrip("\n") for l in lines[-10:]]
    return "\n".join(said) or "dtrain train exited with status %d" % rc


def run(args, metrics, callback=None, echo=True, old=(), poll=0.05):
    """Runs args (a `dtrain train` command line writing --metrics to `metrics`, which held the
    lines `old` before); calls
    callback(record) for every record it writes, in order; a callback returning False stops the run
    the way Ctrl-C does (the step finishes, --save/--checkpoint-dir are written, exit 0), and so does
    a KeyboardInterrupt here, which is raised again afterwards (its .records: the run's records).
    Returns the records; raises Error
    with the command's own message when it fails."""
    p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, preexec_fn=_die_with_parent)
    out, err = [], []
    pumps = [threading.Thread(target=_pump, args=(p.stdout, sys.stdout if echo else None, out), daemon=True),
             threading.Thread(target=_pump, args=(p.stderr, sys.stderr if echo else None, err), daemon=True)]
    for t in pumps:
        t.start()
    records, reader, stopping, interrupted = [], _Records(metrics, old), False, False
    try:
        while True:
            done = p.poll() is not None
            batch = reader.read()
            records += batch  # all of them, even if a callback raises
            for rec in batch:
                if callback is not None and callback(rec) is False and not stopping:
                    stopping = True
                    p.send_signal(signal.SIGINT)
            if done:
                break
            time.sleep(poll)
    except KeyboardInterrupt:
        interrupted = True
        if p.poll() is None:
            p.send_signal(signal.SIGINT)  # one: a second one would kill it before its checkpoint
        p.wait()
    except BaseException:
        p.kill()
        p.wait()
        raise
    finally:
        for t in pumps:
            t.join()
    records += reader.read()  # what it wrote while stopping
    if interrupted:
        e = KeyboardInterrupt()
        e.records = records  # the caller keeps them, and the checkpoint written on the way out
        raise e
    if p.returncode != 0:
        raise Error("exit %d" % p.returncode, _error_message(err + out, p.returncode))
    return records
