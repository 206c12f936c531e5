//! Buckets: the outbox split by a hash of the aggregate, each bucket published under a lease
//! of its own, so that several relays publish one outbox at once.
//!
//! An aggregate lives in exactly one bucket (`hashtextextended` of its type and id, in the
//! `"C"` collation, modulo the count), so per-aggregate order needs nothing across buckets:
//! within a bucket, rows are claimed in `id` order as in an outbox of one bucket. A bucket's
//! lease row is an ordinary row of `outbox_relay_lease` (acquired, renewed, held through a
//! producer's initialisation, released, and checked by claims and marks exactly as the
//! whole-outbox lease), named after the layout and the bucket; with one bucket (the default)
//! the bucket's lease *is* the whole-outbox lease, so relays of a version without buckets and
//! relays of this one elect one leader among them.
//!
//! The relays sharing an outbox renew a membership row each; a relay's share is
//! `ceil(buckets / live members)` ([`share`]): it takes free buckets up to it and releases the
//! excess, so a new relay gets its share within about a lease period.

/// Most buckets an outbox can have.
pub const MAX_BUCKETS: i16 = 256;

/// The holder written into the whole-outbox lease row while the outbox has several buckets:
/// that row then never expires, so a relay that knows only the whole-outbox lease stands by.
pub const BUCKETED_HOLDER: &str = "<buckets>";

/// How the outbox is split: the bucket count and the layout's number (bumped by every change
/// of the count; part of every bucket's lease name and `transactional.id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Number of buckets (1 ..= [`MAX_BUCKETS`]).
    pub buckets: i16,
    /// The layout's number.
    pub number: i32,
}

impl Layout {
    /// Whether the outbox has more than one bucket.
    pub fn is_split(self) -> bool {
        self.buckets > 1
    }

    /// The lease row of `bucket` for the relays of `lease`: `lease` itself with one bucket,
    /// `<lease>/l<layout>/b<bucket>` otherwise.
    pub fn lease_name(self, lease: &str, bucket: i16) -> String {
        if self.is_split() {
            format!("{lease}/l{}/b{bucket}", self.number)
        } else {
            lease.to_owned()
        }
    }

    /// The bucket a lease token of this layout is scoped to (`None`: the whole outbox).
    pub fn scope(self, bucket: i16) -> Option<i16> {
        self.is_split().then_some(bucket)
    }

    /// The Kafka `transactional.id` of `bucket`'s producer, from the relays' shared `base`:
    /// `base` itself with one bucket (as relays without buckets use), `<base>.l<layout>.b<bucket>`
    /// otherwise.
    pub fn transactional_id(self, base: &str, bucket: i16) -> String {
        if self.is_split() {
            format!("{base}.l{}.b{bucket}", self.number)
        } else {
            base.to_owned()
        }
    }
}

/// How many buckets one of `members` live relays should hold: `ceil(buckets / members)`.
pub fn share(buckets: i16, members: i64) -> usize {
    let members = members.max(1) as usize;
    (buckets as usize).div_ceil(members)
}

/// The SQL that makes the outbox's insert path match a count of `buckets`: the function
/// mapping an aggregate to its bucket (kept for one bucket too, returning 0), and, with more
/// than one, the insert trigger that sets `outbox.bucket` (enabled `ALWAYS`: it fires for
/// writers under `session_replication_role = replica` too) and the `(bucket, id)` index a
/// bucket's claim scans. One bucket drops both: writers then pay nothing.
pub fn bucket_ddl(buckets: i16) -> String {
    // `hashtextextended` is what PostgreSQL's hash partitioning uses: stable across releases
    // and `pg_upgrade`. `COLLATE "C"`: a nondeterministic collation would hash by its ICU
    // version. The modulo of a negative hash is negative: shifted into 0 .. buckets.
    let of = |a: &str, b: &str| {
        format!(
            "((pg_catalog.hashtextextended( \
             ({a} OPERATOR(pg_catalog.||) '/' OPERATOR(pg_catalog.||) {b}) COLLATE \"C\", 0) \
             % {buckets} + {buckets}) % {buckets})::int2"
        )
    };
    let function = format!(
        "CREATE OR REPLACE FUNCTION outbox_bucket_of(aggregate_type text, aggregate_id text) \
         RETURNS smallint LANGUAGE sql IMMUTABLE PARALLEL SAFE \
         SET search_path = pg_catalog, pg_temp \
         AS $$ SELECT {} $$;",
        if buckets > 1 {
            of("aggregate_type", "aggregate_id")
        } else {
            "0::int2".to_owned()
        }
    );
    if buckets <= 1 {
        return format!(
            "{function} \
             DROP TRIGGER IF EXISTS outbox_bucket ON outbox; \
             DROP INDEX IF EXISTS outbox_bucket_id;"
        );
    }
    format!(
        "{function} \
         CREATE OR REPLACE FUNCTION outbox_bucket() RETURNS trigger LANGUAGE plpgsql \
         SET search_path = pg_catalog, pg_temp AS $$ \
         BEGIN \
             NEW.bucket := {}; \
             RETURN NEW; \
         END $$; \
         CREATE OR REPLACE TRIGGER outbox_bucket BEFORE INSERT ON outbox \
             FOR EACH ROW EXECUTE FUNCTION outbox_bucket(); \
         ALTER TABLE outbox ENABLE ALWAYS TRIGGER outbox_bucket; \
         CREATE INDEX IF NOT EXISTS outbox_bucket_id ON outbox (bucket, id);",
        of("NEW.aggregate_type", "NEW.aggregate_id")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_bucket_is_the_whole_outbox_lease_and_transactional_id() {
        let one = Layout {
            buckets: 1,
            number: 3,
        };
        assert_eq!(one.lease_name("default", 0), "default");
        assert_eq!(
            one.transactional_id("outbox-relay.db.default", 0),
            "outbox-relay.db.default"
        );
        assert_eq!(one.scope(0), None);
        let eight = Layout {
            buckets: 8,
            number: 2,
        };
        assert_eq!(eight.lease_name("default", 5), "default/l2/b5");
        assert_eq!(eight.transactional_id("t", 5), "t.l2.b5");
        assert_eq!(eight.scope(5), Some(5));
    }

    #[test]
    fn shares_cover_every_bucket_and_differ_by_at_most_one() {
        for buckets in 1..=20i16 {
            for members in 1..=10i64 {
                let s = share(buckets, members);
                assert!(
                    s * members as usize >= buckets as usize,
                    "{buckets}/{members}"
                );
                assert!(
                    (s - 1) * (members as usize) < buckets as usize,
                    "{buckets}/{members}"
                );
            }
        }
        assert_eq!(share(8, 3), 3);
        assert_eq!(share(8, 0), 8);
    }

    #[test]
    fn the_trigger_computes_from_the_new_row_and_one_bucket_drops_it() {
        let ddl = bucket_ddl(8);
        assert!(ddl
            .contains("NEW.bucket := ((pg_catalog.hashtextextended( (NEW.aggregate_type OPERATOR"));
        assert!(ddl.contains("% 8 + 8) % 8"));
        assert!(ddl.contains("ENABLE ALWAYS TRIGGER outbox_bucket"));
        let one = bucket_ddl(1);
        assert!(one.contains("DROP TRIGGER IF EXISTS outbox_bucket ON outbox"));
        assert!(one.contains("SELECT 0::int2"));
    }
}
