//! How the tables write their figures: digits grouped, byte sizes in binary units.

/// `262144` → `256 KiB`, `1000` → `1000 B`.
pub fn bytes_label(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// `1234567.8` → `1 234 568`.
pub fn group(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_labels() {
        assert_eq!(bytes_label(100), "100 B");
        assert_eq!(bytes_label(1_024), "1 KiB");
        assert_eq!(bytes_label(16_384), "16 KiB");
        assert_eq!(bytes_label(262_144), "256 KiB");
        assert_eq!(bytes_label(1_000), "1000 B");
    }

    #[test]
    fn groups_thousands() {
        assert_eq!(group(1_234_567.8), "1 234 568");
        assert_eq!(group(999.0), "999");
        assert_eq!(group(0.2), "0");
    }
}
