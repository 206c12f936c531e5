//! Percentiles of measured samples and of the relay's Prometheus histograms.

use serde::Serialize;

/// Percentiles of a set of samples (same unit as the samples).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

/// Nearest-rank percentiles; `None` without samples.
pub fn percentiles(samples: &[f64]) -> Option<Percentiles> {
    if samples.is_empty() {
        return None;
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    Some(Percentiles {
        count: v.len(),
        p50: rank(0.50),
        p95: rank(0.95),
        p99: rank(0.99),
        max: v[v.len() - 1],
    })
}

pub use test_support::metrics::{histogram, histogram_delta, histogram_quantile, metric_value};

/// Fraction of observations at or below `bound` (which must be a bucket bound).
pub fn fraction_at_most(buckets: &[(f64, f64)], bound: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    let at = buckets.iter().find(|(le, _)| *le == bound)?.1;
    (total > 0.0).then(|| at / total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = percentiles(&v).unwrap();
        assert_eq!((p.p50, p.p95, p.p99, p.max), (50.0, 95.0, 99.0, 100.0));
        assert!(percentiles(&[]).is_none());
    }

    #[test]
    fn histogram_quantiles_from_prometheus_text() {
        let text = "# HELP x\n\
            lat_bucket{le=\"0.01\"} 50\n\
            lat_bucket{le=\"0.05\"} 90\n\
            lat_bucket{le=\"0.1\"} 100\n\
            lat_bucket{le=\"+Inf\"} 100\n\
            lat_sum 3\nlat_count 100\n";
        let h = histogram(text, "lat");
        assert_eq!(h.len(), 4);
        assert!((histogram_quantile(&h, 0.5).unwrap() - 0.01).abs() < 1e-9);
        assert!((histogram_quantile(&h, 0.7).unwrap() - 0.03).abs() < 1e-9);
        assert_eq!(fraction_at_most(&h, 0.05), Some(0.9));
        let before = vec![
            (0.01, 10.0),
            (0.05, 10.0),
            (0.1, 10.0),
            (f64::INFINITY, 10.0),
        ];
        assert_eq!(histogram_delta(&h, &before)[0], (0.01, 40.0));
        assert_eq!(metric_value(text, "lat_count"), Some(100.0));
        assert_eq!(metric_value(text, "lat"), None);
    }

    #[test]
    fn one_series_of_a_labelled_histogram() {
        let text = "stage_bucket{stage=\"claim\",le=\"0.001\"} 7\n\
            stage_bucket{stage=\"claim\",le=\"+Inf\"} 9\n\
            stage_bucket{stage=\"mark\",le=\"0.001\"} 1\n\
            stage_bucket{stage=\"mark\",le=\"+Inf\"} 4\n";
        assert_eq!(
            histogram(text, "stage{stage=\"claim\"}"),
            vec![(0.001, 7.0), (f64::INFINITY, 9.0)]
        );
        assert_eq!(
            histogram(text, "stage{stage=\"mark\"}"),
            vec![(0.001, 1.0), (f64::INFINITY, 4.0)]
        );
        assert!(histogram(text, "stage{stage=\"publish\"}").is_empty());
        // Whole pairs: `substage` is not `stage`, `handle` is not `le`.
        let other = "stage_bucket{substage=\"claim\",handle=\"1\",le=\"0.5\"} 3\n";
        assert!(histogram(other, "stage{stage=\"claim\"}").is_empty());
        assert_eq!(histogram(other, "stage"), vec![(0.5, 3.0)]);
    }
}
