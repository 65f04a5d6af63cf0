//! Latency samples and summary statistics.

use std::time::Duration;

/// A set of latency samples.
#[derive(Default, Clone)]
pub struct Samples {
    nanos: Vec<u64>,
}

impl Samples {
    /// Adds one sample.
    pub fn push(&mut self, d: Duration) {
        self.nanos.push(d.as_nanos() as u64);
    }

    /// Adds every sample of `other`.
    pub fn extend(&mut self, other: &Samples) {
        self.nanos.extend_from_slice(&other.nanos);
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.nanos.len()
    }

    /// The `q` quantile (0..=1) in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.nanos.is_empty() {
            return f64::NAN;
        }
        let mut sorted = self.nanos.clone();
        sorted.sort_unstable();
        let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
        sorted[rank] as f64 / 1e6
    }

    /// Median in milliseconds.
    pub fn p50(&self) -> f64 {
        self.quantile_ms(0.5)
    }

    /// 99th percentile in milliseconds.
    pub fn p99(&self) -> f64 {
        self.quantile_ms(0.99)
    }

    /// The largest sample in milliseconds.
    pub fn max(&self) -> f64 {
        self.quantile_ms(1.0)
    }
}

/// Median of a few run results.
pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// Coefficient of variation (standard deviation / mean).
pub fn coefficient_of_variation(values: &[f64]) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    variance.sqrt() / mean
}
