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
