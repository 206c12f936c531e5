#!/usr/bin/env python3
"""check-links.py BOOK_HTML_DIR [--runbooks ALERTS_YAML] [MARKDOWN_FILE ...]: dead links.

Reads every .html page mdbook wrote and checks each relative link (href/src): the file it
names must exist in the built book, and its #fragment, when it has one, must be an id on that
page. Then checks the given Markdown files outside the book (README.md, crate READMEs, the
dated reports): each relative link must name an existing file of the repository, and a
#fragment of a Markdown file one of its headings. External links (http:, https:, mailto:) are
not fetched: CI has no network to the world. With --runbooks, every `runbook:` annotation of
the Prometheus alert rules (a repository path with a #fragment) must name an existing Markdown
file and one of its headings.

Prints one line per dead link and exits 1 if there was any, 0 otherwise.
"""

import html.parser
import os
import re
import sys
import urllib.parse


class Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for attr in ("href", "src"):
            if a.get(attr):
                self.links.append(a[attr])


def external(link):
    return re.match(r"^[a-z][a-z0-9+.-]*:", link) is not None or link.startswith("//")


def parse(path, cache={}):
    if path not in cache:
        p = Page()
        with open(path, encoding="utf-8") as f:
            p.feed(f.read())
        cache[path] = p
    return cache[path]


def check_book(root):
    dead = []
    for dirpath, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".html"):
                continue
            page_path = os.path.join(dirpath, name)
            if name in ("print.html", "404.html", "toc.html"):
                continue  # generated copies of the other pages
            for link in parse(page_path).links:
                if external(link):
                    continue
                target, _, fragment = link.partition("#")
                target = urllib.parse.unquote(target)
                path = page_path if not target else os.path.normpath(os.path.join(dirpath, target))
                if os.path.isdir(path):
                    path = os.path.join(path, "index.html")
                rel = os.path.relpath(page_path, root)
                if not os.path.exists(path):
                    dead.append(f"{rel}: {link}: no such file in the book")
                elif fragment and path.endswith(".html") and fragment not in parse(path).ids:
                    dead.append(f"{rel}: {link}: no #{fragment} on that page")
    return dead


def slug(heading):
    """GitHub's and mdbook's anchor of a Markdown heading."""
    h = re.sub(r"`", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(path):
    out = set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            if not in_code:
                m = re.match(r"^#+\s+(.*)$", line)
                if m:
                    out.add(slug(m.group(1)))
    return out


def check_markdown(path):
    dead = []
    text = open(path, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    base = os.path.dirname(path)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        link = m.group(1)
        if external(link):
            continue
        target, _, fragment = link.partition("#")
        target_path = path if not target else os.path.normpath(os.path.join(base, target))
        if not os.path.exists(target_path):
            dead.append(f"{path}: {link}: no such file")
        elif fragment and target_path.endswith(".md") and slug(fragment) not in headings(target_path):
            dead.append(f"{path}: {link}: no heading #{fragment}")
    return dead


def check_runbooks(alerts):
    dead = []
    repo = os.getcwd()
    for n, line in enumerate(open(alerts, encoding="utf-8"), 1):
        m = re.match(r'^\s*runbook:\s*"?([^"\s]+)"?\s*$', line)
        if not m:
            continue
        target, _, fragment = m.group(1).partition("#")
        path = os.path.join(repo, target)
        if not os.path.exists(path):
            dead.append(f"{alerts}:{n}: runbook {m.group(1)}: no such file")
        elif not fragment or slug(fragment) not in headings(path):
            dead.append(f"{alerts}:{n}: runbook {m.group(1)}: no such heading")
    return dead


def main(argv):
    args = argv[1:]
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    dead = check_book(args.pop(0))
    while args:
        arg = args.pop(0)
        if arg == "--runbooks":
            dead += check_runbooks(args.pop(0))
        else:
            dead += check_markdown(arg)
    for d in dead:
        print(f"dead link: {d}")
    print(f"check-links: {len(dead)} dead link(s)", file=sys.stderr)
    return 1 if dead else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
