#!/usr/bin/python3
"""Every Catch TEST_CASE name in the tree can be a CTest entry: catch_discover_tests makes one
entry per name, and CMake splits a name at ';' (a list separator) into entries that fail, while
Catch reads a name that begins with '-' as an option. Prints each offending name with its file and
exits 1; exits 0 when there is none.

    check_test_names.py SOURCE_DIR
"""
import pathlib
import re
import sys

NAME = re.compile(r'TEST_CASE\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)')
PIECE = re.compile(r'"((?:[^"\\]|\\.)*)"')


def bad_names(root):
    for path in sorted(pathlib.Path(root).rglob("*.cpp")):
        if any(part.startswith("build") for part in path.relative_to(root).parts):
            continue
        text = path.read_text(errors="replace")
        for match in NAME.finditer(text):
            name = "".join(PIECE.findall(match.group(1)))
            if ";" in name or name.startswith("-"):
                yield path.relative_to(root), name


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = list(bad_names(root))
    for path, name in bad:
        print(f"{path}: test name with ';' or a leading '-': {name}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
