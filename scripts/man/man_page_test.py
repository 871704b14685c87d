#!/usr/bin/env python3
"""man_page_test.py MAN_DIR DRUN DRUN_RENDEZVOUS: the build's man pages are there, groff formats
them without a warning (a structural check where groff is missing), and each page, as man shows
it, names every long option its program's --help lists (drun's: drun status' and drun trace's
too). Exit 0 when all hold, 1 naming what does not."""
import os
import re
import shutil
import subprocess
import sys


def fail(message):
    print(f"man_page_test: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def help_text(command):
    return subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=30, check=True).stdout


def long_options(text):
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9_-]*[a-z0-9])", text))


def rendered(page):
    """The page as text: groff (warnings are failures), else the roff with its escapes undone."""
    source = open(page).read()
    if not source.startswith(".TH ") or "\n.SH NAME\n" not in source or "\n.SH OPTIONS\n" not in source:
        fail(f"{page}: not a man(7) page (.TH, .SH NAME, .SH OPTIONS)")
    if source.count("\n.nf\n") != source.count("\n.fi\n"):
        fail(f"{page}: unbalanced .nf/.fi")
    if shutil.which("groff"):
        done = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", page], capture_output=True, text=True, timeout=30)
        if done.returncode != 0 or done.stderr.strip():
            fail(f"{page}: groff -ww: {done.stderr.strip() or done.returncode}")
        text = subprocess.run(["groff", "-man", "-Tascii", "-P-cbou", page], capture_output=True, text=True,
                              timeout=30, check=True).stdout
        return text.replace("\u2010", "-")
    return re.sub(r"\\f[BIR]", "", source).replace("\\-", "-").replace("\\e", "\\")


def check(page, commands):
    if not os.path.isfile(page):
        fail(f"{page} is missing (build the man_pages target)")
    text = rendered(page)
    wanted = set()
    for command in commands:
        wanted |= long_options(help_text(command))
    missing = sorted(o for o in wanted if o not in text)
    if missing:
        fail(f"{page} lacks {', '.join(missing)}")
    if len(wanted) < 5:
        fail(f"only {len(wanted)} long options found in --help of {commands}: the parse is wrong")
    print(f"man_page_test: {os.path.basename(page)}: {len(wanted)} long options, all named")


def main():
    man_dir, drun, daemon = sys.argv[1:4]
    check(os.path.join(man_dir, "drun.1"), [[drun], [drun, "status"], [drun, "trace"]])
    check(os.path.join(man_dir, "drun-rendezvous.1"), [[daemon]])


if __name__ == "__main__":
    main()
