#!/usr/bin/env python3
"""Keeps docs/configuration.md true to the configuration table.

Reads every key the parser accepts from the X-macro table
runtime/src/config/config_table.h (the one place a key is declared) and every key
row of docs/configuration.md (a table row whose first cell is one key in
backticks, as `refit.delta` or `verify`), and fails naming:

- a key the parser accepts that the page does not document (or documents
  twice), and a key the page documents that the parser does not know;
- a default the page does not state: the row's last cell must hold the
  table's default in backticks (`256MiB`), "required" for a required key,
  "empty" for an empty string, every choice of an enum in backticks, and
  the numeric bounds of an integer key (a bound of C's limits, INT_MAX,
  is left to words).

And the environment: every variable of core/env.h's table
(REFIT_ENV_TABLE, the one list of what refit's code, launcher and Python
package read) must be named in backticks in the first cell of a row of the
page's "Environment variables" section, every variable such a cell names
must be in the table, and the last cell must give a numeric variable's
bounds and a choice variable's every choice.

Usage: check_config_doc.py REPO_ROOT. Standard library only.
"""
import re
import sys
from pathlib import Path

# Bounds written with C's limits mean "as large as the type holds"; the page
# says so in words, so they are not looked for as numbers.
C_LIMITS = {"INT_MAX", "INT32_MAX", "INT64_MAX"}


def split_args(text):
    """Split one macro call's arguments at top-level commas, joining adjacent
    string literals ("a " "b" -> a b) and keeping other tokens as text."""
    args, cur, depth, i = [], [], 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            j = i + 1
            while text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            cur.append(text[i : j + 1])
            i = j + 1
            continue
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            args.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
        i += 1
    args.append("".join(cur).strip())
    return [join_strings(a) for a in args]


def join_strings(arg):
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', arg)
    if parts and re.fullmatch(r'(\s*"(?:[^"\\]|\\.)*"\s*)+', arg):
        return ("str", "".join(parts))
    return ("tok", arg)


def x_rows(header, macro, fields, what):
    """The argument lists of the X(...) rows of `#define macro(X)` in a
    header, each split by split_args; exits when a row has not `fields`."""
    body = header[header.index("#define %s(X)" % macro) :]
    body = body[: body.index("\ntypedef")].replace("\\\n", " ")
    rows = []
    for m in re.finditer(r"\bX\(", body):
        depth, i = 1, m.end()
        while depth:
            if body[i] == '"':
                i = body.index('"', i + 1)
            elif body[i] == "(":
                depth += 1
            elif body[i] == ")":
                depth -= 1
            i += 1
        a = split_args(body[m.end() : i - 1])
        if len(a) != fields:
            sys.exit("check_config_doc: a row of %s has %d fields, not %d: %s"
                     % (what, len(a), fields, body[m.start() : i][:120]))
        rows.append(a)
    return rows


def read_table(root):
    header = (root / "runtime/src/config/config_table.h").read_text()
    defines = {}
    for name, value in re.findall(r"#define (REFIT_CONFIG_MAX_\w+) (\(?[0-9 <]+\)?)\n", header):
        defines[name] = eval(value, {})  # literals and shifts only
    rows = []
    for a in x_rows(header, "REFIT_CONFIG_TABLE", 11, "config_table.h"):
        section, key = a[1][1], a[2][1]
        rows.append({
            "key": section + "." + key if section else key,
            "type": a[3][1],
            "default": a[5][1] if a[5][0] == "str" else None,
            "min": a[6][1],
            "max": a[7][1],
            "choices": a[8][1],
            "flags": a[9][1],
        })
    return rows, defines


def read_doc(path):
    """Key rows of the page: {key: [last cell, ...]} in page order."""
    rows = {}
    for line in path.read_text().splitlines():
        m = re.match(r"\|\s*`([a-z][a-z0-9_.]*)`\s*\|", line)
        if m:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.setdefault(m.group(1), []).append(cells[-1])
    return rows


def bound(text, defines):
    if text in C_LIMITS:
        return None
    if text in defines:
        return defines[text]
    try:
        return int(text)
    except ValueError:
        return None


def check_default(row, cell, defines):
    """What the last cell fails to say about the row, or []."""
    missing = []
    if row["type"] == "SECTION":
        return missing
    if "REFIT_CONFIG_REQUIRED" in row["flags"] and row["default"] is None:
        if "required" not in cell:
            missing.append('"required"')
    elif row["default"] == "":
        if "empty" not in cell:
            missing.append('"empty"')
    elif row["default"] is not None and "`%s`" % row["default"] not in cell:
        missing.append("the default `%s`" % row["default"])
    if row["type"] == "ENUM":
        for choice in row["choices"].split("|"):
            if "`%s`" % choice not in cell:
                missing.append("the choice `%s`" % choice)
    if row["type"] == "INT":
        numbers = set(re.findall(r"\d+", cell.replace(",", "")))
        for text in (row["min"], row["max"]):
            value = bound(text, defines)
            if value is not None and str(value) not in numbers:
                missing.append("the bound %d" % value)
    return missing


def read_env_table(root):
    header = (root / "core/env.h").read_text()
    rows = []
    for a in x_rows(header, "REFIT_ENV_TABLE", 7, "core/env.h"):
        rows.append({"name": a[0][1], "kind": a[1][1], "lo": a[2][1], "hi": a[3][1],
                     "choices": a[4][1] if a[4][0] == "str" else None})
    return rows


def read_env_doc(path):
    """{variable: last cell} of the Environment variables section's rows."""
    text = path.read_text()
    start = text.index("## Environment variables")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end >= 0 else len(text)]
    out = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]):
            out[name] = cells[-1]
    return out


def check_env(root, page):
    problems = []
    rows = read_env_table(root)
    doc = read_env_doc(page)
    names = {r["name"] for r in rows}
    for r in rows:
        cell = doc.get(r["name"])
        if cell is None:
            problems.append("%s: in core/env.h but not a row of docs/"
                            "configuration.md's Environment variables" % r["name"])
            continue
        if r["kind"] == "REFIT_ENV_CHOICE":
            for choice in r["choices"].split("|"):
                if "`%s`" % choice not in cell:
                    problems.append("%s: the last cell does not give the choice `%s`"
                                    % (r["name"], choice))
        if r["kind"] in ("REFIT_ENV_INT", "REFIT_ENV_SECONDS"):
            numbers = set(re.findall(r"\d+", cell.replace(",", "")))
            for text in (r["lo"], r["hi"]):
                value = eval(text, {})  # literals and shifts only
                if str(value) not in numbers:
                    problems.append("%s: the last cell does not give the bound %d"
                                    % (r["name"], value))
    for name in doc:
        if name not in names:
            problems.append("%s: documented as an environment variable but not in "
                            "core/env.h's table" % name)
    return problems, len(rows)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: check_config_doc.py REPO_ROOT")
    root = Path(sys.argv[1])
    page = root / "docs/configuration.md"
    rows, defines = read_table(root)
    doc = read_doc(page)
    problems = []
    known = {r["key"] for r in rows}
    for row in rows:
        cells = doc.get(row["key"])
        if cells is None:
            problems.append("%s: accepted by the parser (runtime/src/config/config_table.h) but not "
                            "documented in docs/configuration.md" % row["key"])
            continue
        if len(cells) > 1:
            problems.append("%s: documented %d times in docs/configuration.md"
                            % (row["key"], len(cells)))
        missing = check_default(row, cells[0], defines)
        if missing:
            problems.append("%s: the default column of docs/configuration.md does not give %s"
                            % (row["key"], ", ".join(missing)))
    for key in doc:
        if key not in known:
            problems.append("%s: documented in docs/configuration.md but unknown to the parser "
                            "(runtime/src/config/config_table.h)" % key)
    env_problems, nenv = check_env(root, page)
    problems += env_problems
    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    print("PASS: %d keys of runtime/src/config/config_table.h, each documented once in "
          "docs/configuration.md with its default; %d environment variables of "
          "core/env.h, each with its bounds or choices" % (len(rows), nenv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
