#!/usr/bin/env python3
"""check-guarantees.py [REPO_ROOT]: the index from the guarantees to their tests, checked.

docs/src/guarantees.md is the source of truth: a table of numbered guarantees (and one of the
consumer runtime's), each row citing the tests that prove it in its "Proved by" column. The
same guarantees are listed in README.md and indexed in docs/src/testing.md (a table of the
folders of tests/it), in tests/it/main.rs (a doc comment on each group) and in each test file's
`//!` docs. This script fails when they drift apart:

- a guarantee cites no test, or cites one that does not exist. Citations are
  `<group>::<file>[::<test>]` (tests/it/<group>/<file>.rs and a `#[test]` fn in it),
  `<crate>::<module>::...::<test>` (a unit test of a workspace crate, e.g.
  `outbox_relay::decide::tests::some_test`) or `<path>.rs[::<test>]` (a test file anywhere in
  the repository, e.g. a service's own tests); any other code span in a "Proved by" cell is an
  error; `<group>::<file>::*` (every test of a file) cites the file. Citations of tests/it in
  the other pages of the book and in the READMEs must exist too;
- the guarantees are not numbered 1..N, or README.md's list does not have the same numbers and
  bold titles as guarantees.md's table;
- a file of tests/it/<group>/ is missing from its folder's row of testing.md's table, or is not
  declared in tests/it/main.rs (it would not be compiled);
- a folder's row in testing.md, a group's doc in main.rs or a test file's `//!` docs name
  guarantees ("guarantee 3", "guarantees 1, 2 and 6") other than exactly those whose rows in
  guarantees.md cite a test of that folder, group or file;
- "guarantee N" anywhere in the book, the READMEs or the Rust sources names a guarantee that
  does not exist.

Prints one line per problem and exits 1 if there was any, 0 otherwise. Python 3 standard
library only; run by deploy/local/book.sh (`make book`, `make test`).
"""

import os
import re
import sys

GUARANTEES = "docs/src/guarantees.md"
TESTING = "docs/src/testing.md"
README = "README.md"
IT = "tests/it"
MAIN = "tests/it/main.rs"

# "guarantee 3", "Guarantees 1, 2, 3 and 6", "guarantees 3 and 5".
CLAIM = re.compile(r"\bguarantees?\s+(\d+(?:\s*,\s*\d+)*(?:\s*,?\s+and\s+\d+)?)", re.I)
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
FORMS = "give `<group>::<file>::<test>`, `<crate>::<module>::<test>` or `<path>.rs::<test>`"
SKIP_DIRS = {".git", "target", "node_modules", ".venv", "venv", "__pycache__"}


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def claims(text):
    """The guarantee numbers a text names."""
    out = set()
    for m in CLAIM.finditer(text):
        out.update(int(n) for n in re.findall(r"\d+", m.group(1)))
    return out


def fmt(numbers):
    """`{1, 2, 6}` → "guarantees 1, 2 and 6"; `{}` → "no guarantee"."""
    numbers = [str(n) for n in sorted(numbers)]
    if not numbers:
        return "no guarantee"
    if len(numbers) == 1:
        return f"guarantee {numbers[0]}"
    return f"guarantees {', '.join(numbers[:-1])} and {numbers[-1]}"


def cells(row):
    """The cells of a Markdown table row; a `|` inside a code span does not split."""
    out, cur, code = [], "", False
    for ch in row.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


def tables(text):
    """Every Markdown table outside code blocks: (header cells, [(line number, cells)])."""
    out, current, in_code = [], None, False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.lstrip().startswith("|"):
            current = None
            continue
        if current is None:
            current = (cells(line), [])
            out.append(current)
        elif not re.fullmatch(r"[\s|:-]+", line):
            current[1].append((n, cells(line)))
    return out


def code_spans(text):
    return re.findall(r"`([^`\n]+)`", text)


def code_spans_by_line(text):
    """(line number, code span) of every code span outside code blocks."""
    in_code = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code:
            for c in code_spans(line):
                yield n, c


def strip_bold(cell):
    m = re.search(r"\*\*(.+?)\*\*", cell)
    return m.group(1) if m else None


def norm_title(t):
    return re.sub(r"\s+", " ", t).strip().rstrip(".:;,").strip()


class Repo:
    def __init__(self, root):
        self.root = root
        self.groups = sorted(
            d for d in os.listdir(self.path(IT)) if os.path.isdir(self.path(IT, d))
        )
        self.crates = self.workspace_crates()

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def exists(self, rel):
        return os.path.isfile(self.path(rel))

    def test_files(self):
        """tests/it/<group>/<file>.rs, as (group, file stem)."""
        out = []
        for g in self.groups:
            for name in sorted(os.listdir(self.path(IT, g))):
                if name.endswith(".rs"):
                    out.append((g, name[:-3]))
        return out

    def workspace_crates(self):
        """Library name (`outbox_relay`) → the crate's directory, from the workspace members."""
        out = {}
        m = re.search(r"members\s*=\s*\[(.*?)\]", read(self.path("Cargo.toml")), re.S)
        for member in re.findall(r'"([^"]+)"', m.group(1) if m else ""):
            manifest = self.path(member, "Cargo.toml")
            if not os.path.isfile(manifest):
                continue
            text = read(manifest)
            lib = re.search(r'^\[lib\][^\[]*?^name\s*=\s*"([^"]+)"', text, re.M | re.S)
            pkg = re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"', text, re.M | re.S)
            name = lib.group(1) if lib else pkg.group(1) if pkg else None
            if name:
                out[name.replace("-", "_")] = member
        return out

    def source_files(self, exts):
        for dirpath, dirs, files in os.walk(self.root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            for name in files:
                if name.endswith(exts):
                    yield os.path.relpath(os.path.join(dirpath, name), self.root)


def test_fn_problem(repo, citation, rel, fn, inline_mods=()):
    """None if `rel` has a test fn `fn` (inside the inline modules `inline_mods`), else why not."""
    text = read(repo.path(rel))
    for module in inline_mods:
        if not re.search(rf"\bmod\s+{module}\s*\{{", text):
            return f"`{citation}` does not exist: {rel} has no inline `mod {module}`"
    lines = text.splitlines()
    pattern = re.compile(rf"^\s*(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?fn\s+{fn}\s*[<(]")
    for i, line in enumerate(lines):
        if not pattern.match(line):
            continue
        # The attributes above the fn, up to the end of the previous item.
        above = []
        for prev in reversed(lines[max(0, i - 12) : i]):
            if not prev.strip() or prev.strip() in ("}", "};") or prev.rstrip().endswith(";"):
                break
            above.append(prev)
        if re.search(r"#\[\s*(?:[\w:]*::)?test\b", "\n".join(above)):
            return None
        return f"`{citation}` is not a test: `fn {fn}` in {rel} has no #[test] attribute"
    return f"`{citation}` does not exist: {rel} has no `fn {fn}`"


def resolve(repo, citation):
    """(the test file a citation names, None) or (None, why it names no test)."""
    parts = citation.split("::")
    if len(parts) > 2 and parts[-1] == "*":
        parts = parts[:-1]  # `<group>::<file>::*`: every test of the file
    head = parts[0]
    if head.endswith(".rs"):
        rel, rest = head, parts[1:]
        if not repo.exists(rel):
            return None, f"`{citation}` does not exist: no file {rel}"
        if len(rest) > 1:
            return None, f"`{citation}` is not a test citation: give `<path>.rs::<test>`"
        if rest:
            why = test_fn_problem(repo, citation, rel, rest[0])
            if why:
                return None, why
        return rel, None
    if len(parts) < 2 or not all(re.fullmatch(IDENT, p) for p in parts):
        return None, f"`{citation}` is not a test citation ({FORMS})"
    if head in repo.groups:
        if len(parts) > 3:
            return None, f"`{citation}` is not a test citation: give `<group>::<file>::<test>`"
        rel = f"{IT}/{head}/{parts[1]}.rs"
        if not repo.exists(rel):
            return None, f"`{citation}` does not exist: no test file {rel}"
        if len(parts) == 3:
            why = test_fn_problem(repo, citation, rel, parts[2])
            if why:
                return None, why
        return rel, None
    if head in repo.crates:
        # Descend through module files while they exist; the rest are inline modules, the
        # last segment the test fn.
        crate = repo.crates[head]
        rel, mod_dir = f"{crate}/src/lib.rs", f"{crate}/src"
        if not repo.exists(rel):
            return None, f"`{citation}` does not exist: {crate} has no src/lib.rs"
        rest = parts[1:]
        while len(rest) > 1:
            as_file = f"{mod_dir}/{rest[0]}.rs"
            as_dir = f"{mod_dir}/{rest[0]}/mod.rs"
            if repo.exists(as_file):
                rel, mod_dir = as_file, f"{mod_dir}/{rest[0]}"
            elif repo.exists(as_dir):
                rel, mod_dir = as_dir, f"{mod_dir}/{rest[0]}"
            else:
                break
            rest = rest[1:]
        return rel, test_fn_problem(repo, citation, rel, rest[-1], rest[:-1])
    return None, (
        f"`{citation}` does not exist: `{head}` is neither a folder of {IT} "
        f"({', '.join(repo.groups)}) nor a workspace crate"
    )


class Guarantee:
    def __init__(self, number, title, line):
        self.number = number  # None for the consumer runtime's (unnumbered) guarantees
        self.title = title
        self.line = line
        self.files = set()  # test files its citations resolve to

    def name(self):
        title = self.title if len(self.title) <= 60 else self.title[:57] + "..."
        if self.number is not None:
            return f"guarantee {self.number} ({title})"
        return f"the consumer runtime's guarantee \"{title}\""


def check_guarantees_page(repo, problems):
    """The guarantees and the test files each cites."""
    text = read(repo.path(GUARANTEES))
    out, seen = [], set()
    for header, rows in tables(text):
        if not any(h.lower() == "proved by" for h in header):
            continue
        proved = [h.lower() for h in header].index("proved by")
        numbered = header[0] == "#"
        for line, row in rows:
            where = f"{GUARANTEES}:{line}"
            if len(row) != len(header):
                problems.append(f"{where}: {len(row)} cells in a table of {len(header)} columns")
                continue
            text_cell = row[1] if numbered else row[0]
            title = norm_title(strip_bold(text_cell) or text_cell)
            number = None
            if numbered:
                if not row[0].isdigit():
                    problems.append(f"{where}: `{row[0]}` is not a guarantee number")
                    continue
                number = int(row[0])
                if not strip_bold(text_cell):
                    problems.append(f"{where}: guarantee {number} has no bold title")
            g = Guarantee(number, title, line)
            cited = code_spans(row[proved])
            if not cited:
                problems.append(f"{where}: {g.name()} cites no test")
            for c in cited:
                rel, why = resolve(repo, c)
                if why:
                    problems.append(f"{where}: {g.name()}: {why}")
                    seen.add((line, why))
                else:
                    g.files.add(rel)
            out.append(g)
    numbers = [g.number for g in out if g.number is not None]
    if not numbers:
        problems.append(
            f"{GUARANTEES}: no table of numbered guarantees (`| # | Guarantee | Proved by |`)"
        )
    elif numbers != list(range(1, len(numbers) + 1)):
        listed = ", ".join(str(n) for n in numbers)
        problems.append(
            f"{GUARANTEES}: guarantees numbered {listed}, not 1 to {len(numbers)} in order"
        )
    # Citations in the page's prose (outside the tables) must exist too.
    for n, c in code_spans_by_line(text):
        if "::" in c and (c.split("::")[0] in repo.groups or c.split("::")[0] in repo.crates):
            _, why = resolve(repo, c)
            if why and (n, why) not in seen:
                problems.append(f"{GUARANTEES}:{n}: {why}")
    return out


def check_readme(repo, numbered, problems):
    text = read(repo.path(README))
    m = re.search(r"^## Guarantees\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        problems.append(f"{README}: no `## Guarantees` section")
        return
    listed = {}
    for n, title in re.findall(r"^(\d+)\.\s+\*\*(.+?)\*\*", m.group(1), re.M):
        listed[int(n)] = norm_title(title)
    book = {g.number: norm_title(g.title) for g in numbered}
    for n in sorted(set(book) - set(listed)):
        problems.append(
            f"{README}: guarantee {n} ({book[n]}) is missing from the list of guarantees"
        )
    for n in sorted(set(listed) - set(book)):
        problems.append(
            f"{README}: lists guarantee {n} ({listed[n]}), which {GUARANTEES} does not have"
        )
    for n in sorted(set(listed) & set(book)):
        if listed[n] != book[n]:
            problems.append(
                f"{README}: guarantee {n} is titled \"{listed[n]}\", "
                f"{GUARANTEES} titles it \"{book[n]}\" (the bold titles must be the same)"
            )


def expected(numbered, files):
    """The guarantees whose rows cite any of `files`."""
    return {g.number for g in numbered if g.files & set(files)}


def compare(where, what, claimed, cited, problems):
    if claimed == cited:
        return
    fixes = []
    if cited - claimed:
        fixes.append(f"add {fmt(cited - claimed)}")
    if claimed - cited:
        fixes.append(f"drop {fmt(claimed - cited)} (or cite these tests there)")
    problems.append(
        f"{where}: {what} names {fmt(claimed)}, but {GUARANTEES} cites its tests for "
        f"{fmt(cited)}: {'; '.join(fixes)}"
    )


def check_testing_page(repo, numbered, problems):
    text = read(repo.path(TESTING))
    table = next((t for t in tables(text) if t[0] and t[0][0].lower().startswith("folder")), None)
    if table is None:
        problems.append(f"{TESTING}: no folder table (`| Folder of `tests/it` | ... |`)")
        return
    rows = {}
    for line, row in table[1]:
        m = re.fullmatch(r"`([^`/]+)/?`", row[0])
        if not m:
            problems.append(f"{TESTING}:{line}: `{row[0]}` is not a folder of {IT}")
            continue
        rows[m.group(1)] = (line, " ".join(row[1:]))
    files = repo.test_files()
    for g in repo.groups:
        if g not in rows:
            problems.append(f"{TESTING}: the folder table has no row for {IT}/{g}/")
    for g, (line, cell) in sorted(rows.items()):
        where = f"{TESTING}:{line}"
        if g not in repo.groups:
            problems.append(f"{where}: the folder table names `{g}/`, which {IT} does not have")
            continue
        listed = {c[:-3] for c in code_spans(cell) if c.endswith(".rs")}
        in_folder = {f for grp, f in files if grp == g}
        for f in sorted(in_folder - listed):
            problems.append(
                f"{where}: {IT}/{g}/{f}.rs is missing from the folder table (row `{g}/`)"
            )
        for f in sorted(listed - in_folder):
            problems.append(f"{where}: row `{g}/` lists `{f}.rs`, which {IT}/{g}/ does not have")
        cited = expected(numbered, {f"{IT}/{g}/{f}.rs" for f in in_folder})
        compare(where, f"row `{g}/`", claims(cell), cited, problems)
    # Paths of test files anywhere on the page must exist.
    for c in code_spans(text):
        if c.startswith(f"{IT}/") and c.endswith(".rs") and not repo.exists(c):
            problems.append(f"{TESTING}: names `{c}`, which does not exist")


def check_main(repo, numbered, problems):
    text = read(repo.path(MAIN))
    blocks = {}
    for m in re.finditer(r"((?:^[ \t]*///[^\n]*\n)*)^mod\s+(\w+)\s*\{(.*?)^\}", text, re.M | re.S):
        doc = " ".join(l.strip()[3:] for l in m.group(1).splitlines())
        line = text[: m.start(2)].count("\n") + 1
        blocks[m.group(2)] = (line, doc, set(re.findall(r"\bmod\s+(\w+)\s*;", m.group(3))))
    files = repo.test_files()
    for g in repo.groups:
        if g not in blocks:
            problems.append(f"{MAIN}: no `mod {g} {{ ... }}` for the folder {IT}/{g}/")
    for g, (line, doc, mods) in sorted(blocks.items()):
        where = f"{MAIN}:{line}"
        in_folder = {f for grp, f in files if grp == g}
        for f in sorted(in_folder - mods):
            problems.append(
                f"{where}: {IT}/{g}/{f}.rs is not declared in `mod {g}` (it is not compiled)"
            )
        cited = expected(numbered, {f"{IT}/{g}/{f}.rs" for f in in_folder})
        compare(where, f"the doc of `mod {g}`", claims(doc), cited, problems)


def check_test_files(repo, numbered, problems):
    for g, f in repo.test_files():
        rel = f"{IT}/{g}/{f}.rs"
        doc = " ".join(
            l.strip()[3:] for l in read(repo.path(rel)).splitlines() if l.strip().startswith("//!")
        )
        compare(rel, "its //! doc", claims(doc), expected(numbered, {rel}), problems)


def check_mentions(repo, numbered, problems):
    """Every "guarantee N" in the book, the READMEs and the Rust sources names one that exists,
    and every citation of a test of tests/it in them resolves."""
    known = {g.number for g in numbered}
    for rel in sorted(repo.source_files((".md", ".rs"))):
        in_book = rel.startswith("docs/src/")
        if rel.endswith(".md") and not (in_book or os.path.basename(rel) == "README.md"):
            continue
        text = read(repo.path(rel))
        for n, line in enumerate(text.splitlines(), 1):
            for m in CLAIM.finditer(line):
                for num in re.findall(r"\d+", m.group(1)):
                    if int(num) not in known:
                        problems.append(
                            f"{rel}:{n}: names guarantee {num}, which {GUARANTEES} does not have"
                        )
        if rel.endswith(".md") and rel != GUARANTEES:
            for n, c in code_spans_by_line(text):
                if "::" in c and c.split("::")[0] in repo.groups:
                    _, why = resolve(repo, c)
                    if why:
                        problems.append(f"{rel}:{n}: {why}")


def main(argv):
    root = argv[1] if len(argv) > 1 else os.getcwd()
    repo = Repo(root)
    problems = []
    guarantees = check_guarantees_page(repo, problems)
    numbered = [g for g in guarantees if g.number is not None]
    check_readme(repo, numbered, problems)
    check_testing_page(repo, numbered, problems)
    check_main(repo, numbered, problems)
    check_test_files(repo, numbered, problems)
    check_mentions(repo, numbered, problems)
    for p in problems:
        print(f"guarantees: {p}")
    print(
        f"check-guarantees: {len(numbered)} numbered guarantees, "
        f"{len(guarantees) - len(numbered)} of the consumer runtime, "
        f"{len(repo.test_files())} test files of {IT}: {len(problems)} problem(s)",
        file=sys.stderr,
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
