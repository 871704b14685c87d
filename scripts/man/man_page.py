#!/usr/bin/env python3
"""Writes a man page (roff, man(7) macros) from a command's --help, at build time.

    man_page.py --name drun --output drun.1 --version "drun 0.1.0" -- BIN [ARGS...]
        [--section "drun status" -- BIN status] ...

The first command's --help gives NAME (its first line, "name: summary"), SYNOPSIS (its "Usage:"
lines), OPTIONS (the CLI11 "Options:" block: one .TP entry per option, its description beside)
and, as preformatted text, whatever follows the options (drun's keys, its environment). Each
--section adds a section of its own from another command's --help (drun status, drun trace), in
the same shape. The page holds nothing --help does not say, so it cannot drift from the binary.
Standard library only.
"""
import argparse
import re
import subprocess
import sys


def roff_text(text):
    """`text` escaped for roff: backslashes, hyphens as \\- (copyable options), no leading dot."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def help_of(command):
    done = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        sys.exit(f"man_page.py: {' '.join(command)} --help exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def option_entries(lines):
    """The CLI11 option block's lines -> [(head, description)]; a head alone on its line has its
    description on the lines below, indented to the description column."""
    indents = [len(l) - len(l.lstrip(" ")) for l in lines if l.startswith("        ") and l.strip()]
    column = min(indents) if indents else None
    entries = []
    for line in lines:
        if re.match(r"^ {1,4}-", line):
            if column and len(line) > column and line[column - 1] == " " and line[column] != " ":
                entries.append([line[:column].strip(), line[column:].strip()])
            else:
                parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
                entries.append([parts[0], parts[1] if len(parts) > 1 else ""])
        elif line.strip() and entries:
            entries[-1][1] = (entries[-1][1] + " " + line.strip()).strip()
    return entries


def parse_help(text):
    """--help -> summary, usage lines, option entries, the rest (lines)."""
    lines = text.rstrip("\n").split("\n")
    summary = lines[0].split(":", 1)[1].strip() if ":" in lines[0] else lines[0]
    usage, options, rest = [], [], []
    state = "head"
    for line in lines[1:]:
        if state == "head" and line.startswith("Usage:"):
            usage.append(line[len("Usage:"):].strip())
            state = "usage"
        elif state == "usage" and line.startswith(" ") and line.strip():
            usage[-1] += " " + line.strip()  # a usage line wrapped in --help
        elif state in ("head", "usage") and line.strip() == "Options:":
            state = "options"
        elif state == "options":
            if line.strip():
                options.append(line)
            elif options:
                state = "rest"
        elif state == "rest":
            rest.append(line)
        elif line.strip():
            rest.append(line)
    return summary, usage, option_entries(options), rest


def usage_roff(usage):
    """The usage lines, one per output line; a path CLI11 printed as the program's name is cut."""
    out = []
    for n, line in enumerate(usage):
        if n:
            out.append(".br")
        out.append(roff_text(re.sub(r"^\S*/", "", line)))
    return out


def head_roff(head):
    """"-r,--redirects 0-3 (Env:PET_REDIRECTS)": the names bold, the value italic, the rest roman."""
    names, _, rest = head.partition(" ")
    out = ", ".join("\\fB" + roff_text(n) + "\\fR" for n in names.split(","))
    for word in rest.split():
        out += " " + (roff_text(word) if word.startswith("(") else "\\fI" + roff_text(word) + "\\fR")
    return out


def options_roff(options):
    out = []
    for head, description in options:
        out += [".TP", head_roff(head), roff_text(description)]
    return out


def preformatted_roff(lines):
    """`lines` as they are (no fill, no adjusting); blank lines kept."""
    while lines and not lines[0].strip():
        lines = lines[1:]
    if not lines:
        return []
    return [".nf"] + [roff_text(line) if line.strip() else "\\&" for line in lines] + [".fi"]


def subcommand_roff(title, help_text):
    """A section for a subcommand (drun status): its summary, usage, options and the rest."""
    summary, usage, options, rest = parse_help(help_text)
    out = [f'.SH "{roff_text(title.upper())}"', roff_text(summary), ".PP"] + usage_roff(usage)
    if options:
        out += [".SS Options"] + options_roff(options)
    if rest:
        out += [".PP"] + preformatted_roff(rest)
    return out


def main():
    argv = sys.argv[1:]
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--version", required=True)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    # BIN ARGS... [--section TITLE -- BIN ARGS...]...
    commands, titles = [[]], [None]
    i = 0
    while i < len(rest):
        if rest[i] == "--section":
            if i + 2 >= len(rest) or rest[i + 2] != "--":
                sys.exit("man_page.py: --section TITLE -- BIN [ARGS...]")
            titles.append(rest[i + 1])
            commands.append([])
            i += 3
            continue
        commands[-1].append(rest[i])
        i += 1
    if not commands[0]:
        sys.exit("man_page.py: no command")

    main_help = help_of(commands[0])
    summary, usage, options, extra = parse_help(main_help)
    name = args.name
    # Left-adjusted, unhyphenated: option names and paths stay whole and copyable.
    out = [f'.TH "{name.upper()}" 1 "" "{roff_text(args.version)}" "User Commands"', ".ad l", ".nh",
           ".SH NAME", f"{roff_text(name)} \\- {roff_text(summary)}", ".SH SYNOPSIS"]
    out += usage_roff(usage) + [".SH OPTIONS"] + options_roff(options)
    details = preformatted_roff(extra)
    if details:
        out += [".SH DETAILS"] + details
    for title, command in zip(titles[1:], commands[1:]):
        out += subcommand_roff(title, help_of(command))
    with open(args.output, "w") as f:
        f.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
