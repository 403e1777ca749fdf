"""``agent-2pc demo``: a one-minute tour in a throwaway git repository.

It runs the real CLI, as an agent would, and prints each command with its output:
  1. a multi-file change staged and shown as a diff, with the tree untouched;
  2. that change committed atomically;
  3. a change aborted because another writer edited the file meanwhile (no lost update);
  4. a change aborted because the project's test fails in the staged view;
  5. a commit killed half-way through, and ``recover`` finishing it.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile

BOLD, DIM, GREEN, RED, RESET = "\033[1m", "\033[2m", "\033[32m", "\033[31m", "\033[0m"

CALC = '''def add(a, b):
    return a + b


def mul(a, b):
    return a * b
'''
TEST = '''from calc import add


def test_add():
    assert add(2, 3) == 5, "add(2, 3) should be 5"


if __name__ == "__main__":
    test_add()
'''
PATCH = '''--- a/calc.py
+++ b/calc.py
@@ -4,3 +4,7 @@
 
 def mul(a, b):
     return a * b
+
+
+def sub(a, b):
+    return a - b
'''


class Tour:
    def __init__(self, repo: str, color: bool) -> None:
        self.repo = repo
        self.color = color
        self.env = dict(os.environ, AGENT2PC_ROOT=repo)
        self.env.pop("AGENT2PC_CRASH_AT", None)

    def c(self, code: str, text: str) -> str:
        return f"{code}{text}{RESET}" if self.color else text

    def say(self, text: str) -> None:
        print(text, flush=True)

    def step(self, n: int, title: str) -> None:
        self.say("\n" + self.c(BOLD, f"{n}. {title}"))

    def run(self, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            show: bool = True) -> subprocess.CompletedProcess[str]:
        shown = "agent-2pc " + " ".join(shlex.quote(a) for a in args)
        if stdin is not None:
            shown = f"... | {shown}"
        if show:
            self.say(self.c(DIM, f"$ {shown}"))
        proc = subprocess.run([sys.executable, "-m", "agent_2pc", *args], cwd=self.repo,
                              env=env or self.env, input=stdin, capture_output=True, text=True,
                              timeout=60)
        out = (proc.stdout + proc.stderr).rstrip()
        if show and out:
            self.say("\n".join("  " + line for line in out.splitlines()))
        return proc

    def sh(self, cmd: str) -> str:
        self.say(self.c(DIM, f"$ {cmd}"))
        out = subprocess.run(cmd, shell=True, cwd=self.repo, capture_output=True, text=True,
                             timeout=60).stdout.rstrip()
        if out:
            self.say("\n".join("  " + line for line in out.splitlines()))
        return out

    def read(self, name: str) -> str:
        with open(os.path.join(self.repo, name), encoding="utf-8") as f:
            return f.read()


def _git(repo: str, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, timeout=60)


def _make_repo(repo: str) -> None:
    files = {"calc.py": CALC, "test_calc.py": TEST, "README.md": "# calc\n\nAdds numbers.\n"}
    for name, text in files.items():
        with open(os.path.join(repo, name), "w", encoding="utf-8") as f:
            f.write(text)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=demo", "-c", "user.email=demo@example.com", "commit", "-q",
         "-m", "start")


def main(keep: bool = False) -> int:
    color = sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
    base = tempfile.mkdtemp(prefix="agent-2pc-demo-")
    repo = os.path.join(base, "repo")
    os.mkdir(repo)
    t = Tour(repo, color)
    try:
        _make_repo(repo)
        t.say(t.c(BOLD, "agent-2pc demo") + f"  (a throwaway git repository in {repo})")
        t.run("init")

        t.step(1, "Stage a multi-file change: nothing touches the tree yet")
        tid = t.run("begin", "--label", "add sub()", show=True).stdout.strip()
        t.run("stage-patch", "--tid", tid, "--stdin", stdin=PATCH)
        t.run("stage-write", "--tid", tid, "--path", "test_sub.py", "--content",
              "from calc import sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n")
        t.run("stage-replace", "--tid", tid, "--path", "README.md", "--old", "Adds numbers.",
              "--new", "Adds and subtracts numbers.")
        t.run("diff", "--tid", tid, "--stat")
        t.sh("git status --short   # the tree is untouched")

        t.step(2, "Commit: all three files change together, durably")
        t.run("commit", "--tid", tid)
        t.sh("git status --short")
        t.sh("git add -A && git -c user.name=demo -c user.email=demo@example.com commit -qm "
             "'add sub()' && git log --oneline | head -1")

        t.step(3, "A conflict: another writer edits the file; the transaction aborts")
        tid = t.run("begin", "--label", "rename mul").stdout.strip()
        t.run("record-read", "--tid", tid, "--path", "calc.py")
        t.run("stage-replace", "--tid", tid, "--path", "calc.py", "--old", "def mul(",
              "--new", "def multiply(")
        t.sh("sed -i 's/return a \\* b/return b * a/' calc.py   # someone else edits calc.py")
        proc = t.run("commit", "--tid", tid)
        assert proc.returncode == 1, proc
        kept = "return b * a" in t.read("calc.py") and "def mul(" in t.read("calc.py")
        t.say(t.c(GREEN if kept else RED, "  -> exit 1; calc.py keeps the other writer's "
                  "edit, and nothing of the aborted transaction reached the tree"
                  if kept else "  -> unexpected tree content"))
        _git(repo, "checkout", "-q", "calc.py")

        t.step(4, "A failing test: the check runs in the staged view and the commit aborts")
        tid = t.run("begin", "--label", "optimize add").stdout.strip()
        t.run("stage-replace", "--tid", tid, "--path", "calc.py", "--old", "return a + b",
              "--new", "return a - b")
        proc = t.run("stage-cmd", "--tid", tid, "--command", "python3 test_calc.py")
        t.say(t.c(DIM, f"  (exit {proc.returncode}: the test ran against the staged calc.py, "
                  "not the tree's)"))
        proc = t.run("commit", "--tid", tid)
        ok = proc.returncode == 1 and "return a + b" in t.read("calc.py")
        t.say(t.c(GREEN if ok else RED, "  -> exit 1; the broken change never reached the tree"
                  if ok else "  -> unexpected result"))
        t.sh("git status --short   # still clean")

        t.step(5, "A crash in the middle of a commit, finished by recover")
        tid = t.run("begin", "--label", "version bump").stdout.strip()
        for name in ("calc.py", "test_calc.py", "README.md"):
            t.run("stage-write", "--tid", tid, "--path", name, "--content",
                  f"# version 2\n{t.read(name)}", show=False)
        t.say(t.c(DIM, "  (staged a version line at the top of calc.py, test_calc.py and "
                  "README.md)"))
        crash_env = dict(t.env, AGENT2PC_CRASH_AT="commit.mid_apply:1")
        t.say(t.c(DIM, "$ AGENT2PC_CRASH_AT=commit.mid_apply:1 agent-2pc commit --tid " + tid))
        proc = t.run("commit", "--tid", tid, env=crash_env, show=False)
        t.say(f"  (the process died with exit status {proc.returncode} after applying one "
              "file of three)")
        t.sh("git status --short   # half-applied: one file changed, two not")
        t.run("recover")
        t.sh("git status --short   # all three, as the decision said")
        t.run("status", "--tid", tid)

        t.say("\n" + t.c(BOLD, "That is the core.") + " Next: 'agent-2pc --help', docs/, and "
              "the Python library: from agent_2pc import Agent2PC.")
        if keep:
            t.say(f"The demo repository is kept at {repo}")
        return 0
    finally:
        if not keep:
            subprocess.run(["rm", "-rf", base], timeout=60)
