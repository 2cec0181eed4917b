#!/usr/bin/env bash
# Fails when the repository points outside itself (docs/engineering.md, "Self-contained sources"):
#  1. a tracked (or new, not ignored) text file names a document that is not in the repository
#     (design, style, reliability or benchmark notes by file name or numbered item), a section
#     sign with a number, an issue or pull-request number (the word "issue", or "PR #", then
#     digits; a link to a third-party tracker, .../issues/N, is fine) or a folder beside the
#     checkout;
#  2. a file under docs/ cited as `docs/NAME.md` does not exist, or a section cited as
#     `docs/NAME.md, "Title"` (or `README, "Title"`) is not a heading of that page (a heading that
#     starts with the quoted words counts);
#  3. a relative Markdown link `](path)` or `](path#anchor)` in a tracked .md file names a file
#     that does not exist, or an anchor that is not a heading of the page it points at.
# Binary files, tests/fixtures/, tests/fuzz/corpus/ and this script are not read. Exit 77
# (ctest: skipped) without git or python3, 1 with CI set. ctest: style/self_contained.
cd "$(dirname "$0")/../.." || exit 1
. tests/tools/skip_lib.sh
command -v python3 >/dev/null || skip self_contained "no python3"
git rev-parse --git-dir >/dev/null 2>&1 || skip self_contained "not a git checkout"

read -r -d '' prog <<'PY'
import os, re, sys

self_path = os.path.normpath(os.path.relpath(sys.argv[1]))
files = sorted({f for f in sys.stdin.read().split("\0") if f and os.path.isfile(f)})
skip_dirs = ("tests/fixtures/", "tests/fuzz/corpus/", "models/")
docs = ("DESIGN", "STYLE", "RELIABILITY", "BENCHMARKS")
outside = [
    (re.compile(r"\b(%s)\.md\b" % "|".join(docs)), "a document that is not in the repository"),
    (re.compile(r"\b(%s)\b:? ?(§ ?|item |no\. ?)?[0-9]+" % "|".join(docs)),
     "a numbered item of a document that is not in the repository"),
    (re.compile(r"\bRELIABILITY:"), "a document that is not in the repository"),
    (re.compile(r"§ ?[0-9]"), "a numbered section of a document that is not in the repository"),
    (re.compile(r"(?<![\w/.-])[Ii]ssues? #?[0-9]+"), "an issue number"),
    (re.compile(r"\b(PR|[Pp]ull request) ?#[0-9]+"), "a pull-request number"),
    (re.compile(r"\bthe issue's\b|\b(next|previous|earlier|later) issue\b"), "the task tracker"),
    (re.compile(r"(?<![\w.-])(\.\./)+shared/|/work/shared\b"), "a folder outside the repository"),
]


def read_text(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def strip_fences(lines):
    """The lines of a Markdown page outside fenced code blocks (others replaced by '')."""
    out, fence = [], None
    for line in lines:
        m = re.match(r"^\s*(```|~~~)", line)
        if m:
            fence = None if fence == m.group(1) else (fence or m.group(1))
            out.append("")
            continue
        out.append("" if fence else line)
    return out


def slug(title):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
    title = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return title.replace(" ", "-")


headings_cache = {}


def headings(path):
    """(titles, anchors) of a Markdown page; titles without Markdown marks."""
    if path not in headings_cache:
        titles, anchors, seen = [], set(), {}
        text = read_text(path) or ""
        for line in strip_fences(text.split("\n")):
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                raw = m.group(1)
                titles.append(re.sub(r"[`*_]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", raw)))
                s = slug(raw)
                n = seen.get(s, 0)
                seen[s] = n + 1
                anchors.add(s if n == 0 else "%s-%d" % (s, n))
            for a in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
                anchors.add(a)
        headings_cache[path] = (titles, anchors)
    return headings_cache[path]


problems = []
cite = re.compile(r"(?<![\w/.-])(docs/[\w.-]+\.md|README(?:\.md)?)(?:,? \"([^\"]+)\")?")
link = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")

for path in files:
    if os.path.normpath(path) == self_path or path.startswith(skip_dirs):
        continue
    text = read_text(path)
    if text is None:
        continue
    lines = text.split("\n")
    for i, line in enumerate(lines, 1):
        for pattern, what in outside:
            m = pattern.search(line)
            if m:
                problems.append("%s:%d: %s (%r)" % (path, i, what, m.group(0)))

    # Citations of docs/ pages and their sections, also where a comment wraps them onto the
    # next line: line breaks and the comment marks after them read as one space.
    joined = re.sub(r"[ \t]*\n[ \t]*(?://+|#+|\*(?!\*)|\"\"\")?[ \t]*", " ", text)
    for m in cite.finditer(joined):
        page, title = m.group(1), m.group(2)
        if page.startswith("README"):
            if not title:
                continue
            page = "README.md"
        if not os.path.isfile(page):
            problems.append("%s: cites %s, which does not exist" % (path, page))
            continue
        if title and not any(t.startswith(title) for t in headings(page)[0]):
            problems.append("%s: cites %s, \"%s\", which is not a heading there" % (path, page, title))

    # Relative links in Markdown pages.
    if path.endswith(".md"):
        for i, line in enumerate(strip_fences(lines), 1):
            for m in link.finditer(re.sub(r"`[^`]*`", "", line)):
                target = m.group(1)
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
                    continue
                file_part, _, anchor = target.partition("#")
                dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(dest):
                    problems.append("%s:%d: link to %s, which does not exist" % (path, i, target))
                elif anchor and dest.endswith(".md") and anchor not in headings(dest)[1]:
                    problems.append("%s:%d: link to %s: no heading #%s in %s" % (path, i, target, anchor, dest))

for p in problems:
    print(p)
if problems:
    print("%d reference(s) outside the repository or broken; docs/engineering.md, "
          "\"Self-contained sources\", says what to write instead" % len(problems))
    sys.exit(1)
print("self-contained: %d files read" % len(files))
PY
git ls-files -z --cached --others --exclude-standard | python3 -c "$prog" "$0"
