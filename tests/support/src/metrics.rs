//! Reading Prometheus text, as the processes under test expose it on `/metrics`.

/// The value of one series, written exactly as exposed: `name{label="value",...}`.
pub fn metric_series(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.rsplit_once(' ').filter(|(s, _)| *s == series))
        .and_then(|(_, v)| v.parse().ok())
}

/// The value of the first sample of metric `name` (any labels).
pub fn metric_value(text: &str, name: &str) -> Option<f64> {
    metric_sample(text, name, &[])
}

/// The value of the first sample of `name` whose labels include every `label="value"` of
/// `labels` (0 when there is none).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sample(text, name, labels).unwrap_or(0.0)
}

/// The value of the first sample of `name` whose labels include every `label="value"` of
/// `labels`.
pub fn metric_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split([' ', '{']).next() == Some(name))
        .find(|l| {
            labels
                .iter()
                .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Cumulative buckets `(upper bound, count)` of histogram `name` in Prometheus text, in
/// order, `+Inf` last. `name` may select one series of a labelled histogram:
/// `outbox_batch_stage_seconds{stage="claim"}`.
pub fn histogram(text: &str, name: &str) -> Vec<(f64, f64)> {
    let (name, labels) = match name.split_once('{') {
        Some((n, l)) => (n, l.trim_end_matches('}')),
        None => (name, ""),
    };
    let wanted: Vec<&str> = labels.split(',').filter(|p| !p.is_empty()).collect();
    let prefix = format!("{name}_bucket{{");
    let mut out: Vec<(f64, f64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| {
            // The label pairs, compared whole (label values here hold no `,` or `}`).
            let (set, count) = l.split_once('}')?;
            let pairs: Vec<&str> = set.split(',').collect();
            if !wanted.iter().all(|w| pairs.contains(w)) {
                return None;
            }
            let le = pairs.iter().find_map(|p| p.strip_prefix("le=\""))?;
            let le = le.strip_suffix('"')?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            let count = count.trim().parse().ok()?;
            Some((le, count))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// Bucket-wise difference `after - before` (observations made in between).
pub fn histogram_delta(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|&(le, n)| {
            let b = before
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, c)| *c);
            (le, n - b)
        })
        .collect()
}

/// Quantile `q` of cumulative buckets, interpolated linearly inside the bucket (as
/// Prometheus' `histogram_quantile` does); the `+Inf` bucket answers its lower bound.
pub fn histogram_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let target = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, n) in buckets {
        if n >= target {
            if le.is_infinite() {
                return Some(prev.0);
            }
            let width = n - prev.1;
            let frac = if width > 0.0 {
                (target - prev.1) / width
            } else {
                1.0
            };
            return Some(prev.0 + (le - prev.0) * frac);
        }
        prev = (le, n);
    }
    None
}
