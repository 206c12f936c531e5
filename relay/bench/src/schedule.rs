//! The order of interleaved runs: the variants of a phase take turns, so slow drift of the
//! machine's load (other builds starting or finishing) falls on all of them alike instead of
//! on whichever ran last.

/// Run order of `variants` variants over `rounds` rounds, as variant indexes: every round runs
/// each variant once; with `mirrored`, every other round runs them in reverse (A B C C B A:
/// a linear drift then costs every variant the same on average), otherwise in the same order
/// (A B A B).
pub fn interleaved(variants: usize, rounds: usize, mirrored: bool) -> Vec<usize> {
    (0..rounds)
        .flat_map(|r| {
            (0..variants).map(move |i| {
                if mirrored && r % 2 == 1 {
                    variants - 1 - i
                } else {
                    i
                }
            })
        })
        .collect()
}

/// The median of `v` (mean of the two middle values for an even count); `None` when empty.
pub fn median(v: &[f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let mid = s.len() / 2;
    Some(if s.len().is_multiple_of(2) {
        (s[mid - 1] + s[mid]) / 2.0
    } else {
        s[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrored_rounds_go_there_and_back() {
        assert_eq!(interleaved(3, 2, true), vec![0, 1, 2, 2, 1, 0]);
        assert_eq!(interleaved(3, 3, true), vec![0, 1, 2, 2, 1, 0, 0, 1, 2]);
        assert_eq!(interleaved(2, 2, false), vec![0, 1, 0, 1]);
        assert!(interleaved(2, 0, false).is_empty());
    }

    #[test]
    fn every_variant_runs_once_per_round_and_mirrored_positions_balance() {
        let order = interleaved(3, 4, true);
        for v in 0..3 {
            let positions: Vec<usize> = order
                .iter()
                .enumerate()
                .filter(|(_, x)| **x == v)
                .map(|(i, _)| i)
                .collect();
            assert_eq!(positions.len(), 4);
            // Same mean position for every variant: linear drift is shared alike.
            assert_eq!(positions.iter().sum::<usize>(), 22);
        }
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }
}
