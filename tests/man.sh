# The man page dtrain(1) (BUILD/dtrain.1, made by `dtrain man`) against --help: the same
# commands, and for every command (and bench benchmark) the same flags with the same metavars,
# help texts and defaults, in both directions; groff renders it without warnings.
. "$(dirname "$0")/testlib.bash"
PAGE="$BUILD/dtrain.1"
[ -f "$PAGE" ] || { echo "skip: $PAGE is not built (make all makes it)"; exit 77; }
DT=$(cd "$(dirname "$DT")" && pwd)/dtrain
export DTRAIN_BLAS_REEXEC=0
if command -v groff >/dev/null; then
  warn=$(groff -man -Tutf8 -ww -z "$PAGE" 2>&1)
  [ -z "$warn" ] && ok "groff renders dtrain.1 without warnings" || bad "groff warnings: $warn"
else echo "note: groff is missing (apt-get install groff-base): rendering not checked"; fi
"$DT" man >"$TMP/fresh.1" 2>&1 && cmp -s "$TMP/fresh.1" "$PAGE" && ok "build/dtrain.1 is what this dtrain man writes" \
  || bad "build/dtrain.1 is stale or dtrain man failed (make rebuilds it)"
out=$(python3 - "$PAGE" "$DT" <<'PY' 2>&1
import re, subprocess, sys
page, dt = open(sys.argv[1]).read(), sys.argv[2]
def plain(s):
    s = re.sub(r"\\f[BRI]", "", s).replace("\\&", "").replace("\\-", "-").replace("\\e", "\\")
    return " ".join(s.split())
def run(*args):
    return subprocess.run([dt, *args], capture_output=True, text=True).stdout
# the command list
cmds = re.findall(r"^  ([\w-]+) ", run("--help").split("Commands:")[1].split("\n\n")[0], re.M)
sect = page.split(".SH COMMANDS\n")[1].split(".SH ")[0]
man_cmds = [c.replace("\\-", "-") for c in re.findall(r"^\.TP\n\.B (\S+)$", sect, re.M)]
print("commands", "ok" if cmds == man_cmds and len(cmds) >= 7 else "BAD %r vs %r" % (cmds, man_cmds))
benches = re.findall(r"^  (\w+) ", run("bench", "--help").split("Benchmarks:")[1], re.M)
want = [("dtrain " + c, [c]) for c in cmds if c != "bench"] + [("dtrain bench " + b, ["bench", b]) for b in benches]
sections = {t.replace("\\-", "-"): b for t, b in re.findall(r'^\.SS "([^"\n]*)"\n(.*?)(?=^\.S[SH] |\Z)', page, re.M | re.S)}
print("sections", "ok" if sorted(sections) == sorted(t for t, _ in want) else "BAD %r" % sorted(sections))
nflags = 0
for title, args in want:
    body = sections.get(title, "")
    entries = [(plain(a), plain(b)) for a, b in re.findall(r"^\.TP\n(.*)\n(.*)$", body, re.M)]
    helptext = run(*args, "--help")
    lines = [" ".join(l.split()) for l in helptext.splitlines() if l.startswith("  --") and not l.startswith("  --help ")]
    man_lines = ["%s %s" % (a, b) for a, b in entries]
    usage = plain(body.split(".nf\n")[1].split("\n.fi")[0]) if ".nf\n" in body else ""
    good = lines == man_lines and usage and usage in " ".join(helptext.split())
    nflags += len(lines)
    print(title.replace(" ", "_"), "ok" if good else "BAD\n  help: %r\n  man:  %r" % (
        [l for l in lines if l not in man_lines], [l for l in man_lines if l not in lines]))
# dtrain train's flag groups and the notes after them, as --help prints them
train_help, train_sect = run("train", "--help"), sections.get("dtrain train", "")
hgroups = re.findall(r"^([A-Z][A-Za-z ]+):\n  --", train_help, re.M)
mgroups = [plain(g) for g in re.findall(r"^\.PP\n\\fB(.*):\\fR$", train_sect, re.M)]
print("train_groups", "ok" if hgroups == mgroups and len(hgroups) >= 7 else "BAD %r vs %r" % (hgroups, mgroups))
blocks = [plain(b) for b in re.findall(r"^\.nf\n(.*?)\n\.fi$", train_sect, re.M | re.S)]
print("train_notes", "ok" if len(blocks) == 2 and all(b in " ".join(train_help.split()) for b in blocks)
      and "Strategies:" in blocks[1] else "BAD %d blocks" % len(blocks))
# EXAMPLES: each command's flags are ones its dtrain command takes (flags, then --help, exit 0)
import shlex
ex = page.split(".SH EXAMPLES\n")[1].split(".SH ")[0] if ".SH EXAMPLES\n" in page else ""
cmds = [plain(l) for b in re.findall(r"^\.nf\n(.*?)\n\.fi$", ex, re.M | re.S) for l in b.split("\n")]
badex = []
for c in cmds:
    args = shlex.split(c)
    r = subprocess.run([dt] + args[args.index("dtrain") + 1:] + ["--help"], capture_output=True, text=True)
    if r.returncode != 0: badex.append("%s: %s" % (c, r.stderr.strip()[:200]))
print("examples", "ok" if len(cmds) >= 12 and not badex else "BAD %d commands: %r" % (len(cmds), badex), len(cmds))
env = sorted(set(re.findall(r"\b[A-Z][A-Z_]+=", run("--help"))))
envsect = plain(page.split(".SH ENVIRONMENT\n")[1].split(".SH ")[0]) if ".SH ENVIRONMENT" in page else ""
print("environment", "ok" if env and all(v in envsect for v in env) else "BAD %r" % [v for v in env if v not in envsect])
print("flags", "ok" if nflags >= 60 else "BAD only %d flags" % nflags, nflags)
PY
)
while read -r what verdict rest; do
  case "$verdict" in ok) ok "man: $what $rest" ;; BAD) bad "man: $what $rest" ;; *) bad "man: $what $verdict $rest" ;; esac
done < <(grep -v '^  ' <<<"$out")
grep -q "^  " <<<"$out" && echo "$out" | grep "^  "
grep -q "^flags ok" <<<"$out" || bad "man check did not finish: $out"
finish
