"""Adds the index tansu 0.6.0's sqlite storage lacks: header (topition, offset_id).

usage: python3 tansu-sqlite-index.py STATE_DIR/tansu.db

tansu's fetch looks up each record's headers with `header_fetch.sql`, a join on
(topition, offset_id) that has no index, so sqlite scans the whole header table once per
record served (EXPLAIN QUERY PLAN: `SCAN h`). Serving a record then costs more the more was
ever produced: ~10 ms per record with 190 000 header rows (a 15-minute chaos run), and a
consumer reading a long run back from offset 0 asked for a 5 MB fetch that took longer than
librdkafka's 60 s request timeout, over and over (README, Chaos). The index turns the scan into a
lookup (20 344 records with their headers read in 0.9 s instead of 135 s).

The test harness runs this on every sqlite broker it starts (and `deploy/local/up.sh` with
TANSU_STORAGE=sqlite). It is idempotent; it waits for tansu to have created its tables.
"""

import sqlite3
import sys
import time

DEADLINE_S = 30


def main(path: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        try:
            db = sqlite3.connect(path, timeout=DEADLINE_S)
            has_table = db.execute(
                "select 1 from sqlite_master where type = 'table' and name = 'header'"
            ).fetchone()
            if has_table:
                db.execute(
                    "create index if not exists header_topition_offset_id"
                    " on header (topition, offset_id)"
                )
                db.commit()
                return
            db.close()
        except sqlite3.OperationalError as e:
            if time.monotonic() > deadline:
                raise SystemExit(f"{path}: {e}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{path}: tansu created no header table within {DEADLINE_S} s")
        time.sleep(0.1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
