//! Marking published rows: deleting them once the broker acknowledged them, fenced by the
//! lease epoch in the same statement, with the failure records of rows that failed before.

use sqlx::Row;

use super::lease::LeaseToken;
use super::pool::Store;

/// Result of [`Store::mark_published`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// The rows were deleted (the count may be lower than asked if they were already gone).
    Deleted(u64),
    /// The lease changed hands: nothing was marked.
    LeaseLost,
}

/// `(min, max)` of `ids` when they are many and dense enough that walking the primary key
/// from the first to the last costs less than looking each one up (at most four entries
/// walked per id): the usual batch, a run of the outbox's head.
fn dense_range(ids: &[i64]) -> Option<(i64, i64)> {
    const MIN_IDS: usize = 64;
    if ids.len() < MIN_IDS {
        return None;
    }
    let lo = *ids.iter().min()?;
    let hi = *ids.iter().max()?;
    let span = u64::try_from(hi.checked_sub(lo)?).ok()?;
    (span < 4 * ids.len() as u64).then_some((lo, hi))
}

impl Store {
    /// Deletes published rows, fenced by the lease epoch.
    ///
    /// The lease row is locked `FOR SHARE` in the same statement: a takeover (which updates
    /// the lease row) either committed before, and then nothing is deleted, or waits for this
    /// statement to finish.
    ///
    /// # Errors
    /// Database errors; retrying is safe (deleting twice deletes nothing).
    pub async fn mark_published(
        &self,
        lease: &LeaseToken,
        ids: &[i64],
    ) -> Result<Marked, sqlx::Error> {
        self.mark_published_clearing(lease, ids, &[], None).await
    }

    /// [`Store::mark_published`], also deleting the failure records of `had_failures` (rows
    /// of `ids` that failed before and were now published), in the same statement; with
    /// `record`, also storing in the lease row the offset of the bucket record that listed
    /// `ids` ([`crate::records`]: a relay settling the bucket reads the records after it).
    ///
    /// # Errors
    /// Database errors; retrying is safe.
    pub async fn mark_published_clearing(
        &self,
        lease: &LeaseToken,
        ids: &[i64],
        had_failures: &[i64],
        record: Option<i64>,
    ) -> Result<Marked, sqlx::Error> {
        let mut s = self.session().await?;
        let dense = dense_range(ids);
        let delete = match dense {
            // One descent of the primary key and a walk along its leaves, the ids checked
            // against a hash of `$4` (PostgreSQL hashes a constant array: the statement is not
            // prepared, so every execution is planned with its values), instead of one descent
            // per id: half the buffer reads and about half the time for a batch of 10 000.
            Some((lo, hi)) => format!(
                "DELETE FROM outbox WHERE id >= {lo} AND id <= {hi} AND (id + 0) = ANY($4) \
                 AND EXISTS (SELECT 1 FROM l) RETURNING 1"
            ),
            None => {
                "DELETE FROM outbox WHERE id = ANY($4) AND EXISTS (SELECT 1 FROM l) RETURNING 1"
                    .to_owned()
            }
        };
        // The lease row locked `FOR SHARE`, or updated (a stronger lock) with the record's
        // offset (a parameter: a small batch's statement stays prepared with transactions
        // on too, one round trip instead of two).
        let lease_row = match record {
            None => {
                "SELECT 1 FROM outbox_relay_lease \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 FOR SHARE"
            }
            Some(_) => {
                "UPDATE outbox_relay_lease \
                 SET record_offset = greatest(coalesce(record_offset, -1), $6) \
                 WHERE name = $1 AND holder = $2 AND epoch = $3 RETURNING 1"
            }
        };
        let sql = format!(
            "WITH l AS ({lease_row}), d AS ({delete}), f AS ( \
                 DELETE FROM outbox_failure WHERE outbox_id = ANY($5) AND EXISTS (SELECT 1 FROM l) \
             ) \
             SELECT (SELECT count(*) FROM l) AS held, (SELECT count(*) FROM d) AS deleted"
        );
        let mut query = sqlx::query(&sql)
            .persistent(dense.is_none())
            .bind(&lease.name)
            .bind(&lease.holder)
            .bind(lease.epoch)
            .bind(ids)
            .bind(had_failures);
        if let Some(offset) = record {
            query = query.bind(offset);
        }
        let row = query.fetch_one(s.conn()).await?;
        s.finish().await?;
        if row.get::<i64, _>("held") == 0 {
            return Ok(Marked::LeaseLost);
        }
        Ok(Marked::Deleted(row.get::<i64, _>("deleted") as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::dense_range;

    #[test]
    fn a_dense_run_of_ids_is_deleted_by_range() {
        let ids: Vec<i64> = (0..100).map(|i| 1_000 + 2 * i).collect();
        assert_eq!(dense_range(&ids), Some((1_000, 1_198)));
        let mut shuffled = ids.clone();
        shuffled.reverse();
        assert_eq!(dense_range(&shuffled), Some((1_000, 1_198)));
    }

    #[test]
    fn few_or_scattered_ids_are_looked_up_one_by_one() {
        let few: Vec<i64> = (0..63).collect();
        assert_eq!(dense_range(&few), None);
        // 100 ids spread over 400 or more: the walk would read more than four per id.
        let sparse: Vec<i64> = (0..100).map(|i| i * 5).collect();
        assert_eq!(dense_range(&sparse), None);
        let far = [vec![i64::MIN], (0..100).collect(), vec![i64::MAX]].concat();
        assert_eq!(dense_range(&far), None);
    }
}
