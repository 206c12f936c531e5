//! The partitions of a topic that cannot take messages, as the cluster's metadata shows them.

use std::collections::HashSet;

/// The partitions of a topic the cluster's metadata shows without a leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadPartitions {
    /// The topic's partition count.
    pub count: i32,
    /// Partitions without a leader.
    pub leaderless: HashSet<i32>,
}

impl DeadPartitions {
    /// A partition with a leader for a keyless event, spread by `seed` (the event's id), or
    /// none when every partition is without one.
    pub fn live_partition(&self, seed: i64) -> Option<i32> {
        let live = self.count - self.leaderless.len() as i32;
        if live <= 0 {
            return None;
        }
        let nth = seed.rem_euclid(i64::from(live)) as usize;
        (0..self.count)
            .filter(|p| !self.leaderless.contains(p))
            .nth(nth)
    }
}

#[cfg(test)]
mod tests {
    use super::DeadPartitions;

    #[test]
    fn a_keyless_event_goes_to_a_partition_with_a_leader() {
        let dead = DeadPartitions {
            count: 4,
            leaderless: [1, 2].into(),
        };
        let chosen: std::collections::BTreeSet<i32> =
            (-5..20).filter_map(|id| dead.live_partition(id)).collect();
        assert_eq!(
            chosen,
            [0, 3].into(),
            "spread over the live partitions only"
        );
        let all_dead = DeadPartitions {
            count: 2,
            leaderless: [0, 1].into(),
        };
        assert_eq!(all_dead.live_partition(7), None);
    }
}
