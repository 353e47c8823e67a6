#!/usr/bin/env python3
"""Checks the relative links in the repository's Markdown: each must name an existing file or directory (a
leading '/' is the repository's root, as on GitHub) and, with a `#anchor`, a heading of that file. Links to
other sites (http:, https:, mailto:) are not followed.

Usage: scripts/check-links.py [FILE.md ...]    (default: README.md, ARCHITECTURE.md and docs/*.md)

Anchors follow GitHub's rule: the heading's text (inline code, emphasis and link syntax reduced to their
text), lower-cased, every character that is not a letter, a digit, a space, '-' or '_' removed, each space
turned into '-'; a repeated heading gets '-1', '-2', ... Links inside code (fenced or indented blocks,
`code spans`) are not links. Exits 0 when every link resolves, 1 listing each broken one (FILE:LINE: link:
why), 2 on bad usage. Standard library only.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^ {0,3}(```+|~~~+)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target); the target may be <...> and may carry a "title".
INLINE_LINK = re.compile(
    r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]"  # [text], one level of nested brackets allowed
    r"\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"  # (target: <...>, or balanced parentheses
    r"(?:\s+\"[^\"]*\")?\s*\)"  # "title")
)
REF_DEF = re.compile(r"^ {0,3}\[([^\]]+)\]:\s*(\S+)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text):
    """(line number, line) for each line outside fenced and indented code blocks."""
    in_fence = None
    prev_blank = True
    in_indented = False
    for n, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line)
        if in_fence:
            if m and m.group(1)[0] == in_fence[0] and len(m.group(1)) >= len(in_fence):
                in_fence = None
            prev_blank = False
            continue
        if m:
            in_fence = m.group(1)
            continue
        blank = not line.strip()
        # An indented code block starts after a blank line (not inside a list item's continuation, which
        # this simple reader treats the same way: such lines hold no links in this repository's docs).
        if line.startswith("    ") and (prev_blank or in_indented) and not blank:
            in_indented = True
            prev_blank = False
            continue
        if not blank:
            in_indented = False
        prev_blank = blank
        yield n, line


def heading_text(raw):
    s = CODE_SPAN.sub(lambda m: m.group(2), raw)
    s = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", s)  # links: their text
    s = re.sub(r"<[^>]+>", "", s)  # inline HTML
    return s


def slug(raw):
    s = heading_text(raw).strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def shown(path):
    """A path as the report names it: from the repository's root when it is inside it."""
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


_anchors = {}


def anchors(path):
    """Every anchor a Markdown file defines: its headings' slugs (with GitHub's -1, -2 for repeats) and
    explicit <a name=...> / id=... targets."""
    if path not in _anchors:
        seen = {}
        found = set()
        text = path.read_text(encoding="utf-8")
        for _, line in prose_lines(text):
            h = HEADING.match(line)
            if h:
                base = slug(h.group(2))
                k = seen.get(base, 0)
                found.add(base if k == 0 else f"{base}-{k}")
                seen[base] = k + 1
            for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
                found.add(m.group(1))
        _anchors[path] = found
    return _anchors[path]


def links(text):
    for n, line in prose_lines(text):
        bare = CODE_SPAN.sub(lambda m: " " * len(m.group(0)), line)
        for m in INLINE_LINK.finditer(bare):
            yield n, m.group(2).strip("<>")
        m = REF_DEF.match(bare)
        if m:
            yield n, m.group(2).strip("<>")


def check(md):
    problems = []
    text = md.read_text(encoding="utf-8")
    for n, target in links(text):
        if not target or EXTERNAL.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        if path_part.startswith("/"):  # GitHub reads a leading '/' as the repository's root
            dest = (ROOT / path_part.lstrip("/")).resolve()
        else:
            dest = (md.parent / path_part).resolve() if path_part else md
        where = f"{shown(md)}:{n}: {target}"
        if path_part and not dest.exists():
            problems.append(f"{where}: no such file {shown(dest)}")
            continue
        if path_part and not dest.is_relative_to(ROOT):
            problems.append(f"{where}: points outside the repository")
            continue
        if anchor:
            if dest.is_dir() or dest.suffix.lower() != ".md":
                problems.append(f"{where}: an anchor on something that is not a Markdown file")
            elif anchor not in anchors(dest):
                problems.append(f"{where}: no heading with anchor #{anchor} in {shown(dest)}")
    return problems


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    if argv:
        files = [pathlib.Path(a).resolve() for a in argv]
    else:
        files = [ROOT / "README.md", ROOT / "ARCHITECTURE.md", *sorted((ROOT / "docs").glob("*.md"))]
    missing = [f for f in files if not f.is_file()]
    if missing:
        print("check-links: no such file: " + ", ".join(map(str, missing)), file=sys.stderr)
        return 2
    problems = []
    count = 0
    for f in files:
        count += sum(1 for _ in links(f.read_text(encoding="utf-8")))
        problems += check(f)
    if problems:
        print(f"check-links: {len(problems)} broken link(s):", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    print(f"check-links: {count} link(s) in {len(files)} file(s), all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
