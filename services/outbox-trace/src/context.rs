//! The `traceparent` / `tracestate` values: parsing by the W3C rules, formatting, new ids.

use std::fmt;

/// The `sampled` bit of the trace flags: the caller may have recorded its span.
pub const SAMPLED: u8 = 0x01;

/// Longest `tracestate` passed on (W3C: propagate at least 512 characters); a longer or
/// malformed one is dropped rather than truncated.
const MAX_TRACESTATE: usize = 512;

/// A 16-byte trace id, never all zero; shown as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId([u8; 16]);

/// An 8-byte span id, never all zero; shown as 16 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId([u8; 8]);

impl TraceId {
    /// A random id.
    pub fn random() -> Self {
        loop {
            let b: [u8; 16] = rand::random();
            if b != [0; 16] {
                return Self(b);
            }
        }
    }

    /// The id's bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl SpanId {
    /// A random id.
    pub fn random() -> Self {
        loop {
            let b: [u8; 8] = rand::random();
            if b != [0; 8] {
                return Self(b);
            }
        }
    }

    /// The id's bytes.
    pub fn to_bytes(self) -> [u8; 8] {
        self.0
    }
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

/// Why a `traceparent` value was refused. The caller starts a new trace; a request is never
/// refused for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TraceparentError {
    /// Shorter than `00-<32 hex>-<16 hex>-<2 hex>`, or version `00` with anything after it.
    #[error("wrong length")]
    Length,
    /// A field is not lowercase hex of its length, or a separator is not `-`.
    #[error("malformed {0}")]
    Malformed(&'static str),
    /// Version `ff`, which W3C forbids.
    #[error("forbidden version ff")]
    ForbiddenVersion,
    /// The trace id is all zeros.
    #[error("all-zero trace id")]
    ZeroTraceId,
    /// The parent id is all zeros.
    #[error("all-zero parent id")]
    ZeroParentId,
}

/// A position in a trace: the trace, the span (in a `traceparent`: the caller's span, the
/// parent of whoever receives it), the flags, and the vendors' `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// The whole trace's id.
    pub trace_id: TraceId,
    /// The span's id.
    pub span_id: SpanId,
    /// Trace flags; only [`SAMPLED`] is defined for version 00 and passed on.
    pub flags: u8,
    /// The `tracestate` to pass on with it, if any.
    pub tracestate: Option<String>,
}

/// `n` lowercase hex digits from `s` into bytes.
fn hex_field<const N: usize>(s: &[u8], what: &'static str) -> Result<[u8; N], TraceparentError> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        _ => Err(TraceparentError::Malformed(what)),
    };
    if s.len() != 2 * N {
        return Err(TraceparentError::Malformed(what));
    }
    let mut out = [0u8; N];
    for (i, pair) in s.chunks_exact(2).enumerate() {
        out[i] = digit(pair[0])? << 4 | digit(pair[1])?;
    }
    Ok(out)
}

impl TraceContext {
    /// The start of a new trace: random trace and span ids, sampled.
    pub fn new_root() -> Self {
        Self {
            trace_id: TraceId::random(),
            span_id: SpanId::random(),
            flags: SAMPLED,
            tracestate: None,
        }
    }

    /// A span below this one: the same trace, flags and trace state, a new span id.
    pub fn child(&self) -> Self {
        Self {
            span_id: SpanId::random(),
            ..self.clone()
        }
    }

    /// Whether the trace is sampled (recorded by whoever sent it).
    pub fn is_sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// Parses a `traceparent` value: `version-traceid-parentid-flags`, lowercase hex, trace and
    /// parent id not all zero, version not `ff`. Version `00` is exactly 55 characters; a later
    /// version may append `-...` fields, which are ignored (W3C's forward compatibility).
    /// Surrounding spaces and tabs (HTTP's optional whitespace) are ignored.
    ///
    /// # Errors
    /// A [`TraceparentError`] saying what is wrong; callers start a new trace then.
    pub fn parse(traceparent: &str) -> Result<Self, TraceparentError> {
        let s = traceparent.trim_matches([' ', '\t']).as_bytes();
        if s.len() < 55 {
            return Err(TraceparentError::Length);
        }
        let [version] = hex_field::<1>(&s[0..2], "version")?;
        if version == 0xff {
            return Err(TraceparentError::ForbiddenVersion);
        }
        if (version == 0 && s.len() != 55) || (s.len() > 55 && s[55] != b'-') {
            return Err(TraceparentError::Length);
        }
        for at in [2, 35, 52] {
            if s[at] != b'-' {
                return Err(TraceparentError::Malformed("separator"));
            }
        }
        let trace_id = hex_field::<16>(&s[3..35], "trace id")?;
        let span_id = hex_field::<8>(&s[36..52], "parent id")?;
        let [flags] = hex_field::<1>(&s[53..55], "flags")?;
        if trace_id == [0; 16] {
            return Err(TraceparentError::ZeroTraceId);
        }
        if span_id == [0; 8] {
            return Err(TraceparentError::ZeroParentId);
        }
        Ok(Self {
            trace_id: TraceId(trace_id),
            span_id: SpanId(span_id),
            flags: flags & SAMPLED,
            tracestate: None,
        })
    }

    /// The context of received `traceparent` / `tracestate` headers, or `None` when there is no
    /// `traceparent` or it is malformed (then the `tracestate` is discarded too, as W3C says).
    pub fn from_headers(traceparent: Option<&str>, tracestate: Option<&str>) -> Option<Self> {
        let parsed = Self::parse(traceparent?).ok()?;
        Some(parsed.with_tracestate(tracestate))
    }

    /// The context with `tracestate` to pass on: kept when it is at most 512 characters of
    /// printable ASCII and not blank, else dropped.
    #[must_use]
    pub fn with_tracestate(mut self, tracestate: Option<&str>) -> Self {
        self.tracestate = tracestate
            .map(|t| t.trim_matches([' ', '\t']))
            .filter(|t| {
                !t.is_empty()
                    && t.len() <= MAX_TRACESTATE
                    && t.bytes().all(|b| (0x20..=0x7e).contains(&b))
            })
            .map(str::to_owned);
        self
    }

    /// The `traceparent` value (version 00) naming this span as the parent.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            self.flags & SAMPLED
        )
    }

    /// Puts `traceparent` (and `tracestate`, if any) into outbox `headers`.
    pub fn insert_into(&self, headers: &mut serde_json::Map<String, serde_json::Value>) {
        headers.insert(super::TRACEPARENT.to_owned(), self.traceparent().into());
        if let Some(state) = &self.tracestate {
            headers.insert(super::TRACESTATE.to_owned(), state.clone().into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_round_trips() {
        let ctx = TraceContext::parse(VALID).unwrap();
        assert_eq!(ctx.trace_id.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id.to_string(), "00f067aa0ba902b7");
        assert!(ctx.is_sampled());
        assert_eq!(ctx.traceparent(), VALID);
        let unsampled = TraceContext::parse(&VALID.replace("-01", "-00")).unwrap();
        assert!(!unsampled.is_sampled());
        assert!(unsampled.traceparent().ends_with("-00"));
    }

    #[test]
    fn the_w3c_rules_decide_what_is_refused() {
        let cases: &[(&str, Result<(), TraceparentError>)] = &[
            (VALID, Ok(())),
            (&format!(" \t{VALID}  "), Ok(())),
            ("", Err(TraceparentError::Length)),
            (&VALID[..54], Err(TraceparentError::Length)),
            (&format!("{VALID}0"), Err(TraceparentError::Length)),
            (&format!("{VALID}-extra"), Err(TraceparentError::Length)),
            // A later version may carry more fields after a `-`.
            (&format!("01{}-extra", &VALID[2..]), Ok(())),
            (&format!("cc{}", &VALID[2..]), Ok(())),
            (
                &format!("01{}x", &VALID[2..]),
                Err(TraceparentError::Length),
            ),
            (
                &format!("ff{}", &VALID[2..]),
                Err(TraceparentError::ForbiddenVersion),
            ),
            (
                &VALID.to_uppercase(),
                Err(TraceparentError::Malformed("trace id")),
            ),
            (
                &format!("0A{}", &VALID[2..]),
                Err(TraceparentError::Malformed("version")),
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                Err(TraceparentError::Malformed("trace id")),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
                Err(TraceparentError::Malformed("parent id")),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                Err(TraceparentError::Malformed("flags")),
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                Err(TraceparentError::Malformed("separator")),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
                Err(TraceparentError::Malformed("separator")),
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                Err(TraceparentError::ZeroTraceId),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                Err(TraceparentError::ZeroParentId),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
                Err(TraceparentError::Malformed("separator")),
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\u{e9}",
                Err(TraceparentError::Length),
            ),
        ];
        for (input, expected) in cases {
            let got = TraceContext::parse(input).map(|_| ());
            assert_eq!(&got, expected, "{input:?}");
        }
    }

    /// Every single-character change of a valid value either still parses to a context that
    /// formats back to the changed value, or is refused: the parser never accepts something it
    /// then misreports.
    #[test]
    fn every_one_character_mutation_is_refused_or_read_exactly() {
        let alphabet = b"0123456789abcdefABCDEFgz-_ \x00";
        for at in 0..VALID.len() {
            for &c in alphabet {
                let mut bytes = VALID.as_bytes().to_vec();
                bytes[at] = c;
                let Ok(text) = String::from_utf8(bytes) else {
                    continue;
                };
                if let Ok(ctx) = TraceContext::parse(&text) {
                    let trimmed = text.trim_matches([' ', '\t']);
                    assert_eq!(trimmed.len(), 55, "{text:?}");
                    let flags_ok = ctx.flags == ctx.flags & SAMPLED;
                    assert!(flags_ok, "{text:?}");
                    // Version and unknown flag bits are not passed on; the ids are exact.
                    assert_eq!(&ctx.traceparent()[3..52], &trimmed[3..52], "{text:?}");
                }
            }
        }
    }

    #[test]
    fn random_contexts_always_round_trip() {
        for _ in 0..1000 {
            let root = TraceContext::new_root();
            let parsed = TraceContext::parse(&root.traceparent()).unwrap();
            assert_eq!(parsed, root);
            let child = root.child();
            assert_eq!(child.trace_id, root.trace_id);
            assert_ne!(child.span_id, root.span_id);
        }
    }

    #[test]
    fn tracestate_is_kept_only_with_a_valid_traceparent_and_when_sane() {
        let ctx = TraceContext::from_headers(Some(VALID), Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(ctx.tracestate.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(
            TraceContext::from_headers(Some("garbage"), Some("a=b")),
            None
        );
        assert_eq!(TraceContext::from_headers(None, Some("a=b")), None);
        let long = "a=".to_owned() + &"b".repeat(600);
        let ctx = TraceContext::from_headers(Some(VALID), Some(&long)).unwrap();
        assert_eq!(ctx.tracestate, None, "over 512 characters: dropped");
        let ctx = TraceContext::from_headers(Some(VALID), Some("a=\u{1}b")).unwrap();
        assert_eq!(ctx.tracestate, None, "control characters: dropped");
        let mut headers = serde_json::Map::new();
        TraceContext::parse(VALID)
            .unwrap()
            .with_tracestate(Some("k=v"))
            .insert_into(&mut headers);
        assert_eq!(headers["traceparent"], VALID);
        assert_eq!(headers["tracestate"], "k=v");
    }
}
