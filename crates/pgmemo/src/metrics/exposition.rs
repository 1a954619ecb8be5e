//! The Prometheus text exposition format (version 0.0.4), written by hand: `# HELP` and
//! `# TYPE` lines per family, then samples with escaped label values. Knows nothing about
//! pgmemo; [`super::render`] decides what to write.

use std::fmt::{Display, Write as _};

use super::histogram::HistogramSnapshot;

/// The `Content-Type` of a page written by [`Exposition`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a family of samples measures, as the `# TYPE` line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (until a restart).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Buckets, sum and count.
    Histogram,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Builds one metrics page. Families must be written whole, one after the other: the format
/// does not allow a family's samples to be split.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(
            self.out,
            "# HELP {name} {}\n# TYPE {name} {}",
            escape_help(help),
            kind.name()
        );
    }

    /// One sample of the current family; `labels` are (name, value) pairs, values escaped here.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{label}=\"{}\"", escape_label_value(value));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A whole histogram family in seconds from a snapshot taken in microseconds.
    pub fn histogram_seconds(&mut self, name: &str, help: &str, snapshot: &HistogramSnapshot) {
        self.family(name, Kind::Histogram, help);
        let bucket = format!("{name}_bucket");
        for &(bound, count) in &snapshot.buckets {
            let le = seconds(bound).to_string();
            self.sample(&bucket, &[("le", &le)], count);
        }
        self.sample(&bucket, &[("le", "+Inf")], snapshot.count);
        self.sample(&format!("{name}_sum"), &[], seconds(snapshot.sum_micros));
        self.sample(&format!("{name}_count"), &[], snapshot.count);
    }

    /// The finished page.
    pub fn finish(self) -> String {
        self.out
    }
}

/// Microseconds as (float) seconds; `Display` of `f64` never uses an exponent, which every
/// Prometheus parser accepts.
pub fn seconds(micros: u64) -> f64 {
    micros as f64 / 1_000_000.0
}

/// A label value as the format requires: backslash, double quote and line feed escaped.
pub fn escape_label_value(value: &str) -> String {
    escape(value, true)
}

/// HELP text as the format requires: backslash and line feed escaped (quotes stay).
fn escape_help(help: &str) -> String {
    escape(help, false)
}

fn escape(text: &str, quote: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '"' if quote => out.push_str("\\\""),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_and_help_are_escaped() {
        let mut page = Exposition::default();
        page.family("m", Kind::Gauge, "a \\ b\nc \"q\"");
        page.sample("m", &[("db", "x\"y\\z\nw"), ("user", "ü")], 3);
        assert_eq!(
            page.finish(),
            "# HELP m a \\\\ b\\nc \"q\"\n# TYPE m gauge\nm{db=\"x\\\"y\\\\z\\nw\",user=\"ü\"} 3\n"
        );
    }

    #[test]
    fn histograms_are_cumulative_in_seconds() {
        let h = super::super::Histogram::default();
        h.observe(80);
        h.observe(1_500_000);
        let mut page = Exposition::default();
        page.histogram_seconds("lat_seconds", "Latency.", &h.snapshot());
        let text = page.finish();
        for line in [
            "# TYPE lat_seconds histogram",
            "lat_seconds_bucket{le=\"0.0001\"} 1\n",
            "lat_seconds_bucket{le=\"1\"} 1\n",
            "lat_seconds_bucket{le=\"2.5\"} 2\n",
            "lat_seconds_bucket{le=\"10\"} 2\n",
            "lat_seconds_bucket{le=\"+Inf\"} 2\n",
            "lat_seconds_sum 1.50008\n",
            "lat_seconds_count 2\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
    }
}
